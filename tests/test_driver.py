"""The driver: one delivery at a time, replay after crashes, determinism errors."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

import fusee
from fusee import _codec
from fusee._driver import RunDriver
from fusee._runtime import StepCall
from fusee.errors import DeterminismError
from fusee.record import Done, Record, Start, Status, Step
from fusee.testing import TestEngine

review = fusee.signal("review", bool)


class FakeHost:
    """A host that records what the driver asks for and runs nothing by itself."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.calls: list[StepCall] = []
        self.errors: list[DeterminismError] = []

    def now_ms(self) -> int:
        return 1_000

    def append(self, driver: RunDriver, record: Record) -> int:
        self.records.append(record)
        return len(self.records)

    def append_step(
        self, driver: RunDriver, seq: int, name: str, attempt: int, status: Status, payload: bytes
    ) -> int:
        return self.append(driver, Step(driver.run, seq, name, attempt, status, payload))

    def run_step(self, driver: RunDriver, call: StepCall) -> None:
        self.calls.append(call)

    def stuck(self, driver: RunDriver, error: DeterminismError) -> None:
        self.errors.append(error)

    def turned(self, driver: RunDriver) -> None:
        return None

    def child_dropped(self, driver: RunDriver, seq: int, child: str) -> None:
        return None


@fusee.workflow("fan")
async def fan(ctx: fusee.Ctx, n: int) -> list[int]:
    order: list[int] = []

    async def one(i: int) -> None:
        order.append(await ctx.step("s", lambda: i))

    await asyncio.gather(*(one(i) for i in range(n)))
    return order


def _payload(seq: int) -> bytes:
    return _codec.encode(seq * 10)


def _run(journal: list[Record], perm: list[int]) -> tuple[FakeHost, RunDriver]:
    """Replays ``journal``, then completes the steps still to run in ``perm``'s order."""
    host = FakeHost()
    host.records = list(journal)
    driver = RunDriver(host, fan, list(journal), len(journal))
    driver.start()
    pending = {c.seq for c in host.calls}
    for seq in perm:
        if seq in pending:
            driver.step_done(seq, Status.OK, _payload(seq))
    return host, driver


def test_a_thousand_gathered_steps_keep_their_interleaving_after_a_crash_anywhere() -> None:
    n = 1_000
    perm = list(range(n))
    random.Random(7).shuffle(perm)
    start = Start(run=1, id="fan-1", wtype="fan", input=_codec.encode(n))
    live, driver = _run([start], perm)
    assert driver.end is not None
    expected = _codec.decode(driver.end.payload)
    assert expected == [seq * 10 for seq in perm]
    journal = live.records
    assert isinstance(journal[-1], Done)
    # Each crash replays the whole fan, and all 2,000 positions together take
    # a minute: every position near the ends (where the gather starts and
    # ends), and one in 13 between.
    edge = 64
    crashes = {*range(1, edge), *range(edge, len(journal) - edge, 13)}
    crashes |= set(range(len(journal) - edge, len(journal)))
    for k in sorted(crashes):
        prefix = journal[:k]
        host, replayed = _run(prefix, perm)
        assert replayed.end is not None, f"crash after record {k}: the run did not end"
        assert _codec.decode(replayed.end.payload) == expected, f"crash after record {k}"
        durable = {r.seq for r in prefix if isinstance(r, Step)}
        assert not durable & {c.seq for c in host.calls}, f"crash after record {k}: ran again"
        # Replayed records are not appended again: the journal only grows.
        assert host.records[:k] == prefix
        assert host.records == journal


# --- determinism errors ---------------------------------------------------------------


async def _diverge(
    old: Callable[[fusee.Ctx], Coroutine[Any, Any, Any]],
    new: Callable[[fusee.Ctx], Coroutine[Any, Any, Any]],
) -> DeterminismError:
    """Runs ``old`` until it sleeps, then recovers the run under ``new``'s code."""
    old_wf = fusee.workflow("wf")(old)
    new_wf = fusee.workflow("wf")(new)
    async with TestEngine(workflows=[old_wf]) as t:
        await t.start(old_wf, "d-1")
        await t.settle()
        store = t.store
    async with TestEngine(workflows=[new_wf], store=store) as t2:
        with pytest.raises(DeterminismError) as e:
            await t2.get("d-1").result()
        desc = await t2.get("d-1").describe()
        assert desc.error == str(e.value)
    return e.value


