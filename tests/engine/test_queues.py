"""Queued starts (fusee/engine/_queues.py): limits, priority, rate, cancel, debounce, crashes.

Every test runs on the memory store, SQLite and Postgres (see conftest), on
the test host's virtual clock, and each once live and once with a crash in
the middle; a step records when a run holds its slot, so the tests count
runs running at once, and no step runs twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from _postgres import Cluster

import fusee
from fusee.engine import Engine
from fusee.record import decode
from fusee.store import Entry, PostgresStore, RunRow, SqliteStore, Store
from fusee.testing import TestEngine

from .conftest import HeldWrites, Host, Stores, assert_steps_ran_once, client_of

pytestmark = pytest.mark.asyncio

CRASH = [pytest.param(False, id="live"), pytest.param(True, id="crash")]
# The stores an engine writes alone: it admits in memory (`_Book`), and a
# queued start is one append.
ALONE = [pytest.param("memory", id="memory"), pytest.param("sqlite", id="sqlite")]


class Gauge:
    """Counts the runs between their ``enter`` and ``leave`` steps, overall and per key."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.keys: Counter[str] = Counter()
        self.most_per_key: Counter[str] = Counter()
        self.order: list[str] = []

    def enter(self, id: str, key: str) -> None:
        self.order.append(id)
        self.now += 1
        self.most = max(self.most, self.now)
        self.keys[key] += 1
        self.most_per_key[key] = max(self.most_per_key[key], self.keys[key])

    def leave(self, key: str) -> None:
        self.now -= 1
        self.keys[key] -= 1


def tracked(gauge: Gauge, name: str = "tracked", work: str = "1s") -> fusee.WorkflowDef[str, str]:
    @fusee.workflow(name)
    async def wf(ctx: fusee.Ctx, key: str) -> str:
        id = ctx.info.id
        await ctx.step("enter", lambda: gauge.enter(id, key))
        await ctx.sleep("work", work)
        await ctx.step("leave", lambda: gauge.leave(key))
        return f"{id} done"

    return wf


async def settle_or_crash(t: TestEngine, crash: bool) -> None:
    await t.settle()
    if crash:
        await t.crash()


@pytest.mark.parametrize("crash", CRASH)
async def test_a_queue_never_runs_more_runs_at_once_than_its_concurrency(
    host: Host, crash: bool
) -> None:
    gauge = Gauge()
    wf = tracked(gauge)
    q = fusee.Queue("work", concurrency=2)
    async with host(workflows=[wf], queues=[q]) as t:
        runs = [await t.start(wf, f"r-{i}", "k", queue=q) for i in range(7)]
        await settle_or_crash(t, crash)
        stats = await t.queue_stats()
        assert [(s.queue, s.queued, s.running) for s in stats] == [("work", 5, 2)]
        assert [(await r.describe()).status for r in runs].count(fusee.RunStatus.QUEUED) == 5
        assert [await r.result() for r in runs] == [f"r-{i} done" for i in range(7)]
        assert gauge.most == 2
        assert sorted(gauge.order) == [f"r-{i}" for i in range(7)]
        assert [(s.queued, s.running) for s in await t.queue_stats()] == [(0, 0)]
        assert_steps_ran_once(t)


@pytest.mark.parametrize("crash", CRASH)
async def test_per_key_bounds_each_key_while_other_keys_run(host: Host, crash: bool) -> None:
    gauge = Gauge()
    wf = tracked(gauge)
    q = fusee.Queue("mail", concurrency=3, per_key=1)
    async with host(workflows=[wf], queues=[q]) as t:
        runs = [
            await t.start(wf, f"{key}-{i}", key, queue="mail", key=key)
            for i in range(3)
            for key in ("a", "b")
        ]
        await settle_or_crash(t, crash)
        (stats,) = await t.queue_stats()
        assert stats.keys == {"a": (2, 1), "b": (2, 1)}
        for r in runs:
            await r.result()
        assert gauge.most_per_key == Counter({"a": 1, "b": 1})
        assert gauge.most == 2
        assert_steps_ran_once(t)


