"""The pytest plugin: the ``fusee_engine`` fixture, a factory of test engines.

Installed with fusee (entry point ``pytest11``), so a test only names the
fixture. Each call makes a `fusee.testing.TestEngine` (memory store, virtual
clock, dev profile, crashes and step mocks), not opened yet: open it with
``async with``. Keyword arguments go to `TestEngine` (``store=``,
``park_after=``, ``start_ms=``, ``profile=``, ``watchdog=``, ``on_pause=``:
``"raise"`` makes ``result()`` of a run that pauses raise `fusee.RunPaused`,
``"wait"`` waits for a resume).

The ``fusee_no_errors_logged`` fixture fails a test in which an engine broke
quietly: the ``fusee`` logger logged an error, asyncio reported an error it
could not raise anywhere ("Task was destroyed but it is pending!",
"Exception in callback", ...), or a run's own loop's exception handler was
called. Turn it on for a whole suite with an autouse fixture in
``conftest.py``; a test that causes such errors on purpose says so with
``@pytest.mark.expect_engine_errors("regex", ...)``::

    @pytest.fixture(autouse=True)
    def _no_errors_logged(fusee_no_errors_logged: None) -> None:
        # Every test fails when an engine logs an unexpected error.

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

import functools
import gc
import logging
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import pytest

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef
    from fusee.testing import TestEngine

__all__ = ["EngineFactory", "fusee_engine", "fusee_no_errors_logged"]

_MARKER = "expect_engine_errors"


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


def pytest_configure(config: pytest.Config) -> None:
    """Registers the ``expect_engine_errors`` marker (pytest may run with strict markers)."""
    config.addinivalue_line(
        "markers",
        f"{_MARKER}(*patterns): errors this test makes the engine log on purpose "
        "(regexes searched in each; none: any); fusee_no_errors_logged lets them pass",
    )


class _ErrorLog(logging.Handler):
    """Keeps every record at ERROR or above that reaches it."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = f"{record.name} {record.levelname}: {record.getMessage()}"
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            text += f" ({type(error).__name__}: {error})"
        self.errors.append(text)


def _context_text(context: dict[str, Any]) -> str:
    text = f"a run's loop's exception handler: {context.get('message', '')}"
    error = context.get("exception")
    if error is not None:
        text += f" ({type(error).__name__}: {error})"
    return text


def unexpected_errors(errors: Iterable[str], patterns: Iterable[str] | None) -> list[str]:
    """The ``errors`` no pattern of ``patterns`` matches (None: every error is expected).

    Example:
        >>> unexpected_errors(["fusee ERROR: boom", "fusee ERROR: bang"], ["bo+m"])
        ['fusee ERROR: bang']
    """
    if patterns is None:
        return []
    compiled = [re.compile(p) for p in patterns]
    return [e for e in errors if not any(p.search(e) for p in compiled)]


_PREVIOUS = pytest.StashKey[tuple[str, "list[str] | None"]]()


def _expected(node: pytest.Item) -> list[str] | None:
    """The patterns of all of ``node``'s ``expect_engine_errors`` markers (None: any error)."""
    patterns = ["(?!)"]  # matches nothing
    for marker in node.iter_markers(_MARKER):
        if not marker.args:
            return None
        patterns.extend(str(p) for p in marker.args)
    return patterns


def _fail(errors: list[str], what: str) -> None:
    listed = "\n".join(f"  {e}" for e in errors)
    pytest.fail(
        f"{what} {len(errors)} unexpected error(s):\n{listed}\n"
        f"a test that causes them on purpose says so: @pytest.mark.{_MARKER}('regex', ...)",
        pytrace=False,
    )


class _Watch:
    """What the check watches, installed at its first use and kept until the session ends.

    It stays installed between tests: a task that the test's fixtures held
    is destroyed after the test's teardown, before the next test starts.
    """

    def __init__(self) -> None:
        from fusee._loop import WorkflowLoop
        from fusee.testing._crash import caused_by_simulated_crash

        self.log = _ErrorLog()
        self.loggers = [logging.getLogger("fusee"), logging.getLogger("asyncio")]
        self.default_handler = WorkflowLoop.default_exception_handler
        log = self.log
        default_handler = self.default_handler

        @functools.wraps(default_handler)
        def observed(loop: WorkflowLoop, context: dict[str, Any]) -> None:
            if not caused_by_simulated_crash(context.get("exception")):
                log.errors.append(_context_text(context))
            default_handler(loop, context)

        setattr(WorkflowLoop, "default_exception_handler", observed)  # noqa: B010
        for logger in self.loggers:
            logger.addHandler(log)

    def drain(self) -> list[str]:
        errors = list(self.log.errors)
        self.log.errors.clear()
        return errors

    def uninstall(self) -> None:
        from fusee._loop import WorkflowLoop

        setattr(WorkflowLoop, "default_exception_handler", self.default_handler)  # noqa: B010
        for logger in self.loggers:
            logger.removeHandler(self.log)


_WATCH = pytest.StashKey[_Watch]()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Uninstalls the error check's watch, if a test installed it."""
    watch = config.stash.get(_WATCH, None)
    if watch is not None:
        watch.uninstall()


@pytest.fixture
def fusee_no_errors_logged(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails the test if an engine broke quietly during it (see the module docstring).

    What counts: a record at ERROR from the ``fusee`` or ``asyncio`` logger
    (asyncio's default exception handler logs there), and any call of a
    run's loop's default exception handler (an error inside a run that
    nothing raised). Errors matched by the test's ``expect_engine_errors``
    marker pass; so do the records of `fusee.testing.crash_everywhere`'s
    own simulated crashes.

    A task dropped while pending is reported when it is garbage collected:
    garbage is collected at the test's end, and what the test's fixtures
    still held then is reported at the start of the next test using this
    fixture, naming this one. To keep that cheap, what survives a test's
    start is moved out of the collector's sight (`gc.freeze`): each
    collection looks only at what the last test made.

    Example:
        >>> import inspect
        >>> "request" in inspect.signature(fusee_no_errors_logged.__wrapped__).parameters
        True
    """
    config = request.config
    watch = config.stash.get(_WATCH, None)
    if watch is None:
        watch = config.stash[_WATCH] = _Watch()
    gc.collect()
    gc.freeze()
    previous = config.stash.get(_PREVIOUS, None)
    config.stash[_PREVIOUS] = (request.node.nodeid, _expected(request.node))
    left = watch.drain()
    if previous is not None:
        left = unexpected_errors(left, previous[1])
        if left:
            _fail(left, f"after the previous test, {previous[0]}, its leftovers logged")
    yield
    gc.collect()
    errors = unexpected_errors(watch.drain(), _expected(request.node))
    if errors:
        _fail(errors, "the engine logged")