def _line_of(fn: Callable[..., Any], text: str) -> str:
    import inspect

    lines, first = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if text in line:
            return f"{inspect.getsourcefile(fn)}:{first + i}"
    raise AssertionError(f"{text!r} not in {fn.__name__}")


# Strict replay logs each divergence it stops, as an operator must see it.
@pytest.mark.expect_engine_errors("run 'd-1' stopped: determinism error")
async def test_a_renamed_step_names_both_names_and_the_line() -> None:
    async def old(ctx: fusee.Ctx) -> None:
        await ctx.step("a", lambda: 1)
        await ctx.step("charge", lambda: 2)
        await ctx.sleep("hold", "1d")

    async def new(ctx: fusee.Ctx) -> None:
        await ctx.step("a", lambda: 1)
        await ctx.step("charge-card", lambda: 2)
        await ctx.sleep("hold", "1d")

    e = await _diverge(old, new)
    assert e.seq == 1
    assert "the journal recorded step 'charge' here but the code called step 'charge-card'" in str(
        e
    )
    assert e.location == _line_of(new, '"charge-card"')


@pytest.mark.expect_engine_errors("run 'd-1' stopped: determinism error")
async def test_reordered_steps_are_caught_at_the_first_difference() -> None:
    async def old(ctx: fusee.Ctx) -> None:
        await ctx.step("a", lambda: 1)
        await ctx.step("b", lambda: 2)
        await ctx.sleep("hold", "1d")

    async def new(ctx: fusee.Ctx) -> None:
        await ctx.step("b", lambda: 2)
        await ctx.step("a", lambda: 1)
        await ctx.sleep("hold", "1d")

    e = await _diverge(old, new)
    assert e.seq == 0
    assert "recorded step 'a' here but the code called step 'b'" in e.message
    assert e.location == _line_of(new, '"b"')


@pytest.mark.expect_engine_errors("run 'd-1' stopped: determinism error")
async def test_an_added_step_is_caught() -> None:
    async def old(ctx: fusee.Ctx) -> None:
        await ctx.step("a", lambda: 1)
        await ctx.sleep("hold", "1d")

    async def new(ctx: fusee.Ctx) -> None:
        await ctx.step("a", lambda: 1)
        await ctx.step("audit", lambda: 1)
        await ctx.sleep("hold", "1d")

    e = await _diverge(old, new)
    assert (e.seq, e.location) == (1, _line_of(new, '"audit"'))
    assert "recorded sleep 'hold' here but the code called step 'audit'" in e.message


@pytest.mark.expect_engine_errors("run 'd-1' stopped: determinism error")
async def test_a_removed_step_is_caught() -> None:
    async def old(ctx: fusee.Ctx) -> None:
        await ctx.step("a", lambda: 1)
        await ctx.step("b", lambda: 1)
        await ctx.sleep("hold", "1d")

    async def new(ctx: fusee.Ctx) -> None:
        await ctx.step("a", lambda: 1)
        await ctx.sleep("hold", "1d")

    e = await _diverge(old, new)
    assert (e.seq, e.location) == (1, _line_of(new, '"hold"'))
    assert "recorded step 'b' here but the code called sleep 'hold'" in e.message


@pytest.mark.expect_engine_errors("run 'd-1' stopped: determinism error")
async def test_a_wait_replaced_by_a_sleep_is_caught() -> None:
    async def old(ctx: fusee.Ctx) -> None:
        await ctx.wait_for(review)

    async def new(ctx: fusee.Ctx) -> None:
        await ctx.sleep("nap", "1h")

    e = await _diverge(old, new)
    assert (e.seq, e.location) == (0, _line_of(new, '"nap"'))
    assert "recorded wait 'review' here but the code called sleep 'nap'" in e.message


