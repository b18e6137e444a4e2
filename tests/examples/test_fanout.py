"""examples/fanout.py: 100 gathered steps, each run once, across crashes."""

from __future__ import annotations

from pathlib import Path

import pytest
from example_runner import run_example

from examples import fanout
from fusee.testing import TestEngine, crash_everywhere


@pytest.mark.asyncio
async def test_a_small_fan_out_survives_a_crash_anywhere() -> None:
    assert await crash_everywhere(fanout.fanout, 6, id="f-1") == "6 scores, total 55"


@pytest.mark.asyncio
async def test_a_hundred_steps_run_once_across_a_crash_in_the_middle() -> None:
    async with TestEngine(workflows=[fanout.fanout]) as t:
        run = await t.start(fanout.fanout, "f-100", 100)
        await t.settle()
        await t.crash()
        assert await run.result() == f"100 scores, total {sum(i * i for i in range(100))}"
        steps = [key for _, key in t.step_log]
        assert len(steps) == len(set(steps)) == 101


def test_the_example_prints_its_summary(tmp_path: Path) -> None:
    out = run_example("fanout", cwd=tmp_path)
    assert "fan-out of 100 steps: 100 scores, total 328350" in out