@pytest.mark.parametrize("crash", CRASH)
async def test_lower_priority_numbers_are_admitted_first_then_arrival_order(
    host: Host, crash: bool
) -> None:
    gauge = Gauge()
    wf = tracked(gauge)
    q = fusee.Queue("one", concurrency=1)
    async with host(workflows=[wf], queues=[q]) as t:
        first = await t.start(wf, "first", "k", queue=q, priority=9)
        await t.settle()
        for id, priority in [("p5", 5), ("p1", 1), ("p3", 3), ("p1-later", 1)]:
            await t.start(wf, id, "k", queue=q, priority=priority)
        await settle_or_crash(t, crash)
        for id in ("first", "p5", "p1", "p3", "p1-later"):
            await t.get(id).result()
        assert first.id == "first"
        assert gauge.order == ["first", "p1", "p1-later", "p3", "p5"]
        assert_steps_ran_once(t)


@pytest.mark.parametrize("crash", CRASH)
async def test_a_rate_admits_at_most_n_runs_in_any_window_of_its_period(
    host: Host, crash: bool
) -> None:
    gauge = Gauge()
    wf = tracked(gauge, work="10ms")
    q = fusee.Queue("api", rate=(2, "1s"))
    async with host(workflows=[wf], queues=[q]) as t:
        t0 = t.clock.now_ms()
        runs = [await t.start(wf, f"r-{i}", "k", queue=q) for i in range(7)]
        await settle_or_crash(t, crash)
        for r in runs:
            await r.result()
        started = [(await r.describe()).started_at for r in runs]
        offsets_ms = [round(s.timestamp() * 1000) - t0 for s in started if s is not None]
        assert offsets_ms == [0, 0, 1000, 1000, 2000, 2000, 3000]
        assert_steps_ran_once(t)


@pytest.mark.parametrize("crash", CRASH)
async def test_cancelling_a_queued_run_ends_it_cancelled_without_running_its_code(
    host: Host, crash: bool
) -> None:
    gauge = Gauge()
    wf = tracked(gauge, work="1h")
    q = fusee.Queue("one", concurrency=1)
    async with host(workflows=[wf], queues=[q]) as t:
        busy = await t.start(wf, "busy", "k", queue=q)
        waiting = await t.start(wf, "waiting", "k", queue=q)
        after = await t.start(wf, "after", "k", queue=q)
        await settle_or_crash(t, crash)
        await waiting.cancel("not needed")
        with pytest.raises(fusee.RunFinished, match="has finished \\(cancelled\\)"):
            await waiting.cancel("again")
        assert (await waiting.describe()).status == "cancelled"
        with pytest.raises(fusee.Cancelled, match="not needed"):
            await waiting.result()
        assert await busy.result() == "busy done"
        assert await after.result() == "after done"
        assert gauge.order == ["busy", "after"]
        if crash:
            await t.crash()
        assert (await waiting.describe()).status == "cancelled"
        assert_steps_ran_once(t)


@pytest.mark.parametrize("crash", CRASH)
async def test_a_debounced_start_replaces_the_input_and_pushes_the_admission_back(
    host: Host, crash: bool
) -> None:
    @fusee.workflow("echo")
    async def echo(ctx: fusee.Ctx, text: str) -> str:
        return await ctx.step("echo", lambda: text)

    q = fusee.Queue("typing")
    async with host(workflows=[echo], queues=[q]) as t:
        t0 = t.clock.now_ms()
        run = await t.start(echo, "save-1", "h", queue=q, debounce="5s")
        await t.advance("3s")
        again = await t.start(echo, "save-1", "hello", queue=q, debounce="5s")
        assert again.id == run.id
        await settle_or_crash(t, crash)
        await t.advance("4s")  # 7s after the first start, 4s after the second
        assert (await run.describe()).status == "queued"
        await t.advance("1s")
        assert await run.result() == "hello"
        info = await run.describe()
        assert info.started_at == datetime.datetime.fromtimestamp((t0 + 8000) / 1000, datetime.UTC)
        assert_steps_ran_once(t)


