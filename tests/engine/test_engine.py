"""The Engine API: start, execute, get, list, describe, id policies, completions.

Every test runs on the memory store and on SQLite (see conftest), live and
then again after a crash, and checks that no step function ran twice.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.store import PostgresStore

from .conftest import HeldWrites, Host, Stores, assert_steps_ran_once, step_runs

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", int)
phase_q = fusee.query("phase")


@fusee.workflow("double")
async def double(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("double", lambda: n * 2)


@fusee.workflow("gated")
async def gated(ctx: fusee.Ctx, tag: str) -> int:
    ctx.set_attributes({"tag": tag})
    got = await ctx.wait_for(go) or 0
    return await ctx.step("use", lambda: got + 1)


@fusee.workflow("broken")
async def broken(ctx: fusee.Ctx) -> None:
    await ctx.step("fine", lambda: 1)
    raise ValueError("out of stock")


@fusee.workflow("napper")
async def napper(ctx: fusee.Ctx) -> str:
    await ctx.sleep("nap", "1h")
    return "rested"


# --- start, execute, result, get ------------------------------------------------------------------


async def test_execute_returns_the_result_and_a_crash_does_not_run_the_step_again(
    host: Host,
) -> None:
    async with host(workflows=[double]) as t:
        assert await t.execute(double, "d-1", 21) == 42
        await t.crash()
        assert await t.get("d-1").result() == 42
        assert await t.execute(double, "d-2", 5) == 10
        assert_steps_ran_once(t)
        assert len(t.step_log) == 2


async def test_start_by_name_and_result_of_a_handle_from_get(host: Host) -> None:
    async with host(workflows=[double]) as t:
        run: fusee.Run[int] = await t.start("double", "d-1", 4)
        assert run.id == "d-1"
        assert await t.get("d-1").result() == 8
        await t.crash()
        assert await t.get("d-1").result() == 8
        assert_steps_ran_once(t)


async def test_a_run_started_before_a_crash_finishes_after_it(host: Host) -> None:
    async with host(workflows=[gated]) as t:
        run = await t.start(gated, "g-1", "a")
        await t.settle()
        await t.crash()
        await run.signal(go, 1)
        assert await run.result() == 2
        await t.crash()
        assert await run.result() == 2
        assert_steps_ran_once(t)


async def test_get_of_an_unknown_id_raises_not_found_when_used(host: Host) -> None:
    async with host(workflows=[double]) as t:
        run = t.get("nobody")
        with pytest.raises(fusee.NotFound, match="no run has id 'nobody'"):
            await run.result()
        with pytest.raises(fusee.NotFound):
            await run.describe()
        with pytest.raises(fusee.NotFound):
            await run.signal(go, 1)


async def test_a_failing_workflow_raises_workflow_failed_live_and_after_a_crash(
    host: Host,
) -> None:
    async with host(workflows=[broken]) as t:
        with pytest.raises(fusee.WorkflowFailed) as live:
            await t.execute(broken, "b-1")
        assert (live.value.type, live.value.message) == ("ValueError", "out of stock")
        await t.crash()
        with pytest.raises(fusee.WorkflowFailed) as again:
            await t.get("b-1").result()
        assert (again.value.type, again.value.message) == ("ValueError", "out of stock")
        assert_steps_ran_once(t)


async def test_results_of_finished_runs_are_read_back_after_reopening_sqlite(
    tmp_path: Path,
) -> None:
    # Store-specific: a memory engine keeps nothing to reopen (TestEngine
    # tests cover crashes on both stores).
    async with await fusee.Engine.open(
        tmp_path, workflows=[double, broken], durability="none"
    ) as engine:
        assert await engine.execute(double, "d-1", 3) == 6
        with pytest.raises(fusee.WorkflowFailed):
            await engine.execute(broken, "b-1")
    async with await fusee.Engine.open(
        tmp_path, workflows=[double, broken], durability="none"
    ) as engine:
        opened_at = engine.committer.lsn
        assert await engine.get("d-1").result() == 6
        with pytest.raises(fusee.WorkflowFailed, match="out of stock"):
            await engine.get("b-1").result()
        info = await engine.get("d-1").describe()
        assert info.status == "completed"
        # Nothing ran again: a step that did would have appended its result.
        await engine.committer.flush()
        assert engine.committer.lsn == opened_at


# --- id policies ----------------------------------------------------------------------------------


async def test_a_taken_id_is_rejected_with_a_helpful_message(host: Host) -> None:
    async with host(workflows=[gated, double]) as t:
        await t.start(gated, "x-1", "a")
        with pytest.raises(fusee.AlreadyExists) as e:
            await t.start(gated, "x-1", "b")
        assert "run 'x-1' exists (running)" in str(e.value)
        assert "IdPolicy.ATTACH" in str(e.value)
        # Another workflow type cannot take it either, nor after a crash.
        await t.crash()
        with pytest.raises(fusee.AlreadyExists):
            await t.start(double, "x-1", 1)


async def test_attach_returns_the_existing_run(host: Host) -> None:
    async with host(workflows=[gated]) as t:
        first = await t.start(gated, "x-1", "a")
        second = await t.start(gated, "x-1", "b", id_policy=fusee.IdPolicy.ATTACH)
        assert second.id == first.id
        await first.signal(go, 1)
        assert await second.result() == 2
        # The input given to the attach was ignored: the attributes say "a".
        assert (await second.describe()).attributes == {"tag": "a"}
        await t.crash()
        third = await t.start(gated, "x-1", "c", id_policy=fusee.IdPolicy.ATTACH)
        assert await third.result() == 2
        assert_steps_ran_once(t)


async def test_replace_starts_a_new_run_only_once_the_old_one_finished(host: Host) -> None:
    async with host(workflows=[gated]) as t:
        run = await t.start(gated, "x-1", "a")
        with pytest.raises(fusee.AlreadyExists, match="running"):
            await t.start(gated, "x-1", "b", id_policy=fusee.IdPolicy.REPLACE)
        await run.signal(go, 1)
        assert await run.result() == 2
        old = await run.describe()
        await t.start(gated, "x-1", "b", id_policy=fusee.IdPolicy.REPLACE)
        new = await run.describe()
        assert new.run > old.run
        assert new.status in ("running", "suspended")
        assert new.attributes == {"tag": "b"}
        await t.crash()
        await run.signal(go, 10)
        assert await run.result() == 11
        # Once per run (step_runs counts by (id, seq), the same in both runs).
        assert step_runs(t) == Counter({("x-1", 2): 2})
        assert_steps_ran_once(t)


async def test_result_after_replace_is_the_new_runs_not_the_remembered_one(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    # An ended run's result is kept in memory for `Run.result`: a new run of
    # the same id must not be answered with it, parked or not.
    async with host(workflows=[gated], park_after="1s") as t:
        run = await t.start(gated, "x-1", "a")
        await run.signal(go, 1)
        assert await run.result() == 2
        await t.start(gated, "x-1", "b", id_policy=fusee.IdPolicy.REPLACE)
        await t.advance("2s")
        assert not t.is_loaded("x-1")  # parked: the store has its row
        waiting = asyncio.ensure_future(run.result())
        await t.settle()
        assert not waiting.done()
        await run.signal(go, 10)
        assert await waiting == 11
        assert await run.result() == 11
        await t.crash()
        assert await run.result() == 11


async def test_a_run_parking_as_the_engine_closes_breaks_nothing(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    # Fix: its park, due at once, ran while the committer's writers were
    # being stopped (the test host skips to it while a caller waits for the
    # result), and woke one of them already cancelled: an engine task failed
    # with InvalidStateError.
    async with host(workflows=[gated], park_after="0s") as t:
        run = await t.start(gated, "x-1", "a")
        await t.settle()
        waiting = asyncio.ensure_future(run.result())
        await t.settle()
    waiting.cancel()  # the caller of a closed test host
    await asyncio.gather(waiting, return_exceptions=True)
    assert "task failed" not in caplog.text
    async with host(workflows=[gated], store=t.store) as t:
        await t.get(run.id).signal(go, 1)
        assert await t.get(run.id).result() == 2


async def test_a_closed_engine_serves_no_run_and_each_handle_call_says_it_is_closed(
    stores: Stores,
) -> None:
    store = stores.new()
    await store.open()
    engine = fusee.Engine(store, [double, gated], worker="w-closing")
    await engine.recover()
    done = await engine.start(double, "d-1", 2)
    assert await done.result() == 4
    waiting = await engine.start(gated, "g-1", "a")
    assert engine.owns("g-1") or stores.kind == "postgres"
    await engine.close()
    assert engine.leases is None or not engine.leases.held
    assert not any(engine.owns(id) for id in ["d-1", "g-1", *(f"r-{i}" for i in range(64))])
    calls = {
        "result of an ended run": done.result(),
        "result": waiting.result(),
        "signal": waiting.signal(go, 1),
        "query": waiting.query(phase_q),
        "describe": waiting.describe(),
        "cancel": waiting.cancel(),
        "resume": waiting.resume(),
        "stream": anext(aiter(waiting.stream("log"))),
        "get_event": waiting.get_event("k"),
        "fork": waiting.fork("g-2", at=0),
        "complete": engine.complete("g-1/1/0/1"),
    }
    for call in calls.values():
        with pytest.raises(fusee.FuseeError, match="this engine is closed"):
            await call
    if isinstance(store, PostgresStore):
        # Its leases were given back: no shard is left to run out under its name.
        assert stores.postgres is not None
        other = PostgresStore(stores.postgres.dsn, schema=store.schema)
        await other.open()
        try:
            owners = {owner for owner, _, live in (await other.leases()).values() if live}
        finally:
            await other.close()
        assert "w-closing" not in owners


@pytest.mark.parametrize("leaves", ["ends", "parks"])
async def test_a_run_that_leaves_memory_is_freed_without_the_cyclic_garbage_collector(
    host: Host, leaves: str
) -> None:
    # Its driver, loop, machine and state refer to each other while it is
    # loaded; once it ends or parks nothing of it may hold a cycle, or every
    # finished run waits for a full collection, which walks them all.
    gc.collect()
    gc.disable()
    try:
        async with host(workflows=[gated], park_after="1s") as t:
            run = await t.start(gated, "x-1", "a")
            await t.settle()
            state = t.engine.runs.loaded("x-1")
            assert state is not None
            driver, loop = weakref.ref(state.driver), weakref.ref(state.driver.loop)
            del state
            if leaves == "ends":
                await run.signal(go, 1)
                assert await run.result() == 2
                await t.settle()
            else:
                await t.advance("2s")
            assert not t.is_loaded("x-1")
            assert (driver(), loop()) == (None, None)
            await t.crash()
            if leaves == "parks":
                await t.get("x-1").signal(go, 1)
            assert await t.get("x-1").result() == 2
    finally:
        gc.enable()


@fusee.workflow("leaves-a-timer")
async def leaves_a_timer(ctx: fusee.Ctx) -> str:
    ctx.sleep("never-awaited", "1h")  # its timer is armed; the run ends first
    ctx.sleep("never-awaited-either", "2h")
    return "ended"


async def test_a_runs_end_cancels_its_own_timers_and_no_other_runs(host: Host) -> None:
    async with host(workflows=[leaves_a_timer, napper]) as t:
        sleeping = await t.start(napper, "n-1")
        await t.settle()
        assert await t.execute(leaves_a_timer, "l-1") == "ended"
        await t.settle()
        armed = [key for shard in t.engine.runs.shards for key in shard.timers]
        assert [key for key in armed if key[0] == "l-1"] == []
        assert [key for key in armed if key[0] == "n-1"] == [("n-1", 0)]
        await t.advance("1h")
        assert await sleeping.result() == "rested"
        await t.crash()
        assert await t.get("l-1").result() == "ended"
        assert await t.get("n-1").result() == "rested"


# --- describe and list ----------------------------------------------------------------------------


@fusee.workflow("slow-retry")
async def slow_retry(ctx: fusee.Ctx) -> str:
    def flaky(s: fusee.StepCtx) -> str:
        if s.attempt == 1:
            raise ConnectionError("try later")
        return "ok"

    return await ctx.step("flaky", flaky, retry=fusee.Retry(attempts=3, initial="1h"))


@fusee.workflow("hopeless")
async def hopeless(ctx: fusee.Ctx) -> str:
    def fail() -> str:
        raise ConnectionError("down")

    return await ctx.step("call", fail, retry=fusee.Retry(attempts=2, initial="1s"))


@fusee.workflow("looper")
async def looper(ctx: fusee.Ctx, n: int) -> int:
    await ctx.wait_for(go)
    if n < 1:
        ctx.continue_as_new(n + 1)
    return n


async def test_describe_tells_each_status(host: Host) -> None:
    async with host(workflows=[slow_retry, hopeless, napper, double, broken, gated, looper]) as t:
        retrying = await t.start(slow_retry, "retrying")
        sleeping = await t.start(napper, "sleeping")
        paused = await t.start(hopeless, "paused")
        await t.advance("10s")
        assert (await retrying.describe()).status == "running"
        assert (await sleeping.describe()).status == "suspended"
        info = await paused.describe()
        assert (info.status, info.paused_steps) == ("paused", ("call",))
        await t.execute(double, "completed", 1)
        with pytest.raises(fusee.WorkflowFailed):
            await t.execute(broken, "failed")
        cancelled = await t.start(gated, "cancelled", "x")
        await cancelled.cancel("no")
        with pytest.raises(fusee.Cancelled):
            await cancelled.result()
        looping = await t.start(looper, "continued", 0)
        await t.settle()
        first = await looping.describe()
        await looping.signal(go, 1)
        await t.settle()
        assert (await looping.describe()).run > first.run

        async def statuses() -> dict[str, str]:
            return {i.id: i.status async for i in t.list()}

        expected = {
            "retrying": "running",
            "sleeping": "suspended",
            "paused": "paused",
            "completed": "completed",
            "failed": "failed",
            "cancelled": "cancelled",
            "continued": "suspended",
        }
        assert await statuses() == expected
        await t.crash()
        await t.settle()  # recovery loads the unfinished runs in the background
        assert await statuses() == expected
        info = await paused.describe()
        assert (info.status, info.paused_steps) == ("paused", ("call",))


async def test_describe_gives_start_and_finish_times_on_the_engine_clock(host: Host) -> None:
    async with host(workflows=[napper]) as t:
        start = t.clock.now_ms()
        run = await t.start(napper, "n-1")
        info = await run.describe()
        assert info.started_at == datetime.datetime.fromtimestamp(start / 1000, datetime.UTC)
        assert info.finished_at is None
        assert (info.id, info.workflow) == ("n-1", "napper")
        assert await run.result() == "rested"
        info = await run.describe()
        assert info.status == "completed"
        assert info.finished_at is not None
        assert info.started_at is not None
        assert info.finished_at - info.started_at == datetime.timedelta(hours=1)
        await t.crash()
        assert await run.describe() == info


async def test_list_filters_by_status_workflow_and_attributes(host: Host) -> None:
    async with host(workflows=[gated, double]) as t:
        await t.start(gated, "g-ana", "ana")
        await t.start(gated, "g-bo", "bo")
        await t.execute(double, "d-1", 1)
        await t.settle()

        async def ids(**filters: Any) -> list[str]:
            return [i.id async for i in t.list(**filters)]

        # By start time, then id: all three started at the same virtual time.
        assert await ids() == ["d-1", "g-ana", "g-bo"]
        assert await ids(workflow="gated") == ["g-ana", "g-bo"]
        assert await ids(status="completed") == ["d-1"]
        assert await ids(status="suspended") == ["g-ana", "g-bo"]
        assert await ids(attributes={"tag": "bo"}) == ["g-bo"]
        assert await ids(workflow="double", attributes={"tag": "bo"}) == []
        assert await ids(limit=1) == ["d-1"]
        await t.crash()
        await t.settle()  # recovery loads the unfinished runs in the background
        assert await ids(status="suspended") == ["g-ana", "g-bo"]
        assert await ids(attributes={"tag": "ana"}) == ["g-ana"]


async def test_list_with_a_limit_reads_only_the_rows_it_needs_from_the_store(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with host(workflows=[gated, double]) as t:
        for i in range(150):
            await t.start(gated, f"g-{i:03}", "x")
        # Last in the listing's order (start time, then id).
        await t.execute(double, "z-1", 1)
        await t.settle()
        fetched: list[int] = []

        async def ids(**filters: Any) -> list[str]:
            store = t.engine.store
            read = store.list

            async def counted(**kw: Any) -> list[Any]:
                rows = await read(**kw)
                fetched.append(len(rows))
                return rows

            fetched.clear()
            with monkeypatch.context() as m:
                m.setattr(store, "list", counted)
                return [i.id async for i in t.list(**filters)]

        for life in range(2):
            assert await ids(limit=1) == ["g-000"]
            assert fetched == [1]
            assert await ids(workflow="gated", limit=3) == ["g-000", "g-001", "g-002"]
            assert fetched == [3]
            # Filtered by status, it reads a page at a time until enough match.
            assert await ids(status="suspended", limit=2) == ["g-000", "g-001"]
            assert sum(fetched) < 151
            assert await ids(status="completed", limit=1) == ["z-1"]
            assert sum(fetched) == 151
            assert len(await ids(status="suspended")) == 150
            assert await ids(limit=0) == []
            if life == 0:
                await t.crash()
                await t.settle()  # recovery loads the unfinished runs in the background


@pytest.mark.parametrize(
    ("argument", "environment", "named"),
    [
        pytest.param("prod", None, "profile", id="argument-prod"),
        pytest.param("debug", None, "profile", id="argument-debug"),
        pytest.param(None, "prod", "FUSEE_PROFILE", id="environment-prod"),
    ],
)
async def test_a_profile_other_than_dev_is_refused_naming_where_it_came_from(
    argument: str | None, environment: str | None, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if environment is not None:
        monkeypatch.setenv("FUSEE_PROFILE", environment)
    value = argument or environment
    with pytest.raises(ValueError, match=rf"^{named} must be 'dev' .* or unset .*; got '{value}'$"):
        await fusee.Engine.open("memory", workflows=[double], profile=argument)


# --- async completions ----------------------------------------------------------------------------


async def test_complete_resolves_an_await_completion_and_the_token_survives_a_crash(
    host: Host,
) -> None:
    tokens: list[str] = []

    @fusee.workflow("approval")
    async def approval(ctx: fusee.Ctx) -> Any:
        return await ctx.await_completion("ask", lambda s: tokens.append(s.token or ""))

    async with host(workflows=[approval]) as t:
        run = await t.start(approval, "a-1")
        await t.settle()
        assert len(tokens) == 1
        assert (await run.describe()).status == "suspended"
        await t.crash()
        await t.settle()
        assert len(tokens) == 1  # the token function is a step: not run again
        await t.complete(tokens[0], {"ok": True})
        assert await run.result() == {"ok": True}
        # A second completion of a used token changes nothing.
        await t.complete(tokens[0], {"ok": False})
        assert await run.result() == {"ok": True}
        assert_steps_ran_once(t)


async def test_complete_refuses_what_is_not_a_token(host: Host) -> None:
    async with host(workflows=[]) as t:
        with pytest.raises(ValueError, match="not an await_completion token"):
            await t.complete("nonsense", 1)


# --- group commit ---------------------------------------------------------------------------------


async def test_many_runs_started_together_share_few_store_writes(host: Host) -> None:
    async def plus(n: int) -> int:
        return n + 1

    @fusee.workflow("fan")
    async def fan(ctx: fusee.Ctx, n: int) -> int:
        a = await ctx.step("a", lambda: plus(n))
        return await ctx.step("b", lambda: plus(a))

    async with host(workflows=[fan]) as t:
        committer = t.engine.committer
        writes, lsn = committer.writes, committer.lsn
        runs = await asyncio.gather(*(t.start(fan, f"f-{i}", i) for i in range(50)))
        results = await asyncio.gather(*(r.result() for r in runs))
        assert results == [i + 2 for i in range(50)]
        await t.settle()
        # Each run appends four records (start, two steps, end): 200 records,
        # each write taking whatever the runs appended while the last one ran.
        records, writes = committer.lsn - lsn, committer.writes - writes
        assert records == 200
        assert writes * 5 <= records, writes
        await t.crash()
        assert await asyncio.gather(*(r.result() for r in runs)) == results
        assert_steps_ran_once(t)


async def test_workflow_code_runs_ahead_of_the_disk_but_a_step_waits_for_its_gate(
    host: Host,
) -> None:
    order: list[str] = []

    async def step() -> int:
        # Async: it would run on the engine's loop at once if nothing held it.
        order.append("step")
        return 1

    @fusee.workflow("gate")
    async def gate_wf(ctx: fusee.Ctx) -> int:
        order.append("code")
        ctx.set_attributes({"k": 1})
        return await ctx.step("s", step)

    async with host(workflows=[gate_wf]) as t:
        with HeldWrites(t.engine.store) as disk:
            start = asyncio.ensure_future(t.start(gate_wf, "g-1"))
            await asyncio.wait_for(disk.waiting.wait(), 10)
            for _ in range(20):
                await asyncio.sleep(0)
            # The code ran up to its step while nothing was durable yet...
            assert order == ["code"]
            assert not start.done()
            assert t.engine.committer.durable_lsn < t.engine.committer.lsn
            # ...and the step waits until the records before it are on disk.
            disk.release()
            run = await start
            assert await run.result() == 1
            assert order == ["code", "step", "code"]  # the last: the dev profile's replay
            assert disk.writes >= 2
        await t.crash()
        assert await run.result() == 1
        assert_steps_ran_once(t)


async def test_a_read_only_step_runs_before_its_gate_is_durable(host: Host) -> None:
    peeked = asyncio.Event()

    async def look() -> str:
        peeked.set()
        return "seen"

    @fusee.workflow("peek")
    async def peek(ctx: fusee.Ctx) -> str:
        return await ctx.step("peek", look, read_only=True)

    async with host(workflows=[peek]) as t:
        with HeldWrites(t.engine.store) as disk:
            start = asyncio.ensure_future(t.start(peek, "p-1"))
            # The step runs although not even the run's start is durable.
            await asyncio.wait_for(peeked.wait(), 10)
            assert not start.done()
            assert t.engine.committer.durable_lsn == 0
            disk.release()
            run = await start
            assert await run.result() == "seen"
        await t.crash()
        assert await run.result() == "seen"
        assert step_runs(t) == Counter({("p-1", 0): 1})
