"""What the engine does for runs: timers, signals, children, updates, queries, streams,
cancellation and continue-as-new.

Every test runs on the memory store and on SQLite, live and then again after
a crash (or at every record, with `crash_everywhere`), and counts step runs.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from typing import Any

import pytest

import fusee
from fusee.testing import crash_everywhere

from .conftest import Host, assert_steps_ran_once, step_runs

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", int)
note = fusee.signal("note", str)
phase_q = fusee.query("phase")
add = fusee.update("add", int)


# --- timers ---------------------------------------------------------------------------------------


@fusee.workflow("alarm")
async def alarm(ctx: fusee.Ctx) -> list[str]:
    t0 = ctx.now()
    await ctx.sleep("first", "1h")
    await asyncio.sleep(1800)
    return [t0.isoformat(), ctx.now().isoformat()]


async def test_a_timer_is_rebuilt_from_the_journal_after_a_crash(host: Host) -> None:
    async with host(workflows=[alarm]) as t:
        run = await t.start(alarm, "a-1")
        await t.advance("59m")
        await t.crash()
        await t.advance("1m")  # the first timer fires at its recorded time
        await t.crash()
        await t.settle()  # recovery loads unfinished runs in the background
        assert (await run.describe()).status == "suspended"
        await t.advance("29m")
        assert (await run.describe()).status == "suspended"
        await t.advance("1m")
        t0, t1 = await run.result()
        gap = datetime.datetime.fromisoformat(t1) - datetime.datetime.fromisoformat(t0)
        assert gap == datetime.timedelta(minutes=90)


async def test_timers_survive_a_crash_at_every_record() -> None:
    t0, t1 = await crash_everywhere(alarm)
    gap = datetime.datetime.fromisoformat(t1) - datetime.datetime.fromisoformat(t0)
    assert gap == datetime.timedelta(minutes=90)


# --- signals --------------------------------------------------------------------------------------


@fusee.workflow("collector")
async def collector(ctx: fusee.Ctx, n: int) -> list[int | None]:
    await ctx.sleep("warm-up", "1h")
    return [await ctx.wait_for(go) for _ in range(n)]


async def test_signals_sent_before_the_wait_are_buffered_in_order(host: Host) -> None:
    async with host(workflows=[collector]) as t:
        run = await t.start(collector, "c-1", 3)
        await run.signal(go, 1)
        await run.signal(go, 2)
        await t.crash()
        await run.signal(go, 3)
        assert await run.result() == [1, 2, 3]
        await t.crash()
        assert await run.result() == [1, 2, 3]


async def test_a_signal_with_a_dedup_id_counts_once_even_across_a_crash(host: Host) -> None:
    async with host(workflows=[collector]) as t:
        run = await t.start(collector, "c-1", 2)
        await run.signal(go, 1, dedup="first")
        await run.signal(go, 1, dedup="first")
        await t.crash()
        await run.signal(go, 1, dedup="first")
        await run.signal(go, 2, dedup="second")
        assert await run.result() == [1, 2]


async def test_a_signal_to_a_finished_run_raises_a_clear_error(host: Host) -> None:
    async with host(workflows=[collector]) as t:
        run = await t.start(collector, "c-1", 0)
        assert await run.result() == []
        with pytest.raises(fusee.FuseeError, match=r"run 'c-1' has finished \(completed\)"):
            await run.signal(go, 1)
        await t.crash()
        with pytest.raises(fusee.FuseeError, match="has finished"):
            await run.signal(go, 1)


async def test_a_wait_times_out_to_none_after_a_crash_too(host: Host) -> None:
    @fusee.workflow("patient")
    async def patient(ctx: fusee.Ctx) -> int | None:
        return await ctx.wait_for(go, timeout="1h")

    async with host(workflows=[patient]) as t:
        run = await t.start(patient, "p-1")
        await t.advance("30m")
        await t.crash()
        await t.advance("29m")
        assert (await run.describe()).status == "suspended"
        await t.advance("1m")
        assert await run.result() is None
        with pytest.raises(fusee.FuseeError, match="has finished"):
            await run.signal(go, 1)


async def test_send_signals_another_run_once_its_record_is_durable(host: Host) -> None:
    @fusee.workflow("sender")
    async def sender(ctx: fusee.Ctx, target: str) -> None:
        await ctx.step("prepare", lambda: None)
        ctx.send(target, go, 7)

    async with host(workflows=[sender, collector]) as t:
        receiver = await t.start(collector, "r-1", 1)
        await t.execute(sender, "s-1", "r-1")
        await t.crash()
        assert await receiver.result() == [7]
        assert_steps_ran_once(t)


async def test_signals_survive_a_crash_at_every_record() -> None:
    async def drive(t: Any, run: fusee.Run[list[int | None]]) -> None:
        await run.signal(go, 1, dedup="one")
        await run.signal(go, 2, dedup="two")

    assert await crash_everywhere(collector, 2, drive=drive) == [1, 2]


# --- children -------------------------------------------------------------------------------------


@fusee.workflow("kid")
async def kid(ctx: fusee.Ctx, n: int) -> int:
    await ctx.sleep("grow", "1h")
    return await ctx.step("work", lambda: n * 10)


@fusee.workflow("bad-kid")
async def bad_kid(ctx: fusee.Ctx) -> None:
    raise LookupError("no such thing")


@fusee.workflow("family")
async def family(ctx: fusee.Ctx, n: int) -> dict[str, Any]:
    attached = await ctx.child(kid, f"{ctx.info.id}-kid", n)
    await ctx.child(kid, f"{ctx.info.id}-detached", n + 1, detached=True)
    try:
        await ctx.child(bad_kid, f"{ctx.info.id}-bad")
        bad = "no error"
    except fusee.ChildFailed as e:
        bad = f"{e.id}: {e.cause}"
    try:
        await ctx.child(kid, "taken", 0)
        taken = "no error"
    except fusee.ChildFailed as e:
        taken = e.cause
    return {"attached": attached, "bad": bad, "taken": taken}


async def test_children_attached_detached_failing_and_with_a_taken_id(host: Host) -> None:
    async with host(workflows=[family, kid, bad_kid, collector]) as t:
        await t.start(collector, "taken", 1)
        run = await t.start(family, "f", 2)
        await t.advance("30m")
        await t.crash()
        got = await run.result()
        assert got["attached"] == 20
        assert got["bad"] == "f-bad: workflow failed: LookupError: no such thing"
        assert "AlreadyExists" in got["taken"]
        assert "'taken' is taken by another run" in got["taken"]
        # The detached child runs on by itself, and is not bound to its parent's end.
        assert await t.get("f-detached").result() == 30
        await t.crash()
        assert await run.result() == got
        assert_steps_ran_once(t)


@fusee.workflow("unregistered")
async def unregistered(ctx: fusee.Ctx) -> None:
    return None


async def test_a_child_of_an_unknown_workflow_fails_with_child_failed(host: Host) -> None:
    @fusee.workflow("orphaned")
    async def orphaned(ctx: fusee.Ctx) -> str:
        try:
            await ctx.child(unregistered, "x-1")
        except fusee.ChildFailed as e:
            return e.cause
        return "no error"

    async with host(workflows=[orphaned]) as t:
        got = await t.execute(orphaned, "o-1")
        assert "UnknownWorkflow" in got
        assert "'unregistered' is not registered" in got
        await t.crash()
        assert await t.get("o-1").result() == got


async def test_children_survive_a_crash_at_every_record() -> None:
    @fusee.workflow("parent")
    async def parent(ctx: fusee.Ctx, n: int) -> int:
        a = await ctx.child(kid, f"{ctx.info.id}-a", n)
        await ctx.child(kid, f"{ctx.info.id}-b", n, detached=True)
        return a + 1

    assert await crash_everywhere(parent, 4, workflows=[kid]) == 41


# --- updates and queries --------------------------------------------------------------------------


@fusee.workflow("basket")
async def basket(ctx: fusee.Ctx) -> list[int]:
    items: list[int] = []

    def validate(n: int) -> None:
        if n <= 0:
            raise ValueError("quantity must be positive")

    async def handle(n: int) -> int:
        price = await ctx.step("price", lambda: n * 100)
        items.append(price)
        return sum(items)

    ctx.on_query(phase_q, lambda _: {"items": list(items)})
    ctx.on_update(add, handle, validator=validate)
    await ctx.wait_for(go)
    return items


async def test_updates_and_queries_on_a_live_a_parked_and_a_finished_run(host: Host) -> None:
    async with host(workflows=[basket], park_after="1s") as t:
        run = await t.start(basket, "b-1")
        assert await run.update(add, 1) == 100
        await t.advance("2s")
        assert not t.is_loaded("b-1")  # parked
        assert await run.query(phase_q) == {"items": [100]}
        await t.advance("2s")
        assert not t.is_loaded("b-1")
        assert await run.update(add, 2) == 300
        with pytest.raises(fusee.FuseeError, match="quantity must be positive"):
            await run.update(add, 0)
        await t.crash()
        assert await run.query(phase_q) == {"items": [100, 200]}
        await run.signal(go, 0)
        assert await run.result() == [100, 200]
        # A finished run answers queries from its journal, and refuses updates.
        assert await run.query(phase_q) == {"items": [100, 200]}
        with pytest.raises(fusee.FuseeError, match="has finished"):
            await run.update(add, 3)
        await t.crash()
        assert await run.query(phase_q) == {"items": [100, 200]}
        assert len(t.step_log) == 2
        assert_steps_ran_once(t)


async def test_a_query_without_a_handler_names_the_fix(host: Host) -> None:
    async with host(workflows=[collector]) as t:
        run = await t.start(collector, "c-1", 1)
        with pytest.raises(fusee.FuseeError, match=r"register one with ctx.on_query"):
            await run.query(phase_q)
        await t.crash()
        with pytest.raises(
            fusee.QueryFailed, match=r"query 'phase' of run 'c-1' failed: UnknownQuery"
        ):
            await run.query(phase_q)


# --- streams --------------------------------------------------------------------------------------


@fusee.workflow("talker")
async def talker(ctx: fusee.Ctx, n: int) -> int:
    async with ctx.stream("words") as out:
        for i in range(n):
            await out.append(f"w{i}")
            await ctx.wait_for(go)
    return n


async def test_a_stream_is_read_live_while_the_run_waits(host: Host) -> None:
    async with host(workflows=[talker]) as t:
        run = await t.start(talker, "t-1", 3)
        got: asyncio.Queue[str] = asyncio.Queue()

        async def read() -> None:
            async for word in run.stream("words"):
                await got.put(word)

        reader = asyncio.ensure_future(read())
        assert await asyncio.wait_for(got.get(), 10) == "w0"
        await run.signal(go, 1)
        assert await asyncio.wait_for(got.get(), 10) == "w1"
        await t.crash()
        # A reader of the engine that crashed ends with a clear error (it
        # would have died with the process) instead of waiting forever.
        with pytest.raises(fusee.FuseeError, match="engine is closed"):
            await asyncio.wait_for(reader, 10)
        # A new reader starts from the beginning and goes on live.
        reader = asyncio.ensure_future(read())
        assert [await asyncio.wait_for(got.get(), 10) for _ in range(2)] == ["w0", "w1"]
        await run.signal(go, 1)
        assert await asyncio.wait_for(got.get(), 10) == "w2"
        await run.signal(go, 1)
        assert await run.result() == 3
        await asyncio.wait_for(reader, 10)
        assert got.empty()
        # Read again from the start, after the end: every chunk once.
        assert [w async for w in run.stream("words")] == ["w0", "w1", "w2"]


async def test_a_stream_stays_open_while_its_run_is_parked(host: Host) -> None:
    async with host(workflows=[talker], park_after="5s") as t:
        run = await t.start(talker, "t-2", 2)
        assert [w async for w in _first(run.stream("words"), 1)] == ["w0"]
        await t.advance("10s")
        assert not t.is_loaded("t-2")
        # Parking ends the run's code in memory, not its stream: replay goes on with it.
        await run.signal(go, 1)
        await run.signal(go, 1)
        assert await run.result() == 2
        assert [w async for w in run.stream("words")] == ["w0", "w1"]


async def _first(chunks: AsyncIterator[str], n: int) -> AsyncIterator[str]:
    for _ in range(n):
        yield await chunks.__anext__()


async def test_a_step_writes_a_stream_that_ends_with_its_result(host: Host) -> None:
    async def generate(s: fusee.StepCtx) -> int:
        async with s.stream("tokens") as out:
            for tok in ("a", "b", "c"):
                await out.append(tok)
        return 3

    @fusee.workflow("generator")
    async def generator(ctx: fusee.Ctx) -> int:
        return await ctx.step("generate", generate)

    async with host(workflows=[generator]) as t:
        run = await t.start(generator, "g-1")
        assert [tok async for tok in run.stream("tokens")] == ["a", "b", "c"]
        assert await run.result() == 3
        await t.crash()
        assert [tok async for tok in run.stream("tokens")] == ["a", "b", "c"]
        assert_steps_ran_once(t)


# --- cancellation ---------------------------------------------------------------------------------


@fusee.workflow("trip")
async def trip(ctx: fusee.Ctx) -> dict[str, Any]:
    booked = await ctx.step("book", lambda: "hotel")
    outcomes: list[str] = []

    async def guarded(name: str, op: Any) -> None:
        try:
            await op
            outcomes.append(f"{name}: done")
        except fusee.Cancelled as e:
            outcomes.append(f"{name}: cancelled ({e})")

    await asyncio.gather(
        guarded("wait", ctx.wait_for(go)),
        guarded("sleep", ctx.sleep("hold", "1d")),
        guarded("kid", ctx.child(kid, f"{ctx.info.id}-kid", 1)),
    )
    released = await ctx.step("release", lambda: f"released {booked}")
    return {"outcomes": outcomes, "released": released}


async def test_cancel_raises_cancelled_in_every_pending_operation_and_compensation_runs(
    host: Host,
) -> None:
    async with host(workflows=[trip, kid]) as t:
        run = await t.start(trip, "t-1")
        await t.advance("10m")
        await run.cancel("plans changed")
        got = await run.result()
        assert sorted(got["outcomes"]) == [
            "kid: cancelled (plans changed)",
            "sleep: cancelled (plans changed)",
            "wait: cancelled (plans changed)",
        ]
        assert got["released"] == "released hotel"
        # Cancelling a finished run is refused, and records nothing.
        with pytest.raises(fusee.RunFinished, match="cancel was not delivered"):
            await run.cancel("again")
        await t.crash()
        assert await run.result() == got
        assert_steps_ran_once(t)


async def test_cancellation_replays_identically_after_a_crash_at_every_record() -> None:
    async def drive(t: Any, run: fusee.Run[dict[str, Any]]) -> None:
        await t.settle()
        await run.cancel("plans changed")

    got = await crash_everywhere(trip, workflows=[kid], drive=drive)
    assert got["released"] == "released hotel"


async def test_cancelling_a_parked_run_wakes_it_to_cancel(host: Host) -> None:
    async with host(workflows=[collector], park_after="1s") as t:
        run = await t.start(collector, "c-1", 1)
        await t.advance("10s")
        assert not t.is_loaded("c-1")
        await run.cancel("stop")
        with pytest.raises(fusee.Cancelled, match="stop"):
            await run.result()
        await t.crash()
        with pytest.raises(fusee.Cancelled, match="stop"):
            await run.result()
        assert (await run.describe()).status == "cancelled"


# --- continue-as-new ------------------------------------------------------------------------------


@fusee.workflow("counter")
async def counter(ctx: fusee.Ctx, n: int) -> int:
    await ctx.sleep("tick", "1h")
    await ctx.step("count", lambda: n)
    if n < 3:
        ctx.continue_as_new(n + 1)
    return n


async def test_result_follows_continue_as_new_to_the_last_run(host: Host) -> None:
    async with host(workflows=[counter]) as t:
        run = await t.start(counter, "c-1", 0)
        await t.advance("90m")
        first = await run.describe()
        await t.crash()
        assert await run.result() == 3
        last = await run.describe()
        assert last.run > first.run
        assert last.status == "completed"
        await t.crash()
        assert await run.result() == 3
        # One step per run (step_runs counts by (id, seq), the same in each run).
        assert step_runs(t) == {("c-1", 1): 4}
        assert_steps_ran_once(t)


async def test_continue_as_new_survives_a_crash_at_every_record() -> None:
    # Between the old run's end and the new run's start there is a write: a
    # crash there must still start the new run on recovery.
    assert await crash_everywhere(counter, 1) == 3


# --- races and edges ------------------------------------------------------------------------------


async def test_cancel_while_a_step_runs_drops_its_late_result(host: Host) -> None:
    started = asyncio.Event()
    finish = asyncio.Event()
    calls: list[str] = []

    async def slow() -> str:
        calls.append("slow")
        started.set()
        await finish.wait()
        return "too late"

    @fusee.workflow("busy")
    async def busy(ctx: fusee.Ctx) -> list[str]:
        try:
            return [await ctx.step("slow", slow)]
        except fusee.Cancelled as e:
            # Operations started after the cancel run normally: compensation.
            return [f"slow: {e}", await ctx.step("undo", lambda: "undone")]

    async with host(workflows=[busy]) as t:
        run = await t.start(busy, "b-1")
        await asyncio.wait_for(started.wait(), 10)
        await run.cancel("stop")
        finish.set()
        assert await run.result() == ["slow: stop", "undone"]
        await t.crash()
        assert await run.result() == ["slow: stop", "undone"]
        assert calls == ["slow"]
        assert_steps_ran_once(t)


async def test_cancel_while_a_step_waits_to_retry_stops_its_retries(host: Host) -> None:
    calls: list[int] = []

    def failing(s: fusee.StepCtx) -> str:
        calls.append(s.attempt)
        raise ConnectionError("down")

    @fusee.workflow("retrier")
    async def retrier(ctx: fusee.Ctx) -> str:
        try:
            return await ctx.step(
                "call", failing, retry=fusee.Retry(initial="1h", max_interval="1h")
            )
        except fusee.Cancelled as e:
            return f"call: {e}"

    async with host(workflows=[retrier]) as t:
        run = await t.start(retrier, "r-1")
        await t.advance("30m")
        assert calls == [1]
        await run.cancel("stop")
        assert await run.result() == "call: stop"
        await t.crash()
        await t.advance("1d")
        assert await run.result() == "call: stop"
        assert calls == [1]


async def test_a_step_stream_retried_continues_after_what_was_recorded(host: Host) -> None:
    async def generate(s: fusee.StepCtx) -> str:
        async with s.stream("tokens") as out:
            for tok in ("a", "b", "c"):
                await out.append(tok)
                if s.attempt == 1 and tok == "b":
                    raise ConnectionError("cut off")
        return "done"

    @fusee.workflow("gen")
    async def gen(ctx: fusee.Ctx) -> str:
        return await ctx.step("generate", generate, retry=fusee.Retry(initial="1s"))

    async with host(workflows=[gen]) as t:
        run = await t.start(gen, "g-1")
        assert await run.result() == "done"
        assert [tok async for tok in run.stream("tokens")] == ["a", "b", "c"]
        await t.crash()
        assert [tok async for tok in run.stream("tokens")] == ["a", "b", "c"]
        assert len(t.step_log) == 2


async def test_updates_and_queries_at_once_wake_a_parked_run_once(host: Host) -> None:
    async with host(workflows=[basket], park_after="1s") as t:
        run = await t.start(basket, "b-1")
        await t.advance("2s")
        assert not t.is_loaded("b-1")
        first, items, second = await asyncio.gather(
            run.update(add, 1), run.query(phase_q), run.update(add, 2)
        )
        # Concurrent updates take some order, the same for the journal and the callers.
        order = [100, 200] if first == 100 else [200, 100]
        assert (first, second) == ((100, 300) if first == 100 else (300, 200))
        assert items["items"] in ([], order[:1], order)
        await run.signal(go, 0)
        assert await run.result() == order
        await t.crash()
        assert await run.result() == order
        assert_steps_ran_once(t)


@fusee.workflow("hasty")
async def hasty(ctx: fusee.Ctx) -> str:
    async def handle(n: int) -> int:
        await ctx.wait_for(note)  # never sent: the run ends first
        return n

    ctx.on_update(add, handle)
    await ctx.wait_for(go)
    return "done"


async def test_an_update_whose_handler_is_cut_off_by_the_runs_end_fails_its_caller(
    host: Host,
) -> None:
    async with host(workflows=[hasty], park_after="1s") as t:
        run = await t.start(hasty, "h-1")
        update = asyncio.ensure_future(run.update(add, 1))
        await t.advance("1m")
        # A caller waits for the handler: the run stays loaded for it.
        assert t.is_loaded("h-1")
        assert not update.done()
        await run.signal(go, 0)
        assert await run.result() == "done"
        with pytest.raises(fusee.FuseeError, match="ended before the update's handler finished"):
            await update
        with pytest.raises(fusee.FuseeError, match="has finished"):
            await run.update(add, 2)
        await t.crash()
        assert await run.result() == "done"


async def test_an_update_caller_of_an_engine_that_closes_is_answered(host: Host) -> None:
    async with host(workflows=[hasty]) as t:
        run = await t.start(hasty, "h-1")
        update = asyncio.ensure_future(run.update(add, 1))
        await t.settle()
        await t.crash()
        with pytest.raises(fusee.FuseeError, match="engine closed"):
            await update
        await run.signal(go, 0)
        assert await run.result() == "done"


async def test_two_starts_of_one_id_at_once_start_one_run(host: Host) -> None:
    async with host(workflows=[collector]) as t:
        got = await asyncio.gather(
            t.start(collector, "c-1", 1),
            t.start(collector, "c-1", 1),
            return_exceptions=True,
        )
        assert sorted(type(g).__name__ for g in got) == ["AlreadyExists", "Run"]
        attached = await asyncio.gather(
            *(t.start(collector, "c-2", 1, id_policy=fusee.IdPolicy.ATTACH) for _ in range(3))
        )
        assert {r.id for r in attached} == {"c-2"}
        await t.crash()
        assert sorted([i.id async for i in t.list()]) == ["c-1", "c-2"]