@pytest.mark.parametrize("crash", CRASH)
async def test_start_now_keeps_the_input_of_a_debounce_landing_in_the_same_instant(
    fusee_engine: Any, postgres_cluster: Cluster, crash: bool
) -> None:
    # On a store workers share, the store applies both (`Store.start_queued`,
    # `Store.debounce_queued`): the debounce lands between start_now's read of
    # the item and its write, or just before its one conditional write (after
    # that write the run may be admitted at once, and a debounce then meets a
    # running id).
    @fusee.workflow("echo")
    async def echo(ctx: fusee.Ctx, text: str) -> str:
        return await ctx.step("echo", lambda: text)

    q = fusee.Queue("typing")
    t: TestEngine = fusee_engine(workflows=[echo], queues=[q], store=postgres_cluster.new_store())
    async with t:
        run = await t.start(echo, "save-2", "old", queue=q, debounce="1h")
        store = t.store
        landed: list[str] = []

        async def land() -> None:
            if not landed:
                landed.append("newer")
                await t.start(echo, "save-2", "newer", queue=q, debounce="5s")

        def debounce_lands(call: Callable[..., Awaitable[Any]], *, before: bool) -> Any:
            async def calling(*args: Any, **kw: Any) -> Any:
                if before:
                    await land()
                result = await call(*args, **kw)
                await land()
                return result

            return calling

        with pytest.MonkeyPatch.context() as mp:
            for name, before in [
                ("queue_items", False),
                ("start_queued", True),
                ("debounce_queued", True),
            ]:
                mp.setattr(store, name, debounce_lands(getattr(store, name), before=before))
            await run.start_now()
        assert landed == ["newer"]
        await settle_or_crash(t, crash)
        await t.advance("5s")
        assert await run.result() == "newer"
        assert_steps_ran_once(t)


@pytest.mark.parametrize("crash", CRASH)
async def test_starting_a_queued_id_follows_the_id_policy(host: Host, crash: bool) -> None:
    gauge = Gauge()
    wf = tracked(gauge)
    q = fusee.Queue("one", concurrency=1)
    async with host(workflows=[wf], queues=[q]) as t:
        await t.start(wf, "busy", "k", queue=q)
        await t.start(wf, "queued", "k", queue=q)
        await settle_or_crash(t, crash)
        with pytest.raises(fusee.AlreadyExists, match="'queued' exists"):
            await t.start(wf, "queued", "k", queue=q)
        with pytest.raises(fusee.AlreadyExists, match="'queued' exists"):
            await t.start(wf, "queued", "k")
        attached = await t.start(wf, "queued", "k", queue=q, id_policy=fusee.IdPolicy.ATTACH)
        assert await attached.result() == "queued done"
        assert gauge.order == ["busy", "queued"]
        assert_steps_ran_once(t)


async def test_an_unknown_queue_is_refused_and_nothing_is_recorded(host: Host) -> None:
    gauge = Gauge()
    wf = tracked(gauge)
    async with host(workflows=[wf], queues=[fusee.Queue("known")]) as t:
        with pytest.raises(
            fusee.UnknownQueue, match=r"queue 'nope' is not one of this engine's queues \('known'\)"
        ):
            await t.start(wf, "r-1", "k", queue="nope")
        with pytest.raises(fusee.UnknownQueue, match=r"differs from the engine's queue 'known'"):
            await t.start(wf, "r-1", "k", queue=fusee.Queue("known", concurrency=1))
        assert [info async for info in t.list()] == []
        assert await t.store.queue_items() == []


async def test_a_run_admitted_before_its_start_was_written_starts_after_a_crash(
    host: Host,
) -> None:
    gauge = Gauge()
    wf = tracked(gauge)
    q = fusee.Queue("one", concurrency=1)
    async with host(workflows=[wf], queues=[q]) as t:
        # Admitted in the store, then a crash before the engine wrote its start.
        from fusee.store._queues import QueueItem

        await t.store.enqueue(
            QueueItem("one", "lost", 1, wf.name, fusee._codec.encode("k")),
            fusee.store.RunRow("lost", 1, wf.name, "queued", t.clock.now_ms()),
        )
        admission = await t.store.admit(q.limits, t.clock.now_ms())
        assert [i.id for i in admission.items] == ["lost"]
        await t.crash()
        assert await t.get("lost").result() == "lost done"
        assert gauge.order == ["lost"]


