"""Tests of the test host: `fusee.testing.TestEngine` and `crash_everywhere`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.store import SqliteStore
from fusee.testing import TestEngine, crash_everywhere

# A bound on the test itself, never a wait: a deadlock fails here instead of
# at the suite's timeout.
DEADLOCK_S = 30


@pytest.fixture
def released() -> Iterator[threading.Event]:
    """An event a blocked step waits on; set at teardown so no thread outlives the test."""
    event = threading.Event()
    yield event
    event.set()


def _blocked_step_workflow(
    released: threading.Event, timeout: str | None
) -> fusee.WorkflowDef[None, str]:
    @fusee.workflow("blocked")
    async def blocked(ctx: fusee.Ctx) -> str:
        got = await ctx.step("wait", lambda: "done" if released.wait() else "", timeout=timeout)
        await ctx.sleep("after", "1m")
        return got

    return blocked


@pytest.mark.parametrize(
    "timeout", [pytest.param(None, id="no-timeout"), pytest.param("1h", id="timeout-1h")]
)
async def test_advance_moves_virtual_time_while_a_step_function_runs(
    released: threading.Event, timeout: str | None
) -> None:
    blocked = _blocked_step_workflow(released, timeout)
    async with TestEngine(workflows=[blocked], step_grace="50ms") as t:
        run = await t.start(blocked, "b-1")
        start = t.clock.now_ms()
        async with asyncio.timeout(DEADLOCK_S):
            await t.advance("2h")
        assert t.clock.now_ms() - start == 2 * 3_600_000
        assert (await run.describe()).status == fusee.RunStatus.RUNNING
        released.set()
        # The step's late result still reaches the run, and its sleep follows.
        assert await run.result() == "done"


async def test_settle_returns_while_a_step_function_runs_and_its_result_comes_later(
    released: threading.Event,
) -> None:
    blocked = _blocked_step_workflow(released, None)
    async with TestEngine(workflows=[blocked], step_grace="50ms") as t:
        run = await t.start(blocked, "b-1")
        async with asyncio.timeout(DEADLOCK_S):
            await t.settle()
        assert t.engine.hooks.busy_steps == 1
        released.set()
        while t.engine.hooks.busy_steps:
            await t.settle()
        await t.advance("1m")
        assert (await run.describe()).status == fusee.RunStatus.COMPLETED
        assert await run.result() == "done"


async def test_settle_waits_for_a_quick_step_function_in_a_thread() -> None:
    @fusee.workflow("quick")
    async def quick(ctx: fusee.Ctx) -> int:
        a = await ctx.step("a", lambda: 1)
        await ctx.sleep("nap", "1s")
        return a + await ctx.step("b", lambda: 1)

    async with TestEngine(workflows=[quick]) as t:
        run = await t.start(quick, "q-1")
        await t.advance("1s")
        assert (await run.describe()).status == fusee.RunStatus.COMPLETED
        assert await run.result() == 2


async def test_advance_waits_for_the_store_read_of_a_signal_sent_from_the_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, released: threading.Event
) -> None:
    # On SQLite a read takes real time on the store's thread: a signal the
    # test sends to a parked run loads it from there, in no engine task, and
    # the virtual clock must not run on (nor advance return) without it.
    poke = fusee.signal("poke", int)

    @fusee.workflow("parked")
    async def parked(ctx: fusee.Ctx) -> int | None:
        return await ctx.wait_for(poke)

    read = SqliteStore._run_read

    def held_read(self: SqliteStore, fn: Any) -> Any:
        released.wait(DEADLOCK_S)
        return read(self, fn)

    async with TestEngine(workflows=[parked], store=SqliteStore(tmp_path)) as t:
        await t.start(parked, "p-1")
        await t.settle()
        await t.crash()  # reopened, the parked run stays in its journal
        before = t.clock.now_ms()
        monkeypatch.setattr(SqliteStore, "_run_read", held_read)
        sent = asyncio.ensure_future(t.get("p-1").signal(poke, 7))
        advancing = asyncio.ensure_future(t.advance("1s"))
        for _ in range(200):  # far more turns than an advance with nothing to wait for takes
            await asyncio.sleep(0)
        # Released before asserting, so a failure does not hold the store's close.
        returned, now = advancing.done(), t.clock.now_ms()
        released.set()
        assert not returned
        assert now == before
        async with asyncio.timeout(DEADLOCK_S):
            await advancing
        assert sent.done()
        assert (await t.get("p-1").describe()).status == fusee.RunStatus.COMPLETED
        assert await t.get("p-1").result() == 7


async def _charge_helper(c: fusee.Ctx) -> str:
    return await c.step("charge", lambda: "ch_live")


@fusee.workflow("checkout")
async def checkout(ctx: fusee.Ctx) -> str:
    quote = await ctx.step("quote", lambda: 10)
    charged = await _charge_helper(ctx)
    return f"{quote}:{charged}"


async def test_mock_step_takes_the_workflow_def_and_replaces_the_step() -> None:
    async with TestEngine(workflows=[checkout]) as t:
        t.mock_step(checkout, "charge", lambda: "ch_test")
        assert await t.execute(checkout, "c-1") == "10:ch_test"


async def test_mock_step_takes_the_workflow_name_too() -> None:
    async with TestEngine(workflows=[checkout]) as t:
        t.mock_step("checkout", "quote", lambda: 20)
        assert await t.execute(checkout, "c-1") == "20:ch_live"


def test_mock_step_of_an_unknown_workflow_raises_unknown_workflow() -> None:
    t = TestEngine(workflows=[checkout])
    with pytest.raises(fusee.UnknownWorkflow, match="'chekout' is not one of"):
        t.mock_step("chekout", "charge", lambda: "ch_test")


@pytest.mark.parametrize(
    "step", [pytest.param("charg", id="typo"), pytest.param("refund", id="absent")]
)
def test_mock_step_of_an_unknown_step_raises_naming_the_known_steps(step: str) -> None:
    t = TestEngine(workflows=[checkout])
    with pytest.raises(ValueError, match="its steps are 'charge', 'quote'"):
        t.mock_step(checkout, step, lambda: "ch_test")


def test_mock_step_accepts_any_name_when_step_names_are_computed() -> None:
    @fusee.workflow("computed")
    async def computed(ctx: fusee.Ctx, n: int) -> list[int]:
        return [await ctx.step(f"part-{i}", lambda: 1) for i in range(n)]

    t = TestEngine(workflows=[computed])
    t.mock_step(computed, "part-3", lambda: 2)


def test_mock_step_accepts_any_name_when_ctx_goes_where_code_cannot_be_followed() -> None:
    helpers = {"charge": _charge_helper}

    @fusee.workflow("opaque")
    async def opaque(ctx: fusee.Ctx) -> str:
        return await helpers["charge"](ctx)

    t = TestEngine(workflows=[opaque])
    t.mock_step(opaque, "charge", lambda: "ch_test")


class _OnWatchdogReport(logging.Handler):
    """Sets ``event`` when the watchdog reports (it logs each report from its thread)."""

    def __init__(self, event: threading.Event) -> None:
        super().__init__(logging.WARNING)
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if "without yielding" in record.getMessage():
            self.event.set()


@pytest.fixture
def watchdog_reported() -> Iterator[threading.Event]:
    event = threading.Event()
    handler = _OnWatchdogReport(event)
    logger = logging.getLogger("fusee")
    logger.addHandler(handler)
    yield event
    logger.removeHandler(handler)
    event.set()


async def test_a_workflow_that_blocks_fails_its_result_with_watchdog_error_naming_the_stack(
    watchdog_reported: threading.Event,
) -> None:
    @fusee.workflow("blocking")
    async def blocking(ctx: fusee.Ctx) -> str:
        # Blocks the loop until the watchdog has seen it (a bound, not a wait).
        watchdog_reported.wait(DEADLOCK_S)
        return "late"

    async with TestEngine(workflows=[blocking], watchdog="100ms") as t:
        with pytest.raises(
            fusee.WatchdogError, match=r"run 'w-1' has run .* without yielding"
        ) as e:
            await t.execute(blocking, "w-1")
        assert "in blocking" in str(e.value)  # the stack names the workflow function
        assert watchdog_reported.is_set()
        # Reported once; the run failed with it, interrupted by the watchdog.
        with pytest.raises(fusee.WorkflowFailed) as failed:
            await t.get("w-1").result()
        assert failed.value.type == "WatchdogError"


async def test_a_workflow_that_blocks_fails_advance_with_watchdog_error(
    watchdog_reported: threading.Event,
) -> None:
    @fusee.workflow("blocking-later")
    async def blocking_later(ctx: fusee.Ctx) -> None:
        await ctx.sleep("nap", "1h")
        watchdog_reported.wait(DEADLOCK_S)

    async with TestEngine(workflows=[blocking_later], watchdog="100ms") as t:
        await t.start(blocking_later, "w-1")
        with pytest.raises(fusee.WatchdogError, match="in blocking_later"):
            await t.advance("1h")


@pytest.mark.parametrize(
    ("watchdog", "limit_s"),
    [
        pytest.param(None, None, id="off"),
        pytest.param("5s", 5.0, id="5s"),
    ],
)
async def test_the_watchdog_limit_of_a_test_engine_is_configurable(
    watchdog: str | None, limit_s: float | None
) -> None:
    async with TestEngine(watchdog=watchdog) as t:
        assert t.engine.watchdog_s == limit_s


async def test_the_watchdog_of_a_test_engine_is_on_with_a_2s_limit() -> None:
    async with TestEngine() as t:
        assert t.engine.watchdog_s == 2.0


go = fusee.signal("go", bool)


async def test_crash_everywhere_crashes_a_run_that_ends_cancelled() -> None:
    released: list[str] = []

    @fusee.workflow("cancellable")
    async def cancellable(ctx: fusee.Ctx) -> str:
        await ctx.step("reserve", lambda: "r-1")
        try:
            await ctx.wait_for(go)
        except fusee.Cancelled:
            await ctx.step("release", lambda: released.append("r-1"))
            raise
        return "went"

    async def drive(t: TestEngine, run: fusee.Run[str]) -> None:
        await t.settle()  # the run waits for the signal
        with contextlib.suppress(fusee.RunFinished):
            await run.cancel("stop")

    with pytest.raises(fusee.Cancelled):
        await crash_everywhere(cancellable, drive=drive)
    # One pass without a crash, and one per record but the last: each cancelled.
    assert len(released) > 2


async def test_crash_everywhere_keeps_its_simulated_crashes_out_of_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @fusee.workflow("two")
    async def two(ctx: fusee.Ctx) -> int:
        a = await ctx.step("a", lambda: 1)
        return a + await ctx.step("b", lambda: 1)

    with caplog.at_level(logging.DEBUG, logger="fusee"):
        assert await crash_everywhere(two) == 2
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


@pytest.mark.expect_engine_errors("a real failure")
async def test_crash_everywhere_still_logs_what_is_not_its_simulated_crash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @fusee.workflow("logs")
    async def logs(ctx: fusee.Ctx) -> int:
        return await ctx.step("a", lambda: 1)

    def noisy() -> int:
        logging.getLogger("fusee").error("a real failure")
        return 1

    with caplog.at_level(logging.ERROR, logger="fusee"):
        await crash_everywhere(logs, mocks={("logs", "a"): noisy})
    assert "a real failure" in [r.getMessage() for r in caplog.records]


class _Gateway:
    """A payment gateway that refuses every charge until it is fixed."""

    def __init__(self) -> None:
        self.up = False
        self.calls = 0

    def charge(self) -> str:
        self.calls += 1
        if not self.up:
            raise ConnectionError("gateway down")
        return "ch_1"


def _checkout(gateway: _Gateway) -> fusee.WorkflowDef[None, str]:
    @fusee.workflow("checkout")
    async def checkout(ctx: fusee.Ctx) -> str:
        await ctx.sleep("cool-off", "1h")
        return await ctx.step("charge", gateway.charge, retry=fusee.Retry(attempts=3, initial="1s"))

    return checkout


async def test_execute_of_a_run_that_pauses_raises_run_paused_naming_step_attempts_and_error() -> (
    None
):
    gateway = _Gateway()
    wf = _checkout(gateway)
    async with TestEngine(workflows=[wf]) as t:
        with pytest.raises(fusee.RunPaused) as caught:
            await asyncio.wait_for(t.execute(wf, "c-1"), DEADLOCK_S)
        e = caught.value
        assert (e.id, e.step, e.attempts, e.error) == (
            "c-1",
            "charge",
            3,
            "ConnectionError: gateway down",
        )
        assert "run.resume()" in str(e)
        assert 'on_pause="wait"' in str(e)
        assert (await t.get("c-1").describe()).status == "paused"
        # From its journal, loaded again: still paused, and said so again.
        await t.crash()
        with pytest.raises(fusee.RunPaused, match="step 'charge' failed 3 attempt"):
            await asyncio.wait_for(t.get("c-1").result(), DEADLOCK_S)
        assert gateway.calls == 3
        # Resumed with the cause fixed, the same handle gives the result.
        gateway.up = True
        await t.get("c-1").resume()
        assert await asyncio.wait_for(t.get("c-1").result(), DEADLOCK_S) == "ch_1"
        assert gateway.calls == 4


async def test_a_run_paused_again_after_a_resume_names_its_attempts_since_the_start() -> None:
    gateway = _Gateway()
    wf = _checkout(gateway)
    async with TestEngine(workflows=[wf]) as t:
        run = await t.start(wf, "c-1")
        with pytest.raises(fusee.RunPaused):
            await asyncio.wait_for(run.result(), DEADLOCK_S)
        await run.resume()
        with pytest.raises(fusee.RunPaused) as caught:
            await asyncio.wait_for(run.result(), DEADLOCK_S)
        assert (caught.value.step, caught.value.attempts) == ("charge", 6)


async def test_a_paused_step_raced_against_a_timer_lets_the_timer_decide() -> None:
    gateway = _Gateway()

    @fusee.workflow("patient")
    async def patient(ctx: fusee.Ctx) -> str:
        which, _ = await fusee.select(
            ctx.step("charge", gateway.charge, retry=fusee.Retry(attempts=2, initial="1s")),
            ctx.sleep("give-up", "1d"),
        )
        return "charged" if which == 0 else "gave up"

    async with TestEngine(workflows=[patient]) as t:
        assert await asyncio.wait_for(t.execute(patient, "p-1"), DEADLOCK_S) == "gave up"
        assert gateway.calls == 2
        await t.crash()
        assert await t.get("p-1").result() == "gave up"
        assert gateway.calls == 2


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda wf, _: TestEngine(workflows=[wf], on_pause="wait"), id="test-engine"),
        pytest.param(
            lambda wf, fusee_engine: fusee_engine(workflows=[wf], on_pause="wait"),
            id="pytest-fixture",
        ),
    ],
)
async def test_on_pause_wait_makes_result_wait_for_the_resume(make: Any, fusee_engine: Any) -> None:
    gateway = _Gateway()
    wf = _checkout(gateway)
    async with make(wf, fusee_engine) as t:
        run = await t.start(wf, "c-1")
        result = asyncio.ensure_future(run.result())
        await t.advance("2h")
        assert (await run.describe()).status == "paused"
        assert not result.done()
        gateway.up = True
        await run.resume()
        assert await asyncio.wait_for(result, DEADLOCK_S) == "ch_1"
        await t.crash()
        assert await run.result() == "ch_1"
        assert gateway.calls == 4


def test_on_pause_takes_raise_or_wait() -> None:
    with pytest.raises(ValueError, match='on_pause must be "raise" or "wait", not \'hang\''):
        TestEngine(on_pause="hang")  # type: ignore[arg-type]


async def test_crash_everywhere_fails_naming_the_crash_and_the_runs_left_waiting() -> None:
    # A message nobody sends stands for one a crash lost: the harness reports
    # it within its bound of virtual time, never hangs on it.
    never = fusee.signal("never", int)

    @fusee.workflow("forgotten")
    async def forgotten(ctx: fusee.Ctx) -> int:
        await ctx.step("a", lambda: 1)
        return await ctx.wait_for(never) or 0

    with pytest.raises(AssertionError, match=r"without a crash: .*'forgotten-1' \(suspended"):
        await crash_everywhere(forgotten, id="forgotten-1", within="1h")


async def test_crash_everywhere_fails_a_run_that_outlasts_its_bound() -> None:
    @fusee.workflow("slow")
    async def slow(ctx: fusee.Ctx) -> int:
        await ctx.sleep("nap", "2h")
        return 1

    with pytest.raises(AssertionError, match="did not end"):
        await crash_everywhere(slow, within="1h")
    assert await crash_everywhere(slow, within="3h") == 1
