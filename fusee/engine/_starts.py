"""`start` and `execute`, typed by the workflow, written once for Engine, TestEngine and Client.

mypy reads a run's input and result types from the `fusee.WorkflowDef`
given: ``await engine.start(wf, "id", input)`` is a ``Run[O]`` for a
``WorkflowDef[I, O]`` and an input that is not an ``I`` is refused. The
overloads saying so live here only; each class writes how it starts a run
(``_start``: on its own engine, on the current life's, or through the
store's inbox).
"""

from __future__ import annotations

import abc
import dataclasses
import datetime
from typing import TYPE_CHECKING, Any, TypeVar, overload

from fusee.engine._run import IdPolicy, Run

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef
    from fusee._queue import Queue

__all__ = ["Executes", "StartOptions", "Starts"]

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - a workflow's input type


@dataclasses.dataclass(frozen=True, slots=True)
class StartOptions:
    """What `Starts.start` takes besides the workflow, the id and the input, as given.

    Example:
        >>> StartOptions(IdPolicy.REJECT, "emails", "acme", 0, None, "1h", None, None).key
        'acme'
    """

    id_policy: IdPolicy
    queue: Queue | str | None
    key: str | None
    priority: int
    debounce: Any
    timeout: Any
    delay: Any
    start_at: datetime.datetime | None


class Starts(abc.ABC):
    """``start``: shared by `fusee.Engine`, `fusee.Client` and `fusee.testing.TestEngine`.

    A class using it provides ``_start``, which gets the workflow, the id,
    the input and the other arguments of ``start`` as one `StartOptions`.
    """

    @abc.abstractmethod
    async def _start(
        self,
        workflow: WorkflowDef[Any, Any] | str,
        id: str,
        input: Any,
        options: StartOptions,
    ) -> Run[Any]:
        """Implemented by the class that uses this one."""

    @overload
    async def start(
        self,
        workflow: WorkflowDef[None, T],
        id: str,
        input: None = None,
        *,
        id_policy: IdPolicy = ...,
        queue: Queue | str | None = ...,
        key: str | None = ...,
        priority: int = ...,
        debounce: Any = ...,
        timeout: Any = ...,
        delay: Any = ...,
        start_at: datetime.datetime | None = ...,
    ) -> Run[T]: ...
    @overload
    async def start(
        self,
        workflow: WorkflowDef[I, T],
        id: str,
        input: I,
        *,
        id_policy: IdPolicy = ...,
        queue: Queue | str | None = ...,
        key: str | None = ...,
        priority: int = ...,
        debounce: Any = ...,
        timeout: Any = ...,
        delay: Any = ...,
        start_at: datetime.datetime | None = ...,
    ) -> Run[T]: ...
    @overload
    async def start(
        self,
        workflow: str,
        id: str,
        input: Any = None,
        *,
        id_policy: IdPolicy = ...,
        queue: Queue | str | None = ...,
        key: str | None = ...,
        priority: int = ...,
        debounce: Any = ...,
        timeout: Any = ...,
        delay: Any = ...,
        start_at: datetime.datetime | None = ...,
    ) -> Run[Any]: ...

    async def start(
        self,
        workflow: WorkflowDef[Any, Any] | str,
        id: str,
        input: Any = None,
        *,
        id_policy: IdPolicy = IdPolicy.REJECT,
        queue: Queue | str | None = None,
        key: str | None = None,
        priority: int = 0,
        debounce: Any = None,
        timeout: Any = None,
        delay: Any = None,
        start_at: datetime.datetime | None = None,
    ) -> Run[Any]:
        """Starts a run of ``workflow`` with id ``id``; returns once its start is durable.

        With ``queue`` (a `fusee.Queue` of the serving engine, or its name)
        the run is ``queued`` until the queue admits it: lower ``priority``
        first, within the queue's limits (``per_key`` counts runs of one
        ``key``). With ``debounce`` (a duration), a start of an id still
        queued replaces its input and holds its admission back that long
        again.

        With ``timeout`` (a duration: ``"1h"``, seconds, a ``timedelta``) the
        run has a deadline: once it passes, the run is cancelled as by
        ``run.cancel(reason="deadline exceeded")`` (its code's compensation
        runs), whichever worker serves it then, after any restart. With
        ``delay`` (a duration) or ``start_at`` (a ``datetime``) the run is
        ``queued`` until then (``describe().wake_at``); ``run.start_now()``
        starts it early, ``run.cancel()`` drops it.

        A `fusee.Client` posts the start to the worker that serves the
        run; a `fusee.testing.TestEngine`'s handle stays valid across its
        crashes.

        Args:
            workflow: A `fusee.WorkflowDef` or a workflow's name.
            id: The run's workflow id.
            input: Its input.
            id_policy: What to do when the id is taken (`fusee.IdPolicy`).
            queue: A queue of the serving engine (a `fusee.Queue` or its name).
            key: Its key, for the queue's ``per_key`` limit.
            priority: Lower numbers are admitted first.
            debounce: A duration: a start of an id still queued replaces its
                input and holds its admission back this long again.
            timeout: A duration: the run is cancelled ("deadline exceeded")
                if it is still going this long after now.
            delay: A duration: the run is ``queued`` until then.
            start_at: A ``datetime``: as ``delay``, until then.

        Raises:
            TypeError: ``workflow`` is not a `fusee.WorkflowDef` (decorate the
                function with ``@fusee.workflow``) nor a workflow's name.
            ValueError: ``id`` is empty or not valid text; ``timeout`` or
                ``delay`` is not a positive duration; both ``delay`` and
                ``start_at`` are given.
            fusee.UnknownWorkflow: The serving engine was not given that workflow.
            fusee.UnknownQueue: The serving engine was not given that queue.
            fusee.AlreadyExists: The id is taken (see `IdPolicy`).
            fusee.PayloadError: ``input`` cannot be encoded, or does not fit
                the workflow's input type (nothing is recorded).

        Example:
            >>> async def main(engine: Starts) -> None:
            ...     run = await engine.start("checkout", "order-1", {"sku": "A1"})
            ...     late = await engine.start("report", "r-1", delay="10m", timeout="1h")
        """
        options = StartOptions(id_policy, queue, key, priority, debounce, timeout, delay, start_at)
        return await self._start(workflow, id, input, options)


class Executes(Starts):
    """``start`` and ``execute``: shared by `fusee.Engine` and `fusee.testing.TestEngine`."""

    @overload
    async def execute(
        self,
        workflow: WorkflowDef[None, T],
        id: str,
        input: None = None,
        *,
        id_policy: IdPolicy = ...,
    ) -> T: ...
    @overload
    async def execute(
        self, workflow: WorkflowDef[I, T], id: str, input: I, *, id_policy: IdPolicy = ...
    ) -> T: ...
    @overload
    async def execute(
        self, workflow: str, id: str, input: Any = None, *, id_policy: IdPolicy = ...
    ) -> Any: ...

    async def execute(
        self,
        workflow: WorkflowDef[Any, Any] | str,
        id: str,
        input: Any = None,
        *,
        id_policy: IdPolicy = IdPolicy.REJECT,
    ) -> Any:
        """Starts a run and waits for its result (a `fusee.testing.TestEngine` skips idle time).

        Example:
            >>> async def main(engine: Executes) -> None:
            ...     receipt = await engine.execute("checkout", "order-2", {"sku": "A1"})
        """
        run = await self.start(workflow, id, input, id_policy=id_policy)
        return await run.result()
