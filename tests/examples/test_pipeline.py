"""examples/pipeline.py: a parent and its children survive a crash anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from example_runner import run_example

from examples import pipeline
from fusee.testing import crash_everywhere

CHECKSUM = sum(i * i for i in range(1, 13))


@pytest.mark.asyncio
async def test_the_pipeline_survives_a_crash_anywhere() -> None:
    got = await crash_everywhere(
        pipeline.pipeline,
        "rows.csv",
        workflows=[pipeline.extract, pipeline.transform, pipeline.load],
        id="etl",
    )
    assert got == CHECKSUM


def test_the_example_lists_the_children(tmp_path: Path) -> None:
    out = run_example("pipeline", cwd=tmp_path)
    assert f"pipeline etl-1 done: checksum {CHECKSUM}" in out
    for child in ("etl-1-extract", "etl-1-transform-0", "etl-1-transform-2", "etl-1-load"):
        assert child in out
