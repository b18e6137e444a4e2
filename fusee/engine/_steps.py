"""The step executor: runs step functions, retries them, pauses them.

A step function runs only once its run's journal is durable through the
step's gate (unless the step is read-only) and its retry time has come.
Failures are retried per the step's `fusee.Retry`; when the attempts run out
the step (and so the run) is paused until ``run.resume()``.

The executor knows the engine only through `StepHost`: where results go,
the clock, and the committer's durability.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import threading
import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Protocol, cast

import anyio.to_thread

from fusee import _codec
from fusee._driver import error_payload
from fusee._loop import start_eagerly
from fusee._stepfn import code_deciding, mark_returns_awaitable, returns_awaitable, takes_arg
from fusee.context import CancelFlag, StepCtx, _current_step, _LaterStepCtx
from fusee.engine._slowsteps import AttemptWatch, expected_s, slow_step_default_s
from fusee.errors import Failure, PayloadError, PayloadTooLarge, StoreError
from fusee.record import PAUSED, Status
from fusee.remote import CompletionToken

if TYPE_CHECKING:
    from fusee._runtime import StepCall
    from fusee.engine._clock import Clock
    from fusee.engine._commit import Committer
    from fusee.engine._hooks import Hooks
    from fusee.engine._state import RunState
    from fusee.engine._streams import StepStream

__all__ = ["StepExecutor", "StepHost"]

log = logging.getLogger("fusee")

_OK = Status.OK
_FAILED = Status.FAILED


class StepTimeout(Exception):
    """A step attempt ran longer than its ``timeout``."""


class StepHost(Protocol):
    """What the step executor needs from the engine."""

    @property
    def committer(self) -> Committer:
        """Durability: a step runs once its gate is durable."""
        ...

    @property
    def clock(self) -> Clock:
        """The engine's clock (retry times)."""
        ...

    @property
    def hooks(self) -> Hooks:
        """Mocks, the step log and the busy count of the test host."""
        ...

    @property
    def closed(self) -> bool:
        """Whether the engine is closed (nothing new may start)."""
        ...

    async def sleep_until(self, at_ms: int) -> None:
        """Sleeps on the engine's clock."""
        ...

    def step_result(self, state: RunState, seq: int, status: Status, payload: bytes) -> None:
        """A step ended for good: its result (or failure) goes to the run."""
        ...

    def step_paused(self, state: RunState) -> None:
        """A step ran out of attempts: the run is paused until resumed."""
        ...

    def token_out(self, state: RunState, seq: int) -> None:
        """An await_completion's token function returned: the run waits for the token."""
        ...

    def heartbeat(self, state: RunState, seq: int, data: bytes) -> None:
        """A step's heartbeat, on the engine's loop."""
        ...

    def step_stream(self, state: RunState, seq: int, name: str) -> StepStream:
        """A stream step ``seq`` writes."""
        ...


class _EngineStepCtx(StepCtx):
    """The `StepCtx` the engine hands a step: its hooks are methods, not closures.

    One is made per attempt (a StepCtx of closures cost about a tenth of a
    trivial step's time). Its ``key`` is made when first asked for: most
    steps never ask.
    """

    __slots__ = ("_executor", "_seq", "_state", "beat_ms", "live", "task", "thread_id")

    def __init__(
        self,
        executor: StepExecutor,
        state: RunState,
        seq: int,
        attempt: int,
        token: str | None,
    ) -> None:
        self.attempt = attempt
        self.token = token
        self.cancelled = CancelFlag()
        self._executor = executor
        self._state = state
        self._seq = seq
        # When the attempt last showed life (its start, then each heartbeat),
        # on the engine's clock; and whether it is still the current attempt.
        # Set when a bounded attempt starts (`_bounded`); 0 for the rest.
        self.beat_ms = 0
        self.live = True
        # Where the attempt's code runs, for a report of a slow attempt: its
        # worker thread's id while a sync one runs there, else its task.
        self.thread_id = 0
        self.task: asyncio.Future[Any] | None = None

    # A read-only property over the base class's attribute: only the engine makes these.
    @property
    def key(self) -> str:  # type: ignore[override]
        return self._state.driver.machine.key(self._seq)

    def end(self) -> None:
        """The attempt is over or abandoned: its later heartbeats are ignored."""
        self.live = False

    @property
    def progress(self) -> Any:
        p = self._state.driver.machine.progress(self._seq)
        return None if p is None else _codec.decode(p)

    def heartbeat(self, progress: Any = None) -> None:
        data = _codec.encode(progress, name="the heartbeat's progress")
        ex = self._executor
        if threading.get_ident() == ex.thread_id:
            self._beat(data)
        else:
            ex.loop.call_soon_threadsafe(self._beat, data)

    def _beat(self, data: bytes) -> None:
        # On the engine's loop. An attempt that timed out may still run in
        # its thread: its progress must not become the next attempt's.
        if not self.live:
            return
        self.beat_ms = self._executor.host.clock.now_ms()
        self._executor.host.heartbeat(self._state, self._seq, data)

    def stream(self, name: str) -> StepStream:
        return self._executor.host.step_stream(self._state, self._seq, name)