@pytest.mark.parametrize("store_kind", ALONE)
@pytest.mark.parametrize("crash", CRASH)
async def test_a_runs_end_frees_its_slot_and_starts_the_next_run_in_the_write_of_its_done(
    host: Host, crash: bool
) -> None:
    # An engine alone on its store admits in memory: a queue costs no write
    # of its own, and no crash frees a slot whose run goes on.
    @fusee.workflow("quick")
    async def quick(ctx: fusee.Ctx, n: int) -> int:
        await ctx.sleep("hold", "1s")  # on the virtual clock: b is queued before a ends
        return await ctx.step("s", lambda: n)

    q = fusee.Queue("one", concurrency=1)
    async with host(workflows=[quick], queues=[q]) as t:
        writes: list[tuple[list[str], list[tuple[str, str]], int]] = []
        inner = t.store.append

        async def append(entries: Sequence[Entry], runs: Sequence[RunRow] = (), **kw: Any) -> None:
            names = [f"{type(decode(e.data)).__name__} {e.id}" for e in entries]
            items = [(i.id, i.state) for i in kw.get("items", ())]
            writes.append((names, items, len(kw.get("forget", ()))))
            await inner(entries, runs, **kw)

        t.store.append = append  # type: ignore[method-assign]
        a = await t.start(quick, "a", 1, queue=q)
        b = await t.start(quick, "b", 2, queue=q)
        # Queued and admitted in the write of its start: one write, not three.
        assert writes[0] == (["Start a", "Timer a"], [("a", "admitted")], 0)
        await settle_or_crash(t, crash)
        assert (await a.result(), await b.result()) == (1, 2)
        ends = [w for w in writes if "Done a" in w[0]]
        if not crash:
            (end,) = ends
            assert "Start b" in end[0]
            # a's item is done, and forgotten at once (no rate window counts it).
            assert (end[1], end[2]) == ([("b", "admitted")], 1)
        assert [(s.queued, s.running) for s in await t.queue_stats()] == [(0, 0)]
        assert_steps_ran_once(t)


class HeldCommit:
    """Holds an SQLite store's next commit in its writer thread, after the store took the write.

    The store then answers reads from that write (`SqliteStore.get`), which
    `HeldWrites`, holding the write before it reaches the store, never shows.
    """

    def __init__(self, store: Store) -> None:
        assert isinstance(store, SqliteStore)
        self.store = store
        self.released = threading.Event()
        self.waiting = asyncio.Event()  # the commit is held (as `HeldWrites.waiting`)
        self._loop = asyncio.get_running_loop()

    def _hold(self, conn: object) -> None:
        self._loop.call_soon_threadsafe(self.waiting.set)
        self.released.wait(30)

    def release(self) -> None:
        self.released.set()

    def __enter__(self) -> HeldCommit:
        self.store.before_next_append(self._hold)
        return self

    def __exit__(self, *exc: object) -> None:
        self.released.set()


# Where a repeated start finds the first start's write: on its way to the
# store, or taken by the store and being committed (SQLite's writer thread).
HOLDS = [
    pytest.param("memory", "before", id="memory-before-the-store"),
    pytest.param("sqlite", "before", id="sqlite-before-the-store"),
    pytest.param("sqlite", "in", id="sqlite-in-the-writer"),
]


@pytest.mark.parametrize(("store_kind", "hold"), HOLDS)
@pytest.mark.parametrize(
    "admitted", [pytest.param(True, id="admitted"), pytest.param(False, id="queued")]
)
async def test_a_repeated_queued_start_is_acknowledged_only_once_the_first_is_durable(
    host: Host, admitted: bool, hold: str
) -> None:
    # A client that timed out sends its start again (ATTACH): the answer
    # "it exists" must not come before the first start's write is durable,
    # whether the run was admitted at once or waits, and wherever the write
    # is; nor while a signal to the id is loading it.
    gauge = Gauge()
    wf = tracked(gauge)
    q = fusee.Queue("one", concurrency=1)
    async with host(workflows=[wf], queues=[q]) as t:
        if not admitted:
            await t.start(wf, "first", "k", queue=q)
            await t.settle()
        holder = HeldWrites if hold == "before" else HeldCommit
        with holder(t.engine.store) as held:
            start = asyncio.ensure_future(t.start(wf, "r", "k", queue=q))
            await held.waiting.wait()
            signal = asyncio.ensure_future(t.get("r").signal(fusee.signal("poke", int), 1))
            # Sent again through the queue, or (a caller that lost track of
            # the queue) straight.
            again = [
                asyncio.ensure_future(
                    t.start(wf, "r", "k", queue=queue, id_policy=fusee.IdPolicy.ATTACH)
                )
                for queue in (q, q, None)
            ]
            for _ in range(20):
                await asyncio.sleep(0)
            assert not any(a.done() for a in [start, *again])
            held.release()
            await asyncio.gather(start, *again)
            with contextlib.suppress(fusee.FuseeError):
                await signal
        await t.crash()
        assert await t.get("r").result() == "r done"