@pytest.mark.expect_engine_errors("run 'd-1' stopped: determinism error")
async def test_a_changed_value_kind_is_caught() -> None:
    async def old(ctx: fusee.Ctx) -> None:
        ctx.random()
        await ctx.sleep("hold", "1d")

    async def new(ctx: fusee.Ctx) -> None:
        ctx.now()
        await ctx.sleep("hold", "1d")

    e = await _diverge(old, new)
    assert (e.seq, e.location) == (0, _line_of(new, "ctx.now()"))
    assert "recorded value kind 2 here but the code asked for kind 1" in e.message


@pytest.mark.expect_engine_errors("run 'd-1' stopped: determinism error")
async def test_code_that_returns_while_its_journal_delivers_is_caught() -> None:
    async def old(ctx: fusee.Ctx) -> None:
        await ctx.step("a", lambda: 1)
        await ctx.step("b", lambda: 1)
        await ctx.sleep("hold", "1d")

    async def new(ctx: fusee.Ctx) -> None:
        await ctx.step("a", lambda: 1)

    e = await _diverge(old, new)
    assert "the workflow returned but its journal holds 1 more deliveries" in e.message
    assert e.location is not None
    assert e.location.endswith(f":{new.__code__.co_firstlineno}")


@pytest.mark.expect_engine_errors("run 'd-1' stopped: determinism error")
async def test_code_waiting_on_something_the_journal_never_started_is_a_stall() -> None:
    async def old(ctx: fusee.Ctx) -> None:
        await ctx.step("a", lambda: 1)
        await ctx.step("b", lambda: 1)
        await ctx.sleep("hold", "1d")

    async def new(ctx: fusee.Ctx) -> None:
        await ctx.step("a", lambda: 1)
        await asyncio.Event().wait()

    e = await _diverge(old, new)
    assert e.seq == 1
    assert (
        "the journal delivers step 'b' next, but the code is waiting without having started it"
        in e.message
    )
    assert e.location == _line_of(new, "asyncio.Event().wait()")


@pytest.mark.expect_engine_errors("run 'd-1' stopped: determinism error")
async def test_a_diverged_run_changes_nothing_recorded() -> None:
    async def old(ctx: fusee.Ctx) -> str:
        await ctx.step("a", lambda: 1)
        await ctx.sleep("hold", "1h")
        return "done"

    async def new(ctx: fusee.Ctx) -> str:
        await ctx.step("z", lambda: 1)
        await ctx.sleep("hold", "1h")
        return "done"

    old_wf = fusee.workflow("wf")(old)
    new_wf = fusee.workflow("wf")(new)
    async with TestEngine(workflows=[old_wf]) as t:
        await t.start(old_wf, "d-1")
        await t.settle()
        store = t.store
    await store.open()
    before = await store.load("d-1")
    async with TestEngine(workflows=[new_wf], store=store) as t2:
        with pytest.raises(DeterminismError):
            await t2.get("d-1").result()
        await t2.advance("2h")
    await store.open()
    assert await store.load("d-1") == before
    # The old code, deployed again, finishes the run.
    async with TestEngine(workflows=[old_wf], store=store) as t3:
        assert await t3.get("d-1").result() == "done"


# --- the watchdog --------------------------------------------------------------------


@fusee.workflow("spin")
async def spin(ctx: fusee.Ctx) -> str:
    # Workflow code that never yields, the thing the watchdog reports.
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        pass
    return "done"


async def test_the_watchdog_reports_code_that_does_not_yield_with_its_stack() -> None:
    async with await fusee.Engine.open("memory", workflows=[spin], watchdog="100ms") as engine:
        # Interrupted, too: the run fails with the report.
        with pytest.raises(fusee.WorkflowFailed) as failed:
            await engine.execute(spin, "spin-1")
        assert failed.value.type == "WatchdogError"
        # The watchdog's thread writes the report while the code spins, in
        # the GIL slices the spinning thread leaves it: it may still be
        # formatting the stack when the run ends.
        deadline = time.monotonic() + 10
        while not engine.hooks.watchdog_reports and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert engine.hooks.watchdog_reports
        report = engine.hooks.watchdog_reports[0]
        assert "run 'spin-1' has run" in report
        assert "blocking work belongs in a step" in report
        assert "test_driver.py" in report
