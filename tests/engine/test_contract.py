"""The contract between runs and the outside: messages never lost, one status, clear errors.

Each behaviour holds live and after a crash, on every store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest

import fusee
from fusee import _codec
from fusee.record import DETACHED, Child, Done, Parent, Signal, decode, encode
from fusee.store import Entry
from fusee.testing import crash_everywhere

from .conftest import HeldWrites, Host, assert_steps_ran_once

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", int)
extra = fusee.signal("extra", int)
bump = fusee.update("bump", int)
phase_q = fusee.query("phase")


# --- messages between runs -------------------------------------------------------------------


@fusee.workflow("listener")
async def listener(ctx: fusee.Ctx) -> int:
    return await ctx.wait_for(go) or 0


@fusee.workflow("sender")
async def sender(ctx: fusee.Ctx, target: str) -> str:
    ctx.send(target, go, 7)
    return "sent"


async def test_a_send_is_delivered_exactly_once_across_a_crash_at_every_record() -> None:
    async def drive(t: Any, run: fusee.Run[str]) -> None:
        await t.start(listener, "l-1", id_policy=fusee.IdPolicy.ATTACH)

    got = await crash_everywhere(sender, "l-1", workflows=[listener], drive=drive)
    assert got == "sent"


@pytest.mark.expect_engine_errors("simulated crash before the signal was written")
async def test_a_send_whose_delivery_a_crash_lost_is_delivered_on_recovery(host: Host) -> None:
    async with host(workflows=[listener, sender]) as t:
        target = await t.start(listener, "l-1")
        store = t.engine.store
        real = store.append
        dropped: list[Entry] = []

        async def lose_the_signal(entries: Any, runs: Any = (), **fence: Any) -> None:
            # The sender's records reach the disk; the target's signal does not
            # (the process dies between the two writes).
            for e in entries:
                if e.id == "l-1" and isinstance(decode(e.data), Signal):
                    dropped.append(e)
                    raise fusee.StoreError("simulated crash before the signal was written")
            await real(entries, runs, **fence)

        store.append = lose_the_signal  # type: ignore[method-assign]
        run = await t.start(sender, "s-1", "l-1")
        await t.settle()
        assert dropped
        store.append = real  # type: ignore[method-assign]
        await t.crash()
        assert await run.result() == "sent"
        assert await target.result() == 7
        await t.crash()
        assert await target.result() == 7
        signals = [
            rec
            for _, data in await t.engine.store.load("l-1")
            if isinstance(rec := decode(data), Signal)
        ]
        assert len(signals) == 1


@fusee.workflow("ship")
async def ship(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("pack", lambda: n * 2)


@fusee.workflow("spawner")
async def spawner(ctx: fusee.Ctx) -> str:
    await ctx.child(ship, "ship-1", 4, detached=True)
    return "spawned"


@fusee.workflow("idle_kid")
async def idle_kid(ctx: fusee.Ctx) -> None:
    await ctx.wait_for(fusee.signal("never", int))


async def test_a_second_start_of_a_child_being_started_returns_only_once_it_is_durable(
    host: Host,
) -> None:
    # Two starts of one child at once (a parent's outbox, and its command
    # posted from another worker): the second finds it loaded, and must not
    # answer before its start is durable, or a crash would lose a child that
    # nothing starts again.
    async with host(workflows=[idle_kid]) as t:
        engine = t.engine
        link = Parent("parent", 1, 0)
        rec = Child(1, 0, idle_kid.name, "the-kid", DETACHED, 0, _codec.encode(None))
        with HeldWrites(engine.store) as held:
            first = asyncio.ensure_future(engine.messages.start_child_of(link, rec))
            await held.waiting.wait()
            second = asyncio.ensure_future(engine.messages.start_child_of(link, rec))
            for _ in range(20):
                await asyncio.sleep(0)
            assert not first.done()
            assert not second.done()
            held.release()
            await asyncio.gather(first, second)
        row = await engine.store.get("the-kid")
        assert row is not None
        assert row.workflow == idle_kid.name


async def test_a_detached_child_starts_though_its_parent_ended_before_a_crash() -> None:
    got = await crash_everywhere(spawner, workflows=[ship])
    assert got == "spawned"


async def test_a_detached_child_of_an_ended_parent_runs_after_recovery(host: Host) -> None:
    async with host(workflows=[spawner, ship]) as t:
        assert await t.execute(spawner, "p-1") == "spawned"
        await t.crash()
        await t.settle()
        assert await t.get("ship-1").result() == 8


# --- the end of a run ------------------------------------------------------------------------


@fusee.workflow("quick")
async def quick(ctx: fusee.Ctx) -> str:
    return await ctx.step("one", lambda: "done")


async def test_a_signal_while_its_run_ends_raises_run_finished_and_nothing_follows_the_end(
    host: Host,
) -> None:
    async with host(workflows=[quick]) as t:
        run = await t.start(quick, "q-1")
        # The step runs once its gate is durable; its result ends the run, and
        # the end is appended before it is durable: a signal then is refused.
        refused: list[fusee.RunFinished] = []
        while not refused and (await run.describe()).status != "completed":
            try:
                await run.signal(go, 1)
            except fusee.RunFinished as e:
                refused.append(e)
            await asyncio.sleep(0)
        assert all("q-1" in str(e) for e in refused)
        await t.settle()
        records = [decode(data) for _, data in await t.engine.store.load("q-1")]
        assert isinstance(records[-1], Done)
        with pytest.raises(fusee.RunFinished):
            await run.signal(go, 1)
        await t.crash()
        assert await run.result() == "done"
        with pytest.raises(fusee.RunFinished, match="signal 'go' was not delivered"):
            await run.signal(go, 2)


async def test_a_store_holding_a_record_after_a_runs_end_still_reads(host: Host) -> None:
    async with host(workflows=[quick]) as t:
        assert await t.execute(quick, "q-1") == "done"
        store = t.engine.store
        row = await store.get("q-1")
        assert row is not None
        last = store.last_lsn
        # What an older engine wrote: a signal journaled after the run's end.
        await store.append(
            [Entry(last + 1, "q-1", row.run, encode(Signal(row.run, "go", 0, b"\x01")))]
        )
        await t.crash()
        assert await run_result(t, "q-1") == "done"
        assert (await t.get("q-1").describe()).status == "completed"


async def run_result(t: Any, id: str) -> Any:
    return await t.get(id).result()


@fusee.workflow("counter")
async def counter(ctx: fusee.Ctx, total: int) -> int:
    got = await ctx.wait_for(go)
    total += got or 0
    if total < 3:
        ctx.continue_as_new(total)
    return total


async def test_continue_as_new_carries_the_signals_its_run_did_not_consume(host: Host) -> None:
    async with host(workflows=[counter]) as t:
        run = await t.start(counter, "c-1", 0)
        # Three signals before the first wait takes one: two are carried over.
        for i in range(3):
            await run.signal(go, 1, dedup=f"s-{i}")
        assert await run.result() == 3
        info = await run.describe()
        assert info.run == 3
        await t.crash()
        assert await run.result() == 3


async def test_continue_as_new_carries_signals_across_a_crash_at_every_record() -> None:
    async def drive(t: Any, run: fusee.Run[int]) -> None:
        for i in range(3):
            try:
                await run.signal(go, 1, dedup=f"s-{i}")
            except fusee.RunFinished:
                return

    assert await crash_everywhere(counter, 0, drive=drive) == 3


@fusee.workflow("two-waits")
async def two_waits(ctx: fusee.Ctx) -> str:
    index, _ = await fusee.select(ctx.wait_for(go), ctx.wait_for(extra))
    return ["go", "extra"][index]


async def test_a_signal_whose_delivery_drops_another_wait_returns_cleanly(host: Host) -> None:
    async with host(workflows=[two_waits]) as t:
        run = await t.start(two_waits, "w-1")
        await run.signal(go, 1)
        assert await run.result() == "go"
        await t.crash()
        assert await run.result() == "go"


# --- updates and queries ---------------------------------------------------------------------


@fusee.workflow("tally")
async def tally(ctx: fusee.Ctx) -> int:
    total = [0]

    def add(n: int) -> int:
        if n == 13:
            raise KeyError("unlucky")
        total[0] += n
        return total[0]

    def check(n: int) -> None:
        if n < 0:
            raise ValueError("must not be negative")

    async def slow(n: int) -> int:
        await ctx.sleep("think", "1h")
        return n

    ctx.on_update(bump, add, validator=check)
    ctx.on_update(fusee.update("slow", int), slow)
    ctx.on_query(phase_q, lambda _: 1 / 0)
    await ctx.wait_for(go)
    return total[0]


async def test_an_update_id_is_applied_once_and_a_repeat_returns_the_first_result(
    host: Host,
) -> None:
    async with host(workflows=[tally]) as t:
        run = await t.start(tally, "t-1")
        assert await run.update(bump, 5, id="u-1") == 5
        assert await run.update(bump, 5, id="u-1") == 5
        assert await run.update(bump, 2, id="u-2") == 7
        await t.crash()
        assert await run.update(bump, 5, id="u-1") == 5
        await run.signal(go, 0)
        assert await run.result() == 7
        # Even once the run ended, a repeat answers what the first did.
        assert await run.update(bump, 5, id="u-2") == 7
        with pytest.raises(fusee.RunFinished):
            await run.update(bump, 5, id="u-3")


async def test_update_errors_come_from_the_tree(host: Host) -> None:
    async with host(workflows=[tally]) as t:
        run = await t.start(tally, "t-1")
        with pytest.raises(fusee.UpdateRejected, match="must not be negative"):
            await run.update(bump, -1)
        with pytest.raises(fusee.UpdateFailed, match="KeyError"):
            await run.update(bump, 13)
        with pytest.raises(fusee.UpdateRejected, match="UnknownUpdate"):
            await run.update(fusee.update("nope", int), 1)
        with pytest.raises(fusee.QueryFailed, match="ZeroDivisionError"):
            await run.query(phase_q)
        await t.crash()
        with pytest.raises(fusee.QueryFailed, match="ZeroDivisionError"):
            await run.query(phase_q)
        assert await run.update(bump, 1) == 1


async def test_an_update_whose_handler_is_cancelled_fails_instead_of_hanging(host: Host) -> None:
    async with host(workflows=[tally]) as t:
        run = await t.start(tally, "t-1")
        caller = asyncio.ensure_future(run.update(fusee.update("slow", int), 3))
        await t.settle()
        await run.cancel("stop")
        with pytest.raises(fusee.FuseeError):
            await asyncio.wait_for(caller, 10)


# --- cancellation ----------------------------------------------------------------------------


@fusee.workflow("asyncio-waiter")
async def asyncio_waiter(ctx: fusee.Ctx) -> str:
    event = asyncio.Event()
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    cond = asyncio.Condition()

    async def on_cond() -> None:
        async with cond:
            await cond.wait()

    try:
        await asyncio.gather(event.wait(), fut, on_cond())
    except asyncio.CancelledError:
        return await ctx.step("compensate", lambda: "compensated")
    return "never"


async def test_cancel_reaches_code_that_awaits_only_asyncio_objects(host: Host) -> None:
    async with host(workflows=[asyncio_waiter]) as t:
        run = await t.start(asyncio_waiter, "a-1")
        await t.settle()
        await run.cancel("stop")
        assert await run.result() == "compensated"
        await t.crash()
        assert await run.result() == "compensated"
        assert_steps_ran_once(t)


@fusee.workflow("careful")
async def careful(ctx: fusee.Ctx) -> list[str]:
    try:
        await ctx.wait_for(go)
        return ["done"]
    except fusee.Cancelled:
        first = await ctx.step("undo-1", lambda: "undo-1")
        await ctx.sleep("breathe", "1m")
        second = await ctx.step("undo-2", lambda: "undo-2")
        return [first, second]


async def test_a_second_cancel_is_a_no_op_and_compensation_runs_to_its_end(host: Host) -> None:
    async with host(workflows=[careful]) as t:
        run = await t.start(careful, "c-1")
        await run.cancel("first")
        await t.settle()
        await run.cancel("second")
        await t.advance("2m")
        assert await run.result() == ["undo-1", "undo-2"]
        await t.crash()
        assert await run.result() == ["undo-1", "undo-2"]
        assert_steps_ran_once(t)


async def test_messages_to_an_ended_run_raise_run_finished_and_record_nothing(host: Host) -> None:
    async with host(workflows=[quick]) as t:
        run = await t.start(quick, "q-1")
        assert await run.result() == "done"
        before = await t.engine.store.load("q-1")
        for send in (run.signal(go, 1), run.update(bump, 1), run.cancel("late")):
            with pytest.raises(fusee.RunFinished, match="has finished"):
                await send
        await t.settle()
        assert await t.engine.store.load("q-1") == before


# --- statuses and run numbers ----------------------------------------------------------------


async def test_a_waiting_run_shows_one_status_in_describe_list_and_its_row(host: Host) -> None:
    async with host(workflows=[listener], park_after="1h") as t:
        run = await t.start(listener, "l-1")
        await t.settle()
        assert (await run.describe()).status == fusee.RunStatus.SUSPENDED
        assert [i.id async for i in t.list(status="suspended")] == ["l-1"]
        row = await t.engine.store.get("l-1")
        assert row is not None
        assert row.status == "suspended"
        await t.crash()
        assert (await run.describe()).status == "suspended"
        await run.signal(go, 1)
        assert await run.result() == 1


@pytest.mark.expect_engine_errors("run 'v-1' stopped: determinism error")
async def test_a_diverged_run_shows_diverged_everywhere(host: Host) -> None:
    @fusee.workflow("versioned")
    async def old(ctx: fusee.Ctx) -> str:
        await ctx.step("a", lambda: 1)
        await ctx.sleep("nap", "1m")
        return "old"

    @fusee.workflow("versioned")
    async def new(ctx: fusee.Ctx) -> str:
        await ctx.step("b", lambda: 1)
        await ctx.sleep("nap", "1m")
        return "new"

    async with host(workflows=[old]) as t:
        await t.start(old, "v-1")
        await t.settle()
        store = t.store
        await t.crash()
    async with host(workflows=[new], store=store) as t2:
        run = t2.get("v-1")
        with pytest.raises(fusee.DeterminismError):
            await run.result()
        assert (await run.describe()).status == "diverged"
        assert [i.id async for i in t2.list(status="diverged")] == ["v-1"]
        await t2.settle()
        row = await t2.engine.store.get("v-1")
        assert row is not None
        assert row.status == "diverged"
    async with host(workflows=[old], store=store) as t3:
        # Compatible code deployed again: the run goes on.
        await t3.advance("2m")
        assert await t3.get("v-1").result() == "old"


@fusee.workflow("again")
async def again(ctx: fusee.Ctx, n: int) -> str:
    key: str = await ctx.step("key", lambda s: s.key)
    if n < 2:
        ctx.continue_as_new(n + 1)
    return key


async def test_run_numbers_count_the_runs_of_one_id(host: Host) -> None:
    async with host(workflows=[again]) as t:
        run = await t.start(again, "a-1", 0)
        assert await run.result() == "a-1/3/0"
        assert (await run.describe()).run == 3
        await t.start(again, "a-1", 2, id_policy=fusee.IdPolicy.REPLACE)
        assert await run.result() == "a-1/4/0"
        await t.crash()
        assert (await run.describe()).run == 4
        first = await t.start(again, "b-1", 2)
        assert await first.result() == "b-1/1/0"


# --- what the engine logs --------------------------------------------------------------------


async def test_a_run_that_ends_with_unconsumed_signals_logs_them(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    async with host(workflows=[listener]) as t:
        run = await t.start(listener, "l-1")
        await run.signal(extra, 1)
        with caplog.at_level(logging.WARNING, logger="fusee"):
            await run.signal(go, 2)
            assert await run.result() == 2
        assert "signals nobody waited for: extra" in caplog.text


@fusee.workflow("flaky")
async def flaky(ctx: fusee.Ctx) -> str:
    def boom() -> str:
        raise RuntimeError("card network down")

    return await ctx.step("charge", boom, retry=fusee.Retry(attempts=1))


async def test_a_run_that_pauses_logs_a_line_naming_the_step(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    async with host(workflows=[flaky]) as t:
        with caplog.at_level(logging.WARNING, logger="fusee"):
            run = await t.start(flaky, "f-1")
            await t.settle()
        assert (await run.describe()).status == "paused"
        assert "run 'f-1' paused: step 'charge'" in caplog.text


# --- children and cancellation ---------------------------------------------------------------


@fusee.workflow("sleepy-kid")
async def sleepy_kid(ctx: fusee.Ctx, n: int) -> int:
    await ctx.sleep("grow", "1h")
    return n


@fusee.workflow("family")
async def family(ctx: fusee.Ctx) -> str:
    await ctx.child(sleepy_kid, "free-kid", 1, detached=True)
    try:
        await ctx.child(sleepy_kid, "kept-kid", 2)
    except fusee.Cancelled:
        return "cancelled"
    return "grown"


async def test_cancelling_a_parent_cancels_its_attached_children_not_its_detached_ones(
    host: Host,
) -> None:
    async with host(workflows=[family, sleepy_kid]) as t:
        run = await t.start(family, "f-1")
        await t.settle()
        await run.cancel("stop")
        assert await run.result() == "cancelled"
        await t.settle()
        with pytest.raises(fusee.Cancelled, match="stopped waiting"):
            await t.get("kept-kid").result()
        await t.crash()
        await t.advance("2h")
        assert await t.get("free-kid").result() == 1
        with pytest.raises(fusee.Cancelled):
            await t.get("kept-kid").result()
        assert await run.result() == "cancelled"


@fusee.workflow("impatient")
async def impatient(ctx: fusee.Ctx) -> str:
    kid = asyncio.ensure_future(ctx.child(sleepy_kid, "never-kid", 3))
    kid.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await kid
    return await ctx.step("after", lambda: "went on")


async def test_a_child_cancelled_in_the_turn_it_was_made_never_starts(host: Host) -> None:
    async with host(workflows=[impatient, sleepy_kid]) as t:
        run = await t.start(impatient, "i-1")
        assert await run.result() == "went on"
        await t.settle()
        with pytest.raises(fusee.NotFound):
            await t.get("never-kid").describe()
        await t.crash()
        await t.settle()
        with pytest.raises(fusee.NotFound):
            await t.get("never-kid").describe()
