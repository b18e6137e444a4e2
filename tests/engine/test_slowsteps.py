"""Steps that run far past their expected time with no heartbeat are reported with their stack.

Sync steps by their worker thread's stack, async ones by their task's, on the
engine's (virtual) clock; inline steps that block the loop by the watchdog.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator

import pytest

import fusee
from fusee.engine._slowsteps import SLOW_STEP_S, slow_step_default_s
from fusee.testing import TestEngine

pytestmark = pytest.mark.asyncio

# A bound on a blocked thread's wait, never reached in a passing test.
DEADLOCK_S = 20.0

_ONCE = fusee.Retry(attempts=1, on_exhausted="fail")


class _OnReport(logging.Handler):
    """Sets ``event`` when a WARNING with ``text`` is logged (from any thread)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.WARNING)
        self.text = text
        self.event = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.text in message:
            self.messages.append(message)
            self.event.set()


@pytest.fixture
def slow_reports() -> Iterator[_OnReport]:
    handler = _OnReport("with no heartbeat, past the")
    logger = logging.getLogger("fusee")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def _wait_for_release(release: threading.Event) -> str:
    release.wait(DEADLOCK_S)
    return "done"


async def test_a_sync_step_past_its_expected_time_is_reported_once_with_its_threads_stack(
    slow_reports: _OnReport,
) -> None:
    release = threading.Event()

    @fusee.workflow("slow-sync")
    async def slow_sync(ctx: fusee.Ctx) -> str:
        return await ctx.step("crunch", lambda: _wait_for_release(release))

    async with TestEngine(workflows=[slow_sync], step_grace="10ms") as t:
        run = await t.start(slow_sync, "s-1")
        t.engine.steps.slow_step_s = 30.0
        await t.advance("20s")
        assert slow_reports.messages == []
        await t.advance("20s")
        await t.advance("2m")
        release.set()
        assert await run.result() == "done"
    (message,) = slow_reports.messages  # once per attempt
    assert "step 'crunch' of run 's-1' (attempt 1)" in message
    assert "worker thread" in message
    assert "in _wait_for_release" in message  # the thread's stack


async def test_an_async_step_past_its_heartbeat_timeout_is_reported_with_its_tasks_stack(
    slow_reports: _OnReport,
) -> None:
    @fusee.workflow("slow-async")
    async def slow_async(ctx: fusee.Ctx) -> str:
        async def stuck(s: fusee.StepCtx) -> str:
            await asyncio.Event().wait()
            return "never"

        try:
            return await ctx.step("stuck", stuck, heartbeat_timeout="10s", retry=_ONCE)
        except fusee.StepFailed:
            return "timed out"

    async with TestEngine(workflows=[slow_async]) as t:
        # The heartbeat timeout fails the attempt; a step whose code ignores
        # the cancel would run on, and the report says where it waits.
        t.engine.steps.slow_step_s = 3600.0
        run = await t.start(slow_async, "a-1")
        await t.advance("15s")
        assert await run.result() == "timed out"
    (message,) = slow_reports.messages
    assert "past the 10s expected" in message
    assert "its task" in message
    assert "in stuck" in message


async def test_a_step_that_heartbeats_is_not_reported(slow_reports: _OnReport) -> None:
    beats = asyncio.Event()

    @fusee.workflow("beating")
    async def beating(ctx: fusee.Ctx) -> int:
        async def work(s: fusee.StepCtx) -> int:
            for i in range(6):
                s.heartbeat(i)
                beats.set()
                await asyncio.sleep(0)
            await asyncio.Event().wait()
            return 0

        return await ctx.step("work", work, timeout="1h")

    async with TestEngine(workflows=[beating]) as t:
        t.engine.steps.slow_step_s = 30.0
        await t.start(beating, "b-1")
        await beats.wait()
        await t.advance("20m")
        # Its limit is its timeout (1h): 20 minutes is within it.
        assert slow_reports.messages == []


async def test_an_inline_step_that_blocks_the_loop_is_reported_like_blocking_workflow_code() -> (
    None
):
    handler = _OnReport("has blocked the loop")
    logger = logging.getLogger("fusee")
    logger.addHandler(handler)

    def blocking() -> str:
        # Blocks the loop until the watchdog has seen it (a bound, not a wait).
        handler.event.wait(DEADLOCK_S)
        return "late"

    @fusee.workflow("inline-block")
    async def inline_block(ctx: fusee.Ctx) -> str:
        return await ctx.step("hog", blocking, inline=True)

    try:
        async with TestEngine(workflows=[inline_block], watchdog="100ms") as t:
            with pytest.raises(fusee.WatchdogError, match=r"inline step 'hog' of run 'i-1'") as e:
                await t.execute(inline_block, "i-1")
            assert "in blocking" in str(e.value)  # the loop's stack names the step
            assert await t.get("i-1").result() == "late"
    finally:
        logger.removeHandler(handler)
        handler.event.set()


async def test_the_default_expected_time_is_a_minute_or_fusee_slow_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FUSEE_SLOW_STEP", raising=False)
    assert slow_step_default_s() == SLOW_STEP_S == 60.0
    monkeypatch.setenv("FUSEE_SLOW_STEP", "5m")
    assert slow_step_default_s() == 300.0
