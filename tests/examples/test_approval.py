"""examples/approval.py: a signal or the deadline decides, whatever the crash."""

from __future__ import annotations

from pathlib import Path

import pytest
from example_runner import run_example

import fusee
from examples import approval
from fusee.testing import TestEngine, crash_everywhere

REQUEST = approval.Request("r-1", "a laptop", timeout_s=3600)


@pytest.mark.asyncio
@pytest.mark.parametrize(("decision", "expected"), [(True, "approved"), (False, "rejected")])
async def test_the_review_signal_decides(decision: bool, expected: str) -> None:
    async def review(t: TestEngine, run: fusee.Run[str]) -> None:
        await run.signal(approval.review, decision, dedup="the-review")

    got = await crash_everywhere(approval.approval, REQUEST, id="r-1", drive=review)
    assert got == expected


@pytest.mark.asyncio
async def test_no_review_before_the_deadline_escalates() -> None:
    assert await crash_everywhere(approval.approval, REQUEST, id="r-1") == "expired"


@pytest.mark.asyncio
async def test_the_wait_survives_a_crash_and_a_day_of_virtual_time() -> None:
    async with TestEngine(workflows=[approval.approval]) as t:
        run = await t.start(approval.approval, "r-2", REQUEST)
        await t.advance("30m")
        await t.crash()
        assert (await run.describe()).status in ("running", "suspended")
        await run.signal(approval.review, True)
        assert await run.result() == "approved"


def test_the_example_goes_three_ways(tmp_path: Path) -> None:
    out = run_example("approval", cwd=tmp_path)
    assert "r-1: approved" in out
    assert "r-2: rejected" in out
    assert "escalated to a manager" in out
    assert "r-3: expired" in out