class _EagerStepCtx(_LaterStepCtx):
    """The current step of an eager attempt whose function takes no `StepCtx`.

    Its `_EngineStepCtx` is made if the code asks for it (`fusee.current_step`)
    or the attempt goes on past its first suspension (`_run_step` holds it,
    to cancel it).
    """

    __slots__ = ("_call", "_executor", "_state")

    def __init__(self, executor: StepExecutor, state: RunState, call: StepCall) -> None:
        self.made = None
        self._executor = executor
        self._state = state
        self._call = call

    def make(self) -> _EngineStepCtx:
        return self._executor._step_ctx(self._state, self._call, self._call.attempt)


def _made(current: _EngineStepCtx | _EagerStepCtx) -> _EngineStepCtx:
    """The attempt's `_EngineStepCtx`, made now if it was not yet."""
    if isinstance(current, _EagerStepCtx):
        return cast(_EngineStepCtx, current.get())
    return current


# What an eager first attempt left for `_run_step` to finish in the same
# task: ("suspended", (coroutine, yielded)), ("awaitable", awaitable) or
# ("raised", exception), and the attempt's StepCtx (the one its code holds:
# its `cancelled` flag is the one to set).
_First = tuple[str, Any, "_EngineStepCtx"]


class StepExecutor:
    """Runs the steps of every loaded run for one engine.

    Example:
        See `fusee.engine.Engine`, which makes one and hands it each step.
    """

    def __init__(self, host: StepHost, loop: asyncio.AbstractEventLoop) -> None:
        self.host = host
        # The engine's max_payload: a result over it fails its step.
        self.max_payload: int | None = None
        self.loop = loop
        # The loop's thread: a step's heartbeat from any other goes through the loop.
        self.thread_id = threading.get_ident()
        # Attempts bounded on the engine's clock running in a worker thread now.
        self.bounded_threads = 0
        # Each running step task's position and current attempt.
        self._attempts: dict[asyncio.Task[Any], tuple[int, _EngineStepCtx]] = {}
        # Each tracked step task's run (`_track`, `_task_done`).
        self._runs_of: dict[asyncio.Task[Any], RunState] = {}
        # How long an attempt with no heartbeat_timeout or timeout may go
        # with no heartbeat before it is reported (fusee.engine._slowsteps).
        self.slow_step_s = slow_step_default_s()
        # The inline step blocking the loop now, if any: (since, run id, step
        # name), read by the watchdog's thread.
        self.inline_running: tuple[float, str, str] | None = None
        # The first call in a worker thread of each sync step code, by code
        # object: resolved when it returns, and kept (`_in_worker_thread`).
        self.probes: dict[types.CodeType, asyncio.Future[None]] = {}

    def run(self, state: RunState, call: StepCall) -> None:
        """Runs ``call`` for ``state``'s run in a task of its own, once its gate is durable."""
        host = self.host
        mocks = host.hooks.mocks
        # Whether the first attempt may start eagerly (`_eager`): an async
        # step with no timeout and no delay, not mocked.
        if (
            call.timeout_s is None
            and call.not_before_ms == 0
            and (call.is_async or returns_awaitable(call.fn))
            and not (mocks and (state.workflow.name, call.name) in mocks)
        ):
            # Its task starts once its gate is durable, from the committer's
            # release (never inside this turn: the step is not workflow
            # code), in the context a task made here would copy: the code
            # sees the same context variables on every path.
            context = contextvars.copy_context()
            gate = state.driver.machine.gate
            committer = host.committer
            if call.read_only or gate <= committer.durable_lsn:
                self.loop.call_soon(self._eager, state, call, context)
            else:
                committer.on_durable(gate, functools.partial(self._eager, state, call, context))
            return
        self._track(self.loop.create_task(self._run_step(state, call, None)), state)

    def _eager(self, state: RunState, call: StepCall, context: contextvars.Context) -> None:
        """Starts the task of a step whose gate is durable; it runs at once, as that task.

        The task runs the attempt from its first line to its end: anything
        the code binds to its task (a cancel scope, ``asyncio.timeout``)
        holds. It starts eagerly, here (`fusee._loop.start_eagerly`): a
        coroutine that returns without suspending is done before this
        returns, with no loop iteration before its result, and is never
        tracked.
        """
        if not state.loaded:
            return
        task = start_eagerly(self.loop, self._run_first(state, call), context)
        if task is not None:
            self._track(task, state)

    async def _run_first(self, state: RunState, call: StepCall) -> None:
        """The task of a step whose first attempt starts at once: it finishes in this task."""
        try:
            first = self._run_eagerly(state, call)
        except Exception:
            # The executor's own error (an attempt's are caught): reported
            # with the step and run it concerns.
            log.exception("fusee step %r of run %r failed to start", call.name, state.id)
            return
        if first is not None:
            await self._run_step(state, call, first)

    def _track(self, task: asyncio.Task[None], state: RunState) -> None:
        state.steps.add(task)
        self._runs_of[task] = state
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        _failed(task)
        state = self._runs_of.pop(task)
        state.steps.discard(task)
        self._attempts.pop(task, None)
        if not state.steps:
            state.driver.host.turned(state.driver)

    def _step_ctx(self, state: RunState, call: StepCall, attempt: int) -> _EngineStepCtx:
        m = state.driver.machine
        seq = call.seq
        token = None
        if call.is_await:
            token_attempt = m.await_attempt(seq)
            if token_attempt is not None:
                token = str(CompletionToken(state.id, state.run, seq, token_attempt))
        return _EngineStepCtx(self, state, seq, attempt, token)

    def _ended(self, state: RunState, seq: int) -> bool:
        """Whether the run no longer wants step ``seq`` (delivered, dropped, parked, closed)."""
        return not state.driver.machine.step_pending(seq) or state.driver.loop.is_closed()

    def _run_eagerly(self, state: RunState, call: StepCall) -> _First | None:
        """The first attempt of an async step, up to its coroutine's first suspension.

        Called in the step's task (`_run_first`), as it starts, before it is
        tracked. Most step coroutines return without suspending: their
        result then goes to the run with none of `_run_step`'s bookkeeping
        and no loop iteration of their own. Returns None when the attempt is finished
        (or the run no longer wants it), else what `_run_step` must finish,
        in this same task.
        """
        host = self.host
        seq = call.seq
        if host.closed or self._ended(state, seq) or host.committer.failed is not None:
            return None
        tel = state.telemetry
        sctx: _EngineStepCtx | None = None
        if call.takes_ctx or call.is_await or tel is not None:
            sctx = self._step_ctx(state, call, call.attempt)
        # Else the function takes none: one is made only if its code asks.
        current = sctx if sctx is not None else _EagerStepCtx(self, state, call)
        hooks = host.hooks
        if hooks.step_log is not None:
            hooks.step_started(state.id, state.run, seq)
        if tel is not None:
            assert sctx is not None
            tel.attempt_started(call, sctx)
            span_token = tel.enter(sctx)
        token = _current_step.set(current)
        try:
            result = call.fn(sctx) if call.takes_ctx else call.fn()
            if type(result) is types.CoroutineType or inspect.iscoroutine(result):
                try:
                    yielded = result.send(None)
                except StopIteration as stop:
                    result = stop.value
                else:
                    return ("suspended", (result, yielded), _made(current))
            elif inspect.isawaitable(result):
                return ("awaitable", result, _made(current))
            payload = _encode_result(call, result, self.max_payload)
        except Exception as e:
            return ("raised", e, _made(current))
        finally:
            _current_step.reset(token)
            if tel is not None:
                tel.leave(span_token)
        if tel is not None:
            assert sctx is not None
            tel.attempt_ended(sctx, None, "waiting" if call.is_await else "ok")
        if call.is_await:
            host.token_out(state, seq)
        else:
            host.step_result(state, seq, _OK, payload)
        return None

    async def _run_step(self, state: RunState, call: StepCall, first: _First | None) -> None:
        """Runs one step to its final result (or until the run no longer wants it).

        ``first``: what an eager first attempt left to finish: a coroutine that
        suspended, an awaitable, or the exception it raised.
        """
        host = self.host
        hooks = host.hooks
        driver = state.driver
        m = driver.machine
        seq = call.seq
        gate = m.gate
        attempt = call.attempt
        not_before = call.not_before_ms
        fn = hooks.mock(driver.workflow.name, call.name) or call.fn
        takes_ctx = call.takes_ctx if fn is call.fn else takes_arg(fn)
        me = asyncio.current_task()
        tel = state.telemetry
        while True:
            runner: Awaitable[Any]
            first_done = first is None
            if first is not None:
                # The eager first attempt ran already: finish it, do not call again.
                sctx = first[2]
                runner = _finish_first(first, sctx)
                first = None
            else:
                if not_before == PAUSED:
                    await state.resumed.wait()
                    if self._ended(state, seq):
                        return
                    attempt = 1
                    not_before = 0
                    gate = m.gate
                    continue
                if not call.read_only and not host.committer.is_durable(gate):
                    try:
                        await host.committer.durable(gate, bounded=False)
                    except StoreError:
                        # The store failed (reported once, by the engine):
                        # nothing the run did since may act. Reopening
                        # recovers it.
                        return
                if not_before > host.clock.now_ms():
                    await host.sleep_until(not_before)
                if self._ended(state, seq):
                    return
                if host.committer.failed is not None:
                    # The store failed: what the run did since its last good
                    # write is lost, so nothing may act on it. Reopening
                    # recovers the run.
                    return
                sctx = self._step_ctx(state, call, attempt)
                hooks.step_started(driver.id, driver.run, seq)
                if tel is not None:
                    tel.attempt_started(call, sctx)
                runner = _invoke(fn, takes_ctx, call, sctx)
            if me is not None:
                self._attempts[me] = (seq, sctx)
            # The attempt's span is the current one while its code runs
            # (this task's context, which its worker thread copies).
            span_token = tel.enter(sctx) if tel is not None else None
            # An attempt bounded on the engine's clock is not "busy" to the
            # test host: its advance() moves virtual time past it instead of
            # waiting in real time for an attempt that may never end. One in
            # a worker thread is working, though: a run's result() lets it
            # finish before skipping idle time to its deadline.
            bounded = call.timeout_s is not None or call.heartbeat_timeout_s is not None
            busy = 0 if bounded else 1
            threaded = int(bounded and runner_in_thread(fn, call) and first_done)
            hooks.busy_steps += busy
            self.bounded_threads += threaded
            sctx.task = me
            watch = AttemptWatch(host.clock, state, call, sctx, expected_s(call, self.slow_step_s))
            try:
                try:
                    result = await self._bounded(runner, call, sctx)
                    payload = _encode_result(call, result, self.max_payload)
                finally:
                    watch.stop()
                    hooks.busy_steps -= busy
                    self.bounded_threads -= threaded
                    sctx.end()
                    if tel is not None:
                        tel.leave(span_token)
            except asyncio.CancelledError:
                sctx.cancelled.set()
                if tel is not None:
                    tel.attempt_ended(sctx, None, "cancelled")
                raise
            except Exception as e:
                if self._ended(state, seq):
                    if tel is not None:
                        tel.attempt_ended(sctx, e, "cancelled")
                    return
                if isinstance(e, (Failure | PayloadError, call.retry.non_retryable)):
                    if tel is not None:
                        tel.attempt_ended(sctx, e, "failed")
                    self._deliver(me, state, seq, _FAILED, error_payload(e))
                    return
                err = error_payload(e)
                if attempt >= call.retry.attempts:
                    if call.retry.on_exhausted == "fail":
                        if tel is not None:
                            tel.attempt_ended(sctx, e, "failed")
                        self._deliver(me, state, seq, _FAILED, err)
                        return
                    if tel is not None:
                        tel.attempt_ended(sctx, e, "paused")
                    driver.append(m.step_retry(seq, PAUSED, err))
                    host.step_paused(state)
                    not_before = PAUSED
                    continue
                if tel is not None:
                    tel.attempt_ended(sctx, e, "retry")
                retry_at = host.clock.now_ms() + round(call.retry.delay_s(attempt) * 1000)
                driver.append(m.step_retry(seq, retry_at, err))
                gate = m.gate
                attempt += 1
                not_before = retry_at
                continue
            if tel is not None:
                tel.attempt_ended(sctx, None, "waiting" if call.is_await else "ok")
            if self._ended(state, seq):
                return
            if call.is_await:
                if me is not None:
                    self._attempts.pop(me, None)
                host.token_out(state, seq)
            else:
                self._deliver(me, state, seq, _OK, payload)
            return

    def _deliver(
        self, me: asyncio.Task[Any] | None, state: RunState, seq: int, status: Status, data: bytes
    ) -> None:
        # The step is done: the turn this result starts must not take it
        # for a dropped step.
        if me is not None:
            self._attempts.pop(me, None)
        self.host.step_result(state, seq, status, data)

    async def _bounded(self, runner: Awaitable[Any], call: StepCall, sctx: _EngineStepCtx) -> Any:
        """Awaits one attempt, failing it when it outlives its limits on the engine's clock.

        ``timeout`` counts from the attempt's start, ``heartbeat_timeout``
        from its start and from each heartbeat. The engine's clock (virtual
        under the test host) decides, not asyncio's. An attempt that runs
        past its limit is cancelled (a sync one is abandoned in its thread,
        its result and heartbeats ignored) and awaited.
        """
        timeout_s = call.timeout_s
        beat_s = call.heartbeat_timeout_s
        if timeout_s is None and beat_s is None:
            return await runner
        host = self.host
        clock = host.clock
        started = clock.now_ms()
        sctx.beat_ms = started
        task: asyncio.Future[Any] = asyncio.ensure_future(runner)
        sctx.task = task
        try:
            while True:
                limits = []
                if timeout_s is not None:
                    limits.append((started + round(timeout_s * 1000), "ran longer than", timeout_s))
                if beat_s is not None:
                    limits.append(
                        (sctx.beat_ms + round(beat_s * 1000), "sent no heartbeat for", beat_s)
                    )
                at, what, limit_s = min(limits, key=lambda x: x[0])
                if clock.now_ms() >= at:
                    raise StepTimeout(
                        f"step '{call.name}' attempt {sctx.attempt} {what} {limit_s:g}s"
                    )
                sleeper = asyncio.ensure_future(host.sleep_until(at))
                try:
                    await asyncio.wait([task, sleeper], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not sleeper.done():
                        sleeper.cancel()
                        await asyncio.wait([sleeper])
                if task.done():
                    return task.result()
        finally:
            if not task.done():
                sctx.end()
                sctx.cancelled.set()
                task.cancel()
                await asyncio.wait([task])
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: an abandoned attempt's error is not "never retrieved"

    def drop_unwanted(self, state: RunState) -> None:
        """Cancels the step tasks of ``state`` that its run no longer wants.

        A step the code dropped (a lost race, a timeout, a cancel) or whose
        run ended: its attempt's ``s.cancelled`` is set and its task is
        cancelled; the task stays referenced until it has run its cleanup.
        """
        ended = state.driver.end is not None
        for task in list(state.steps):
            held = self._attempts.get(task)
            seq = held[0] if held is not None else None
            if seq is None and not ended:
                continue
            if ended or (seq is not None and self._ended(state, seq)):
                if held is not None:
                    held[1].cancelled.set()
                self._attempts.pop(task, None)
                task.cancel()


def _undeclared(
    call: StepCall, result: Any, kind: str, path: str, record: object, hint: str
) -> PayloadError:
    """The error of a step whose result holds a typed record but declares no result type."""
    name = type(record).__qualname__
    what = f"a {kind} ({name})"
    if path:
        what = f"a {type(result).__name__} holding {what} at {path}"
    return PayloadError(
        f"step '{call.name}' returned {what} but declares no result type, so it would come "
        "back as a dict; annotate the step function's return type, or pass "
        f"result_type={hint} to ctx.step"
    )


def _failed(task: asyncio.Task[None]) -> None:
    """Logs the error a step task ended with: an executor's bug (attempts' errors are caught)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("fusee step task failed", exc_info=task.exception())


def _encode_result(call: StepCall, result: Any, limit: int | None) -> bytes:
    """A step's result as bytes; refused if its type would be lost on the way back.

    With no declared type the result comes back as its plain shape (a
    dataclass as a dict), while the workflow's types say otherwise. A result
    over ``limit`` bytes (``max_payload``) fails the step: it never reaches
    the journal.
    """
    if not call.declared and not call.is_await:
        found = _codec.structured_part(result)
        if found is not None:
            raise _undeclared(call, result, *found)
    try:
        data = _codec.encode(result)
    except PayloadError:
        # Again, for the message: it names the step. Not built for every result.
        data = _codec.encode(result, name=f"the result of step '{call.name}'")
    if limit is not None and len(data) > limit:
        raise PayloadTooLarge(f"the result of step '{call.name}'", len(data), limit)
    return data


async def _finish_first(first: _First, sctx: StepCtx) -> Any:
    kind, obj, _ = first
    if kind == "raised":
        raise obj
    token = _current_step.set(sctx)
    try:
        if kind == "suspended":
            return await _Resume(*obj)
        return await obj
    finally:
        _current_step.reset(token)


class _Resume:
    """Awaits the rest of a coroutine that already ran to its first suspension."""

    __slots__ = ("_coro", "_yielded")

    def __init__(self, coro: Coroutine[Any, Any, Any], yielded: Any) -> None:
        self._coro = coro
        self._yielded = yielded

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self._coro
        to_yield = self._yielded
        while True:
            try:
                sent = yield to_yield
            except BaseException as e:  # a cancellation (or error) thrown into the task
                try:
                    to_yield = coro.throw(e)
                except StopIteration as stop:
                    return stop.value
                continue
            try:
                to_yield = coro.send(sent)
            except StopIteration as stop:
                return stop.value


async def _invoke(fn: Callable[..., Any], takes_ctx: bool, call: StepCall, sctx: StepCtx) -> Any:
    args = (sctx,) if takes_ctx else ()
    token = _current_step.set(sctx)
    try:
        return await _call(fn, args, call, sctx)
    finally:
        _current_step.reset(token)


def runner_in_thread(fn: Callable[..., Any], call: StepCall) -> bool:
    """Whether an attempt of ``fn`` runs in a worker thread (not on the loop)."""
    return not (call.is_async or call.inline or returns_awaitable(fn))


async def _call(
    fn: Callable[..., Any], args: tuple[Any, ...], call: StepCall, sctx: StepCtx
) -> Any:
    if not runner_in_thread(fn, call):
        if call.inline and isinstance(sctx, _EngineStepCtx):
            # On the loop, which it blocks until it returns: the watchdog's
            # thread reports one that blocks too long.
            executor = sctx._executor
            executor.inline_running = (time.monotonic(), sctx._state.id, call.name)
            try:
                result = fn(*args)
            finally:
                executor.inline_running = None
        else:
            result = fn(*args)
    else:
        result = await _in_worker_thread(fn, args, sctx)
    if inspect.isawaitable(result):
        result = await result
    return result


# How long a call of sync step code waits for the first call of the same code
# to come back from its worker thread (`_in_worker_thread`).
_PROBE_WAIT_S = 0.05


async def _in_worker_thread(fn: Callable[..., Any], args: tuple[Any, ...], sctx: StepCtx) -> Any:
    """Calls sync ``fn`` in a worker thread, or on the loop once it is seen to return an awaitable.

    A sync callable not yet seen to return an awaitable runs in a worker
    thread, since it may block. A lambda around an async call is seen to
    return one when its first call comes back; until then every call of it
    would go to a thread too, and hundreds of runs recovered at once would
    queue for the 40 worker threads, one hop each. So the first call of each
    code is a probe (`StepExecutor.probes`), and a call made while it is in
    its thread waits for it a moment (`_PROBE_WAIT_S`): a lambda comes back
    at once, and the waiting calls then run on the loop; a step that blocks
    costs them that moment only.
    """
    probes = sctx._executor.probes if isinstance(sctx, _EngineStepCtx) else {}
    code = code_deciding(fn)
    probe = None
    if code is not None:
        pending = probes.get(code)
        if pending is None:
            probe = probes[code] = asyncio.get_running_loop().create_future()
        elif not pending.done():
            await asyncio.wait((pending,), timeout=_PROBE_WAIT_S)
            if returns_awaitable(fn):
                return fn(*args)
    ctx = contextvars.copy_context()
    try:
        # Abandoned on cancel: a thread cannot be interrupted, so a timed-out
        # or dropped sync attempt runs on there, its result ignored.
        result = await anyio.to_thread.run_sync(
            ctx.run, _in_thread, sctx, fn, *args, abandon_on_cancel=True
        )
    except BaseException:
        if code is not None and probe is not None:
            del probes[code]  # the next call probes again
            probe.set_result(None)
        raise
    if inspect.isawaitable(result):
        mark_returns_awaitable(fn)
    if probe is not None:
        # Kept, resolved: later calls of this code neither wait nor probe.
        probe.set_result(None)
    return result


def _in_thread(sctx: StepCtx, fn: Callable[..., Any], *args: Any) -> Any:
    """Runs a sync step in its worker thread, noting the thread for a slow attempt's report."""
    if not isinstance(sctx, _EngineStepCtx):
        return fn(*args)
    sctx.thread_id = threading.get_ident()
    try:
        return fn(*args)
    finally:
        sctx.thread_id = 0
