"""Schedules (`fusee.engine._schedules`): ticks on the virtual clock, overlap, catch-up, control.

Every test runs on the memory store, SQLite and Postgres, and again after a
crash (or a restart after downtime); none starts a tick twice.
"""

from __future__ import annotations

import datetime
from collections import Counter
from typing import Any

import pytest
from _postgres import Cluster

import fusee
from fusee import _codec
from fusee._schedule import run_id
from fusee.record import Done, Start, decode
from fusee.store import PostgresStore, Store
from fusee.testing import TestEngine

from .conftest import Host, assert_steps_ran_once
from .test_recovery import _FailingWrites as FailingWrites

pytestmark = pytest.mark.asyncio

# 2026-01-01T00:00:00Z, the test host's default start.
T0 = 1_767_225_600_000
MIN = 60_000
go = fusee.signal("go", int)


@fusee.workflow("tick_job")
async def tick_job(ctx: fusee.Ctx) -> str:
    return await ctx.step("work", lambda: "worked")


@fusee.workflow("long_job")
async def long_job(ctx: fusee.Ctx) -> int | None:
    return await ctx.wait_for(go)


def ids_at(name: str, *minutes: int, base: int = T0) -> list[str]:
    return [run_id(name, base + m * MIN) for m in minutes]


async def run_ids(t: TestEngine) -> list[str]:
    return sorted([info.id async for info in t.list()])


async def statuses(t: TestEngine) -> dict[str, str]:
    return {info.id: str(info.status) async for info in t.list()}


async def assert_started_once(store: Store, ids: list[str]) -> None:
    """Each run's journal has one Start and at most one Done: no tick started twice."""
    for id in ids:
        records = [decode(data) for _, data in await store.load(id)]
        kinds = Counter(type(r) for r in records)
        assert kinds[Start] == 1, (id, records)
        assert kinds[Done] <= 1, (id, records)


# --- ticks ----------------------------------------------------------------------------------------


async def test_an_every_minute_cron_starts_one_run_per_tick_over_16_minutes(host: Host) -> None:
    every_minute = fusee.Schedule("m", tick_job, cron="* * * * *")
    async with host(workflows=[tick_job], schedules=[every_minute]) as t:
        await t.advance("8m")
        await t.crash()
        await t.advance("8m")
        await t.crash()
        await t.settle()
        assert await run_ids(t) == ids_at("m", *range(1, 17))
        assert set((await statuses(t)).values()) == {"completed"}
        assert await t.get(ids_at("m", 16)[0]).result() == "worked"
        assert_steps_ran_once(t)
        await assert_started_once(t.store, ids_at("m", *range(1, 17)))
        (row,) = await t.schedules.list()
        assert (row.last_tick_ms, row.last_run) == (T0 + 16 * MIN, ids_at("m", 16)[0])
        assert row.next_ms == T0 + 17 * MIN


async def test_an_interval_ticks_at_its_multiples_since_the_epoch(host: Host) -> None:
    # Opened 30 s past a quarter hour: the first tick is the next quarter.
    quarter = fusee.Schedule("q", tick_job, every="15m")
    async with host(workflows=[tick_job], schedules=[quarter], start_ms=T0 + 30_000) as t:
        await t.advance("20m")
        await t.crash()
        await t.advance("25m")
        assert await run_ids(t) == ids_at("q", 15, 30, 45)


