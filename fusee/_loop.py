"""WorkflowLoop: a deterministic asyncio event loop, one per workflow run.

The run's driver makes it the running loop for a turn (`WorkflowLoop.enter`)
and calls `WorkflowLoop.run_ready` after each journal delivery; the loop runs
ready callbacks in FIFO order until none is left, keeps a time that moves only
when the driver says so, and hands every timer to its `TimerHost` to be made
durable. `wait`, `as_completed` and `select`, asyncio's helpers with list
order instead of set order, are in `fusee._combinators`. `start_eagerly`
starts a task on any asyncio loop at once, up to its first suspension (a
step's task, on the engine's loop).

The one rule: no I/O, no clock, no threads. This module is part of the pure
core; what workflow code cannot repeat on replay raises `NondeterministicCall`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import inspect
import sys
import types
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, Protocol, TypeVar, cast

from fusee.errors import NondeterministicCall

if TYPE_CHECKING:
    from asyncio import _CoroutineLike
    from asyncio.events import _ExceptionHandler, _TaskFactory
    from collections.abc import AsyncGenerator
    from contextvars import Context
    from typing import TypeVarTuple

    _Ts = TypeVarTuple("_Ts")
    _AsyncgenHook = Callable[[AsyncGenerator[Any, Any]], None]

__all__ = [
    "RunEvicted",
    "TimerHost",
    "WorkflowLoop",
    "start_eagerly",
]

_T = TypeVar("_T")

# A finally block may await once per round (each await is failed at once with
# RunEvicted); a task still pending after this many rounds swallowed it.
_EVICTION_ROUNDS = 16

_STEP = "Do the work in a step: await ctx.step('name', fn)"
_CREATE_INSIDE = (
    "Create asyncio.Event, Queue, Lock, Semaphore and Condition objects inside the "
    "workflow, and bring results from outside in through a step: "
    "await ctx.step('name', fn)"
)
# Suffixes of the RuntimeErrors asyncio raises (tasks.py and mixins.py).
_FOREIGN_FUTURE = " attached to a different loop"
_FOREIGN_PRIMITIVE = " is bound to a different event loop"


# The rules refused loop methods break, and what to do instead.
_DRIVEN = "the run's driver runs this loop, one journal delivery at a time"
_AWAIT_INSTEAD = "Workflow code already runs on it: await the coroutine instead."
_THREADS = "threads are not replayed"
_DNS = "DNS lookups are I/O, which replay cannot repeat"
_NETWORK = "network I/O is not replayed"
_PIPES = "pipe I/O is not replayed"
_SUBPROCESSES = "subprocesses are not replayed"
_DESCRIPTORS = "file descriptor I/O is not replayed"
_SIGNALS = "process signals are not replayed"
_SIGNALS_INSTEAD = (
    "Receive outside events as fusee signals: review = fusee.signal('review', bool); "
    "await ctx.wait_for(review)"
)
_NO_MEANING = "this loop method has no deterministic meaning in a workflow run"
_UNNAMED = "<refused loop method>"


def _refused(rule: str, advice: str = _STEP) -> Any:
    """A loop method workflow code may not call: it raises, naming itself and ``rule``.

    `_name_refusals` names it after the attribute it is assigned to. Typed
    ``Any``: no one callable type matches every loop method it stands for
    (mypy matches none to the ``TypeVarTuple``-generic ones, such as
    ``call_soon_threadsafe``).
    """

    def refused(self: WorkflowLoop, *args: object, **kwargs: object) -> NoReturn:
        raise NondeterministicCall(
            f"{refused.__name__} cannot run in workflow code: {rule}. {advice}"
        )

    refused.__name__ = _UNNAMED
    refused.__doc__ = f"Refused: {rule}."
    return refused


class TimerHost(Protocol):
    """What a `WorkflowLoop` tells about its timers (the run's driver).

    Every ``call_later``/``call_at`` (``asyncio.sleep(x)`` with x > 0,
    ``asyncio.timeout``, ``asyncio.wait_for``) is a durable timer: the host
    records it and later calls `WorkflowLoop.fire_timer`. A timer that workflow
    code cancels before it fires is reported once through `timer_cancelled`;
    nothing is reported while the loop shuts down (the timers stay in the
    journal for the parked run). `timer_started` may call `fire_timer` at once
    (for a time that is not in the future, say).

    ``asyncio.TimerHandle`` compares and hashes by value (when, callback,
    args), and a cancelled handle forgets its callback: key timers by
    ``id(handle)``, or compare them with ``is``.

    Example:
        >>> class RecordingHost:
        ...     def __init__(self) -> None:
        ...         self.timers: dict[int, asyncio.TimerHandle] = {}
        ...     def timer_started(self, handle: asyncio.TimerHandle) -> None:
        ...         self.timers[id(handle)] = handle
        ...     def timer_cancelled(self, handle: asyncio.TimerHandle) -> None:
        ...         del self.timers[id(handle)]
    """

    def timer_started(self, handle: asyncio.TimerHandle) -> None:
        """Record a new timer; ``handle.when()`` is absolute loop time."""

    def timer_cancelled(self, handle: asyncio.TimerHandle) -> None:
        """Forget a pending timer (``handle.cancelled()`` may still be False)."""


class _ClosedHost:
    """The host of a closed loop, which starts and cancels no timer any more."""

    def timer_started(self, handle: asyncio.TimerHandle) -> None:
        raise AssertionError("a closed workflow loop starts no timer")

    def timer_cancelled(self, handle: asyncio.TimerHandle) -> None:
        raise AssertionError("a closed workflow loop reports no cancelled timer")


_CLOSED_HOST = _ClosedHost()


class RunEvicted(BaseException):
    """Thrown into every task of a run whose loop shuts down (parked, or closing).

    It is a `BaseException` so that ``except Exception`` and
    ``except asyncio.CancelledError`` compensation code does not run: the run
    is not cancelled, it is only dropped from memory and replayed later.
    ``finally`` blocks run; anything they await fails at once with another
    `RunEvicted`. Workflow code must not catch it without re-raising.

    Example:
        >>> issubclass(RunEvicted, Exception)
        False
    """


_new_handle = asyncio.Handle.__new__
# Bound once: a turn switches the running loop and the async generator hooks
# in and back out, and module attribute lookups cost as much as the calls.
_get_running_loop = asyncio.events._get_running_loop
_set_running_loop = asyncio.events._set_running_loop
_get_asyncgen_hooks = sys.get_asyncgen_hooks
_set_asyncgen_hooks = sys.set_asyncgen_hooks


class WorkflowLoop(asyncio.AbstractEventLoop):
    """One workflow run's event loop: deterministic, driven one turn at a time.

    It is never run with ``run_forever``. The driver, itself a coroutine on the
    process's real loop, makes it the running loop for a turn (`enter`, then
    `leave`) and calls `run_ready` after creating the run's main task and
    after resolving each journal future. Workflow code sees this
    loop as the running loop and may use ``asyncio.gather``, ``create_task``,
    ``TaskGroup``, ``Event``, ``Queue``, ``Lock``, ``Semaphore``,
    ``Condition``, ``timeout``, ``wait_for``, ``shield`` and ``sleep``.

    ``Event``, ``Queue``, ``Lock`` and the like bind to the first loop that
    uses them, so workflow code must create them inside the run. Awaiting one
    bound to another loop, or a future of another loop, raises asyncio's
    ``RuntimeError`` with that advice in its message, and a
    `NondeterministicCall` is recorded in `errors` for the driver. Errors
    asyncio cannot raise anywhere (a callback that failed, say) are collected
    in `errors` too; nothing is logged or printed.

    Args:
        host: Told about every timer started and cancelled.
        name: The run's name; tasks are named ``"{name}-task-{n}"``.
        start_time: The run's recorded start, in seconds; `time` starts here.

    Example:
        >>> class Host:
        ...     def timer_started(self, handle: asyncio.TimerHandle) -> None: ...
        ...     def timer_cancelled(self, handle: asyncio.TimerHandle) -> None: ...
        >>> loop = WorkflowLoop(Host(), name="order-1")
        >>> fut = loop.create_future()
        >>> async def workflow() -> int:
        ...     return await fut + 1
        >>> task = loop.create_task(workflow())
        >>> token = loop.enter(); loop.run_ready(); loop.leave(token)
        >>> fut.set_result(41)
        >>> token = loop.enter(); loop.run_ready(); loop.leave(token)
        >>> task.get_name(), task.result()
        ('order-1-task-1', 42)
        >>> loop.shutdown()
    """

    # The C Task schedules its own steps with a wrapper that hides its argument
    # from Python; learned from the first task this class creates.
    _step_wrapper: ClassVar[type | None] = None

    def __init__(self, host: TimerHost, *, name: str = "workflow", start_time: float = 0.0) -> None:
        self._host = host
        self._name = name
        self._time = float(start_time)
        self._ready: deque[asyncio.Handle] = deque()
        # Strong references in creation order: a pending task that is garbage
        # collected gets GeneratorExit thrown into it at a random time.
        self._tasks: dict[asyncio.Future[Any], None] = {}
        # Tasks whose first step was queued here and that create_task did not
        # make (see call_soon); may hold tasks that are done.
        self._seen_steps: dict[asyncio.Future[Any], None] = {}
        self._task_count = 0
        # Made at the first async generator: most runs have none, and a weak
        # dictionary is half a dozen objects to build and to collect.
        self._asyncgens: weakref.WeakKeyDictionary[AsyncGenerator[Any, Any], None] | None = None
        self._aclose_count = 0
        self._asyncgen_hooks: tuple[_AsyncgenHook | None, _AsyncgenHook | None] = (
            self._asyncgen_firstiter,
            self._asyncgen_finalizer,
        )
        self._running = False
        self._turn = 0  # run_ready calls: completions in one are simultaneous
        self._shutting_down = False
        self._closed = False
        self._debug = False
        self._task_factory: _TaskFactory | None = None
        self._exception_handler: _ExceptionHandler | None = None
        self.slow_callback_duration = 0.1
        self.errors: list[dict[str, Any]] = []
        """Contexts passed to `call_exception_handler`, for the driver to read."""

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._ready)} ready"
        return f"<WorkflowLoop {self._name!r} time={self._time} {state}>"

    @property
    def name(self) -> str:
        """The run's name, as given to the constructor.

        Example:
            >>> WorkflowLoop(cast(TimerHost, None), name="order-1").name
            'order-1'
        """
        return self._name

    @property
    def tasks(self) -> tuple[asyncio.Task[Any], ...]:
        """The run's tasks that are not done yet, oldest first.

        Example:
            >>> loop = WorkflowLoop(cast(TimerHost, None), name="order-1")
            >>> async def noop() -> None: ...
            >>> [task.get_name() for task in (loop.create_task(noop()), *loop.tasks)]
            ['order-1-task-1', 'order-1-task-1']
            >>> token = loop.enter(); loop.run_ready(); loop.leave(token)
            >>> loop.tasks
            ()
            >>> loop.close()
        """
        return tuple(cast("asyncio.Task[Any]", task) for task in self._tasks if not task.done())

    # -- turns ---------------------------------------------------------------

    def enter(self) -> tuple[asyncio.AbstractEventLoop | None, tuple[Any, ...]]:
        """Makes this the running loop for a whole driver turn; undo with `leave`.

        A turn hands the code many deliveries, each followed by `run_ready`;
        switching the running loop and the async generator hooks once per
        turn instead of once per delivery saves that switch on every delivery
        but the turn's first.

        Returns:
            What `leave` restores.

        Example:
            >>> loop = WorkflowLoop(cast(TimerHost, None))
            >>> token = loop.enter()
            >>> asyncio.get_running_loop() is loop
            True
            >>> loop.leave(token)
        """
        if self._running:
            raise RuntimeError(
                f"workflow loop {self._name!r} is already running: a turn is not re-entrant"
            )
        if self._closed:
            raise RuntimeError("Event loop is closed")
        previous = _get_running_loop()
        hooks = _get_asyncgen_hooks()
        _set_running_loop(self)
        # Async generators first iterated here must be finalized here, inside
        # the run, not by the driver's loop at some later time.
        _set_asyncgen_hooks(*self._asyncgen_hooks)
        self._running = True
        return previous, hooks

    def leave(self, token: tuple[asyncio.AbstractEventLoop | None, tuple[Any, ...]]) -> None:
        """Restores the running loop and hooks `enter` replaced."""
        previous, hooks = token
        self._running = False
        _set_asyncgen_hooks(*hooks)
        _set_running_loop(previous)

    def run_ready(self) -> None:
        """Runs ready callbacks, in ``call_soon`` order, until none is left.

        Call it inside `enter` / `leave`. Callbacks scheduled meanwhile run in
        the same call. Only ``SystemExit`` and ``KeyboardInterrupt`` escape a
        callback; the other errors go to `call_exception_handler`.

        Example:
            >>> loop = WorkflowLoop(cast(TimerHost, None))
            >>> seen: list[int] = []
            >>> _ = loop.call_soon(seen.append, 1)
            >>> _ = loop.call_soon(lambda: loop.call_soon(seen.append, 3))
            >>> _ = loop.call_soon(seen.append, 2)
            >>> token = loop.enter(); loop.run_ready(); loop.leave(token)
            >>> seen, loop.is_quiescent()
            ([1, 2, 3], True)
        """
        self._turn += 1
        ready = self._ready
        popleft = ready.popleft
        while ready:
            handle = popleft()
            if not handle._cancelled:
                handle._run()

    def is_quiescent(self) -> bool:
        """Whether no callback is ready to run (the code waits on futures).

        Example:
            >>> loop = WorkflowLoop(cast(TimerHost, None))
            >>> _ = loop.call_soon(print, "hi")
            >>> loop.is_quiescent()
            False
        """
        return not self._ready

    def is_shutting_down(self) -> bool:
        """Whether `shutdown` has begun (it stays True once the loop is closed).

        Code that starts or drops journal operations should do neither then
        (raise `RunEvicted` instead of starting one): the run is being
        dropped, not continued, and asyncio may cancel futures as the tasks
        unwind.

        Example:
            >>> WorkflowLoop(cast(TimerHost, None)).is_shutting_down()
            False
        """
        return self._shutting_down

    # -- time and timers -----------------------------------------------------

    def time(self) -> float:
        """The run's deterministic time in seconds; moved only by the driver.

        Example:
            >>> WorkflowLoop(cast(TimerHost, None), start_time=100.0).time()
            100.0
        """
        return self._time

    def advance_to(self, t: float) -> None:
        """Move `time` forward to ``t`` (recorded time; no timer fires).

        Raises:
            ValueError: ``t`` is earlier than `time`.

        Example:
            >>> loop = WorkflowLoop(cast(TimerHost, None), start_time=5.0)
            >>> loop.advance_to(7.5)
            >>> loop.time()
            7.5
        """
        if t < self._time:
            raise ValueError(
                f"workflow time moves forward only: advance_to({t}) while time() is {self._time}"
            )
        self._time = float(t)

    def call_later(
        self,
        delay: float,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        """Start a durable timer ``delay`` seconds after `time` (see `call_at`).

        Example:
            >>> class Host:
            ...     def timer_started(self, handle: asyncio.TimerHandle) -> None:
            ...         print("timer at", handle.when())
            ...     def timer_cancelled(self, handle: asyncio.TimerHandle) -> None: ...
            >>> loop = WorkflowLoop(Host(), start_time=10.0)
            >>> handle = loop.call_later(5, print, "ring")
            timer at 15.0
        """
        return self.call_at(self._time + delay, callback, *args, context=context)

    def call_at(
        self,
        when: float,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: Context | None = None,
    ) -> asyncio.TimerHandle:
        """Start a durable timer at absolute loop time ``when``.

        The host hears ``timer_started(handle)``, also for a time that is not
        in the future (the driver decides), and later calls `fire_timer`.

        Example:
            >>> class Host:
            ...     def timer_started(self, handle: asyncio.TimerHandle) -> None:
            ...         print("timer at", handle.when())
            ...     def timer_cancelled(self, handle: asyncio.TimerHandle) -> None:
            ...         print("cancelled")
            >>> loop = WorkflowLoop(Host())
            >>> handle = loop.call_at(60.0, print, "late")
            timer at 60.0
            >>> handle.cancel()
            cancelled
        """
        if self._closed:
            raise RuntimeError("Event loop is closed")
        handle = asyncio.TimerHandle(when, callback, args, self, context)
        if not self._shutting_down:
            # `_scheduled` is the flag asyncio's own loops keep: True from start
            # until fired or cancelled, so a cancel after firing (asyncio.sleep
            # always cancels in its finally) is not reported.
            cast(Any, handle)._scheduled = True
            self._host.timer_started(handle)
        return handle

    def fire_timer(self, handle: asyncio.TimerHandle) -> bool:
        """Fire a timer: time moves to its ``when()``, its callback is queued.

        Time becomes ``max(time(), handle.when())`` even when the timer was
        cancelled meanwhile; the callback is queued only if it was not.

        Returns:
            Whether the callback was queued (False: the handle was cancelled).

        Raises:
            ValueError: The handle belongs to another loop.
            RuntimeError: The timer already fired, or was started while the
                loop was shutting down.

        Example:
            >>> class Host:
            ...     def timer_started(self, handle: asyncio.TimerHandle) -> None: ...
            ...     def timer_cancelled(self, handle: asyncio.TimerHandle) -> None: ...
            >>> loop = WorkflowLoop(Host())
            >>> handle = loop.call_later(30, print, "fired")
            >>> loop.fire_timer(handle)
            True
            >>> token = loop.enter(); loop.run_ready(); loop.leave(token)
            fired
            >>> loop.time()
            30.0
        """
        if getattr(handle, "_loop", None) is not self:
            raise ValueError(f"{handle!r} is not a timer of workflow loop {self._name!r}")
        if self._closed:
            raise RuntimeError("Event loop is closed")
        when = handle.when()
        if when > self._time:
            self._time = when
        if handle.cancelled():
            return False
        state = cast(Any, handle)
        if not state._scheduled:
            raise RuntimeError(
                f"timer {handle!r} of workflow loop {self._name!r} is not pending: it fired "
                "already or was started during shutdown; fire each timer once"
            )
        state._scheduled = False
        self._ready.append(handle)
        return True

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        # TimerHandle.cancel() calls this before marking itself cancelled.
        state = cast(Any, handle)
        if state._scheduled:
            state._scheduled = False
            if not self._shutting_down:
                self._host.timer_cancelled(handle)

    # -- callbacks, futures and tasks ----------------------------------------

    def call_soon(
        self,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: Context | None = None,
    ) -> asyncio.Handle:
        """Queue ``callback(*args)`` to run in this turn, after those queued before.

        Example:
            >>> loop = WorkflowLoop(cast(TimerHost, None))
            >>> _ = loop.call_soon(print, "soon")
            >>> token = loop.enter(); loop.run_ready(); loop.leave(token)
            soon
        """
        if self._closed:
            raise RuntimeError("Event loop is closed")
        if context is None or self._debug:
            handle = asyncio.Handle(callback, args, self, context)
        else:
            # The Handle's fields set here rather than by its __init__, which
            # calls get_debug() (Python code) for every callback: a future
            # (always with a context) wakes a task through here every delivery.
            handle = _new_handle(asyncio.Handle)
            h: Any = handle
            h._callback = callback
            h._args = args
            h._cancelled = False
            h._loop = self
            h._source_traceback = None
            h._repr = None
            h._context = context
        self._ready.append(handle)
        # A task that yields a future of another loop reschedules itself with
        # a RuntimeError to throw (as the argument of a Python Task's step, or
        # hidden in the C Task's step wrapper): the one place where a foreign
        # await can be seen before workflow code does. Two type checks on the
        # hot path; the wrapper is only opened for steps that carry no future.
        extra: tuple[Any, ...] = args
        if extra:
            if type(extra[0]) is RuntimeError:
                self._explain_foreign_await(extra[0])
        elif type(callback) is self._step_wrapper:
            # A task's first step: one built with asyncio.Task(coro, loop=...)
            # bypassed create_task, and shutdown must still find it (without
            # scanning every task of the process at each run's end).
            task = callback.__self__  # type: ignore[attr-defined]
            if task not in self._tasks:
                self._seen_steps[task] = None
            for referent in gc.get_referents(callback):
                if type(referent) is RuntimeError:
                    self._explain_foreign_await(referent)
        return handle

    def create_future(self) -> asyncio.Future[Any]:
        """A new future of this loop (resolved by the driver or by workflow code).

        Example:
            >>> WorkflowLoop(cast(TimerHost, None)).create_future().done()
            False
        """
        return asyncio.Future(loop=self)

    def create_task(
        self,
        coro: _CoroutineLike[_T],
        *,
        name: str | None = None,
        context: Context | None = None,
    ) -> asyncio.Task[_T]:
        """Start ``coro`` as a task of this run, kept alive until it is done.

        Unnamed tasks are named ``"{loop name}-task-{n}"``, n counting every
        task this loop created from 1, so names are equal on replay (never
        asyncio's process-wide counter). A task factory, if set, is used.

        Example:
            >>> loop = WorkflowLoop(cast(TimerHost, None), name="order-1")
            >>> async def noop() -> None: ...
            >>> loop.create_task(noop()).get_name()
            'order-1-task-1'
            >>> loop.shutdown()
        """
        if self._closed:
            raise RuntimeError("Event loop is closed")
        self._task_count += 1
        if name is None:
            name = f"{self._name}-task-{self._task_count}"
        factory = self._task_factory
        if factory is None:
            task = asyncio.Task(coro, loop=self, name=name, context=context)
            if self._step_wrapper is None:
                self._learn_step_wrapper(task)
        else:
            make = cast(Any, factory)
            made = make(self, coro) if context is None else make(self, coro, context=context)
            task = cast("asyncio.Task[_T]", made)
            task.set_name(name)
        self._tasks[task] = None
        self._seen_steps.pop(task, None)
        task.add_done_callback(self._on_task_done)
        return task

    def _learn_step_wrapper(self, task: asyncio.Task[Any]) -> None:
        step = getattr(self._ready[-1], "_callback", None) if self._ready else None
        if getattr(step, "__self__", None) is task and not isinstance(step, types.MethodType):
            WorkflowLoop._step_wrapper = type(step)

    def _on_task_done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.pop(task, None)
        if task.cancelled():
            return
        if self._shutting_down:
            # Read it now: nobody else will, and "exception was never
            # retrieved" would otherwise be reported at a random later time.
            error = task.exception()
            if error is not None:
                self.call_exception_handler(
                    {
                        "message": f"task {_task_name(task)!r} raised while its run shut down",
                        "exception": error,
                        "task": task,
                    }
                )
            return
        error = task._exception  # peek: reading exception() would mark it retrieved
        if type(error) is RuntimeError and str(error).endswith(_FOREIGN_PRIMITIVE):
            # Raised synchronously by asyncio's loop-bound primitives (Event,
            # Queue, Lock...): it cannot be intercepted before workflow code
            # sees it, so it is explained once it ends the task.
            self._report_foreign(
                error,
                f"{error}: it was created or first used outside this workflow run. "
                f"{_CREATE_INSIDE}",
                task,
            )

    def _explain_foreign_await(self, error: RuntimeError) -> None:
        text = str(error)
        if text.endswith(_FOREIGN_FUTURE):
            self._report_foreign(
                error,
                f"{text}: workflow code awaited a future of another event loop, which "
                f"replay cannot repeat. {_CREATE_INSIDE}",
                asyncio.current_task(self),
            )

    def _report_foreign(
        self, error: RuntimeError, message: str, task: asyncio.Future[Any] | None
    ) -> None:
        # Why workflow code gets asyncio's RuntimeError and not the
        # NondeterministicCall itself: the C Task builds the error inside its
        # step and throws it into the coroutine; only a Python Task (a task
        # factory, several times slower per step) could throw another type,
        # and a subclass of the C Task cannot reach its step. The primitives
        # raise theirs synchronously inside workflow code. So the error keeps
        # its type (NondeterministicCall's base: `except RuntimeError` acts the
        # same) but carries the advice, and the driver finds the
        # NondeterministicCall in `errors` and can fail the run with it.
        error.args = (message,)
        self.call_exception_handler(
            {"message": message, "exception": NondeterministicCall(message), "task": task}
        )

    # -- async generators ----------------------------------------------------

    def _asyncgen_firstiter(self, agen: AsyncGenerator[Any, Any]) -> None:
        if self._asyncgens is None:
            self._asyncgens = weakref.WeakKeyDictionary()
        self._asyncgens[agen] = None

    def _asyncgen_finalizer(self, agen: AsyncGenerator[Any, Any]) -> None:
        # Called when an unfinished generator is collected; closing it in a
        # task of this loop runs its finally blocks inside the run.
        if self._asyncgens is not None:
            self._asyncgens.pop(agen, None)
        if not self._closed:
            self._start_aclose(agen)

    def _take_asyncgens(self) -> list[AsyncGenerator[Any, Any]]:
        """The open async generators first iterated here, forgotten by the loop."""
        agens = list(self._asyncgens) if self._asyncgens is not None else []
        self._asyncgens = None
        return agens

    def _start_aclose(self, agen: AsyncGenerator[Any, Any]) -> None:
        # Named apart from create_task's counter: collection of a generator in
        # a reference cycle happens at a random time, and must not shift the
        # names of the run's own tasks.
        self._aclose_count += 1
        task = asyncio.Task(
            agen.aclose(), loop=self, name=f"{self._name}-asyncgen-close-{self._aclose_count}"
        )
        self._tasks[task] = None
        task.add_done_callback(self._on_aclose_done)

    def _on_aclose_done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.pop(task, None)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            self.call_exception_handler(
                {
                    "message": "an error occurred during closing of an asynchronous generator",
                    "exception": error,
                    "task": task,
                }
            )

    async def shutdown_asyncgens(self) -> None:
        """Close every async generator first iterated on this loop and still open.

        `shutdown` does this too; workflow code rarely needs it.

        Example:
            >>> loop = WorkflowLoop(cast(TimerHost, None))
            >>> task = loop.create_task(loop.shutdown_asyncgens())
            >>> token = loop.enter(); loop.run_ready(); loop.leave(token)
            >>> task.done()
            True
        """
        agens = self._take_asyncgens()
        results = await asyncio.gather(*(agen.aclose() for agen in agens), return_exceptions=True)
        for result, agen in zip(results, agens, strict=True):
            if isinstance(result, Exception):
                self.call_exception_handler(
                    {
                        "message": f"an error occurred closing asynchronous generator {agen!r}",
                        "exception": result,
                        "asyncgen": agen,
                    }
                )

    # -- shutting down -------------------------------------------------------

    def shutdown(self) -> None:
        """End every task of the run without running its cancellation handlers, then close.

        Each pending task, newest first, gets `RunEvicted` thrown in where it
        waits, through its own wakeup (so its context and ``current_task()``
        are right), and the loop is drained; ``finally`` blocks run, and what
        they await fails at once in the next round. What tasks await is left
        alone (a journal future stays pending). Tasks that never started are
        cancelled before any of their code runs. The host hears nothing: a
        parked run keeps its timers. Then open async generators are closed
        and the loop is closed. Calling it again does nothing.

        Raises:
            RuntimeError: Called from a callback of this loop, or a task kept
                running after `RunEvicted` (it caught it and did not re-raise);
                the message names the tasks. The loop is closed anyway.

        Example:
            >>> loop = WorkflowLoop(cast(TimerHost, None))
            >>> async def forever() -> None:
            ...     try:
            ...         await loop.create_future()
            ...     except asyncio.CancelledError:
            ...         print("compensating")  # not run on shutdown
            ...     finally:
            ...         print("finally")
            >>> task = loop.create_task(forever())
            >>> token = loop.enter(); loop.run_ready(); loop.leave(token)
            >>> loop.shutdown()
            finally
            >>> task.done(), loop.is_closed()
            (True, True)
        """
        if self._closed:
            return
        if self._running:
            raise RuntimeError(
                f"workflow loop {self._name!r} cannot shut down from its own callbacks; "
                "the driver shuts it down between turns"
            )
        self._shutting_down = True
        try:
            for round_ in range(_EVICTION_ROUNDS):
                pending = self._pending_tasks()
                if not pending:
                    agens = self._take_asyncgens()
                    if not agens:
                        break
                    for agen in agens:
                        self._start_aclose(agen)
                # Newest first: a child ends before the parent that made it
                # unwinds, so a TaskGroup or gather finds it done and does not
                # cancel it (which would cancel the journal future it awaits).
                for task in reversed(pending):
                    self._evict(task, first_round=round_ == 0)
                token = self.enter()
                try:
                    self.run_ready()
                finally:
                    self.leave(token)
            stuck = self._pending_tasks()
            if stuck:
                for task in stuck:
                    # Closed now rather than by the garbage collector at some
                    # random later time; the Task object stays pending.
                    cast(Any, task)._log_destroy_pending = False
                    with contextlib.suppress(RuntimeError):  # it ignored GeneratorExit too
                        cast(Any, task).get_coro().close()
                names = ", ".join(repr(_task_name(task)) for task in stuck)
                raise RuntimeError(
                    f"task(s) {names} of workflow run {self._name!r} kept running after "
                    f"RunEvicted was thrown into them {_EVICTION_ROUNDS} times: workflow code "
                    "must not catch BaseException without re-raising it (catch Exception)"
                )
        finally:
            self._closed = True
            self._ready.clear()
            self._asyncgens = None
            # A closed loop calls neither its host nor its hooks again. It
            # lets go of both so that a finished run's objects, which refer
            # to the loop and to the host, hold no cycle through it: reference
            # counting frees them when the run ends, not the cyclic garbage
            # collector, which would walk them in every collection until then.
            self._host = _CLOSED_HOST
            self._asyncgen_hooks = (None, None)

    def _pending_tasks(self) -> list[asyncio.Future[Any]]:
        tasks = self._tasks
        if not tasks and not self._seen_steps and self._step_wrapper is not None:
            # A run that ended: its tasks left `_tasks` as they ended.
            return []
        pending = [task for task in tasks if not task.done()]
        # Tasks built with asyncio.Task(coro, loop=...) bypass create_task;
        # call_soon saw their first step (before the step's type was learnt,
        # only asyncio's list of every task can tell).
        maybe = self._seen_steps if self._step_wrapper is not None else asyncio.all_tasks(self)
        strays = [task for task in maybe if task not in tasks and not task.done()]
        return pending + sorted(strays, key=_task_name)

    def _evict(self, task: asyncio.Future[Any], *, first_round: bool) -> None:
        waiter: asyncio.Future[Any] | None = getattr(task, "_fut_waiter", None)
        if waiter is None:
            # Its next step is already queued: a task that has not started, or
            # one that yielded bare (sleep(0)). A task that has not started is
            # cancelled: no code of it has run, so no handler can catch it.
            # The other kind runs that step, and is evicted at its next await.
            if first_round and not _has_started(task):
                task.cancel()
            return
        self.throw(task, RunEvicted(f"workflow run {self._name!r} was shut down"))

    def throw(self, task: asyncio.Future[Any], exc: BaseException) -> None:
        """Makes ``task`` raise ``exc`` where it awaits, leaving the awaited thing alone.

        The task is woken through its own wakeup callback with a future that
        failed with ``exc``, as if the awaited thing had failed: the awaited
        thing (an `asyncio.Event`'s waiter, another task, a shared future) is
        not touched. It reaches a run's tasks that await only asyncio objects
        when the run is cancelled, and ends them when the run is shut down.
        """
        failed: asyncio.Future[Any] = asyncio.Future(loop=self)
        failed.set_exception(exc)
        waiter: asyncio.Future[Any] | None = getattr(task, "_fut_waiter", None)
        if waiter is None:
            return
        if waiter.done():
            for handle in self._ready:
                step = getattr(handle, "_callback", None)
                args = handle._args
                if getattr(step, "__self__", None) is task and len(args) == 1 and args[0] is waiter:
                    handle._args = (failed,)
                    return
        else:
            for callback, context in waiter._callbacks or ():
                if getattr(callback, "__self__", None) is task:
                    waiter.remove_done_callback(callback)
                    self.call_soon(callback, failed, context=context)
                    return
        # A future type that keeps its callbacks elsewhere: cancelling is the
        # only remaining way in (and runs the task's cancellation handlers).
        task.cancel(str(exc))

    def close(self) -> None:
        """Close the loop; pending tasks are ended first, as by `shutdown`.

        Example:
            >>> loop = WorkflowLoop(cast(TimerHost, None))
            >>> loop.close()
            >>> loop.is_closed(), loop.is_running()
            (True, False)
        """
        self.shutdown()

    def is_closed(self) -> bool:
        """Whether the loop was closed (by `shutdown` or `close`).

        Example:
            >>> WorkflowLoop(cast(TimerHost, None)).is_closed()
            False
        """
        return self._closed

    def is_running(self) -> bool:
        """True until the loop is closed.

        Workflow code only ever runs inside `run_ready`, so from its
        side the loop is always running; between turns it is merely waiting.
        Library code asking this wants to know whether it may call
        ``run_until_complete``, and the answer for a run's loop is no.

        Example:
            >>> WorkflowLoop(cast(TimerHost, None)).is_running()
            True
        """
        return not self._closed

    # -- settings ------------------------------------------------------------

    def get_debug(self) -> bool:
        """Whether asyncio debug mode is on (False unless `set_debug` turned it on).

        Example:
            >>> WorkflowLoop(cast(TimerHost, None)).get_debug()
            False
        """
        return self._debug

    def set_debug(self, enabled: bool) -> None:
        """Turn asyncio debug mode on or off (handles keep their creation stack).

        Example:
            >>> loop = WorkflowLoop(cast(TimerHost, None))
            >>> loop.set_debug(True)
            >>> loop.get_debug()
            True
        """
        self._debug = enabled

    def get_task_factory(self) -> _TaskFactory | None:
        """The factory `create_task` uses, or None for ``asyncio.Task``.

        Example:
            >>> WorkflowLoop(cast(TimerHost, None)).get_task_factory() is None
            True
        """
        return self._task_factory

    def set_task_factory(self, factory: _TaskFactory | None) -> None:
        """Make `create_task` call ``factory(loop, coro)`` (None: ``asyncio.Task``).

        Example:
            >>> loop = WorkflowLoop(cast(TimerHost, None))
            >>> loop.set_task_factory(None)
        """
        if factory is not None and not callable(factory):
            raise TypeError("task factory must be a callable or None")
        self._task_factory = factory

    def get_exception_handler(self) -> _ExceptionHandler | None:
        """The handler set with `set_exception_handler`, or None.

        Example:
            >>> WorkflowLoop(cast(TimerHost, None)).get_exception_handler() is None
            True
        """
        return self._exception_handler

    def set_exception_handler(self, handler: _ExceptionHandler | None) -> None:
        """Call ``handler(loop, context)`` instead of `default_exception_handler`.

        Example:
            >>> loop = WorkflowLoop(cast(TimerHost, None))
            >>> loop.set_exception_handler(lambda loop, context: print(context["message"]))
            >>> loop.call_exception_handler({"message": "boom"})
            boom
        """
        if handler is not None and not callable(handler):
            raise TypeError(f"A callable object or None is expected, got {handler!r}")
        self._exception_handler = handler

    def default_exception_handler(self, context: dict[str, Any]) -> None:
        """Append ``context`` to `errors`; the driver reports them (nothing is logged).

        Example:
            >>> loop = WorkflowLoop(cast(TimerHost, None))
            >>> loop.default_exception_handler({"message": "boom"})
            >>> loop.errors
            [{'message': 'boom'}]
        """
        self.errors.append(context)

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        """Report an error asyncio could not raise anywhere (to `errors` by default).

        Contexts whose exception is `RunEvicted` (or a group of them) are
        dropped: they are the shutdown itself, not errors.

        Example:
            >>> loop = WorkflowLoop(cast(TimerHost, None))
            >>> loop.call_exception_handler({"message": "boom", "exception": ValueError()})
            >>> [context["message"] for context in loop.errors]
            ['boom']
        """
        if _is_eviction(context.get("exception")):
            return
        handler = self._exception_handler
        if handler is None:
            self.default_exception_handler(context)
            return
        try:
            handler(self, context)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            self.default_exception_handler(
                {
                    "message": "Unhandled error in exception handler",
                    "exception": exc,
                    "context": context,
                }
            )

    # -- refused: what replay cannot repeat ----------------------------------
    # One line per method and the rule it breaks. Each raises
    # NondeterministicCall at the call, naming itself and the rule, before
    # anything starts; the async ones are plain methods here, so
    # `await loop.getaddrinfo(...)` fails at the call.

    run_forever = _refused(_DRIVEN, _AWAIT_INSTEAD)
    run_until_complete = _refused(_DRIVEN, _AWAIT_INSTEAD)
    stop = _refused(_DRIVEN, "Return from the workflow function (or raise) to end the run.")
    call_soon_threadsafe = _refused(_THREADS)
    run_in_executor = _refused(_THREADS)  # what asyncio.to_thread calls
    set_default_executor = _refused(_THREADS)
    shutdown_default_executor = _refused(_THREADS)
    getaddrinfo = _refused(_DNS)
    getnameinfo = _refused(_DNS)
    create_connection = _refused(_NETWORK)
    create_server = _refused(_NETWORK)
    create_datagram_endpoint = _refused(_NETWORK)
    create_unix_connection = _refused(_NETWORK)
    create_unix_server = _refused(_NETWORK)
    connect_accepted_socket = _refused(_NETWORK)
    sendfile = _refused(_NETWORK)
    start_tls = _refused(_NETWORK)
    connect_read_pipe = _refused(_PIPES)
    connect_write_pipe = _refused(_PIPES)
    subprocess_exec = _refused(_SUBPROCESSES)
    subprocess_shell = _refused(_SUBPROCESSES)
    add_reader = _refused(_DESCRIPTORS)
    remove_reader = _refused(_DESCRIPTORS)
    add_writer = _refused(_DESCRIPTORS)
    remove_writer = _refused(_DESCRIPTORS)
    sock_recv = _refused(_NETWORK)
    sock_recv_into = _refused(_NETWORK)
    sock_recvfrom = _refused(_NETWORK)
    sock_recvfrom_into = _refused(_NETWORK)
    sock_sendall = _refused(_NETWORK)
    sock_sendto = _refused(_NETWORK)
    sock_connect = _refused(_NETWORK)
    sock_accept = _refused(_NETWORK)
    sock_sendfile = _refused(_NETWORK)
    add_signal_handler = _refused(_SIGNALS, _SIGNALS_INSTEAD)
    remove_signal_handler = _refused(_SIGNALS, _SIGNALS_INSTEAD)


def _name_refusals(cls: type, base: type) -> None:
    """Names each of ``cls``'s refusals after its attribute, and refuses what else ``base`` has.

    A newer Python may add loop methods: they are refused too, rather than
    inherited as ``AbstractEventLoop``'s bare ``NotImplementedError``.
    """
    for name, value in vars(base).items():
        if callable(value) and not name.startswith("__") and name not in vars(cls):
            setattr(cls, name, _refused(_NO_MEANING))
    for name, value in vars(cls).items():
        if getattr(value, "__name__", None) == _UNNAMED:
            value.__name__ = name
            value.__qualname__ = f"{cls.__qualname__}.{name}"


_name_refusals(WorkflowLoop, asyncio.AbstractEventLoop)


def _is_eviction(error: object) -> bool:
    # A TaskGroup whose tasks were evicted raises a group of RunEvicted.
    if isinstance(error, BaseExceptionGroup):
        return error.split(RunEvicted)[1] is None
    return isinstance(error, RunEvicted)


def _task_name(task: asyncio.Future[Any]) -> str:
    get_name = getattr(task, "get_name", None)
    return str(get_name()) if get_name is not None else repr(task)


def _has_started(task: asyncio.Future[Any]) -> bool:
    get_coro = getattr(task, "get_coro", None)
    coro = get_coro() if get_coro is not None else None
    if inspect.iscoroutine(coro):
        return inspect.getcoroutinestate(coro) != inspect.CORO_CREATED
    if inspect.isgenerator(coro):
        return inspect.getgeneratorstate(coro) != inspect.GEN_CREATED
    return True


# -- eager start ---------------------------------------------------------------
# A step's task (fusee.engine._steps) on the engine's own asyncio loop, not on
# a WorkflowLoop: the task runs at once, up to its coroutine's first
# suspension, so a step that returns at once costs no loop iteration.

if sys.version_info >= (3, 12):

    def start_eagerly(
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, None],
        context: contextvars.Context,
    ) -> asyncio.Task[None] | None:
        """Runs ``coro`` in a new task of ``loop`` at once, up to its first suspension.

        The task is the current task from the coroutine's first line to its
        end, and its context is ``context``: what the code binds to its task
        (an anyio cancel scope, ``asyncio.timeout``) and its context
        variables hold on every path. On Python 3.11, which has no eager
        tasks, the start is emulated (the definition below).

        Returns:
            The task, or None if the coroutine ended before suspending (the
            task ended as the coroutine did: its errors are its own to catch).

        Example:
            >>> async def main() -> bool:
            ...     async def work() -> None:
            ...         seen.append(asyncio.current_task())
            ...     seen: list[object] = []
            ...     context = contextvars.copy_context()
            ...     task = start_eagerly(asyncio.get_running_loop(), work(), context)
            ...     return task is None and seen[0] is not None
            >>> asyncio.run(main())
            True
        """
        task = asyncio.Task(coro, loop=loop, context=context, eager_start=True)
        return None if task.done() else task

else:
    _current_tasks: dict[asyncio.AbstractEventLoop, asyncio.Task[Any]] = cast(
        Any, asyncio.tasks
    )._current_tasks
    # The first step of the task being made (`_hold`).
    _held: list[Callable[[], object]] = []

    def _hold(
        step: Callable[[], object], *args: Any, context: contextvars.Context | None = None
    ) -> None:
        _held.append(step)

    def start_eagerly(
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, None],
        context: contextvars.Context,
    ) -> asyncio.Task[None] | None:
        """`start_eagerly` on Python 3.11 (no eager tasks): the task's first step is taken here.

        A task's constructor schedules its first step with ``loop.call_soon``;
        for the length of the constructor the loop's own ``call_soon`` is
        shadowed by `_hold`, which keeps the step instead, and the step is
        then taken at once, in the task's context, as the loop would take
        it: asyncio's own step makes the task the current task (the
        caller's task, if any, is set aside meanwhile) and runs the
        coroutine to its first suspension, where the task waits on what it
        awaits, or to its end. A loop with no instance attributes
        (uvloop's) gets an ordinary task, started by the loop.
        """
        own = getattr(loop, "__dict__", None)
        if own is None or "call_soon" in own:
            return loop.create_task(coro, context=context)
        own["call_soon"] = _hold
        try:
            # Not loop.create_task: as on 3.12, no task factory makes it.
            task: asyncio.Task[None] = asyncio.Task(coro, loop=loop, context=context)
        except BaseException:
            _held.clear()  # the next task's step must not be taken for this one's
            raise
        finally:
            del own["call_soon"]
        step = _held.pop()
        outer = _current_tasks.pop(loop, None)
        try:
            context.run(step)
        finally:
            if outer is not None:
                _current_tasks[loop] = outer
        return None if task.done() else task
