"""`Queue`: a named bound on how many runs start, and how fast; and `QueueStats`.

A run started with ``queue=`` is ``queued`` until its queue admits it
(`fusee.engine._queues` does, in the store). The rule: a `Queue` is a plain
value, checked when made; the limits it names are applied only by the
store's admission (`fusee.store._queues.plan_admission`), never here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fusee._durations import duration_ms
from fusee.store._queues import QueueLimits

__all__ = ["Queue", "QueueStats", "stats_json"]


def _bound(value: object, what: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise ValueError(f"Queue {what} must be an int >= 1 or None, not {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Queue:
    """A queue runs are started through: ``engine.start(..., queue=q, key=..., priority=...)``.

    Args:
        name: Its name, unique per engine (the store keys items by it).
        concurrency: At most this many of its runs at once, across every
            worker; a run holds its slot until it ends, waiting included.
        per_key: At most this many at once per ``key``.
        rate: ``(n, period)``: at most ``n`` admissions in any window one
            ``period`` long (a sliding window; ``period`` a duration such as
            ``"1m"``).

    Raises:
        ValueError: A bound that is not a positive int, or a bad rate.

    Example:
        >>> emails = Queue("emails", concurrency=10, per_key=1, rate=(100, "1m"))
        >>> (emails.limits.rate_n, emails.limits.rate_ms)
        (100, 60000)
    """

    name: str
    concurrency: int | None = None
    per_key: int | None = None
    rate: tuple[int, Any] | None = None
    limits: QueueLimits = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a Queue needs a non-empty string name, not {self.name!r}")
        concurrency = _bound(self.concurrency, "concurrency")
        per_key = _bound(self.per_key, "per_key")
        rate_n: int | None = None
        rate_ms = 0
        if self.rate is not None:
            if not isinstance(self.rate, tuple) or len(self.rate) != 2:
                raise ValueError(
                    f"Queue rate must be a pair (n, period), like (100, '1m'), not {self.rate!r}"
                )
            rate_n = _bound(self.rate[0], "rate's n")
            rate_ms = duration_ms(self.rate[1])
            if rate_ms < 1:
                raise ValueError(f"Queue rate's period must be 1ms or more, not {self.rate[1]!r}")
        object.__setattr__(
            self, "limits", QueueLimits(self.name, concurrency, per_key, rate_n, rate_ms)
        )


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's figures: runs waiting in it and runs it admitted that have not ended.

    Attributes:
        queue: The queue's name.
        queued: Runs waiting for admission.
        running: Runs admitted and not ended (waiting and suspended included).
        keys: The same two figures per key, as ``{key: (queued, running)}``
            (runs started without a key are not in it).

    Example:
        >>> QueueStats("emails", 3, 1, {"cust-7": (3, 1)}).keys["cust-7"]
        (3, 1)
    """

    queue: str
    queued: int
    running: int
    keys: Mapping[str, tuple[int, int]] = field(default_factory=dict)


def stats_json(stats: Iterable[QueueStats]) -> list[dict[str, Any]]:
    """The figures as JSON values (``fusee queues --json``, ``GET /api/queues``).

    Example:
        >>> stats_json([QueueStats("q", 2, 1, {"k": (2, 1)})])
        [{'queue': 'q', 'queued': 2, 'running': 1, 'keys': {'k': {'queued': 2, 'running': 1}}}]
    """
    return [
        {
            "queue": s.queue,
            "queued": s.queued,
            "running": s.running,
            "keys": {k: {"queued": q, "running": r} for k, (q, r) in s.keys.items()},
        }
        for s in stats
    ]