class LateReads:
    """Answers a store's reads of a run's row late: each once the test opens its gate.

    The read itself is made at once; only its answer waits, as one from a
    starved reader thread reaches the loop after whatever ran meanwhile.
    """

    def __init__(self, store: Store, calls: int) -> None:
        self.store = store
        self.real = store.get
        self.gates = [asyncio.Event() for _ in range(calls)]
        self.read = asyncio.Event()  # every call has its answer, waiting for its gate
        self._calls = 0

    async def get(self, id: str) -> RunRow | None:
        gate = self.gates[self._calls] if self._calls < len(self.gates) else None
        self._calls += 1
        row = await self.real(id)
        if gate is None:
            return row
        if self._calls >= len(self.gates):
            self.read.set()
        await gate.wait()
        return row

    def __enter__(self) -> LateReads:
        self.store.get = self.get  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        for gate in self.gates:
            gate.set()
        self.store.get = self.real  # type: ignore[method-assign]


@pytest.mark.parametrize("store_kind", ALONE)
async def test_a_repeated_queued_start_the_engine_answers_after_crashing_is_not_acknowledged(
    host: Host,
) -> None:
    # A client's start and its resend (ATTACH) both read the id's row; the
    # first start's queue item goes to the book and waits for its write,
    # and the process dies before the write is made. The resend's read
    # answers after that: it finds the item in the dead engine's book, and
    # "it exists" would be a lie, as nothing of the run was written.
    gauge = Gauge()
    wf = tracked(gauge)
    q = fusee.Queue("one", concurrency=1)
    async with host(workflows=[wf], queues=[q]) as t:
        with LateReads(t.engine.store, calls=2) as late:
            first = asyncio.ensure_future(t.start(wf, "r", "k", queue=q))
            again = asyncio.ensure_future(
                t.start(wf, "r", "k", queue=q, id_policy=fusee.IdPolicy.ATTACH)
            )
            await late.read.wait()
            late.gates[0].set()
            # One turn: the first start books its item and waits for the
            # write, which the committer makes on its next turn: too late.
            await asyncio.sleep(0)
            await t.crash()
            late.gates[1].set()
            answers = await asyncio.gather(first, again, return_exceptions=True)
        assert await t.store.get("r") is None
        assert isinstance(answers[0], BaseException)
        assert isinstance(answers[1], fusee.FuseeError), answers[1]
        # The client sends it again to the engine now running: it runs once.
        await t.start(wf, "r", "k", queue=q, id_policy=fusee.IdPolicy.ATTACH)
        await t.settle()
        await t.crash()
        assert await t.get("r").result() == "r done"
        assert gauge.order == ["r"]


async def test_two_engines_on_one_postgres_database_share_a_queue_s_concurrency(
    postgres_cluster: Cluster,
) -> None:
    gauge = Gauge()
    left, right = tracked(gauge, "left", "30ms"), tracked(gauge, "right", "30ms")
    q = fusee.Queue("shared", concurrency=2)
    schema = postgres_cluster.new_name("queues_")
    engines: list[Engine] = []
    try:
        # Workers serve the same workflows; each admits and runs the runs of
        # the shards it holds.
        for name in ("a", "b"):
            store = PostgresStore(postgres_cluster.dsn, schema=schema, durability="none")
            await store.open()
            engine = Engine(
                store, [left, right], queues=[q], watchdog=None, lease="2s", worker=name
            )
            await engine.recover()
            engines.append(engine)
        a, b = engines
        assert a.leases is not None
        assert b.leases is not None
        for _ in range(200):  # the second takes its half within a few rounds
            if len(a.leases.held) == len(b.leases.held):
                break
            await asyncio.sleep(0.05)
        assert len(a.leases.held) == len(b.leases.held)
        runs = [
            await engine.start(wf, f"{wf.name}-{i}", "k", queue=q)
            for i in range(5)
            for engine, wf in zip(engines, (left, right), strict=True)
        ]
        results = await asyncio.wait_for(asyncio.gather(*(r.result() for r in runs)), 30)
        assert sorted(results) == sorted(f"{r.id} done" for r in runs)
        assert gauge.most == 2
        assert len(gauge.order) == 10
    finally:
        for engine in engines:
            await engine.close()


go = fusee.signal("go", int)


@fusee.workflow("held")
async def held(ctx: fusee.Ctx) -> int:
    return await ctx.wait_for(go) or 0


