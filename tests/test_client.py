"""`fusee.Client` and `fusee.SyncClient`: runs started and driven through a store a worker serves.

Each behaviour runs with the engine in this process on the memory store,
SQLite and Postgres (the client on its own client store), and, on SQLite,
with the engine in a worker process of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import client_workflows as wfs
import pytest
import pytest_asyncio
from _postgres import Cluster
from engine.conftest import eventually

import fusee
import fusee.remote
from fusee import _codec
from fusee.client import SyncRun
from fusee.record import Signal, decode
from fusee.store import MemoryStore, PostgresStore, Store

HERE = Path(__file__).parent
WORKFLOWS: list[fusee.WorkflowDef[Any, Any]] = [
    wfs.tally,
    wfs.echo,
    wfs.charge,
    wfs.ticker,
    wfs.fragile,
]


@contextlib.asynccontextmanager
async def serving(
    store: Store, codecs: tuple[fusee.PayloadCodec, ...] = ()
) -> AsyncIterator[fusee.Engine]:
    await store.open()
    engine = fusee.Engine(store, WORKFLOWS, codecs=codecs)
    await engine.recover()
    try:
        yield engine
    finally:
        await engine.close()


@pytest_asyncio.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres"),
    ]
)
async def client(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[fusee.Client]:
    """A Client on a store an engine of this process serves."""
    kind = request.param
    if kind == "memory":
        store: Store = MemoryStore()
        async with serving(store), await fusee.Client.connect(store) as c:
            yield c
    elif kind == "sqlite":
        async with (
            await fusee.Engine.open(tmp_path, workflows=WORKFLOWS, durability="none"),
            await fusee.Client.connect(tmp_path, durability="none") as c,
        ):
            yield c
    else:
        cluster: Cluster = request.getfixturevalue("postgres_cluster")
        store = cluster.new_store()
        async with serving(store):
            # Answers come by notification: a poll for them would wait an hour.
            theirs = PostgresStore(
                cluster.dsn, schema=store.schema, client=True, answer_poll_s=3600
            )
            await theirs.open()
            try:
                async with await fusee.Client.connect(theirs) as c:
                    yield c
            finally:
                await theirs.close()


async def test_a_run_started_by_definition_and_by_name_gives_its_result(
    client: fusee.Client,
) -> None:
    run = await client.start(wfs.echo, "e-1", "hi")
    assert await run.result() == "hi"
    by_name: fusee.Run[int] = await client.start("tally", "t-1", 40)
    await by_name.signal(wfs.add, 2)
    await by_name.signal(wfs.add, 0)
    assert await by_name.result() == 42
    info = await by_name.describe()
    assert (info.status, info.workflow) == ("completed", "tally")
    assert [i.id async for i in client.list(status="completed")] == ["e-1", "t-1"]


async def test_signals_with_one_dedup_id_count_once_and_updates_and_queries_answer(
    client: fusee.Client,
) -> None:
    run = await client.start(wfs.tally, "t-1", 0)
    for _ in range(3):
        await run.signal(wfs.add, 5, dedup="pay-1")
    assert await run.update(wfs.bump, 10) == 15
    assert await run.query(wfs.total) == 15
    await run.signal(wfs.add, 0)
    assert await run.result() == 15
    assert [chunk async for chunk in run.stream("log")] == ["total 15"]


async def test_a_long_stream_polled_through_a_client_decodes_each_record_once(
    client: fusee.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[int] = []  # the LSN of every record the client's stream decodes
    decode_journal = fusee.remote.decode_journal

    def counting(id: str, run: int, entries: list[tuple[int, bytes]]) -> list[Any]:
        decoded.extend(lsn for lsn, _ in entries)
        return decode_journal(id, run, entries)

    monkeypatch.setattr("fusee.remote._readers.decode_journal", counting)
    run = await client.start(wfs.ticker, "tick-1")
    received: asyncio.Queue[int] = asyncio.Queue()

    async def read() -> None:
        async for n in run.stream("ticks"):
            received.put_nowait(n)

    async with asyncio.TaskGroup() as tg:
        tg.create_task(read())
        # One chunk at a time: the reader polls the journal once it has grown each time.
        for n in range(1, 41):
            await run.signal(wfs.add, n)
            assert await received.get() == n
        await run.signal(wfs.add, 0)
    assert await run.result() == 40
    assert received.empty()
    assert len(decoded) == len(set(decoded)) >= 40


async def test_a_closed_client_says_so_at_once_for_each_call(client: fusee.Client) -> None:
    run = await client.start(wfs.tally, "t-1", 0)
    await client.close()
    calls = {
        "start": client.start(wfs.echo, "e-1", "hi"),
        "list": anext(aiter(client.list())),
        "queue_stats": client.queue_stats(),
        "complete": client.complete("t-1/1/0/1"),
        "result": run.result(),
        "signal": run.signal(wfs.add, 1),
        "query": run.query(wfs.total),
        "update": run.update(wfs.bump, 1),
        "describe": run.describe(),
        "cancel": run.cancel(),
        "stream": anext(aiter(run.stream("log"))),
        "get_event": run.get_event("k"),
        "fork": run.fork("t-2", at=0),
        "schedules": client.schedules.list(),
    }
    for call in calls.values():
        with pytest.raises(fusee.FuseeError, match="this client is closed"):
            await call


async def test_a_wrongly_typed_signal_is_refused_before_it_is_recorded(
    client: fusee.Client,
) -> None:
    run = await client.start(wfs.tally, "t-1", 1)
    # The client has no workflow code: the engine checks the payload against
    # the definition it knows, and records nothing.
    with pytest.raises(fusee.PayloadError, match="does not fit the signal's type int"):
        await run.signal(fusee.signal("add"), "three")
    with pytest.raises(fusee.PayloadError, match="does not fit"):
        await run.signal(wfs.add, "three")  # type: ignore[misc]
    await run.signal(fusee.signal("add"), 2)
    await run.signal(wfs.add, 0)
    assert await run.result() == 3
    row = await client.store.get("t-1")
    assert row is not None
    journal = [decode(data) for _, data in await client.store.load("t-1", row.run)]
    assert [_codec.decode(r.payload) for r in journal if isinstance(r, Signal)] == [2, 0]


async def test_query_answers_decode_to_the_querys_result_type(client: fusee.Client) -> None:
    run = await client.start(wfs.tally, "t-1", 1)
    await run.signal(wfs.add, 2)
    # Durable is not yet seen by the code: the update waits for the sum.
    await eventually(lambda: _is(run.query(wfs.total), 3), "the signal's sum")
    assert await run.update(wfs.bump, 4) == 7
    assert await run.query(wfs.summary) == wfs.Summary(total=7, signals=1)
    assert await run.query(wfs.counts) == wfs.Counts(signals=1, bumps=1)
    assert await run.query(fusee.query("summary")) == {"total": 7, "signals": 1}
    await run.signal(wfs.add, 0)
    assert await run.result() == 7
    assert await run.query(wfs.summary) == wfs.Summary(total=7, signals=1)


async def test_a_run_id_is_checked_by_get_as_the_engine_checks_it(client: fusee.Client) -> None:
    async with await fusee.Engine.open("memory", workflows=[]) as engine:
        for bad in ("", "bad\ud800"):
            with pytest.raises(ValueError, match="a run") as by_client:
                client.get(bad)
            with pytest.raises(ValueError, match="a run") as by_engine:
                engine.get(bad)
            assert str(by_client.value) == str(by_engine.value)


async def test_a_cancelled_run_raises_cancelled_from_result(client: fusee.Client) -> None:
    run = await client.start(wfs.tally, "t-1", 0)
    await run.cancel("no longer needed")
    with pytest.raises(fusee.Cancelled, match="no longer needed"):
        await run.result()


async def test_a_run_started_with_a_timeout_is_cancelled_once_it_passes(
    client: fusee.Client,
) -> None:
    # tally waits for signals forever: only its deadline ends it.
    run = await client.start(wfs.tally, "t-deadline", 0, timeout="1ms")
    with pytest.raises(fusee.Cancelled, match="deadline exceeded"):
        await run.result()
    assert (await run.describe()).status == "cancelled"


async def test_a_delayed_run_is_queued_until_a_client_starts_it_now(
    client: fusee.Client,
) -> None:
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
    run = await client.start(wfs.echo, "e-later", "tomorrow", start_at=at)
    info = await run.describe()
    assert info.status == "queued"
    assert info.wake_at is not None
    assert abs((info.wake_at - at).total_seconds()) < 0.001
    await run.start_now()
    assert await run.result() == "tomorrow"


async def test_a_client_resumes_a_run_a_bug_paused_once_the_fix_is_deployed(
    client: fusee.Client,
) -> None:
    wfs.FRAGILE_FIXED["on"] = False
    run = await client.start(wfs.fragile, "f-1", 21)
    while (await run.describe()).status != "paused":
        await asyncio.sleep(0.01)
    wfs.FRAGILE_FIXED["on"] = True
    await run.resume()
    assert await run.result() == 42


async def test_the_workers_errors_are_raised_with_their_types(client: fusee.Client) -> None:
    await client.start(wfs.echo, "e-1", "hi")
    with pytest.raises(fusee.AlreadyExists, match="exists"):
        await client.start(wfs.echo, "e-1", "again")
    attached = await client.start(wfs.echo, "e-1", "again", id_policy=fusee.IdPolicy.ATTACH)
    assert await attached.result() == "hi"
    with pytest.raises(fusee.UnknownWorkflow, match="'nope'"):
        await client.start("nope", "n-1")
    with pytest.raises(fusee.PayloadError):
        # mypy refuses the wrong input as well: the test sends it all the same.
        await client.start(wfs.tally, "t-9", "not a number")  # type: ignore[misc]
    with pytest.raises(fusee.NotFound):
        await client.get("nobody").signal(wfs.add, 1)
    with pytest.raises(fusee.FuseeError, match="has finished"):
        await client.get("e-1").signal(wfs.add, 1)
    run = await client.start(wfs.tally, "t-1", 0)
    with pytest.raises(fusee.FuseeError, match="bump by a positive number"):
        await run.update(wfs.bump, -1)
    with pytest.raises(fusee.NotFound):
        await client.get("nobody").result()
    with pytest.raises(ValueError, match="await_completion token"):
        await client.complete("junk")


async def test_starts_made_at_once_start_each_run_once_and_fail_only_their_own_caller(
    client: fusee.Client,
) -> None:
    # On Postgres they are posted in one statement, their answers read in
    # one, and the worker answers them in one: each caller still gets its own.
    await client.start(wfs.echo, "taken", "first")
    ids = [f"many-{k}" for k in range(12)]
    *started, taken, unknown, mistyped = await asyncio.gather(
        *(client.start(wfs.echo, id, id) for id in ids),
        client.start(wfs.echo, "taken", "again"),
        client.start("nope", "unknown-1"),
        client.start(wfs.tally, "mistyped-1", "not a number"),  # type: ignore[misc]
        return_exceptions=True,
    )
    assert isinstance(taken, fusee.AlreadyExists)
    assert isinstance(unknown, fusee.UnknownWorkflow)
    assert isinstance(mistyped, fusee.PayloadError)
    assert all(isinstance(run, fusee.Run) for run in started), started
    assert [await cast("fusee.Run[str]", run).result() for run in started] == ids
    runs = [info.id async for info in client.list()]
    assert sorted(runs) == sorted([*ids, "taken"])  # each once; the refused ones not at all
    assert await client.get("taken").result() == "first"


async def test_starts_posted_at_once_are_applied_by_a_postgres_worker_in_one_transaction(
    postgres_cluster: Cluster,
) -> None:
    import asyncpg

    # Their Start records share the worker's commit, their answers its next
    # one (the row a transaction wrote last says which: its xmin).
    store = postgres_cluster.new_store()
    async with serving(store):
        theirs = PostgresStore(
            postgres_cluster.dsn, schema=store.schema, client=True, answer_poll_s=3600
        )
        await theirs.open()
        try:
            async with await fusee.Client.connect(theirs) as client:
                ids = [f"e-{k}" for k in range(20)]
                runs = await asyncio.gather(*(client.start(wfs.echo, id, id) for id in ids))
                assert [await run.result() for run in runs] == ids
        finally:
            await theirs.close()
    conn = await asyncpg.connect(postgres_cluster.dsn)
    try:
        q = f'"{store.schema}"'
        starts = await conn.fetchval(
            "SELECT count(DISTINCT xmin::text) FROM"
            f" (SELECT DISTINCT ON (id) xmin FROM {q}.journal ORDER BY id, lsn) AS first"
        )
        answers = await conn.fetchval(
            f"SELECT count(DISTINCT xmin::text) FROM {q}.commands WHERE kind = 'start'"
        )
    finally:
        await conn.close()
    assert (starts, answers) == (1, 1)


async def test_results_read_ahead_on_postgres_are_opened_by_the_clients_codecs(
    postgres_cluster: Cluster,
) -> None:
    store = postgres_cluster.new_store()
    codecs = (fusee.codecs.Zstd(),)
    async with serving(store, codecs=codecs):
        theirs = PostgresStore(postgres_cluster.dsn, schema=store.schema, client=True)
        await theirs.open()
        try:
            async with await fusee.Client.connect(theirs, codecs=codecs) as client:
                ids = [f"z-{k}" for k in range(4)]
                runs = await asyncio.gather(*(client.start(wfs.echo, id, id * 50) for id in ids))
                # The first result read finds its run ended and reads the
                # others' ends ahead: each through the codec chain.
                assert [await run.result() for run in runs] == [id * 50 for id in ids]
        finally:
            await theirs.close()


async def test_results_awaited_one_by_one_on_postgres_are_read_ahead_in_one_trip(
    postgres_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = postgres_cluster.new_store()
    async with serving(store) as engine:
        theirs = PostgresStore(
            postgres_cluster.dsn, schema=store.schema, client=True, answer_poll_s=3600
        )
        await theirs.open()
        try:
            async with await fusee.Client.connect(theirs) as client:
                ids = [f"e-{k}" for k in range(12)]
                runs = await asyncio.gather(*(client.start(wfs.echo, id, id) for id in ids))
                cancelled = await client.start(wfs.tally, "t-1", 1)
                await cancelled.cancel("no more")
                waiting = await client.start(wfs.tally, "t-2", 2)
                for id in ids:
                    await engine.get(id).result()
                with pytest.raises(fusee.Cancelled):
                    await engine.get("t-1").result()
                trips: list[str] = []
                query = theirs._query

                async def counted(fn: Any, doing: str) -> Any:
                    trips.append(doing)
                    return await query(fn, doing)

                monkeypatch.setattr(theirs, "_query", counted)
                # The first read finds its run ended: the next one reads the
                # other runs this client started (ended or not) at once.
                assert [await run.result() for run in runs] == ids
                with pytest.raises(fusee.Cancelled, match="no more"):
                    await cancelled.result()
                assert len(trips) == 2
                # Read ahead once: now from the store, with t-2 (not ended) read ahead again.
                assert await runs[0].result() == "e-0"
                assert len(trips) == 4
                await waiting.signal(wfs.add, 0)
                assert await waiting.result() == 2
        finally:
            await theirs.close()


async def test_a_client_creates_backfills_updates_and_deletes_a_schedule_on_the_worker(
    client: fusee.Client,
) -> None:
    await client.schedules.create("echoes", wfs.echo, every="1h", input="hi")
    [row] = await client.schedules.list()
    assert (row.workflow, row.dynamic, row.as_json()["origin"]) == ("echo", True, "runtime")
    hour = datetime.timedelta(hours=1)
    end = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1)
    runs = await client.schedules.backfill("echoes", end - 3 * hour, end)
    assert [await run.result() for run in runs] == ["hi", "hi", "hi"]
    again = await client.schedules.backfill("echoes", end - 3 * hour, end)
    assert [run.id for run in again] == [run.id for run in runs]
    await client.schedules.update("echoes", every="2h", input="ho")
    older = await client.schedules.backfill("echoes", end - 9 * hour, end - 7 * hour)
    assert [await run.result() for run in older] == ["ho"]
    with pytest.raises(fusee.AlreadyExists, match="schedule 'echoes' exists"):
        await client.schedules.create("echoes", "echo", every="1h", input="hi")
    with pytest.raises(fusee.PayloadError):
        await client.schedules.create("numbers", wfs.tally, every="1h", input="not a number")
    await client.schedules.delete("echoes")
    assert await client.schedules.list() == []
    assert len([i async for i in client.list(workflow="echo")]) == 4


async def test_a_fork_posted_by_a_client_copies_the_steps_before_its_position(
    client: fusee.Client,
) -> None:
    run = await client.start(wfs.echo, "e-1", "hi")
    assert await run.result() == "hi"
    # At 0 the echo step runs again, on the new input; at 1 (past it) its
    # recorded result is replayed.
    assert await (await run.fork("e-2", at=0, input="yo")).result() == "yo"
    assert await (await client.get("e-1").fork("e-3", at=1, input="yo")).result() == "hi"
    assert await (await run.fork("e-4", at="echo")).result() == "hi"
    with pytest.raises(fusee.AlreadyExists, match="e-2"):
        await run.fork("e-2", at=0)
    with pytest.raises(ValueError, match="positions"):
        await run.fork("e-5", at=99)
    with pytest.raises(fusee.NotFound):
        await client.get("nobody").fork("e-6", at=0)
    with pytest.raises(fusee.PayloadError):
        await run.fork("e-7", at=0, input=5)


async def test_a_finished_run_a_client_deletes_is_gone_and_its_id_starts_again(
    client: fusee.Client,
) -> None:
    assert await (await client.start(wfs.echo, "e-1", "hi")).result() == "hi"
    running = await client.start(wfs.tally, "t-1", 0)
    with pytest.raises(fusee.RunNotFinished, match="cancel it first"):
        await running.delete()
    await client.get("e-1").delete()
    assert await client.store.get("e-1") is None
    with pytest.raises(fusee.NotFound):
        await client.get("e-1").describe()
    with pytest.raises(fusee.NotFound):
        await client.get("e-1").delete()
    assert await (await client.start(wfs.echo, "e-1", "again")).result() == "again"
    await running.cancel("done with it")
    with pytest.raises(fusee.Cancelled):
        await running.result()
    await running.delete()
    assert [i.id async for i in client.list()] == ["e-1"]


async def _paused(client: fusee.Client, ids: list[str]) -> None:
    # The worker pauses them on its own time: polled, as a result is.
    for _ in range(1000):
        if [(await client.get(id).describe()).status for id in ids] == ["paused"] * len(ids):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"runs {ids} did not pause")


async def test_cancel_many_cancels_each_matching_run_once_and_says_what_it_did(
    client: fusee.Client,
) -> None:
    runs = [await client.start(wfs.tally, f"t-{n}", n) for n in range(3)]
    assert await (await client.start(wfs.echo, "e-1", "hi")).result() == "hi"
    dry = await client.cancel_many(workflow="tally", dry_run=True)
    assert (dry.done, dict(dry.skipped)) == (("t-0", "t-1", "t-2"), {})
    done = await client.cancel_many(workflow="tally", reason="closing the shop")
    assert done.done == ("t-0", "t-1", "t-2")
    for run in runs:
        with pytest.raises(fusee.Cancelled, match="closing the shop"):
            await run.result()
    # Finished runs do not match a cancel.
    again = await client.cancel_many(workflow="tally")
    assert (again.done, dict(again.skipped)) == ((), {})
    assert (await client.get("e-1").describe()).status == "completed"
    with pytest.raises(ValueError, match="status 'nope'"):
        await client.cancel_many(status="nope")


async def test_fork_many_and_resume_many_move_every_paused_run_on(client: fusee.Client) -> None:
    wfs.DECLINED.update({"c-1", "c-2"})
    try:
        runs = [await client.start(wfs.charge, f"c-{n}", n * 10) for n in (1, 2)]
        assert await (await client.start(wfs.charge, "c-3", 30)).result() == 30
        await _paused(client, ["c-1", "c-2"])
        # Each fork runs the failed step again, live, under its new id.
        forks = await client.fork_many(workflow="charge", status="paused", new_id="{id}-again")
        assert forks.done == ("c-1-again", "c-2-again")
        assert [await client.get(id).result() for id in forks.done] == [10, 20]
        # A completed run has no failed step to fork from.
        none = await client.fork_many(workflow="charge", status="completed")
        assert none.done == ()
        assert sorted(none.skipped) == ["c-1-again", "c-2-again", "c-3"]
        assert "no failed step" in none.skipped["c-3"]
        wfs.DECLINED.clear()
        resumed = await client.resume_many(workflow="charge", status="paused")
        assert resumed.done == ("c-1", "c-2")
        assert [await run.result() for run in runs] == [10, 20]
    finally:
        wfs.DECLINED.clear()


async def test_a_sync_client_makes_the_same_calls_from_a_thread(tmp_path: Path) -> None:
    async with await fusee.Engine.open(tmp_path, workflows=WORKFLOWS, durability="none"):

        def script() -> tuple[int, list[str], str]:
            with fusee.SyncClient.connect(tmp_path, durability="none") as sync:
                run = sync.start(wfs.tally, "t-1", 1)
                run.signal(wfs.add, 2, dedup="a")
                run.signal(wfs.add, 2, dedup="a")
                assert run.update(wfs.bump, 3) == 6
                assert run.query(wfs.total) == 6
                assert run.query(wfs.counts) == wfs.Counts(signals=1, bumps=1)
                with pytest.raises(fusee.PayloadError, match="does not fit"):
                    run.signal(fusee.signal("add"), "two")
                run.signal(wfs.add, 0)
                result = run.result()
                ids = [info.id for info in sync.list(status="completed")]
                with pytest.raises(fusee.AlreadyExists):
                    sync.start(wfs.tally, "t-1", 1)
                echoed = sync.start(wfs.echo, "e-1", "hi")
                assert echoed.fork("e-2", at=0, input="yo").result() == "yo"
                other: SyncRun[int] = sync.start("tally", "t-2", 0)
                other.cancel("stop")
                with pytest.raises(fusee.Cancelled, match="stop"):
                    other.result()
                sync.start("tally", "t-3", 0)
                assert sync.cancel_many(workflow="tally").done == ("t-3",)
                assert sync.resume_many(status="paused").done == ()
                assert sync.fork_many(workflow="tally", dry_run=True).done == ("t-1", "t-2", "t-3")
                other.delete()
                with pytest.raises(fusee.NotFound):
                    other.describe()
                later = sync.start(wfs.echo, "e-3", "later", delay="1h", timeout="2h")
                assert later.describe().status == "queued"
                later.start_now()
                assert later.result() == "later"
                return result, ids, next(iter(run.stream("log")))

        assert await asyncio.to_thread(script) == (6, ["t-1"], "total 6")


@fusee.workflow("stepping")
async def stepping(ctx: fusee.Ctx) -> str:
    await ctx.set_event("phase", "waiting")
    await ctx.wait_for(wfs.add)
    await ctx.set_event("phase", "done")
    return "ok"


async def test_a_sync_client_reads_events_and_waits_for_them(tmp_path: Path) -> None:
    async with await fusee.Engine.open(tmp_path, workflows=[stepping], durability="none") as e:
        run = await e.start(stepping, "s-1")
        assert await run.get_event("phase") == "waiting"

        def script() -> tuple[Any, Any]:
            with fusee.SyncClient.connect(tmp_path, durability="none") as sync:
                handle = sync.get("s-1")
                first = handle.get_event("phase")
                with pytest.raises(TimeoutError, match="did not set event 'other'"):
                    handle.get_event("other", timeout="10ms")
                handle.signal(wfs.add, 1)
                assert handle.result() == "ok"
                return first, handle.get_event("phase")

        assert await asyncio.to_thread(script) == ("waiting", "done")


@fusee.workflow("chime")
async def chime(ctx: fusee.Ctx) -> str:
    return "chimed"


async def test_a_sync_client_lists_pauses_resumes_and_triggers_schedules(tmp_path: Path) -> None:
    hourly = fusee.Schedule("hourly", chime, every="1h")
    async with await fusee.Engine.open(
        tmp_path, workflows=[chime], schedules=[hourly], durability="none"
    ):

        def script() -> tuple[list[bool], str, str]:
            with fusee.SyncClient.connect(tmp_path, durability="none") as sync:
                sync.schedules.pause("hourly")
                paused = [row.paused for row in sync.schedules.list()]
                sync.schedules.resume("hourly")
                paused += [row.paused for row in sync.schedules.list()]
                run = sync.schedules.trigger("hourly")
                with pytest.raises(fusee.NotFound, match="no schedule 'nope'"):
                    sync.schedules.pause("nope")
                sync.schedules.create("daily", "chime", cron="0 9 * * *")
                end = datetime.datetime.now(datetime.UTC)
                [back] = sync.schedules.backfill("daily", end - datetime.timedelta(days=1), end)
                assert back.result() == "chimed"
                sync.schedules.delete("daily")
                return paused, run.id.split("-")[0], run.result()

        assert await asyncio.to_thread(script) == ([True, False], "hourly", "chimed")


# --- a worker in another process ------------------------------------------------------------------


@contextlib.contextmanager
def worker_process(target: Path | str, durability: str = "none") -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, str(HERE / "client_worker.py"), str(target), durability],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=HERE,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        yield process
    finally:
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.close()
        process.wait(30)
        process.stdout.close()


async def test_a_client_drives_a_run_a_worker_process_serves(tmp_path: Path) -> None:
    with worker_process(tmp_path):
        async with await fusee.Client.connect(tmp_path, durability="none") as client:
            run = await client.start(wfs.tally, "t-1", 1)
            await run.signal(wfs.add, 1, dedup="x")
            await run.signal(wfs.add, 1, dedup="x")
            assert await run.query(wfs.total) == 2
            await run.signal(wfs.add, 0)
            assert await run.result() == 2


async def test_every_command_of_a_quick_series_from_another_process_is_applied(
    tmp_path: Path,
) -> None:
    # Hundreds of commits from two processes into one WAL, while the worker
    # watches the WAL index for new commands: none may be lost.
    with worker_process(tmp_path, durability="fsync"):
        async with await fusee.Client.connect(tmp_path) as client:
            runs = [await client.start(wfs.echo, f"e-{n}", str(n)) for n in range(300)]
            assert [await run.result() for run in runs] == [str(n) for n in range(300)]


async def test_commands_posted_while_no_worker_runs_are_applied_when_one_starts(
    tmp_path: Path,
) -> None:
    async with await fusee.Client.connect(tmp_path, durability="none") as client:
        started = await client.post(
            "start", "t-1", {"workflow": "tally", "input": fusee._codec.encode(3)}
        )
        await client.post("signal", "t-1", {"name": "add", "payload": fusee._codec.encode(0)})
        assert await client.wait_answer(started.id, timeout_s=0) is None
        with worker_process(tmp_path):
            answer = await client.wait_answer(started.id)
            assert answer is not None
            assert answer.ok
            assert await client.get("t-1").result() == 3


async def test_a_run_started_before_a_worker_is_killed_ends_under_the_next_one(
    tmp_path: Path,
) -> None:
    async with await fusee.Client.connect(tmp_path, durability="none") as client:
        with worker_process(tmp_path) as process:
            run = await client.start(wfs.tally, "t-1", 5)
            await run.signal(wfs.add, 1, dedup="once")
            process.kill()
            process.wait(30)
        waiting = asyncio.ensure_future(run.result())
        await client.post("signal", "t-1", {"name": "add", "payload": fusee._codec.encode(0)})
        with worker_process(tmp_path):
            assert await waiting == 6


async def test_a_client_posts_to_a_postgres_worker_process(postgres_cluster: Cluster) -> None:
    url = postgres_cluster.dsn
    with worker_process(url):
        async with await fusee.Client.connect(url, durability="none") as client:
            run = await client.start(wfs.tally, "client-pg-1", 1)
            await run.signal(wfs.add, 0)
            assert await run.result() == 1


async def _is(answer: Any, expected: Any) -> bool:
    return bool(await answer == expected)
