"""The pytest plugin: the ``fusee_engine`` fixture, a factory of test engines.

Installed with fusee (entry point ``pytest11``), so a test only names the
fixture. Each call makes a `fusee.testing.TestEngine` (memory store, virtual
clock, dev profile, crashes and step mocks), not opened yet: open it with
``async with``. Keyword arguments go to `TestEngine` (``store=``,
``park_after=``, ``start_ms=``, ``profile=``).

The rule: the fixture itself needs no event loop; the engine is opened and
closed by the test's own ``async with``, on the test's loop (pytest-asyncio,
anyio or a plain ``asyncio.run``).

Example:
    A test module using it (with pytest-asyncio)::

        import fusee, pytest

        @fusee.workflow("greet")
        async def greet(ctx: fusee.Ctx, name: str) -> str:
            return await ctx.step("hello", lambda: f"hello {name}")

        @pytest.mark.asyncio
        async def test_greet(fusee_engine) -> None:
            async with fusee_engine(workflows=[greet]) as t:
                assert await t.execute(greet, "g-1", "ada") == "hello ada"
                await t.crash()
                assert await t.get("g-1").result() == "hello ada"

    The factory, called directly:

    >>> import asyncio, fusee
    >>> @fusee.workflow("nap")
    ... async def nap(ctx) -> str:
    ...     await ctx.sleep("nap", "1h")
    ...     return "rested"
    >>> async def main(make: EngineFactory) -> str:
    ...     async with make(workflows=[nap]) as t:
    ...         return await t.execute(nap, "nap-1")
    >>> asyncio.run(main(_factory()))
    'rested'
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

import pytest

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef
    from fusee.testing import TestEngine

__all__ = ["EngineFactory", "fusee_engine"]


class EngineFactory(Protocol):
    """What the ``fusee_engine`` fixture gives: ``(workflows=[...], **kw) -> TestEngine``."""

    def __call__(
        self, workflows: Iterable[WorkflowDef[Any, Any]] = (), **kw: Any
    ) -> TestEngine: ...


def _factory() -> EngineFactory:
    def make(workflows: Iterable[WorkflowDef[Any, Any]] = (), **kw: Any) -> TestEngine:
        # Imported here: pytest loads this plugin in every session of an
        # environment with fusee installed, also sessions that never use it.
        from fusee.testing import TestEngine

        return TestEngine(workflows, **kw)

    return make


@pytest.fixture
def fusee_engine() -> EngineFactory:
    """A factory of `fusee.testing.TestEngine` values: ``fusee_engine(workflows=[wf])``.

    Open the engine it returns with ``async with``; it closes at the block's end.

    Example:
        >>> async def test_it(fusee_engine: EngineFactory) -> None:
        ...     async with fusee_engine(workflows=[]) as t:
        ...         await t.advance("1h")
    """
    return _factory()
