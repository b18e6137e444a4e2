"""The step executor: retries on the engine's clock, pausing, resuming, timeouts, heartbeats.

Every test runs on the memory store and on SQLite, live and then again after
a crash, and counts the step function's invocations.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Any

import pytest

import fusee
from fusee.engine import _steps

from .conftest import Host, step_runs

pytestmark = pytest.mark.asyncio

HOUR_MS = 3_600_000
# A new number for each code object a test compiles (see its use).
_FRESH_CODE = itertools.count(1)


class Flaky:
    """A step function that fails its first ``failures`` calls, noting each call."""

    def __init__(self, failures: int, error: type[Exception] = ConnectionError) -> None:
        self.failures = failures
        self.error = error
        self.calls: list[tuple[int, str, int]] = []  # (attempt, key, clock ms)
        self.clock: Any = None

    def __call__(self, s: fusee.StepCtx) -> str:
        self.calls.append((s.attempt, s.key, self.clock.now_ms()))
        if len(self.calls) <= self.failures:
            raise self.error(f"failure {len(self.calls)}")
        return f"ok after {len(self.calls)}"


def flaky_workflow(fn: Flaky, retry: fusee.Retry, name: str = "flaky") -> Any:
    @fusee.workflow(name)
    async def wf(ctx: fusee.Ctx) -> str:
        return await ctx.step("call", fn, retry=retry)

    return wf


async def test_a_failing_step_is_retried_with_backoff_on_the_engine_clock(host: Host) -> None:
    fn = Flaky(failures=3)
    wf = flaky_workflow(fn, fusee.Retry(attempts=5, initial="10s", backoff=2.0, max_interval="15s"))
    async with host(workflows=[wf]) as t:
        fn.clock = t.clock
        t0 = t.clock.now_ms()
        assert await t.execute(wf, "f-1") == "ok after 4"
        assert [a for a, _, _ in fn.calls] == [1, 2, 3, 4]
        # Waits of 10s, 20s capped at 15s, 15s: on the virtual clock, in no real time.
        assert [ms - t0 for _, _, ms in fn.calls] == [0, 10_000, 25_000, 40_000]
        assert {key for _, key, _ in fn.calls} == {"f-1/1/0"}
        await t.crash()
        assert await t.get("f-1").result() == "ok after 4"
        assert len(fn.calls) == 4


async def test_a_retry_pending_at_a_crash_runs_at_its_time_with_the_same_key(host: Host) -> None:
    fn = Flaky(failures=2)
    wf = flaky_workflow(fn, fusee.Retry(attempts=5, initial="1h", backoff=1.0, max_interval="1h"))
    async with host(workflows=[wf]) as t:
        fn.clock = t.clock
        t0 = t.clock.now_ms()
        run = await t.start(wf, "f-1")
        await t.advance("30m")
        assert [a for a, _, _ in fn.calls] == [1]
        await t.crash()
        await t.advance("20m")
        # Not yet: the retry recorded before the crash is due at 1h.
        assert [a for a, _, _ in fn.calls] == [1]
        await t.advance("10m")
        assert [a for a, _, _ in fn.calls] == [1, 2]
        await t.crash()
        assert await run.result() == "ok after 3"
        assert [a for a, _, _ in fn.calls] == [1, 2, 3]
        assert [ms - t0 for _, _, ms in fn.calls] == [0, HOUR_MS, 2 * HOUR_MS]
        assert {key for _, key, _ in fn.calls} == {"f-1/1/0"}


async def test_a_step_out_of_retries_pauses_the_run_until_resume(host: Host) -> None:
    fn = Flaky(failures=3)
    wf = flaky_workflow(fn, fusee.Retry(attempts=2, initial="1s"))
    async with host(workflows=[wf]) as t:
        fn.clock = t.clock
        run = await t.start(wf, "f-1")
        await t.advance("1d")
        info = await run.describe()
        assert (info.status, info.paused_steps) == ("paused", ("call",))
        assert len(fn.calls) == 2
        # Paused costs nothing and does not go on by itself, nor after a crash.
        await t.crash()
        await t.advance("1d")
        info = await run.describe()
        assert (info.status, info.paused_steps) == ("paused", ("call",))
        assert len(fn.calls) == 2
        # A fresh budget of two attempts: one more failure, then success.
        await run.resume()
        assert await run.result() == "ok after 4"
        assert [a for a, _, _ in fn.calls] == [1, 2, 1, 2]
        assert {key for _, key, _ in fn.calls} == {"f-1/1/0"}
        info = await run.describe()
        assert (info.status, info.paused_steps) == ("completed", ())
        await t.crash()
        assert await run.result() == "ok after 4"
        assert len(fn.calls) == 4


async def test_resume_after_a_crash_while_paused_gives_a_fresh_budget(host: Host) -> None:
    fn = Flaky(failures=1)
    wf = flaky_workflow(fn, fusee.Retry(attempts=1))
    async with host(workflows=[wf]) as t:
        fn.clock = t.clock
        run = await t.start(wf, "f-1")
        await t.settle()
        assert (await run.describe()).status == "paused"
        await t.crash()
        await run.resume()
        assert await run.result() == "ok after 2"
        assert [a for a, _, _ in fn.calls] == [1, 1]


async def test_a_run_that_runs_out_again_after_resume_pauses_again(host: Host) -> None:
    fn = Flaky(failures=10)
    wf = flaky_workflow(fn, fusee.Retry(attempts=2, initial="1s"))
    async with host(workflows=[wf]) as t:
        fn.clock = t.clock
        run = await t.start(wf, "f-1")
        await t.advance("1m")
        await run.resume()
        await t.advance("1m")
        info = await run.describe()
        assert (info.status, info.paused_steps) == ("paused", ("call",))
        assert [a for a, _, _ in fn.calls] == [1, 2, 1, 2]
        await t.crash()
        await t.advance("1d")
        assert [a for a, _, _ in fn.calls] == [1, 2, 1, 2]


@fusee.workflow("two-paused")
async def two_paused(ctx: fusee.Ctx) -> list[str]:
    def down() -> str:
        raise ConnectionError("down")

    once = fusee.Retry(attempts=1)
    return list(
        await asyncio.gather(ctx.step("a", down, retry=once), ctx.step("b", down, retry=once))
    )


async def test_describe_lists_every_paused_step(host: Host) -> None:
    async with host(workflows=[two_paused]) as t:
        run = await t.start(two_paused, "p-1")
        await t.settle()
        assert (await run.describe()).paused_steps == ("a", "b")
        await t.crash()
        await t.settle()
        assert (await run.describe()).paused_steps == ("a", "b")


@pytest.mark.parametrize(
    ("error", "retry", "expected"),
    [
        pytest.param(
            fusee.Failure("card declined"),
            fusee.Retry(),
            ("pay", "Failure", "card declined"),
            id="failure",
        ),
        pytest.param(
            KeyError("sku"),
            fusee.Retry(non_retryable=(KeyError,)),
            ("pay", "KeyError", "'sku'"),
            id="non-retryable",
        ),
    ],
)
async def test_a_non_retryable_error_fails_the_step_at_once(
    host: Host, error: Exception, retry: fusee.Retry, expected: tuple[str, str, str]
) -> None:
    calls: list[int] = []

    def pay() -> None:
        calls.append(1)
        raise error

    @fusee.workflow("payer")
    async def payer(ctx: fusee.Ctx) -> tuple[str, str, str]:
        try:
            await ctx.step("pay", pay, retry=retry)
        except fusee.StepFailed as e:
            return (e.step, e.type, e.message)
        return ("", "", "")

    async with host(workflows=[payer]) as t:
        got = await t.execute(payer, "p-1")
        assert tuple(got) == expected
        await t.crash()
        assert tuple(await t.get("p-1").result()) == expected
        assert calls == [1]


async def test_an_uncaught_step_failure_fails_the_run(host: Host) -> None:
    @fusee.workflow("careless")
    async def careless(ctx: fusee.Ctx) -> None:
        await ctx.step("pay", _declined)

    async with host(workflows=[careless]) as t:
        with pytest.raises(fusee.WorkflowFailed) as e:
            await t.execute(careless, "c-1")
        assert e.value.type == "StepFailed"
        assert "step 'pay' failed: Failure: declined" in e.value.message
        await t.crash()
        with pytest.raises(fusee.WorkflowFailed, match="Failure: declined"):
            await t.get("c-1").result()
        assert len(t.step_log) == 1


def _declined() -> None:
    raise fusee.Failure("declined")


async def test_a_step_attempt_past_its_timeout_fails_and_is_retried(host: Host) -> None:
    attempts: list[int] = []

    async def slow(s: fusee.StepCtx) -> str:
        attempts.append(s.attempt)
        if s.attempt == 1:
            await asyncio.Event().wait()  # never set: only the timeout ends it
        return "fast enough"

    @fusee.workflow("timed")
    async def timed(ctx: fusee.Ctx) -> str:
        return await ctx.step("slow", slow, timeout="20ms", retry=fusee.Retry(initial="1s"))

    async with host(workflows=[timed]) as t:
        assert await t.execute(timed, "t-1") == "fast enough"
        assert attempts == [1, 2]
        await t.crash()
        assert await t.get("t-1").result() == "fast enough"
        assert attempts == [1, 2]


async def test_a_timeout_on_every_attempt_pauses_the_run(host: Host) -> None:
    async def hang() -> None:
        await asyncio.Event().wait()

    @fusee.workflow("hung")
    async def hung(ctx: fusee.Ctx) -> None:
        await ctx.step("hang", hang, timeout="10ms", retry=fusee.Retry(attempts=2, initial="1s"))

    async with host(workflows=[hung]) as t:
        run = await t.start(hung, "h-1")
        await t.advance("1m")
        assert (await run.describe()).paused_steps == ("hang",)
        await t.crash()
        await t.advance("1m")
        assert (await run.describe()).paused_steps == ("hang",)
        assert len(t.step_log) == 2


async def test_heartbeat_progress_survives_into_the_retry_and_a_crash(host: Host) -> None:
    seen: list[tuple[int, Any]] = []

    def export(s: fusee.StepCtx) -> int:
        seen.append((s.attempt, s.progress))
        start = s.progress or 0
        for page in range(start, 6):
            s.heartbeat(page)
            if s.attempt == 1 and page == 3:
                raise ConnectionError("lost the connection at page 3")
        return 6

    @fusee.workflow("export")
    async def export_wf(ctx: fusee.Ctx) -> int:
        return await ctx.step("export", export, retry=fusee.Retry(initial="1h", max_interval="1h"))

    async with host(workflows=[export_wf]) as t:
        run = await t.start(export_wf, "e-1")
        await t.advance("30m")
        assert seen == [(1, None)]
        await t.crash()
        assert await run.result() == 6
        # The retry, in the engine's next life, starts where the first attempt got to.
        assert seen == [(1, None), (2, 3)]
        await t.crash()
        assert await run.result() == 6
        assert len(seen) == 2


async def test_sync_steps_run_in_a_worker_thread_unless_inline(host: Host) -> None:
    threads: dict[str, int] = {}

    def where(name: str) -> Any:
        def fn() -> None:
            threads[name] = threading.get_ident()

        return fn

    @fusee.workflow("threads")
    async def threads_wf(ctx: fusee.Ctx) -> None:
        await ctx.step("worker", where("worker"))
        await ctx.step("inline", where("inline"), inline=True)

    async with host(workflows=[threads_wf]) as t:
        await t.execute(threads_wf, "t-1")
        assert threads["inline"] == threading.get_ident()
        assert threads["worker"] != threading.get_ident()
        await t.crash()
        await t.get("t-1").result()
        assert step_runs(t) == {("t-1", 0): 1, ("t-1", 1): 1}


async def test_a_lambda_around_an_async_call_goes_to_a_thread_once_when_many_runs_call_it_first(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The calls made meanwhile wait for the first as long as it takes here:
    # on a loaded machine the loop may hear of its return after the bound.
    monkeypatch.setattr(_steps, "_PROBE_WAIT_S", 60.0)
    in_threads: list[int] = []
    # Compiled here, with a constant of its own (code objects compare by
    # value), so its code is new to this process on every store: no call of
    # it has yet been seen to return an awaitable. A counter, not an id():
    # an earlier store's list may have left its address to this one.
    around: Any = eval(f"lambda body: (lambda: (body(), {next(_FRESH_CODE)})[0])")
    loop_thread = threading.get_ident()

    async def add_one() -> int:
        return 1

    def body() -> Any:
        if threading.get_ident() != loop_thread:
            in_threads.append(1)
        return add_one()

    @fusee.workflow("first-calls")
    async def first_calls(ctx: fusee.Ctx) -> int:
        return await ctx.step("s", around(body))

    async with host(workflows=[first_calls]) as t:
        runs = await asyncio.gather(*(t.start(first_calls, f"f-{k}") for k in range(50)))
        assert [await run.result() for run in runs] == [1] * 50
        # The first call found out, in its thread, that the lambda only builds
        # a coroutine; the 49 made meanwhile waited for it and ran on the loop.
        assert len(in_threads) == 1
        await t.crash()
        assert [await t.get(f"f-{k}").result() for k in range(50)] == [1] * 50
        assert step_runs(t) == {(f"f-{k}", 0): 1 for k in range(50)}


@pytest.mark.parametrize(
    "kind", ["sync", "async", "async-suspends"], ids=["sync", "async", "async-suspends"]
)
async def test_current_step_reaches_one_step_ctx_from_deeper_code(host: Host, kind: str) -> None:
    def deep_sync() -> str:
        s = fusee.current_step()
        assert s is not None
        assert fusee.current_step() is s
        return f"{s.key}#{s.attempt}"

    async def deep_async() -> str:
        s = fusee.current_step()
        assert s is not None
        assert fusee.current_step() is s
        if kind == "async-suspends":
            # The attempt goes on in a task: the same StepCtx there.
            await asyncio.sleep(0)
            assert fusee.current_step() is s
        return f"{s.key}#{s.attempt}"

    deep: Any = deep_sync if kind == "sync" else deep_async

    @fusee.workflow("deep")
    async def deep_wf(ctx: fusee.Ctx) -> list[str | None]:
        key = await ctx.step("deep", deep)
        return [key, None if fusee.current_step() is None else "leaked"]

    async with host(workflows=[deep_wf]) as t:
        assert await t.execute(deep_wf, "d-1") == ["d-1/1/0#1", None]
        await t.crash()
        assert await t.get("d-1").result() == ["d-1/1/0#1", None]
        assert len(t.step_log) == 1


async def test_a_thread_of_an_async_step_reaches_the_same_step_ctx(host: Host) -> None:
    def in_thread() -> fusee.StepCtx | None:
        return fusee.current_step()

    async def with_thread() -> bool:
        # The thread asks while the attempt goes on in a task: one StepCtx.
        theirs = await asyncio.to_thread(in_thread)
        return theirs is not None and theirs is fusee.current_step()

    @fusee.workflow("thread-ctx")
    async def thread_wf(ctx: fusee.Ctx) -> bool:
        return await ctx.step("with-thread", with_thread)

    async with host(workflows=[thread_wf]) as t:
        assert await t.execute(thread_wf, "t-1") is True
        await t.crash()
        assert await t.get("t-1").result() is True


async def test_a_mocked_step_runs_instead_of_the_real_one(host: Host) -> None:
    def charge() -> str:
        raise AssertionError("the real charge must not run in tests")

    @fusee.workflow("shop")
    async def shop(ctx: fusee.Ctx) -> str:
        return await ctx.step("charge", charge)

    async with host(workflows=[shop]) as t:
        t.mock_step("shop", "charge", lambda s: f"mocked {s.key}")
        assert await t.execute(shop, "s-1") == "mocked s-1/1/0"
        await t.crash()
        assert await t.get("s-1").result() == "mocked s-1/1/0"
        assert step_runs(t) == {("s-1", 0): 1}
