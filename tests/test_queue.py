"""`fusee.Queue` (fusee/_queue.py): its limits are checked when it is made."""

from __future__ import annotations

from typing import Any

import pytest

import fusee


def test_a_queue_keeps_its_limits_for_the_store() -> None:
    q = fusee.Queue("emails", concurrency=10, per_key=1, rate=(100, "1m"))
    assert (q.limits.name, q.limits.concurrency, q.limits.per_key) == ("emails", 10, 1)
    assert (q.limits.rate_n, q.limits.rate_ms) == (100, 60_000)
    assert q == fusee.Queue("emails", concurrency=10, per_key=1, rate=(100, "1m"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"concurrency": 0}, "concurrency must be an int >= 1", id="concurrency"),
        pytest.param({"per_key": 1.5}, "per_key must be an int >= 1", id="per-key"),
        pytest.param({"rate": (5,)}, "rate must be a pair", id="rate-shape"),
        pytest.param({"rate": (5, "soon")}, "invalid duration", id="rate-period"),
    ],
)
def test_a_queue_with_bad_limits_is_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fusee.Queue("q", **kwargs)