async def test_a_client_starts_runs_through_a_queue_and_reads_its_figures(
    stores: Stores,
) -> None:
    q = fusee.Queue("jobs", concurrency=1, per_key=1)
    store = stores.new()
    await store.open()
    engine = Engine(store, [held], queues=[q], watchdog=None)
    await engine.recover()
    try:
        async with client_of(stores, store) as client:
            first = await client.start(held, "c-1", queue=q, key="a")
            second: fusee.Run[int] = await client.start(
                "held", "c-2", queue="jobs", key="b", priority=1
            )
            with pytest.raises(fusee.UnknownQueue, match="queue 'other' is not one of"):
                await client.start(held, "c-3", queue="other")
            while (await second.describe()).status != "queued" or (
                await first.describe()
            ).status == "queued":
                await asyncio.sleep(0.01)
            (stats,) = await client.queue_stats()
            assert (stats.queue, stats.queued, stats.running) == ("jobs", 1, 1)
            assert stats.keys == {"a": (0, 1), "b": (1, 0)}
            await first.signal(go, 1)
            assert await first.result() == 1
            while (await second.describe()).status == "queued":
                await asyncio.sleep(0.01)
            await second.signal(go, 2)
            assert await second.result() == 2
            assert all(s.queued == 0 for s in await client.queue_stats())
    finally:
        await engine.close()


@pytest.mark.parametrize("crash", CRASH)
async def test_children_started_through_a_queue_wait_their_turn_and_report_to_the_parent(
    host: Host, crash: bool
) -> None:
    gauge = Gauge()
    child = tracked(gauge, "child")
    q = fusee.Queue("kids", concurrency=1, per_key=1)

    @fusee.workflow("parent")
    async def parent(ctx: fusee.Ctx) -> list[str]:
        kids = [ctx.child(child, f"kid-{i}", "k", queue=q, key=f"k{i % 2}") for i in range(3)]
        return list(await asyncio.gather(*kids))

    async with host(workflows=[parent, child], queues=[q]) as t:
        run = await t.start(parent, "p-1")
        await settle_or_crash(t, crash)
        (stats,) = await t.queue_stats()
        assert (stats.queued, stats.running) == (2, 1)
        assert await run.result() == [f"kid-{i} done" for i in range(3)]
        assert gauge.most == 1
        info = await t.get("kid-2").describe()
        assert info.status == "completed"
        assert_steps_ran_once(t)


@pytest.mark.parametrize("crash", CRASH)
async def test_a_queued_child_is_cancelled_with_its_parent_and_a_missing_queue_fails_it(
    host: Host, crash: bool
) -> None:
    gauge = Gauge()
    child = tracked(gauge, "child", work="1h")
    q = fusee.Queue("kids", concurrency=1)

    @fusee.workflow("parent")
    async def parent(ctx: fusee.Ctx) -> str:
        first = ctx.child(child, "kid-1", "k", queue=q)
        second = ctx.child(child, "kid-2", "k", queue="kids")
        try:
            await ctx.child(child, "kid-3", "k", queue="nowhere")
        except fusee.ChildFailed as e:
            missing = str(e)
        await asyncio.gather(first, second)
        return missing

    async with host(workflows=[parent, child], queues=[q]) as t:
        await t.start(child, "blocker", "k", queue=q)
        await t.settle()
        run = await t.start(parent, "p-1")
        await settle_or_crash(t, crash)
        assert [(await t.get(f"kid-{i}").describe()).status for i in (1, 2)] == ["queued"] * 2
        await run.cancel("stop")
        with pytest.raises(fusee.Cancelled):
            await run.result()
        await t.settle()
        assert [(await t.get(f"kid-{i}").describe()).status for i in (1, 2)] == ["cancelled"] * 2
        with pytest.raises(fusee.Cancelled, match="stopped waiting"):
            await t.get("kid-1").result()
        assert gauge.order == ["blocker"]
        assert_steps_ran_once(t)


async def test_a_child_through_a_queue_the_engine_lacks_fails_with_unknown_queue(
    host: Host,
) -> None:
    gauge = Gauge()
    child = tracked(gauge, "child")

    @fusee.workflow("parent")
    async def parent(ctx: fusee.Ctx) -> str:
        try:
            return await ctx.child(child, "kid-1", "k", queue="nowhere")
        except fusee.ChildFailed as e:
            return str(e)

    async with host(workflows=[parent, child], queues=[fusee.Queue("kids")]) as t:
        assert "queue 'nowhere' is not one of this engine's queues ('kids')" in await t.execute(
            parent, "p-1"
        )
        await t.crash()
        assert "UnknownQueue" in await t.get("p-1").result()
        assert gauge.order == []


