"""Workflows the UI's tests run, and a store made of their runs."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import fusee

go = fusee.signal("go", bool)
bump = fusee.update("bump", int)

# A step of `flaky` fails while this is False (it is, in these tests): the run pauses.
FLAKY_OK = {"ok": False}


@dataclasses.dataclass(frozen=True)
class Order:
    id: str
    amount: int


@fusee.workflow("greet")
async def greet(ctx: fusee.Ctx, name: str) -> str:
    ctx.set_attributes({"customer": name})
    return await ctx.step("greet", lambda: f"hello {name}")


@fusee.workflow("ship")
async def ship(ctx: fusee.Ctx, order: Order) -> str:
    return await ctx.step("label", lambda: f"FR-{order.id}")


@fusee.workflow("gated")
async def gated(ctx: fusee.Ctx, order: Order) -> str:
    """A retried step, a timer, a signal, a child and a stream."""
    ctx.set_attributes({"customer": "ada", "amount": order.amount})
    tries = {"n": 0}

    def charge() -> int:
        tries["n"] += 1
        if tries["n"] == 1:
            raise ConnectionError("card network unreachable")
        return order.amount

    await ctx.step("charge", charge, retry=fusee.Retry(attempts=3, initial="10ms"))
    await ctx.sleep("cool-off", "20ms")
    if not await ctx.wait_for(go, timeout="1h"):
        return "rejected"
    label = await ctx.child(ship, f"ship-{order.id}", order)
    async with ctx.stream("log") as out:
        await out.append(f"shipped {label}")
    return f"shipped {label}"


@fusee.workflow("flaky")
async def flaky(ctx: fusee.Ctx) -> str:
    def call() -> str:
        if not FLAKY_OK["ok"]:
            raise ConnectionError("still down")
        return "up"

    return await ctx.step("call", call, retry=fusee.Retry(attempts=1, initial="10ms"))


@fusee.workflow("boom")
async def boom(ctx: fusee.Ctx) -> None:
    await ctx.step("ok", lambda: 1)
    raise KeyError("sku")


@fusee.workflow("tally")
async def tally(ctx: fusee.Ctx, start: int) -> int:
    """Takes `bump` updates (each a step in its handler) until `go`."""
    total = {"n": start}

    async def add(n: int) -> int:
        total["n"] = await ctx.step("add", lambda: total["n"] + n)
        return total["n"]

    ctx.on_update(bump, add)
    await ctx.step("open", lambda: start)
    await ctx.wait_for(go)
    return await ctx.step("close", lambda: total["n"])


@fusee.workflow("racer")
async def racer(ctx: fusee.Ctx) -> None:
    """A step that takes an hour beside a timer: the timer's record comes first."""

    async def slow() -> None:
        await asyncio.sleep(3600)

    await asyncio.gather(ctx.step("slow", slow), ctx.sleep("nap", "1h"))


WORKFLOWS: list[fusee.WorkflowDef[Any, Any]] = [greet, ship, gated, flaky, boom, tally, racer]

SCHEDULES = [
    fusee.Schedule("nightly-greet", greet, cron="0 2 * * *", tz="Europe/Paris", input="ana"),
    fusee.Schedule("hourly-greet", greet, every="1h", input="bo", overlap="buffer_one"),
]
"""Schedules `add_schedules` stores (neither ticks during a test)."""

GREETED = [f"g-{n:02d}" for n in range(23)]
"""The ids of the `greet` runs in `make_store`'s store (customers ana and bo, by turns)."""


async def _fill(data: Path) -> None:
    async with await fusee.Engine.open(data, workflows=WORKFLOWS, durability="none") as engine:
        for n, id in enumerate(GREETED):
            await engine.execute(greet, id, "ana" if n % 2 == 0 else "bo")
        run = await engine.start(gated, "order-1", Order("o1", 42))
        while (await run.describe()).status != "suspended" or not await _waiting(engine):
            await asyncio.sleep(0.01)
        await run.signal(go, True)
        assert await run.result() == "shipped FR-o1"
        # Paused: its one attempt failed; it stays so.
        paused = await engine.start(flaky, "flaky-1")
        while (await paused.describe()).status != "paused":
            await asyncio.sleep(0.01)
        with contextlib.suppress(fusee.WorkflowFailed):
            await engine.execute(boom, "boom-1")


async def _waiting(engine: fusee.Engine, id: str = "order-1") -> bool:
    """Whether run ``id`` waits for its signal (its journal holds its `Wait`)."""
    from fusee.record import Wait, decode

    return any(isinstance(decode(d), Wait) for _, d in await engine.store.load(id))


def make_store(data: Path) -> Path:
    """Fills ``data`` with runs: 23 greets, a gated order (retry, timer, signal, child), ..."""
    in_thread(_fill, data)
    return data


async def _more(data: Path, ids: list[str]) -> None:
    async with await fusee.Engine.open(data, workflows=WORKFLOWS, durability="none") as engine:
        for id in ids:
            await engine.execute(greet, id, "cy")


def add_greets(data: Path, *ids: str) -> None:
    """Opens an engine on ``data`` (in a thread of its own) and runs more greets."""
    in_thread(_more, data, list(ids))


