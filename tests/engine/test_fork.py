"""Forks: `Run.fork` copies a journal before a position and goes on live from there.

Every test runs on the memory store, SQLite and Postgres.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections import Counter

import _postgres
import pytest

import fusee
from fusee.engine._fork import fork_records
from fusee.record import Done, Record, Signal, Start, Status, Step, Timer, Wait, decode
from fusee.remote import position
from fusee.store import MemoryStore, PostgresStore, SqliteStore, Store

from .conftest import Host, eventually

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", int)


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, n: int) -> list[int]:
    a = await ctx.step("quote", lambda: n)
    b = await ctx.step("charge", lambda: a + 1)
    c = await ctx.step("ship", lambda: b + 1)
    return [a, b, c]


@fusee.workflow("waiter")
async def waiter(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("first", lambda: n)
    got = await ctx.wait_for(go)
    assert got is not None
    return a + got + await ctx.step("last", lambda: 1)


def _steps(t: fusee.testing.TestEngine) -> Counter[tuple[str, int]]:
    return Counter((id, seq) for _, (id, _run, seq) in t.step_log)


async def _journal(store: Store, id: str) -> list[object]:
    return [decode(data) for _, data in await store.load(id)]


@pytest.mark.parametrize(
    "at", [pytest.param(1, id="position"), pytest.param("charge", id="step-name")]
)
async def test_a_fork_copies_the_steps_before_its_position_and_runs_the_rest(
    host: Host, at: int | str
) -> None:
    async with host(workflows=[order]) as t:
        run = await t.start(order, "o-1", 10)
        assert await run.result() == [10, 11, 12]
        before = await _journal(t.engine.store, "o-1")
        forked = await run.fork("o-2", at=at)
        assert forked.id == "o-2"
        assert await forked.result() == [10, 11, 12]
        # quote (position 0) ran once, in the old run only.
        assert _steps(t) == Counter(
            {("o-1", 0): 1, ("o-1", 1): 1, ("o-1", 2): 1, ("o-2", 1): 1, ("o-2", 2): 1}
        )
        assert await _journal(t.engine.store, "o-1") == before
        start = (await _journal(t.engine.store, "o-2"))[0]
        assert isinstance(start, Start)
        assert (start.id, start.run) == ("o-2", 1)
        await t.crash()
        assert await t.get("o-2").result() == [10, 11, 12]
        assert (await t.get("o-2").describe()).status == "completed"


async def test_a_fork_with_a_new_input_replays_the_copy_and_uses_the_input_live(
    host: Host,
) -> None:
    async with host(workflows=[order]) as t:
        run = await t.start(order, "o-1", 10)
        await run.result()
        # The copied quote keeps its recorded 10; charge runs live on it.
        assert await (await run.fork("o-2", at=1, input=99)).result() == [10, 11, 12]
        assert await (await run.fork("o-3", at=0, input=99)).result() == [99, 100, 101]


async def test_a_fork_of_a_waiting_run_waits_too_and_the_old_run_is_unchanged(
    host: Host,
) -> None:
    async with host(workflows=[waiter]) as t:
        run = await t.start(waiter, "w-1", 1)
        await t.settle()
        forked = await run.fork("w-2", at=2)
        await t.crash()
        await t.get("w-2").signal(go, 100)
        assert await forked.result() == 102
        await run.signal(go, 10)
        assert await run.result() == 12
        assert _steps(t)[("w-2", 0)] == 0


@pytest.mark.parametrize(
    ("at", "error"),
    [
        pytest.param(-1, "positions 0..3", id="negative"),
        pytest.param(4, "positions 0..3", id="past-the-end"),
        pytest.param("refund", "no operation named 'refund'", id="unknown-name"),
    ],
)
async def test_a_fork_at_a_bad_position_is_refused_and_writes_nothing(
    host: Host, at: int | str, error: str
) -> None:
    async with host(workflows=[order]) as t:
        run = await t.start(order, "o-1", 1)
        await run.result()
        with pytest.raises(ValueError, match=error):
            await run.fork("o-2", at=at)
        assert await t.engine.store.get("o-2") is None


async def test_a_fork_to_a_taken_id_or_of_an_unknown_run_is_refused(host: Host) -> None:
    async with host(workflows=[order]) as t:
        run = await t.start(order, "o-1", 1)
        other = await t.start(order, "o-2", 5)
        await run.result()
        await other.result()
        with pytest.raises(fusee.AlreadyExists, match="o-2"):
            await run.fork("o-2", at=1)
        with pytest.raises(fusee.NotFound):
            await t.get("nobody").fork("o-3", at=0)
        assert await t.engine.store.get("o-3") is None
        assert await other.result() == [5, 6, 7]


async def test_a_fork_whose_input_does_not_fit_is_refused(host: Host) -> None:
    async with host(workflows=[order]) as t:
        run = await t.start(order, "o-1", 1)
        await run.result()
        with pytest.raises(fusee.PayloadError):
            await run.fork("o-2", at=0, input="not a number")
        assert await t.engine.store.get("o-2") is None


def _fail_next_write(store: Store) -> None:
    if isinstance(store, MemoryStore):
        store.fail_next_append(fusee.StoreError("injected: disk full"))
    elif isinstance(store, PostgresStore):
        _postgres.fail_next_append(store)
    else:
        assert isinstance(store, SqliteStore)
        store.fail_next_append(sqlite3.OperationalError("injected: disk I/O error"))


async def test_a_crash_in_the_forks_write_leaves_no_part_of_it(host: Host) -> None:
    async with host(workflows=[order]) as t:
        run = await t.start(order, "o-1", 1)
        await run.result()
        await t.settle()
        _fail_next_write(t.engine.store)
        # The fork's one write fails; the crash comes while it waits for its retry.
        fork = asyncio.ensure_future(run.fork("o-2", at=2))
        await eventually(lambda: t.engine.committer.backing_off)
        assert not fork.done()
        await t.crash()
        with contextlib.suppress(asyncio.CancelledError, fusee.FuseeError):
            await fork
        assert await t.engine.store.get("o-2") is None
        with pytest.raises(fusee.NotFound):
            await t.engine.store.load("o-2")
        # Nothing half-written is in the way: the fork can be made again.
        assert await (await run.fork("o-2", at=2)).result() == [1, 2, 3]
        assert _steps(t)[("o-2", 0)] == _steps(t)[("o-2", 1)] == 0


async def test_a_fork_durable_before_a_crash_recovers_whole(host: Host) -> None:
    async with host(workflows=[waiter]) as t:
        run = await t.start(waiter, "w-1", 1)
        await t.settle()  # waiting for the signal
        await run.signal(go, 5)
        assert await run.result() == 7
        # At the wait: the copy holds the first step, not the signal.
        await run.fork("w-2", at=1)
        await t.crash()
        journal = await _journal(t.engine.store, "w-2")
        assert not any(isinstance(rec, Signal | Done) for rec in journal)
        await t.get("w-2").signal(go, 50)
        assert await t.get("w-2").result() == 52
        assert _steps(t)[("w-2", 0)] == 0


async def test_the_copy_keeps_results_of_earlier_operations_that_came_after_the_cut() -> None:
    journal: list[Record] = [
        Start(3, "a", "wf", input=b"\x01"),
        Timer(3, 1, "nap", 500),
        Step(3, 2, "late", 1, Status.OK, b"\x02"),
        Step(3, 0, "slow", 1, Status.OK, b"\x03"),
        Signal(3, "go", 0, b"\x04"),
        Wait(3, 3, "go", 0),
        Done(3, Status.OK, 9, b"\xc0"),
    ]
    copy = fork_records(journal, "b", 1, started_ms=7)
    assert copy == [
        Start(1, "b", "wf", started_ms=7, input=b"\x01"),
        Step(1, 0, "slow", 1, Status.OK, b"\x03"),
    ]
    assert position(journal, "late", "a") == 2
    assert position(journal, 4, "a") == 4