def utc_ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> int:
    when = datetime.datetime(year, month, day, hour, minute, tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


async def test_a_paris_cron_ticks_once_on_the_days_daylight_saving_time_changes(
    host: Host,
) -> None:
    nightly = fusee.Schedule("n", tick_job, cron="30 2 * * *", tz="Europe/Paris")
    # Noon UTC the day before the spring-forward night (2026-03-29, 02:00 -> 03:00).
    async with host(
        workflows=[tick_job], schedules=[nightly], start_ms=utc_ms(2026, 3, 28, 12)
    ) as t:
        await t.advance("1d")
        await t.crash()
        await t.advance("1d")
        # 02:30 does not exist on the 29th: the tick is at 03:00 CEST (01:00 UTC);
        # the next day is 02:30 CEST again (00:30 UTC).
        assert await run_ids(t) == [
            run_id("n", utc_ms(2026, 3, 29, 1)),
            run_id("n", utc_ms(2026, 3, 30, 0, 30)),
        ]
    # Noon UTC the day before the fall-back night (2026-10-25, 03:00 -> 02:00).
    async with host(
        workflows=[tick_job], schedules=[nightly], start_ms=utc_ms(2026, 10, 24, 12)
    ) as t:
        await t.advance("1d")
        await t.crash()
        await t.advance("1d")
        # 02:30 happens twice on the 25th: it ticks once, at the first (CEST, 00:30 UTC).
        assert await run_ids(t) == [
            run_id("n", utc_ms(2026, 10, 25, 0, 30)),
            run_id("n", utc_ms(2026, 10, 26, 1, 30)),
        ]


async def test_a_stepped_cron_ticks_on_both_passes_of_a_repeated_hour(host: Host) -> None:
    half_hourly = fusee.Schedule("h", tick_job, cron="*/30 1 * * *", tz="America/New_York")
    # 2026-11-01 in New York: 02:00 EDT -> 01:00 EST, so 01:00-01:59 happens
    # twice, and each pass is its own instants (05:xx UTC, then 06:xx UTC).
    async with host(
        workflows=[tick_job], schedules=[half_hourly], start_ms=utc_ms(2026, 11, 1, 0)
    ) as t:
        await t.advance("5h40m")
        await t.crash()
        await t.advance("1d20m")
        assert await run_ids(t) == [
            run_id("h", utc_ms(2026, 11, 1, 5)),
            run_id("h", utc_ms(2026, 11, 1, 5, 30)),
            run_id("h", utc_ms(2026, 11, 1, 6)),
            run_id("h", utc_ms(2026, 11, 1, 6, 30)),
            run_id("h", utc_ms(2026, 11, 2, 6)),
        ]


# --- overlap --------------------------------------------------------------------------------------


def every_minute(overlap: str) -> fusee.Schedule:
    return fusee.Schedule("o", long_job, every="1m", overlap=overlap)  # type: ignore[arg-type]


async def test_overlap_skip_starts_no_tick_while_the_last_run_runs(host: Host) -> None:
    async with host(workflows=[long_job], schedules=[every_minute("skip")]) as t:
        await t.advance("3m")
        await t.crash()
        await t.advance("30s")
        assert await run_ids(t) == ids_at("o", 1)
        await t.get(ids_at("o", 1)[0]).signal(go, 1)
        await t.advance("1m")  # minute 4
        assert await run_ids(t) == ids_at("o", 1, 4)
        await assert_started_once(t.store, ids_at("o", 1, 4))


async def test_overlap_buffer_one_starts_one_tick_when_the_last_run_ends(host: Host) -> None:
    async with host(workflows=[long_job], schedules=[every_minute("buffer_one")]) as t:
        await t.advance("3m")
        await t.crash()
        assert await run_ids(t) == ids_at("o", 1)
        (row,) = await t.schedules.list()
        assert row.buffered_ms == T0 + 2 * MIN  # the first tick behind it; 3 was dropped
        await t.get(ids_at("o", 1)[0]).signal(go, 1)
        await t.settle()
        # Started at once (minute 3), not at the next tick.
        assert await run_ids(t) == ids_at("o", 1, 2)
        await t.crash()
        await t.get(ids_at("o", 2)[0]).signal(go, 2)
        await t.advance("1m")  # minute 4: nothing runs, so it starts
        assert await run_ids(t) == ids_at("o", 1, 2, 4)
        await assert_started_once(t.store, ids_at("o", 1, 2, 4))


async def test_a_paused_schedule_holds_its_buffered_tick_until_resumed(host: Host) -> None:
    async with host(workflows=[long_job], schedules=[every_minute("buffer_one")]) as t:
        await t.advance("2m")
        await t.schedules.pause("o")
        await t.get(ids_at("o", 1)[0]).signal(go, 1)
        await t.advance("1m")
        await t.crash()
        await t.advance("1m")
        assert await run_ids(t) == ids_at("o", 1)
        await t.schedules.resume("o")
        await t.advance("1m")  # minute 5: the buffered tick starts first
        assert await run_ids(t) == ids_at("o", 1, 2)
        (row,) = await t.schedules.list()
        assert row.buffered_ms == T0 + 5 * MIN  # behind the run of tick 2


async def test_a_buffered_tick_starts_at_the_next_tick_if_its_run_ended_during_a_crash(
    host: Host,
) -> None:
    async with host(workflows=[long_job], schedules=[every_minute("buffer_one")]) as t:
        await t.advance("2m")
        await t.get(ids_at("o", 1)[0]).signal(go, 1)
        await t.crash()  # lost or not, the end's wake-up is not heard again
        await t.advance("1m")
        assert ids_at("o", 2)[0] in await run_ids(t)
        await assert_started_once(t.store, await run_ids(t))


async def test_overlap_allow_starts_every_tick(host: Host) -> None:
    async with host(workflows=[long_job], schedules=[every_minute("allow")]) as t:
        await t.advance("2m")
        await t.crash()
        await t.advance("1m")
        assert await statuses(t) == dict.fromkeys(ids_at("o", 1, 2, 3), "suspended")


async def test_overlap_cancel_other_cancels_the_last_run_and_starts_the_new(host: Host) -> None:
    async with host(workflows=[long_job], schedules=[every_minute("cancel_other")]) as t:
        await t.advance("2m")
        await t.crash()
        await t.advance("1m")
        first, second, third = ids_at("o", 1, 2, 3)
        assert await statuses(t) == {
            first: "cancelled",
            second: "cancelled",
            third: "suspended",
        }
        with pytest.raises(fusee.Cancelled, match="started a newer tick"):
            await t.get(first).result()


# --- downtime -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("catch_up", "started"),
    [
        pytest.param("5m", [7, 8, 9, 10, 11, 12], id="within-5m"),
        pytest.param("0s", [12], id="none"),
    ],
)
async def test_after_downtime_ticks_within_catch_up_start_in_order_and_older_ones_do_not(
    host: Host, catch_up: str, started: list[int]
) -> None:
    # Overlap "allow": each missed tick starts, though the one before still runs.
    s = fusee.Schedule("c", tick_job, every="1m", catch_up=catch_up, overlap="allow")
    async with host(workflows=[tick_job], schedules=[s]) as t:
        await t.advance("2m")
        store = t.store
        await t.crash()
    # Down from minute 2 to minute 12; a new process opens then.
    async with host(workflows=[tick_job], schedules=[s], store=store, start_ms=T0 + 12 * MIN) as t2:
        await t2.settle()
        ids = await run_ids(t2)
        assert ids == ids_at("c", 1, 2, *started)
        # Started in tick order: their Start records' LSNs increase.
        first_lsns = [(await t2.store.load(i))[0][0] for i in ids_at("c", *started)]
        assert first_lsns == sorted(first_lsns)
        await t2.crash()
        await t2.advance("1m")
        assert await run_ids(t2) == ids_at("c", 1, 2, *started, 13)
        await assert_started_once(t2.store, await run_ids(t2))