@fusee.workflow("tally")
async def tally(ctx: fusee.Ctx) -> list[int]:
    got = [await ctx.wait_for(go) or 0 for _ in range(2)]
    return await ctx.step("sum", lambda: got)


@pytest.mark.parametrize("crash", CRASH)
async def test_signals_to_a_queued_run_wait_for_it_and_one_dedup_id_counts_once(
    host: Host, crash: bool
) -> None:
    q = fusee.Queue("one", concurrency=1)
    async with host(workflows=[tally], queues=[q]) as t:
        first = await t.start(tally, "first", queue=q)
        second = await t.start(tally, "second", queue=q)
        await t.settle()
        assert (await second.describe()).status == "queued"
        await second.signal(go, 3, dedup="a")
        await second.signal(go, 3, dedup="a")
        await second.signal(go, 4)
        await settle_or_crash(t, crash)
        assert (await second.describe()).status == "queued"
        await first.signal(go, 1)
        await first.signal(go, 2)
        assert await first.result() == [1, 2]
        assert await second.result() == [3, 4]
        assert_steps_ran_once(t)


@fusee.workflow("streamer")
async def streamer(ctx: fusee.Ctx) -> int:
    async with ctx.stream("rows") as rows:
        await rows.append(await ctx.wait_for(go))
    return 0


async def test_a_query_update_resume_or_fork_of_a_queued_run_raises_run_queued(
    host: Host,
) -> None:
    q = fusee.Queue("one", concurrency=1)
    status = fusee.query("status")
    bump = fusee.update("bump", int)
    calls: list[tuple[str, Callable[[fusee.Run[Any]], Awaitable[object]]]] = [
        ("query", lambda run: run.query(status)),
        ("update", lambda run: run.update(bump, 1)),
        ("resume", lambda run: run.resume()),
        ("fork", lambda run: run.fork("second-copy", at=0)),
    ]
    async with host(workflows=[tally], queues=[q]) as t:
        await t.start(tally, "first", queue=q)
        second = await t.start(tally, "second", queue=q)
        await t.settle()
        for crashed in (False, True):
            for what, call in calls:
                with pytest.raises(fusee.RunQueued, match="'second' is queued and none of its"):
                    await call(second)
                assert (await second.describe()).status == fusee.RunStatus.QUEUED, what
            if not crashed:
                await t.crash()
        async with await fusee.Client.connect(t.store) as client:
            with pytest.raises(fusee.RunQueued, match="until its queue admits it"):
                await client.get("second").query(status)


async def test_a_stream_of_a_queued_run_is_read_once_it_is_admitted(host: Host) -> None:
    q = fusee.Queue("one", concurrency=1)
    async with host(workflows=[streamer], queues=[q]) as t:
        first = await t.start(streamer, "first", queue=q)
        second = await t.start(streamer, "second", queue=q)
        await t.crash()

        async def read() -> list[int]:
            return [v async for v in second.stream("rows")]

        reader = asyncio.ensure_future(read())
        await t.settle()
        assert not reader.done()
        await first.signal(go, 1)
        await second.signal(go, 2)
        assert await reader == [2]
        assert await first.result() == 0


async def test_a_result_awaited_while_a_message_loads_a_queued_run_waits_for_its_end(
    host: Host,
) -> None:
    # The message finds the run queued (and holds its signal there); the
    # result's caller, waiting on the same load, waits for the run's end.
    q = fusee.Queue("one", concurrency=1)
    async with host(workflows=[tally], queues=[q]) as t:
        first = await t.start(tally, "first", queue=q)
        second = await t.start(tally, "second", queue=q)
        await t.settle()
        result = asyncio.ensure_future(second.result())
        await second.signal(go, 3)
        await t.settle()
        assert not result.done()
        await first.signal(go, 1)
        await first.signal(go, 2)
        await asyncio.wait_for(second.signal(go, 4), 2)
        assert await result == [3, 4]


