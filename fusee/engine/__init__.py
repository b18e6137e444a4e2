"""The embedded engine: `Engine`, `Run` handles, `IdPolicy`, `RunInfo`.

See `fusee.engine._engine` for how it works; this package re-exports its
public names.
"""

from __future__ import annotations

from fusee.engine._engine import Engine, IdPolicy, Run, RunInfo

__all__ = ["Engine", "IdPolicy", "Run", "RunInfo"]
