"""``ctx.logger`` (fusee/_logger.py): each line logs once per run, with the run's fields."""

from __future__ import annotations

import logging

import pytest

import fusee
from fusee.testing import TestEngine

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", int)


@fusee.workflow("logged")
async def logged(ctx: fusee.Ctx, n: int) -> int:
    ctx.logger.info("begin %d", n)
    a = await ctx.step("a", lambda: n)
    ctx.logger.warning("after a")
    got = await ctx.wait_for(go)
    assert got is not None
    ctx.logger.info("got %d", got)

    def b(s: fusee.StepCtx) -> int:
        ctx.logger.info("inside b")
        return a + got

    total = await ctx.step("b", b)
    ctx.logger.info("done")
    return total


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fusee.workflow.logged"]


async def test_each_line_logs_once_across_crashes_and_replays(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="fusee.workflow")
    async with TestEngine([logged]) as t:
        run = await t.start(logged, "l-1", 2)
        await t.settle()
        await t.crash()  # replays begin, a, "after a"
        await t.settle()
        await run.signal(go, 3)
        assert await run.result() == 5
        await t.crash()  # the finished run is not replayed into the log either
        assert await run.result() == 5
    assert _messages(caplog) == [
        "[l-1 logged] begin 2",
        "[l-1 logged] after a",
        "[l-1 logged] got 3",
        "[l-1 logged b#1] inside b",
        "[l-1 logged] done",
    ]


async def test_records_carry_the_run_and_step_as_extra_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="fusee.workflow")
    async with TestEngine([logged]) as t:
        run = await t.start(logged, "l-2", 1)
        await run.signal(go, 1)
        await run.result()
    records = [r for r in caplog.records if r.name == "fusee.workflow.logged"]
    names = ("fusee_id", "fusee_run", "fusee_workflow", "fusee_step", "fusee_attempt", "levelname")
    fields = [tuple(vars(r)[name] for name in names) for r in records]
    assert fields[1] == ("l-2", 1, "logged", None, None, "WARNING")
    assert fields[3] == ("l-2", 1, "logged", "b", 1, "INFO")
    # The caller is the workflow's line, not the adapter's.
    assert {r.filename for r in records} == {"test_logger.py"}


async def test_a_level_the_logger_does_not_take_is_not_logged_and_extra_is_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @fusee.workflow("levels")
    async def levels(ctx: fusee.Ctx) -> None:
        ctx.logger.debug("hidden")
        ctx.logger.info("shown", extra={"order": "o-1"})

    caplog.set_level(logging.INFO, logger="fusee.workflow")
    async with TestEngine([levels]) as t:
        await t.execute(levels, "v-1")
    records = [r for r in caplog.records if r.name == "fusee.workflow.levels"]
    assert [r.getMessage() for r in records] == ["[v-1 levels] shown"]
    assert vars(records[0])["order"] == "o-1"
    assert vars(records[0])["fusee_id"] == "v-1"