async def test_two_engines_on_one_postgres_store_start_each_tick_once(
    postgres_cluster: Cluster,
) -> None:
    # One engine writes an SQLite or memory store: only Postgres has two.
    first = postgres_cluster.new_store()
    second = PostgresStore(postgres_cluster.dsn, schema=first.schema, durability="none")
    s = fusee.Schedule("two", tick_job, every="1m")
    async with (
        TestEngine([tick_job], first, schedules=[s]) as a,
        TestEngine([tick_job], second, schedules=[s]) as b,
    ):
        for _ in range(5):
            await a.advance("1m")
            await b.advance("1m")
        ids = await run_ids(a)
        assert ids == ids_at("two", 1, 2, 3, 4, 5)
        steps = Counter(key for t in (a, b) for _, key in t.step_log)
        assert sorted(id for id, _, _ in steps) == ids
        assert set(steps.values()) == {1}
        await assert_started_once(first, ids)


# --- control --------------------------------------------------------------------------------------


async def test_pause_skips_ticks_resume_goes_on_and_trigger_starts_one_now(host: Host) -> None:
    s = fusee.Schedule("p", tick_job, every="1m")
    async with host(workflows=[tick_job], schedules=[s]) as t:
        await t.advance("1m")
        await t.schedules.pause("p")
        await t.crash()
        await t.advance("3m")
        assert await run_ids(t) == ids_at("p", 1)
        assert [r.paused for r in await t.schedules.list()] == [True]
        manual = await t.schedules.trigger("p")
        assert manual.id == "p-manual-2026-01-01T00:04:00.000+00:00"
        assert await manual.result() == "worked"
        await t.schedules.resume("p")
        await t.crash()
        await t.advance("1m")
        assert await run_ids(t) == sorted([*ids_at("p", 1, 5), manual.id])
        with pytest.raises(fusee.NotFound, match="no schedule 'nope'"):
            await t.schedules.pause("nope")


