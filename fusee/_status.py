"""`RunStatus`: the statuses a run can have, the one vocabulary of every surface.

The rule: a status is decided in one place (`fusee.engine._run.status_of`);
the store keeps it as its string value, and describe, list, the CLI and the
UI show that value.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["FINISHED_STATUSES", "UNFINISHED_STATUSES", "RunStatus"]


class RunStatus(enum.StrEnum):
    """A run's status, as `Run.describe`, `Engine.list`, the CLI and the UI show it.

    - ``QUEUED``: admitted to no worker yet (queues).
    - ``RUNNING``: it has work in flight (a step, a retry's wait).
    - ``SUSPENDED``: waiting only on time, a signal, a child or a completion,
      loaded or parked.
    - ``PAUSED``: a step ran out of retries; ``run.resume()`` goes on.
    - ``DIVERGED``: its code differs from its journal; it waits for
      compatible code.
    - ``COMPLETED``, ``FAILED``, ``CANCELLED``: ended.
    - ``CONTINUED``: ended by continue-as-new (its id's next run goes on).

    Members are strings, so ``status == "running"`` holds for ``RUNNING``.

    Example:
        >>> RunStatus.SUSPENDED == "suspended"
        True
        >>> RunStatus("paused").is_finished
        False
    """

    QUEUED = "queued"
    RUNNING = "running"
    SUSPENDED = "suspended"
    PAUSED = "paused"
    DIVERGED = "diverged"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CONTINUED = "continued"

    @property
    def is_finished(self) -> bool:
        """Whether the run has ended (continue-as-new included)."""
        return self in FINISHED_STATUSES


FINISHED_STATUSES: Final = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.CONTINUED}
)
"""The statuses of runs that have ended."""

UNFINISHED_STATUSES: Final = frozenset(
    {
        RunStatus.QUEUED,
        RunStatus.RUNNING,
        RunStatus.SUSPENDED,
        RunStatus.PAUSED,
        RunStatus.DIVERGED,
    }
)
"""The statuses of runs that recovery picks up again."""
