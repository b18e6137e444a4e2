"""The step executor: runs step functions, retries them, pauses them.

A step function runs only once its run's journal is durable through the
step's gate (unless the step is read-only) and its retry time has come.
Failures are retried per the step's `fusee.Retry`; when the attempts run out
the step (and so the run) is paused until ``run.resume()``.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from fusee import _codec
from fusee._driver import error_payload
from fusee.context import StepCtx, _current_step
from fusee.errors import Failure, PayloadError
from fusee.record import PAUSED, Status

if TYPE_CHECKING:
    from fusee._driver import StepCall
    from fusee.engine._engine import Engine, _RunState

__all__ = ["run_step"]

_OK = Status.OK
_FAILED = Status.FAILED

# Code objects of sync callables that turned out to return an awaitable (a
# lambda around an async call): calling them only builds the coroutine, so
# they are called on the loop from then on, without a thread hop.
_RETURNS_AWAITABLE: set[object] = set()


class StepTimeout(Exception):
    """A step attempt ran longer than its ``timeout``."""


async def run_step(
    engine: Engine, state: _RunState, call: StepCall, first: _First | None = None
) -> None:
    """Runs one step to its final result (or until the run no longer wants it).

    ``first``: what an eager first attempt (`run_eagerly`) left to finish: a
    coroutine that suspended, an awaitable, or the exception it raised.
    """
    driver = state.driver
    m = driver.machine
    seq = call.seq
    gate = m.gate
    attempt = call.attempt
    not_before = call.not_before_ms
    fn = engine.mocks.get((driver.workflow.name, call.name), call.fn)
    takes_ctx = call.takes_ctx if fn is call.fn else _takes_arg(fn)
    while True:
        runner: Awaitable[Any]
        if first is not None:
            # The eager first attempt ran already: finish it, do not call again.
            runner = _finish_first(first, engine._step_ctx(state, call, attempt))
            first = None
        else:
            if not_before == PAUSED:
                await state.resumed.wait()
                if not m.step_pending(seq) or driver.loop.is_closed():
                    return
                attempt = 1
                not_before = 0
                gate = m.gate
                continue
            if not call.read_only and not engine.committer.is_durable(gate):
                await engine.committer.durable(gate)
            now = engine.clock.now_ms()
            if not_before > now:
                await engine._sleep_until(not_before)
            if not m.step_pending(seq) or driver.loop.is_closed():
                return
            if engine.committer.failed is not None:
                # The store failed: what the run did since its last good write
                # is lost, so nothing may act on it. Reopening recovers the run.
                return
            sctx = engine._step_ctx(state, call, attempt)
            if engine.step_log is not None:
                engine.step_log.append((engine.life, (driver.id, driver.run, seq)))
            runner = _invoke(fn, takes_ctx, call, sctx)
        engine.busy_steps += 1
        try:
            try:
                result = await runner
                payload = _codec.encode(result, name=f"the result of step '{call.name}'")
            finally:
                engine.busy_steps -= 1
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if not m.step_pending(seq) or driver.loop.is_closed():
                return
            if isinstance(e, (Failure | PayloadError, call.retry.non_retryable)):
                engine._step_result(state, seq, _FAILED, error_payload(e))
                return
            err = error_payload(e)
            if attempt >= call.retry.attempts:
                driver.append(m.step_retry(seq, PAUSED, err))
                engine._paused(state)
                not_before = PAUSED
                continue
            retry_at = engine.clock.now_ms() + round(call.retry.delay_s(attempt) * 1000)
            driver.append(m.step_retry(seq, retry_at, err))
            gate = m.gate
            attempt += 1
            not_before = retry_at
            continue
        if not m.step_pending(seq) or driver.loop.is_closed():
            return
        if call.is_await:
            engine._token_out(state, seq)
        else:
            engine._step_result(state, seq, _OK, payload)
        return


# What an eager first attempt left: ("suspended", (coroutine, yielded)),
# ("awaitable", awaitable) or ("raised", exception).
_First = tuple[str, Any]


def eager_ok(call: StepCall) -> bool:
    """Whether a step's first attempt may run eagerly (`run_eagerly`)."""
    if call.timeout_s is not None or call.not_before_ms != 0:
        return False
    if call.is_async:
        return True
    code = getattr(call.fn, "__code__", None)
    return code is not None and code in _RETURNS_AWAITABLE


def run_eagerly(engine: Engine, state: _RunState, call: StepCall) -> _First | None:
    """The first attempt of an async step, called at once on the engine's loop.

    Called once the step's gate is durable. Most step coroutines return
    without suspending: their result then goes to the run with no task, no
    future and no loop iteration of their own (what Python 3.12 calls an
    eager task). Returns None when the attempt is finished (or the run no
    longer wants it), else what a task must finish (`run_step`'s ``first``).
    """
    driver = state.driver
    m = driver.machine
    seq = call.seq
    if (
        engine._closed
        or not m.step_pending(seq)
        or driver.loop.is_closed()
        or engine.committer.failed is not None
    ):
        return None
    sctx = engine._step_ctx(state, call, call.attempt)
    if engine.step_log is not None:
        engine.step_log.append((engine.life, (driver.id, driver.run, seq)))
    token = _current_step.set(sctx)
    try:
        result = call.fn(sctx) if call.takes_ctx else call.fn()
        if type(result) is types.CoroutineType or inspect.iscoroutine(result):
            try:
                yielded = result.send(None)
            except StopIteration as stop:
                result = stop.value
            else:
                return ("suspended", (result, yielded))
        elif inspect.isawaitable(result):
            return ("awaitable", result)
        payload = _codec.encode(result, name=f"the result of step '{call.name}'")
    except Exception as e:
        return ("raised", e)
    finally:
        _current_step.reset(token)
    if call.is_await:
        engine._token_out(state, seq)
    else:
        engine._step_result(state, seq, _OK, payload)
    return None


async def _finish_first(first: _First, sctx: StepCtx) -> Any:
    kind, obj = first
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


def _takes_arg(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for p in params
    )


async def _invoke(fn: Callable[..., Any], takes_ctx: bool, call: StepCall, sctx: StepCtx) -> Any:
    args = (sctx,) if takes_ctx else ()
    token = _current_step.set(sctx)
    try:
        if call.timeout_s is None:
            return await _call(fn, args, call)
        try:
            async with asyncio.timeout(call.timeout_s):
                return await _call(fn, args, call)
        except TimeoutError:
            raise StepTimeout(
                f"step '{call.name}' attempt {sctx.attempt} ran longer than {call.timeout_s}s"
            ) from None
    finally:
        _current_step.reset(token)


async def _call(fn: Callable[..., Any], args: tuple[Any, ...], call: StepCall) -> Any:
    code = getattr(fn, "__code__", None)
    if call.is_async or call.inline or (code is not None and code in _RETURNS_AWAITABLE):
        result = fn(*args)
    else:
        ctx = contextvars.copy_context()
        result = await anyio.to_thread.run_sync(ctx.run, fn, *args)
        if inspect.isawaitable(result) and code is not None:
            _RETURNS_AWAITABLE.add(code)
    if inspect.isawaitable(result):
        result = await result
    return result