async def test_the_client_lists_pauses_resumes_and_triggers_through_the_worker(
    host: Host,
) -> None:
    s = fusee.Schedule("cl", tick_job, every="1m")
    async with (
        host(workflows=[tick_job], schedules=[s]) as t,
        await fusee.Client.connect(t.store) as client,
    ):
        await client.schedules.pause("cl")
        await t.advance("2m")
        assert await run_ids(t) == []
        await client.schedules.resume("cl")
        run = await client.schedules.trigger("cl")
        assert run.id.startswith("cl-manual-")
        assert await t.get(run.id).result() == "worked"
        [row] = await client.schedules.list()
        assert (row.name, row.paused, row.last_run) == ("cl", False, run.id)
        with pytest.raises(fusee.NotFound):
            await client.schedules.trigger("nope")


async def test_schedules_in_code_are_reconciled_with_the_stored_ones_on_open(host: Host) -> None:
    old = fusee.Schedule("r", tick_job, every="1m")
    gone = fusee.Schedule("gone", tick_job, every="1m")
    async with host(workflows=[tick_job], schedules=[old, gone]) as t:
        await t.advance("1m")
        store = t.store
        await t.crash()
    new = fusee.Schedule("r", tick_job, every="5m")
    async with host(workflows=[tick_job], schedules=[new], store=store, start_ms=T0 + MIN) as t2:
        await t2.advance("10m")
        rows: dict[str, Any] = {r.name: r for r in await t2.schedules.list()}
        assert rows["gone"].removed
        assert not rows["r"].removed
        assert rows["r"].spec == new.spec
        assert await run_ids(t2) == sorted(ids_at("r", 1, 5, 10) + ids_at("gone", 1))
        await t2.crash()
        await t2.advance("5m")
        assert await run_ids(t2) == sorted(ids_at("r", 1, 5, 10, 15) + ids_at("gone", 1))


async def test_a_tick_claimed_by_a_worker_that_stopped_before_starting_it_starts_on_open(
    host: Host,
) -> None:
    s = fusee.Schedule("z", tick_job, every="1m")
    async with host(workflows=[tick_job], schedules=[s]) as t:
        await t.settle()
        # What a worker that crashed between claiming the tick and starting it left.
        assert await t.store.claim_tick("z", T0 + MIN)
        store = t.store
        await t.crash()
    async with host(
        workflows=[tick_job], schedules=[s], store=store, start_ms=T0 + MIN + 5_000
    ) as t2:
        await t2.settle()
        assert await run_ids(t2) == ids_at("z", 1)
        (row,) = await t2.schedules.list()
        assert row.done_tick_ms == T0 + MIN
        await t2.crash()
        await t2.advance("1m")
        assert await run_ids(t2) == ids_at("z", 1, 2)
        await assert_started_once(t2.store, ids_at("z", 1, 2))


async def test_an_engine_refuses_a_schedule_of_a_workflow_it_does_not_run(host: Host) -> None:
    s = fusee.Schedule("w", tick_job, every="1m")
    with pytest.raises(ValueError, match="starts workflow 'tick_job', which is not one"):
        host(workflows=[long_job], schedules=[s])
    with pytest.raises(ValueError, match="two schedules named 'w'"):
        host(workflows=[tick_job], schedules=[s, s])
    with pytest.raises(ValueError, match="which is not one"):
        await fusee.Engine.open("memory", workflows=[long_job], schedules=[s])


# --- schedules made at run time ---------------------------------------------------------------


@fusee.workflow("tick_at")
async def tick_at(ctx: fusee.Ctx, label: str) -> str:
    """Says which tick started it: ``ctx.info.scheduled_at``, journaled with its start."""
    at = ctx.info.scheduled_at
    return await ctx.step("say", lambda: f"{label}@{at.isoformat() if at else None}")


