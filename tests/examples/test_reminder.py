"""examples/reminder.py: the loop continues as new and stops on its signal."""

from __future__ import annotations

from pathlib import Path

import pytest
from example_runner import run_example

import fusee
from examples import reminder
from fusee.testing import TestEngine, crash_everywhere


@pytest.mark.asyncio
async def test_reminders_continue_as_new_across_crashes() -> None:
    state = reminder.Reminders("ada", 3600, remaining=4)
    assert await crash_everywhere(reminder.reminder, state, id="rem") == 4


@pytest.mark.asyncio
async def test_each_run_keeps_a_short_journal_and_stop_ends_the_loop() -> None:
    async with TestEngine(workflows=[reminder.reminder]) as t:
        run = await t.start(reminder.reminder, "rem-1", reminder.Reminders("bo", 60, 100))
        first = (await run.describe()).run
        await t.advance("10m")
        await t.crash()
        await run.signal(reminder.stop, True)
        assert await run.result() == 10
        assert (await run.describe()).run != first  # continued as new on the way
        assert (await run.describe()).status == "completed"


def test_stop_is_a_signal() -> None:
    assert isinstance(reminder.stop, fusee.SignalDef)


def test_the_example_counts_runs(tmp_path: Path) -> None:
    out = run_example("reminder", cwd=tmp_path)
    assert "reminder #7 to ada" in out
    assert "sent 7 reminders over 3 runs of one id" in out
    assert "bo said stop after" in out
