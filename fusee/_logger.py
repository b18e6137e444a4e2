"""``ctx.logger``: a logger for workflow code that logs each line once per run.

Workflow code runs again whenever its run is replayed (after a crash, when a
parked run wakes, for a query of a finished run); a plain logger would
repeat every line each time. `RunLogger` drops records while the code
replays what its journal holds and passes them on once it runs past it. It
adds the run's id, run number, workflow and (inside a step function) the
step and attempt to each record, as ``extra`` fields and as a message prefix.

The rule: whether a record is dropped depends on the run's journal position
alone (`fusee.machine.RunMachine.is_past_journal`), never on a clock or on
what was logged before, so a crash neither loses nor doubles a line of code
that ran past its journal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fusee.context import StepCtx
    from fusee.machine import RunMachine
    from fusee.record import Start

    _Adapter = logging.LoggerAdapter[logging.Logger]
else:
    _Adapter = logging.LoggerAdapter

__all__ = ["LOGGER_PREFIX", "RunLogger"]

LOGGER_PREFIX = "fusee.workflow"
"""``ctx.logger`` logs to ``fusee.workflow.<workflow name>``."""


class RunLogger(_Adapter):
    """A `logging.LoggerAdapter` for one run's workflow code (``ctx.logger``).

    Each record carries ``fusee_id``, ``fusee_run``, ``fusee_workflow``,
    ``fusee_step`` and ``fusee_attempt`` (None outside a step function) and
    starts with ``[id workflow]`` (``[id workflow step#attempt]`` in a step).
    While the code replays its journal, nothing is logged; inside a step
    function (which runs only live) everything is.

    Example:
        >>> import fusee
        >>> @fusee.workflow("greeter")
        ... async def greeter(ctx: fusee.Ctx, name: str) -> str:
        ...     ctx.logger.info("greeting %s", name)  # once per run, even after a crash
        ...     return await ctx.step("greet", lambda: f"hello {name}")
    """

    def __init__(
        self, machine: RunMachine, start: Start, current_step: Callable[[], StepCtx | None]
    ) -> None:
        super().__init__(logging.getLogger(f"{LOGGER_PREFIX}.{start.wtype}"), None)
        self._current_step = current_step
        self._machine = machine
        self._id = start.id
        self._run = start.run
        self._workflow = start.wtype
        self._key_prefix = f"{start.id}/{start.run}/"

    def _step(self) -> tuple[str, int] | None:
        """The (name, attempt) of this run's step whose function logs now, if one does."""
        s = self._current_step()
        if s is None or not s.key.startswith(self._key_prefix):
            return None
        seq = int(s.key[len(self._key_prefix) :])
        return self._machine.pending_name(seq) or f"step #{seq}", s.attempt

    def isEnabledFor(self, level: int) -> bool:
        """Whether a record at ``level`` would be logged now (never while replaying)."""
        if not self._machine.is_past_journal() and self._step() is None:
            return False
        return self.logger.isEnabledFor(level)

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        """Adds the run's fields to the record's ``extra`` and its prefix to the message."""
        step = self._step()
        fields = {
            "fusee_id": self._id,
            "fusee_run": self._run,
            "fusee_workflow": self._workflow,
            "fusee_step": step[0] if step is not None else None,
            "fusee_attempt": step[1] if step is not None else None,
        }
        extra = kwargs.get("extra")
        kwargs["extra"] = fields if extra is None else {**fields, **extra}
        where = f"{self._id} {self._workflow}" + (f" {step[0]}#{step[1]}" if step else "")
        return f"[{where}] {msg}", kwargs
