"""Hooks: what a test host watches and changes in an engine, kept out of the engine.

An engine runs with `Hooks()` (no mocks, nothing logged); `fusee.testing`
installs its own to mock steps, log every step invocation, count running
step functions and collect watchdog reports.

The rule: the engine only calls hooks; it never reads what a test host
keeps in them beyond the mocks it is told to use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["Hooks"]


class Hooks:
    """The test host's view into an engine.

    Attributes:
        mocks: Step functions to call instead of the workflow's, by
            ``(workflow name, step name)``.
        step_log: Every step invocation as ``(life, (id, run, seq))``, or None
            to log nothing (outside tests a log of every step would grow
            forever). The run is in the key because runs of one id
            (continue-as-new, REPLACE) reuse seqs.
        life: Which life of the store this engine is (the test host counts
            crashes).
        busy_steps: Step functions running now (an attempt counts from its
            call until it returns or raises).
        watchdog_reports: What the watchdog reported, newest last (appended
            from the watchdog's thread).
        wait_result: Awaits a run's end for `fusee.Run.result` (the test host
            skips idle virtual time there), or None to await it plainly.

    Example:
        >>> h = Hooks()
        >>> h.mock("checkout", "charge") is None
        True
    """

    __slots__ = ("busy_steps", "life", "mocks", "step_log", "wait_result", "watchdog_reports")

    def __init__(
        self,
        *,
        mocks: dict[tuple[str, str], Callable[..., Any]] | None = None,
        step_log: list[tuple[int, tuple[str, int, int]]] | None = None,
        life: int = 0,
        wait_result: Callable[[asyncio.Future[None]], Awaitable[None]] | None = None,
        watchdog_reports: list[str] | None = None,
    ) -> None:
        self.mocks: dict[tuple[str, str], Callable[..., Any]] = mocks if mocks is not None else {}
        self.step_log = step_log
        self.life = life
        self.busy_steps = 0
        # The test host passes one list for every life, so a report made
        # just before a crash still reaches the test.
        self.watchdog_reports: list[str] = watchdog_reports if watchdog_reports is not None else []
        self.wait_result = wait_result

    def mock(self, workflow: str, step: str) -> Callable[..., Any] | None:
        """The mock of step ``step`` of ``workflow``, or None."""
        if not self.mocks:
            return None
        return self.mocks.get((workflow, step))

    def step_started(self, id: str, run: int, seq: int) -> None:
        """A step function is called (every attempt)."""
        if self.step_log is not None:
            self.step_log.append((self.life, (id, run, seq)))