async def _start_waiting(data: Path, id: str, version: str | None = None) -> None:
    async with await fusee.Engine.open(
        data, workflows=WORKFLOWS, durability="none", version=version
    ) as engine:
        await engine.start(gated, id, Order(id, 7))
        while not await _waits(engine, id):
            await asyncio.sleep(0.01)


async def _waits(engine: fusee.Engine, id: str) -> bool:
    from fusee.record import Wait, decode

    return any(isinstance(decode(d), Wait) for _, d in await engine.store.load(id))


async def _release(data: Path, id: str) -> None:
    async with await fusee.Engine.open(data, workflows=WORKFLOWS, durability="none") as engine:
        run = engine.get(id)
        await run.signal(go, True)
        await run.result()


async def _cancel_waiting(data: Path, id: str, reason: str) -> None:
    async with await fusee.Engine.open(data, workflows=WORKFLOWS, durability="none") as engine:
        run = await engine.start(gated, id, Order(id, 7))
        while not await _waits(engine, id):
            await asyncio.sleep(0.01)
        await run.cancel(reason)
        with contextlib.suppress(fusee.Cancelled):
            await run.result()


def cancel_waiting(data: Path, id: str, reason: str) -> None:
    """Starts a `gated` run ``id`` and cancels it while it waits for `go`."""
    in_thread(_cancel_waiting, data, id, reason)


async def _updated(data: Path, id: str) -> None:
    async with await fusee.Engine.open(data, workflows=WORKFLOWS, durability="none") as engine:
        run = await engine.start(tally, id, 1)
        # The update comes once the run waits for `go`: its positions are
        # then the same in every run of the test.
        while not await _waiting(engine, id):
            await asyncio.sleep(0.01)
        assert await run.update(bump, 2) == 3
        await run.signal(go, True)
        assert await run.result() == 3


def run_updated(data: Path, id: str) -> None:
    """Runs a `tally` ``id`` that takes one `bump` update, then `go`."""
    in_thread(_updated, data, id)


async def _start_racing(data: Path, id: str) -> None:
    from fusee.record import Timer, decode

    async with await fusee.Engine.open(data, workflows=WORKFLOWS, durability="none") as engine:
        await engine.start(racer, id)
        while not any(isinstance(decode(d), Timer) for _, d in await engine.store.load(id)):
            await asyncio.sleep(0.01)


def start_racing(data: Path, id: str) -> None:
    """Starts a `racer` ``id`` and stops its engine with its step in flight, its timer set."""
    in_thread(_start_racing, data, id)


async def _schedules(data: Path) -> None:
    async with await fusee.Engine.open(
        data, workflows=WORKFLOWS, durability="none", schedules=SCHEDULES
    ):
        pass


def add_schedules(data: Path) -> None:
    """Opens an engine with `SCHEDULES` on ``data`` once: their rows are in the store."""
    in_thread(_schedules, data)


async def _enqueue(data: Path) -> None:
    from fusee.store import RunRow, SqliteStore
    from fusee.store._queues import QueueItem, QueueLimits

    store = SqliteStore(data, durability="none")
    await store.open()
    try:
        for i, key in enumerate(["cust-7", "cust-7", "cust-9"]):
            await store.enqueue(
                QueueItem("emails", f"mail-{i}", 1, "greet", b"\xc0", key=key),
                RunRow(f"mail-{i}", 1, "greet", "queued", 0),
            )
        await store.admit(QueueLimits("emails", concurrency=1), 0)
    finally:
        await store.close()


def enqueue_mails(data: Path) -> None:
    """Puts three runs in queue ``emails`` (keys cust-7 twice, cust-9), one admitted."""
    in_thread(_enqueue, data)


async def _bug_paused(data: Path, id: str) -> None:
    async with await fusee.Engine.open(
        data, workflows=WORKFLOWS, durability="none", on_error="pause"
    ) as engine:
        run = await engine.start(boom, id)
        while (await run.describe()).status != "paused":
            await asyncio.sleep(0.01)


def add_bug_paused(data: Path, id: str) -> None:
    """Runs a `boom` run ``id`` on an engine that pauses on bugs, and stops it once paused."""
    in_thread(_bug_paused, data, id)


def in_thread(fn: Any, *args: Any) -> None:
    """Runs ``asyncio.run(fn(*args))`` in a thread of its own.

    An engine beside the test: the test's thread may have a loop running
    already (Playwright's sync API keeps one).
    """
    import threading

    errors: list[BaseException] = []

    def work() -> None:
        try:
            asyncio.run(fn(*args))
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join(60)
    assert not t.is_alive()
    assert not errors, errors


def start_waiting(data: Path, id: str, version: str | None = None) -> None:
    """Starts a `gated` run ``id`` and stops its engine once the run waits for `go`.

    ``version``: its engine's (default: derived from `WORKFLOWS`, as the tests' other engines').
    """
    in_thread(_start_waiting, data, id, version)


def release(data: Path, id: str) -> None:
    """Signals `go` to a waiting `gated` run and lets it finish (ship, stream, done)."""
    in_thread(_release, data, id)
