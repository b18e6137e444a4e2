"""The embedded engine: `Engine`, `Run` handles, `IdPolicy`, `RunInfo`.

See ARCHITECTURE.md for where each concern lives: `_engine` (the API,
opening, recovery), `_run` (handles and statuses), `_runs` (loading,
parking), `_host` (what drivers call), `_steps` (the step executor),
`_messages`, `_timers`, `_streams`, `_commit` (group commit), `_watchdog`,
`_starts` (the typed `start` and `execute` Engine, TestEngine and Client share).
"""

from __future__ import annotations

from fusee.engine._bulk import BulkActions, BulkResult, Filters, bulk
from fusee.engine._engine import Engine
from fusee.engine._run import IdPolicy, Run, RunInfo
from fusee.engine._starts import Executes, StartOptions, Starts

__all__ = [
    "BulkActions",
    "BulkResult",
    "Engine",
    "Executes",
    "Filters",
    "IdPolicy",
    "Run",
    "RunInfo",
    "StartOptions",
    "Starts",
    "bulk",
]
