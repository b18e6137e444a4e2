"""The contract at the door and for steps: typed values checked where they enter, step options.

Every test runs on every store (the ``host`` fixture), live and again after
a crash.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.testing import crash_everywhere

from .conftest import Host, step_runs

pytestmark = pytest.mark.asyncio

review = fusee.signal("review", bool)
bump = fusee.update("bump", int, int)


@dataclasses.dataclass(frozen=True)
class Quote:
    price: int


@fusee.workflow("reviewed")
async def reviewed(ctx: fusee.Ctx, n: int) -> bool | None:
    total = [n]

    def add(k: int) -> int:
        total[0] += k
        return total[0]

    ctx.on_update(bump, add)
    return await ctx.wait_for(review, timeout="1h")


# --- values checked where they enter --------------------------------------------------------------


async def test_a_bool_signal_sent_a_string_is_refused_at_run_signal_and_not_recorded(
    host: Host,
) -> None:
    async with host(workflows=[reviewed]) as t:
        run = await t.start(reviewed, "r-1", 1)
        await t.settle()
        before = await t.engine.store.load("r-1")
        bad: Any = "yes"
        with pytest.raises(fusee.PayloadError, match="signal 'review'"):
            await run.signal(review, bad)
        await t.settle()
        assert await t.engine.store.load("r-1") == before
        await t.crash()
        await run.signal(review, True)
        assert await run.result() is True


async def test_a_start_input_of_the_wrong_type_is_refused_and_nothing_recorded(
    host: Host,
) -> None:
    async with host(workflows=[reviewed]) as t:
        bad: Any = "one"
        with pytest.raises(fusee.PayloadError, match="the input of run 'r-1'"):
            await t.start(reviewed, "r-1", bad)
        assert await t.engine.store.get("r-1") is None
        await t.crash()
        assert await t.engine.store.get("r-1") is None


async def test_an_update_payload_of_the_wrong_type_is_refused_and_its_result_is_typed(
    host: Host,
) -> None:
    async with host(workflows=[reviewed]) as t:
        run = await t.start(reviewed, "r-1", 1)
        bad: Any = "2"
        with pytest.raises(fusee.PayloadError, match="update 'bump'"):
            await run.update(bump, bad)
        assert await run.update(bump, 2) == 3
        await t.crash()
        assert await run.update(bump, 4) == 7
        await run.signal(review, False)
        assert await run.result() is False


async def test_complete_refuses_a_value_that_does_not_fit_the_awaits_result_type(
    host: Host,
) -> None:
    tokens: list[str] = []

    @fusee.workflow("approval")
    async def approval(ctx: fusee.Ctx) -> bool:
        return await ctx.await_completion(
            "ok", lambda s: tokens.append(s.token or ""), result_type=bool
        )

    async with host(workflows=[approval]) as t:
        run = await t.start(approval, "a-1")
        await t.settle()
        before = await t.engine.store.load("a-1")
        with pytest.raises(fusee.PayloadError, match="the completion of 'ok'"):
            await t.complete(tokens[-1], "yes")
        await t.settle()
        assert await t.engine.store.load("a-1") == before
        await t.crash()
        await t.complete(tokens[-1], True)
        assert await run.result() is True


# --- result types of steps ------------------------------------------------------------------------


async def test_a_lambda_step_with_result_type_decodes_to_it_live_and_after_a_crash(
    host: Host,
) -> None:
    @fusee.workflow("quoted")
    async def quoted(ctx: fusee.Ctx) -> str:
        q = await ctx.step("quote", lambda: Quote(3), result_type=Quote)
        assert isinstance(q, Quote)
        await ctx.sleep("nap", "1m")
        return f"{type(q).__name__}:{q.price}"

    async with host(workflows=[quoted]) as t:
        run = await t.start(quoted, "q-1")
        await t.settle()
        await t.crash()
        assert await run.result() == "Quote:3"
        assert list(step_runs(t).values()) == [1]


@pytest.mark.parametrize(
    ("result", "told"),
    [
        pytest.param(Quote(1), ["returned a dataclass (Quote)", "result_type=Quote "], id="top"),
        pytest.param(
            {"quotes": [Quote(1)]},
            [
                "returned a dict holding a dataclass (Quote) at ['quotes'][0]",
                "result_type=dict[str, list[Quote]] ",
            ],
            id="nested",
        ),
    ],
)
async def test_a_step_returning_a_typed_record_with_no_declared_type_fails_at_once(
    host: Host, result: Any, told: list[str]
) -> None:
    calls: list[int] = []

    def make() -> Any:
        calls.append(1)
        return result

    @fusee.workflow("untyped")
    async def untyped(ctx: fusee.Ctx) -> str:
        try:
            await ctx.step("quote", lambda: make())
        except fusee.StepFailed as e:
            return f"{e.type}: {e.message}"
        return "accepted"

    async with host(workflows=[untyped]) as t:
        got = await t.execute(untyped, "u-1")
        assert got.startswith("PayloadError: ")
        assert all(part in got for part in told), got
        assert calls == [1]  # not retried
        await t.crash()
        assert await t.get("u-1").result() == got
        assert calls == [1]


# --- step options ---------------------------------------------------------------------------------


async def test_retry_on_exhausted_fail_raises_step_failed_once_the_attempts_run_out(
    host: Host,
) -> None:
    calls: list[int] = []

    def boom(s: fusee.StepCtx) -> None:
        calls.append(s.attempt)
        raise ConnectionError("down")

    @fusee.workflow("failing")
    async def failing(ctx: fusee.Ctx) -> str:
        retry = fusee.Retry(attempts=2, initial="1s", on_exhausted="fail")
        try:
            await ctx.step("boom", boom, retry=retry)
        except fusee.StepFailed as e:
            return f"{e.type}: {e.message}"
        return "ok"

    async with host(workflows=[failing]) as t:
        assert await t.execute(failing, "f-1") == "ConnectionError: down"
        assert calls == [1, 2]
        await t.crash()
        assert await t.get("f-1").result() == "ConnectionError: down"
        assert calls == [1, 2]


@pytest.mark.filterwarnings("ignore")
def test_retry_refuses_an_unknown_on_exhausted() -> None:
    with pytest.raises(ValueError, match="on_exhausted"):
        fusee.Retry(on_exhausted="stop")  # type: ignore[arg-type]


async def test_an_attempt_without_a_heartbeat_within_heartbeat_timeout_is_retried(
    host: Host,
) -> None:
    started = asyncio.Event()
    told: list[bool] = []

    async def quiet(s: fusee.StepCtx) -> str:
        if s.attempt == 1:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                told.append(s.cancelled.is_set())
                raise
            return "too late"
        return f"attempt {s.attempt}"

    @fusee.workflow("beating")
    async def beating(ctx: fusee.Ctx) -> str:
        return await ctx.step("quiet", quiet, heartbeat_timeout="30s")

    async with host(workflows=[beating]) as t:
        run = await t.start(beating, "b-1")
        await started.wait()
        await t.advance("29s")
        assert told == []
        await t.advance("2s")
        assert told == [True]
        assert await run.result() == "attempt 2"
        await t.crash()
        assert await run.result() == "attempt 2"


async def test_a_late_heartbeat_of_an_abandoned_attempt_is_not_the_next_attempts_progress(
    host: Host,
) -> None:
    release = threading.Event()
    beat_sent = threading.Event()
    first_started = threading.Event()
    second_started = threading.Event()
    go_on = threading.Event()
    progress: list[Any] = []

    def slow(s: fusee.StepCtx) -> str:
        if s.attempt == 1:
            first_started.set()
            release.wait(10)
            s.heartbeat("stale")  # from an attempt that timed out long ago
            beat_sent.set()
            return "abandoned"
        second_started.set()
        go_on.wait(10)
        progress.append(s.progress)
        return "done"

    @fusee.workflow("late")
    async def late(ctx: fusee.Ctx) -> str:
        return await ctx.step("slow", slow, timeout="1m", retry=fusee.Retry(initial="1s"))

    loop = asyncio.get_running_loop()
    async with host(workflows=[late]) as t:
        try:
            run = await t.start(late, "l-1")
            await loop.run_in_executor(None, first_started.wait, 10)
            await t.advance("2m")  # attempt 1 times out, abandoned in its thread
            await loop.run_in_executor(None, second_started.wait, 10)
            release.set()
            await loop.run_in_executor(None, beat_sent.wait, 10)
            await t.settle()
            go_on.set()
            assert await run.result() == "done"
            assert progress == [None]
            await t.crash()
            assert await run.result() == "done"
        finally:
            release.set()
            go_on.set()


async def test_await_completion_timeout_bounds_the_whole_wait(host: Host) -> None:
    tokens: list[str] = []

    @fusee.workflow("bounded")
    async def bounded(ctx: fusee.Ctx) -> str:
        try:
            await ctx.await_completion(
                "ok", lambda s: tokens.append(s.token or ""), timeout="1h", result_type=bool
            )
        except TimeoutError:
            return "timed out"
        return "completed"

    async with host(workflows=[bounded]) as t:
        run = await t.start(bounded, "w-1")
        await t.advance("30m")
        await t.crash()
        await t.advance("31m")
        assert await run.result() == "timed out"
        await t.complete(tokens[-1], True)  # too late: ignored
        assert await run.result() == "timed out"


async def test_a_step_that_loses_a_race_is_told_and_its_task_is_cancelled(host: Host) -> None:
    started = asyncio.Event()
    seen: list[str] = []

    async def forever(s: fusee.StepCtx) -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append(f"cancelled, told={s.cancelled.is_set()}")
            raise
        return "never"

    @fusee.workflow("racing")
    async def racing(ctx: fusee.Ctx) -> int:
        i, _ = await fusee.select(
            ctx.step("forever", forever, timeout="1h"), ctx.sleep("limit", "1m")
        )
        return i

    async with host(workflows=[racing]) as t:
        run = await t.start(racing, "x-1")
        await started.wait()
        await t.advance("2m")
        assert await run.result() == 1
        assert seen == ["cancelled, told=True"]
        assert not t.engine.runs.all() or all(not s.steps for s in t.engine.runs.all())
        await t.crash()
        assert await run.result() == 1


async def test_cancelling_a_run_with_a_paused_step_leaves_no_pending_task(host: Host) -> None:
    def boom() -> None:
        raise ConnectionError("down")

    @fusee.workflow("paused")
    async def paused(ctx: fusee.Ctx) -> None:
        await ctx.step("boom", boom, retry=fusee.Retry(attempts=1))

    async with host(workflows=[paused]) as t:
        run = await t.start(paused, "p-1")
        await t.settle()
        assert (await run.describe()).paused_steps == ("boom",)
        tasks = [task for s in t.engine.runs.all() for task in s.steps]
        assert tasks
        await run.cancel("stop")
        with pytest.raises(fusee.Cancelled):
            await run.result()
        await t.settle()
        assert all(task.done() for task in tasks)
        await t.crash()
        with pytest.raises(fusee.Cancelled):
            await run.result()


# --- errors from the tree -------------------------------------------------------------------------


async def test_starting_an_undecorated_function_raises_type_error_naming_the_decorator(
    host: Host,
) -> None:
    async def plain(ctx: fusee.Ctx) -> None:
        return None

    async with host(workflows=[reviewed]) as t:
        with pytest.raises(TypeError, match=r"@fusee\.workflow"):
            await t.start(plain, "p-1")  # type: ignore[call-overload]


async def test_an_id_or_dedup_key_with_a_lone_surrogate_raises_value_error(host: Host) -> None:
    async with host(workflows=[reviewed]) as t:
        with pytest.raises(ValueError, match="not valid text"):
            await t.start(reviewed, "bad\ud800", 1)
        with pytest.raises(ValueError, match="not valid text"):
            t.get("bad\ud800")
        run = await t.start(reviewed, "r-1", 1)
        with pytest.raises(ValueError, match="not valid text"):
            await run.signal(review, True, dedup="bad\ud800")
        await t.crash()
        assert [row.id for row in await t.engine.store.list()] == ["r-1"]
        await run.signal(review, True, dedup="fine")
        assert await run.result() is True


async def test_engine_open_refuses_an_empty_target_and_a_regular_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a target"):
        await fusee.Engine.open("", workflows=[])
    f = tmp_path / "a-file"
    f.write_text("not a directory")
    with pytest.raises(ValueError, match="is a file"):
        await fusee.Engine.open(f, workflows=[])


# --- step timeouts on the engine's clock, and crashes at every record -----------------------------


@pytest.mark.parametrize(
    "kind", [pytest.param("async", id="async"), pytest.param("sync", id="sync")]
)
async def test_a_step_timeout_counts_the_engines_clock_not_real_time(host: Host, kind: str) -> None:
    release = threading.Event()
    started = threading.Event()
    attempts: list[int] = []

    async def async_step(s: fusee.StepCtx) -> str:
        attempts.append(s.attempt)
        if s.attempt == 1:
            started.set()
            await asyncio.Event().wait()
        return f"attempt {s.attempt}"

    def sync_step(s: fusee.StepCtx) -> str:
        attempts.append(s.attempt)
        if s.attempt == 1:
            started.set()
            release.wait(10)  # cannot be interrupted: abandoned, its result ignored
            return "abandoned"
        return f"attempt {s.attempt}"

    fn: Any = async_step if kind == "async" else sync_step

    @fusee.workflow("timed")
    async def timed(ctx: fusee.Ctx) -> str:
        return await ctx.step("slow", fn, timeout="1h", retry=fusee.Retry(initial="1m"))

    async with host(workflows=[timed]) as t:
        try:
            run = await t.start(timed, "t-1")
            await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
            await t.advance("2h")
            assert await run.result() == "attempt 2"
            assert attempts == [1, 2]
            await t.crash()
            assert await run.result() == "attempt 2"
            assert attempts == [1, 2]
        finally:
            release.set()


async def test_an_await_completion_timeout_survives_a_crash_at_every_record() -> None:
    @fusee.workflow("expiring")
    async def expiring(ctx: fusee.Ctx) -> str:
        try:
            await ctx.await_completion("ok", lambda s: None, timeout="1d", result_type=bool)
        except TimeoutError:
            return "expired"
        return "completed"

    assert await crash_everywhere(expiring) == "expired"


async def test_result_type_and_on_exhausted_fail_hold_at_every_crash_point() -> None:
    def down() -> None:
        raise ConnectionError("down")

    @fusee.workflow("typed")
    async def typed(ctx: fusee.Ctx) -> str:
        q = await ctx.step("quote", lambda: Quote(5), result_type=Quote)
        try:
            await ctx.step("down", down, retry=fusee.Retry(attempts=2, on_exhausted="fail"))
        except fusee.StepFailed as e:
            return f"{type(q).__name__} {q.price}, then {e.type}"
        return "no failure"

    assert await crash_everywhere(typed) == "Quote 5, then ConnectionError"


@fusee.workflow("child-of")
async def child_of(ctx: fusee.Ctx, n: int) -> int:
    return n + 1


async def test_ctx_send_and_ctx_child_refuse_wrong_values_in_the_workflow(host: Host) -> None:
    @fusee.workflow("sender")
    async def sender(ctx: fusee.Ctx) -> list[str]:
        seen: list[str] = []
        bad: Any = "yes"
        for attempt in (
            lambda: ctx.send("other", review, bad),
            lambda: ctx.child(child_of, "c-1", bad),
            lambda: ctx.child(child_of, "bad\ud800", 1),
        ):
            try:
                attempt()
            except (fusee.PayloadError, ValueError) as e:
                seen.append(type(e).__name__)
        seen.append(str(await ctx.child(child_of, "c-2", 1)))
        return seen

    async with host(workflows=[sender, child_of]) as t:
        run = await t.start(sender, "s-1")
        expected = ["PayloadError", "PayloadError", "ValueError", "2"]
        assert await run.result() == expected
        assert await t.engine.store.get("c-1") is None
        await t.crash()
        assert await run.result() == expected


async def test_a_sync_step_running_in_its_thread_is_told_when_its_run_is_cancelled(
    host: Host,
) -> None:
    started = threading.Event()
    go = threading.Event()
    done = threading.Event()
    told: list[bool] = []

    def long_export(s: fusee.StepCtx) -> str:
        started.set()
        go.wait(10)
        told.append(s.cancelled.is_set())  # a long step polls it between pieces of work
        done.set()
        return "stopped" if s.cancelled else "finished"

    @fusee.workflow("exporting")
    async def exporting(ctx: fusee.Ctx) -> str:
        return await ctx.step("export", long_export)

    async with host(workflows=[exporting]) as t:
        run = await t.start(exporting, "e-1")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, started.wait, 10)
        await run.cancel("no longer needed")
        with pytest.raises(fusee.Cancelled):
            await run.result()
        go.set()
        await loop.run_in_executor(None, done.wait, 10)
        assert told == [True]
        await t.crash()
        with pytest.raises(fusee.Cancelled):
            await run.result()
