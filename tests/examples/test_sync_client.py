"""examples/sync_client.py: blocking calls start, query, signal and cancel a worker's runs."""

from __future__ import annotations

from pathlib import Path

from example_runner import run_example


def test_the_script_drives_three_invoices_with_blocking_calls(tmp_path: Path) -> None:
    out = run_example("sync_client", cwd=tmp_path)
    assert out.splitlines() == [
        "worker ready",
        "inv-2 is due 200 EUR",
        "inv-1: sent 100 EUR, approved by ada",
        "inv-2: sent 200 EUR, approved by bo",
        "inv-3: cancelled (customer left)",
        "completed: ['inv-1', 'inv-2']",
    ]
