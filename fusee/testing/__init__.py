"""Testing workflows: `TestEngine` and `crash_everywhere`.

`TestEngine` is the `Engine` on the memory store (or a store the test
gives it) with a virtual clock that
stands still until the test moves it (`TestEngine.advance`) or awaits a
run's result (then idle time skips to the next timer, as in Temporal's
time-skipping environment). `TestEngine.crash` loses everything but the
store and recovers, as a process restart would. The dev profile is on:
every run's journal is replayed against the code when it waits or ends.

Its parts: `_test_engine` (`TestEngine`), `_step_names` (the scanner that
checks a mocked step's name against the workflow's code) and `_crash` (the
crash harness, `crash_everywhere`).

Example:
    >>> import asyncio, fusee
    >>> @fusee.workflow("nap")
    ... async def nap(ctx) -> str:
    ...     await ctx.sleep("nap", "1d")
    ...     return "rested"
    >>> async def main() -> str:
    ...     async with TestEngine(workflows=[nap]) as t:
    ...         return await t.execute(nap, "nap-1")   # a day passes in no time
    >>> asyncio.run(main())
    'rested'
"""

from __future__ import annotations

from fusee.testing._crash import crash_everywhere
from fusee.testing._test_engine import TestEngine

__all__ = ["TestEngine", "crash_everywhere"]
