"""examples/web_app.py: the app's Client starts, pays and reads orders a worker process runs."""

from __future__ import annotations

import re
from pathlib import Path

from example_runner import run_example


def test_the_app_starts_pays_and_ships_an_order_through_the_worker(tmp_path: Path) -> None:
    out = run_example("web_app", cwd=tmp_path)
    assert "worker ready" in out
    # Right after its start the run is running, or already waiting for its
    # payment (suspended): the worker's first turn races the answer.
    assert re.search(r"POST /orders/o-1: 201 \{'id': 'o-1', 'status': '(running|suspended)'\}", out)
    assert "POST /orders/o-1 again: 409 {'error': 'that order exists'}" in out
    # The payment, then its retry, applied once.
    assert out.count("POST /orders/o-1/paid: 200 {'id': 'o-1', 'paid': 'pay-77'}") == 2
    assert (
        "GET /orders/o-1?wait=1: {'id': 'o-1', 'result': {'status': 'shipped', "
        "'payment': 'pay-77', 'label': 'FR-A1-2'}}"
    ) in out
    assert "GET /orders/o-2: {'id': 'o-2', 'status': 'suspended'}" in out