@fusee.workflow("tick_chain")
async def tick_chain(ctx: fusee.Ctx, n: int) -> list[str]:
    """Continues as new once: each run of the tick's id says which tick it serves."""
    at = ctx.info.scheduled_at
    seen = await ctx.step("say", lambda: f"run {ctx.info.run}@{at.isoformat() if at else None}")
    if n == 0:
        ctx.continue_as_new(1)
    await ctx.wait_for(go)
    return [seen]


def at(minute: int) -> str:
    when = datetime.datetime.fromtimestamp((T0 + minute * MIN) / 1000, datetime.UTC)
    return when.isoformat()


async def results(t: TestEngine, ids: list[str]) -> list[Any]:
    return [await t.get(id).result() for id in ids]


async def test_a_schedule_made_at_run_time_ticks_across_crashes_and_its_runs_know_their_tick(
    host: Host,
) -> None:
    async with host(workflows=[tick_at]) as t:
        row = await t.schedules.create("rt", tick_at, every="1m", input="a")
        assert (row.dynamic, row.ticked_ms) == (True, 0)
        await t.advance("2m")
        await t.crash()
        await t.advance("2m")
        await t.crash()
        await t.settle()
        assert await run_ids(t) == ids_at("rt", 1, 2, 3, 4)
        assert await results(t, ids_at("rt", 1, 4)) == [f"a@{at(1)}", f"a@{at(4)}"]
        await assert_started_once(t.store, ids_at("rt", 1, 2, 3, 4))
        (row,) = await t.schedules.list()
        view = row.as_json()
        assert (view["origin"], view["state"], view["last_tick_at"]) == ("runtime", "active", at(4))
        assert view["last_run"] == ids_at("rt", 4)[0]
        assert view["spec"] == "every 1m; overlap skip; catch_up 0s"
        with pytest.raises(fusee.AlreadyExists, match="schedule 'rt' exists"):
            await t.schedules.create("rt", tick_at, every="1h", input="b")


async def test_a_run_time_schedule_is_updated_then_deleted_and_each_holds_after_a_crash(
    host: Host,
) -> None:
    async with host(workflows=[tick_at]) as t:
        await t.schedules.create("up", tick_at, cron="*/2 * * * *", input="a")
        await t.advance("2m")
        await t.schedules.update("up", every="3m", input="b")
        await t.crash()
        await t.advance("4m")  # minutes 3 and 6
        assert await run_ids(t) == ids_at("up", 2, 3, 6)
        assert await results(t, ids_at("up", 2, 6)) == [f"a@{at(2)}", f"b@{at(6)}"]
        (row,) = await t.schedules.list()
        assert row.spec == "every 180000ms; overlap skip; catch_up 0ms"
        await t.schedules.delete("up")
        await t.crash()
        await t.advance("6m")
        assert await run_ids(t) == ids_at("up", 2, 3, 6)
        assert await t.schedules.list() == []
        with pytest.raises(fusee.NotFound, match="no schedule 'up'"):
            await t.schedules.delete("up")


async def test_a_schedule_in_code_is_changed_in_code_only(host: Host) -> None:
    s = fusee.Schedule("code", tick_job, every="1m")
    async with host(workflows=[tick_job], schedules=[s]) as t:
        with pytest.raises(ValueError, match="'code' is defined in code"):
            await t.schedules.update("code", every="2m")
        with pytest.raises(ValueError, match="'code' is defined in code"):
            await t.schedules.delete("code")
        with pytest.raises(fusee.AlreadyExists, match="made in code"):
            await t.schedules.create("code", tick_job, every="1h")
        with pytest.raises(ValueError, match="is not a cron expression"):
            await t.schedules.create("bad", tick_job, cron="every day")
        with pytest.raises(fusee.UnknownWorkflow):
            await t.schedules.create("other", "nope", every="1m")
        assert [r.name for r in await t.schedules.list()] == ["code"]


async def test_a_schedule_on_a_queue_starts_its_runs_queued_with_their_tick(host: Host) -> None:
    one = fusee.Queue("one", concurrency=1)
    async with host(workflows=[long_job, tick_at], queues=[one]) as t:
        await t.schedules.create("q", long_job, every="1m", queue=one)
        await t.schedules.create("q2", tick_at, every="2m", input="c", queue="one")
        await t.advance("2m")
        await t.crash()
        first, second = ids_at("q", 1)[0], ids_at("q2", 2)[0]
        assert await statuses(t) == {first: "suspended", second: "queued"}
        await t.get(first).signal(go, 1)
        assert await t.get(second).result() == f"c@{at(2)}"
        with pytest.raises(fusee.UnknownQueue):
            await t.schedules.create("q3", long_job, every="1m", queue="nope")


