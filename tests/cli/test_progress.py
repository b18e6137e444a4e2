"""The rule by which heartbeat progress draws a bar (`fusee show --follow`)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from fusee.cli._output import Output
from fusee.cli._progress import Bars, fraction


@pytest.mark.parametrize(
    ("progress", "expected"),
    [
        pytest.param(0, (0.0, ""), id="zero"),
        pytest.param(0.4, (0.4, ""), id="fraction"),
        pytest.param(1, (1.0, ""), id="one"),
        pytest.param({"pct": 40}, (0.4, ""), id="pct"),
        pytest.param({"pct": 12.5, "stage": "copy"}, (0.125, ""), id="pct-with-more"),
        pytest.param({"done": 3, "total": 4}, (0.75, "3/4"), id="done-total"),
        pytest.param({"done": 5, "total": 4}, (1.0, "5/4"), id="done-past-total"),
        pytest.param(1.5, None, id="above-one"),
        pytest.param(-0.1, None, id="negative"),
        pytest.param(True, None, id="bool"),
        pytest.param(float("nan"), None, id="nan"),
        pytest.param("half", None, id="text"),
        pytest.param({"pct": 140}, None, id="pct-above-100"),
        pytest.param({"done": 1, "total": 0}, None, id="zero-total"),
        pytest.param({"done": "1", "total": 2}, None, id="done-not-a-number"),
        pytest.param([1, 2], None, id="list"),
        pytest.param(None, None, id="none"),
    ],
)
def test_progress_draws_a_bar_only_in_the_documented_shapes(
    progress: Any, expected: tuple[float, str] | None
) -> None:
    assert fraction(progress) == expected


def test_bars_off_a_terminal_print_a_line_each_time_a_steps_progress_changes() -> None:
    stream = io.StringIO()
    bars = Bars(Output(stream, stream, as_json=False))
    bars.draw({2: ("upload", 0.5), 3: ("other", "not a bar")})
    bars.draw({2: ("upload", 0.5)})
    bars.draw({2: ("upload", {"done": 9, "total": 10})})
    bars.close()
    lines = [ln.split() for ln in stream.getvalue().splitlines()]
    assert [(ln[0], ln[1], ln[3:]) for ln in lines] == [
        ("progress", "upload", ["50%"]),
        ("progress", "upload", ["90%", "9/10"]),
    ]