@pytest.mark.parametrize("store_kind", [pytest.param("postgres", id="postgres")])
async def test_a_message_to_a_run_admitted_but_not_started_waits_for_its_start(
    host: Host,
) -> None:
    # On a store workers share, admitted by an owner that died before it
    # wrote the run's start: the shard's next owner starts it (its queue
    # items are recovered with the shard), and a signal or cancel sent
    # meanwhile waits for that. (An engine alone on its store admits and
    # starts in one write.)
    from fusee.store._queues import QueueItem

    q = fusee.Queue("one", concurrency=1)
    async with host(workflows=[tally], queues=[q]) as t:
        await t.settle()
        await t.store.enqueue(
            QueueItem("one", "late", 1, tally.name, fusee._codec.encode(None)),
            fusee.store.RunRow("late", 1, tally.name, "queued", t.clock.now_ms()),
        )
        (admitted,) = (await t.store.admit(q.limits, t.clock.now_ms())).items
        assert admitted.id == "late"
        signal = asyncio.ensure_future(t.get("late").signal(go, 5))
        for _ in range(20):
            await asyncio.sleep(0.002)
        assert not signal.done()
        await t.engine.queues.recover({t.engine.runs.shard_index("late")})
        await signal
        await t.get("late").signal(go, 6)
        assert await t.get("late").result() == [5, 6]


@pytest.mark.parametrize("store_kind", [pytest.param("postgres", id="postgres")])
async def test_a_crash_between_a_queued_runs_cancel_and_its_items_removal_leaves_it_cancelled(
    host: Host,
) -> None:
    # On a store workers share the cancelled journal is written first and
    # the queue item goes after: a crash between leaves an item that
    # recovery drops, never a queued row that nothing ends.
    gauge = Gauge()
    wf = tracked(gauge)
    q = fusee.Queue("one", concurrency=1)
    async with host(workflows=[wf], queues=[q]) as t:
        blocker = await t.start(wf, "blocker", "k", queue=q)
        doomed = await t.start(wf, "doomed", "k", queue=q)
        await t.settle()

        async def crash_here(id: str) -> None:
            raise fusee.StoreError("simulated crash before the item went")

        unqueue = t.store.unqueue
        t.store.unqueue = crash_here  # type: ignore[method-assign]
        with pytest.raises(fusee.StoreError, match="simulated crash"):
            await doomed.cancel("no longer wanted")
        t.store.unqueue = unqueue  # type: ignore[method-assign]
        await t.crash()
        assert (await doomed.describe()).status == "cancelled"
        assert await blocker.result() == "blocker done"
        await t.settle()
        assert [(s.queued, s.running) for s in await t.queue_stats()] == [(0, 0)]
        assert gauge.order == ["blocker"]


async def test_two_cancels_of_a_queued_run_at_once_end_it_once(host: Host) -> None:
    gauge = Gauge()
    wf = tracked(gauge)
    q = fusee.Queue("one", concurrency=1)
    async with host(workflows=[wf], queues=[q]) as t:
        await t.start(wf, "blocker", "k", queue=q)
        doomed = await t.start(wf, "doomed", "k", queue=q)
        await t.settle()
        both = await asyncio.gather(
            doomed.cancel("one"), doomed.cancel("two"), return_exceptions=True
        )
        # One cancels it; the other finds it ended, as any cancel of an ended run does.
        assert sorted(type(r).__name__ for r in both) == ["NoneType", "RunFinished"]
        journal = [type(decode(data)).__name__ for _, data in await t.store.load("doomed")]
        assert journal == ["Start", "Done"]
        with pytest.raises(fusee.Cancelled):
            await doomed.result()


async def test_an_admitted_item_found_twice_starts_its_run_once(tmp_path: Path) -> None:
    # An admission and a shard's recovery may both find one item admitted
    # with no journal: the second start of it, on the same engine, is none.
    q = fusee.Queue("one", concurrency=1)
    async with await fusee.Engine.open(
        str(tmp_path), workflows=[tally], queues=[q], durability="none"
    ) as engine:
        run = await engine.start(tally, "once", queue=q)
        assert engine.queues.book is not None
        item = engine.queues.book.active("once")
        assert item is not None
        assert item.state == "admitted"
        engine.queues._run(item)
        await run.signal(go, 1)
        await run.signal(go, 2)
        assert await run.result() == [1, 2]
        kinds = [type(decode(data)).__name__ for _, data in await engine.store.load("once", 1)]
        assert kinds.count("Start") == 1