@pytest.mark.parametrize(
    "crash", [pytest.param(False, id="live"), pytest.param(True, id="crashed")]
)
async def test_a_scheduled_run_continued_as_new_keeps_its_tick(host: Host, crash: bool) -> None:
    every_2m = fusee.Schedule("chain", tick_chain, every="2m", input=0)
    async with host(workflows=[tick_chain], schedules=[every_2m]) as t:
        await t.advance("2m")
        await t.settle()
        (id,) = ids_at("chain", 2)
        if crash:
            await t.crash()
            await t.settle()
        run = t.get(id)
        info = await run.describe()
        assert (info.run, info.status) == (2, "suspended")
        await run.signal(go, 1)
        assert await run.result() == [f"run 2@{at(2)}"]
        assert_steps_ran_once(t)


@pytest.mark.expect_engine_errors("the store failed; runs stop .*: simulated crash")
async def test_a_scheduled_run_continued_by_recovery_keeps_its_tick(host: Host) -> None:
    # A crash between the two runs: recovery starts the next run from the
    # first's journal (its "continued" row), with the tick its `Start` holds.
    every_2m = fusee.Schedule("chain", tick_chain, every="2m", input=0)

    def next_run_starts(records: list[Any]) -> bool:
        return any(type(r) is Start and r.input == _codec.encode(1) for r in records)

    async with host(workflows=[tick_chain], schedules=[every_2m]) as t:
        with FailingWrites(t.engine.store, next_run_starts) as w:
            await t.advance("2m")
            await t.settle()
            assert w.failed == 1
        (id,) = ids_at("chain", 2)
        row = await t.store.get(id)
        assert row is not None
        assert (row.run, row.status) == (1, "continued")
        await t.crash()
        run = t.get(id)
        await run.signal(go, 1)
        assert await run.result() == [f"run 2@{at(2)}"]


async def test_backfill_starts_each_past_tick_once_across_crashes(host: Host) -> None:
    def utc(minute: int) -> datetime.datetime:
        return datetime.datetime.fromtimestamp((T0 + minute * MIN) / 1000, datetime.UTC)

    async with host(workflows=[tick_at], start_ms=T0 - 10 * MIN) as t:
        await t.schedules.create("bf", tick_at, every="1m", input="x", overlap="allow")
        await t.advance("12m")  # minutes -9 to 2
        runs = await t.schedules.backfill("bf", utc(-13), utc(-8))
        assert [r.id for r in runs] == ids_at("bf", -13, -12, -11, -10, -9, -8)
        await t.crash()
        again = await t.schedules.backfill("bf", utc(-13), utc(-12))
        assert [r.id for r in again] == ids_at("bf", -13, -12)
        assert await results(t, ids_at("bf", -13, -8)) == [f"x@{at(-13)}", f"x@{at(-8)}"]
        assert await run_ids(t) == ids_at("bf", *range(-13, 3))
        await assert_started_once(t.store, ids_at("bf", *range(-13, 3)))
        with pytest.raises(ValueError, match="after now"):
            await t.schedules.backfill("bf", utc(0), utc(5))
        with pytest.raises(ValueError, match="before its start"):
            await t.schedules.backfill("bf", utc(-1), utc(-2))


async def test_a_run_time_schedule_made_on_one_postgres_worker_is_ticked_once_by_both(
    postgres_cluster: Cluster,
) -> None:
    first = postgres_cluster.new_store()
    second = PostgresStore(postgres_cluster.dsn, schema=first.schema, durability="none")
    async with (
        TestEngine([tick_at], first) as a,
        TestEngine([tick_at], second) as b,
    ):
        await a.schedules.create("both", tick_at, every="1m", input="z")
        for _ in range(2):
            await a.advance("1m")
            await b.advance("1m")
        # b found it in its once-a-minute look and ticks it too; a claim lets one through.
        assert "both" in b.engine.schedules.names
        await a.schedules.delete("both")
        for _ in range(3):
            await a.advance("1m")
            await b.advance("1m")
        assert "both" not in b.engine.schedules.names
        ids = await run_ids(a)
        assert ids == ids_at("both", 1, 2)
        await assert_started_once(first, ids)
