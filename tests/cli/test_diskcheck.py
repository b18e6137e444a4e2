"""`fusee disk-check`: the flush latency of a disk."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import cli


def test_disk_check_prints_flush_latency(tmp_path: Path) -> None:
    code, out, _ = cli("disk-check", str(tmp_path), "--count", "5")
    assert code == 0
    assert "p50" in out
    assert "p99" in out
    assert "max" in out
    assert "µs" in out
    code, out, _ = cli("disk-check", str(tmp_path), "--count", "5", "--size", "512", "--json")
    report = json.loads(out)
    assert report["count"] == 5
    assert report["size"] == 512
    assert 0 < report["p50_us"] <= report["p99_us"] <= report["max_us"]
    assert list(tmp_path.iterdir()) == []
