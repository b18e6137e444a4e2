"""Messages between runs: never lost, delivered exactly once, across any crash.

Shapes from outside suites (Restate's SDK conformance suite, DBOS's workflow
management tests, Temporal's test_workflow.py): a send to a child started in
the same turn, a send after a child's result, a cancel cascade through a tree
of children, and a handle's `result()` after a REPLACE. Each runs live and
after a crash: at every record (`crash_everywhere`), and between records
(after some loop turns, or once a `Send` is durable but not yet applied), on
every store.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic
import pytest

import fusee
from fusee import _codec
from fusee.record import Send, Signal, decode
from fusee.testing import TestEngine, crash_everywhere

from .conftest import Host

pytestmark = pytest.mark.asyncio

add = fusee.signal("add", int)
gone = fusee.signal("gone", str)
order = fusee.signal("order", str)

# Loop turns after a start at which the between-records crashes fall.
TURNS = [pytest.param(n, id=f"{n}-turns") for n in (0, 1, 2, 3, 5, 8, 13)]


async def signals_of(t: TestEngine, id: str) -> list[Signal]:
    """The signals run ``id``'s journal holds."""
    row = await t.engine.store.get(id)
    assert row is not None
    entries = await t.engine.store.load(id, row.run)
    return [rec for _, data in entries if isinstance(rec := decode(data), Signal)]


# --- a send to a child started in the same turn ----------------------------------------------


@fusee.workflow("counter")
async def counter(ctx: fusee.Ctx) -> int:
    return await ctx.wait_for(add) or 0


@fusee.workflow("spawner")
async def spawner(ctx: fusee.Ctx) -> int:
    child_id = f"{ctx.info.id}-counter"
    handle = ctx.child(counter, child_id)
    ctx.send(child_id, add, 5)
    return await handle + 1


async def test_a_send_in_the_turn_of_the_child_it_targets_reaches_it(host: Host) -> None:
    async with host(workflows=[spawner, counter]) as t:
        run = await t.start(spawner, "sp-1")
        assert await run.result() == 6
        assert [_codec.decode(s.payload) for s in await signals_of(t, "sp-1-counter")] == [5]


async def test_a_send_in_the_turn_of_the_child_it_targets_survives_a_crash_at_every_record() -> (
    None
):
    assert await crash_everywhere(spawner, workflows=[counter]) == 6


@pytest.mark.parametrize("turns", TURNS)
async def test_a_send_in_the_turn_of_the_child_it_targets_survives_a_crash_between_records(
    host: Host, turns: int
) -> None:
    async with host(workflows=[spawner, counter]) as t:
        run = await t.start(spawner, "sp-1")
        for _ in range(turns):
            await asyncio.sleep(0)
        await t.crash()
        assert await run.result() == 6
        assert len(await signals_of(t, "sp-1-counter")) == 1


# --- sends around children's results (Restate's CallOrdering, one-way calls) -----------------


@fusee.workflow("tally")
async def tally(ctx: fusee.Ctx, expected: int) -> list[str]:
    """Collects ``expected`` one-way messages, in their arrival order."""
    got = []
    for _ in range(expected):
        got.append(await ctx.wait_for(order) or "")
    return got


@fusee.workflow("echo")
async def echo(ctx: fusee.Ctx, text: str) -> str:
    return await ctx.step("echo", lambda: text)


@fusee.workflow("call-ordering")
async def call_ordering(ctx: fusee.Ctx, plan: list[bool]) -> list[str]:
    """Restate's CallOrdering: one-way sends (False) and child calls (True) in ``plan``'s order."""
    target = f"{ctx.info.id}-tally"
    ctx.child(tally, target, plan.count(False), detached=True)
    calls = []
    for i, is_call in enumerate(plan):
        if is_call:
            calls.append(await ctx.child(echo, f"{ctx.info.id}-echo-{i}", f"call-{i}"))
        else:
            ctx.send(target, order, f"send-{i}")
    return calls


PLANS = [
    pytest.param([False, True], id="send-then-call"),
    pytest.param([True, False], id="call-then-send"),
    pytest.param([True, False, False, True, False], id="call-send-send-call-send"),
]


@pytest.mark.parametrize("plan", PLANS)
async def test_one_way_sends_and_child_calls_in_any_order_each_arrive_once(
    host: Host, plan: list[bool]
) -> None:
    async with host(workflows=[call_ordering, tally, echo]) as t:
        run = await t.start(call_ordering, "co-1", plan)
        calls = [f"call-{i}" for i, c in enumerate(plan) if c]
        sends = [f"send-{i}" for i, c in enumerate(plan) if not c]
        assert await run.result() == calls
        assert await t.get("co-1-tally").result() == sends


@pytest.mark.parametrize("plan", PLANS)
async def test_one_way_sends_and_child_calls_survive_a_crash_at_every_record(
    plan: list[bool],
) -> None:
    async def drive(t: TestEngine, run: fusee.Run[list[str]]) -> None:
        await t.settle()

    got = await crash_everywhere(call_ordering, plan, workflows=[tally, echo], drive=drive)
    assert got == [f"call-{i}" for i, c in enumerate(plan) if c]


@pytest.mark.parametrize("turns", TURNS)
@pytest.mark.parametrize("plan", PLANS)
async def test_one_way_sends_and_child_calls_survive_a_crash_some_loop_turns_in(
    host: Host, plan: list[bool], turns: int
) -> None:
    async with host(workflows=[call_ordering, tally, echo]) as t:
        run = await t.start(call_ordering, "co-1", plan)
        for _ in range(turns):
            await asyncio.sleep(0)
        await t.crash()
        await run.result()
        sends = [f"send-{i}" for i, c in enumerate(plan) if not c]
        assert await t.get("co-1-tally").result() == sends


@pytest.mark.parametrize("plan", PLANS)
async def test_a_send_durable_but_not_yet_applied_is_applied_after_a_crash(
    host: Host, plan: list[bool]
) -> None:
    async with host(workflows=[call_ordering, tally, echo]) as t:
        store = t.engine.store
        real = store.append
        sent = asyncio.Event()
        never = asyncio.Event()

        async def hold_after_a_send(entries: Any, runs: Any = (), **fence: Any) -> None:
            # The batch with the sender's first `Send` reaches the disk; every
            # later write hangs (the process dies before the outbox applies it).
            if sent.is_set():
                await never.wait()
            await real(entries, runs, **fence)
            if any(e.id == "co-1" and isinstance(decode(e.data), Send) for e in entries):
                sent.set()

        store.append = hold_after_a_send  # type: ignore[method-assign]
        run = await t.start(call_ordering, "co-1", plan)
        await sent.wait()
        store.append = real  # type: ignore[method-assign]
        await t.crash()
        await run.result()
        sends = [f"send-{i}" for i, c in enumerate(plan) if not c]
        assert await t.get("co-1-tally").result() == sends


@fusee.workflow("adder")
async def adder(ctx: fusee.Ctx, total: int) -> int:
    """A counter that adds what it is sent until it is sent 0."""
    while (n := await ctx.wait_for(add)) != 0:
        total += n or 0
    return total


class Forward(pydantic.BaseModel):
    target: str
    amounts: list[int]


@fusee.workflow("proxy")
async def proxy(ctx: fusee.Ctx, job: Forward) -> str:
    """Restate's proxy one-way add: forwards each amount, asked of a child, as a one-way send."""
    for i, n in enumerate(job.amounts):
        ctx.send(job.target, add, int(await ctx.child(echo, f"{ctx.info.id}-ask-{i}", str(n))))
    ctx.send(job.target, add, 0)
    return "forwarded"


@fusee.workflow("caller-service")
async def caller_service(ctx: fusee.Ctx, target: str) -> str:
    """Restate's service-to-service one-way call: a call, then a one-way send, then the end."""
    answer = await ctx.child(echo, f"{ctx.info.id}-ping", "ping")
    ctx.send(target, add, len(answer))
    ctx.send(target, add, 0)
    return answer


async def start_adder(t: TestEngine, run: Any) -> None:
    await t.start(adder, "adder-1", 0, id_policy=fusee.IdPolicy.ATTACH)


async def test_a_proxy_one_way_add_arrives_once_live_and_after_a_crash_at_every_record() -> None:
    got = await crash_everywhere(
        proxy, Forward(target="adder-1", amounts=[2, 3]), workflows=[adder, echo], drive=start_adder
    )
    assert got == "forwarded"


async def test_a_service_to_service_one_way_call_survives_a_crash_at_every_record() -> None:
    got = await crash_everywhere(
        caller_service, "adder-1", workflows=[adder, echo], drive=start_adder
    )
    assert got == "ping"


@pytest.mark.parametrize("turns", TURNS)
async def test_a_proxy_one_way_add_is_counted_once_after_a_crash_some_loop_turns_in(
    host: Host, turns: int
) -> None:
    async with host(workflows=[proxy, adder, echo]) as t:
        target = await t.start(adder, "adder-1", 0)
        run = await t.start(proxy, "px-1", Forward(target="adder-1", amounts=[2, 3]))
        for _ in range(turns):
            await asyncio.sleep(0)
        await t.crash()
        assert await run.result() == "forwarded"
        assert await target.result() == 5
        await t.crash()
        assert await target.result() == 5


# --- a cancel cascade -------------------------------------------------------------------------


@fusee.workflow("leaf")
async def leaf(ctx: fusee.Ctx, root: str) -> int:
    try:
        return await ctx.wait_for(add) or 0
    except fusee.Cancelled:
        ctx.send(root, gone, ctx.info.id)
        raise


@fusee.workflow("branch")
async def branch(ctx: fusee.Ctx, root: str) -> int:
    try:
        return await ctx.child(leaf, f"{ctx.info.id}-leaf", root)
    except fusee.Cancelled:
        ctx.send(root, gone, ctx.info.id)
        raise


@fusee.workflow("trunk")
async def trunk(ctx: fusee.Ctx, root: str) -> int:
    return await ctx.child(branch, f"{ctx.info.id}-branch", root)


@fusee.workflow("root")
async def root(ctx: fusee.Ctx) -> list[str]:
    """Starts a tree (trunk -> branch -> leaf), detached, and hears each part's cancellation."""
    ctx.child(trunk, f"{ctx.info.id}-trunk", ctx.info.id, detached=True)
    heard = [await ctx.wait_for(gone) or "", await ctx.wait_for(gone) or ""]
    return sorted(heard)


async def cancel_trunk(t: TestEngine, run: Any) -> None:
    await t.settle()
    try:
        await t.get(f"{run.id}-trunk").cancel()
    except fusee.RunFinished:
        return


CASCADE = ["crash-everywhere-trunk-branch", "crash-everywhere-trunk-branch-leaf"]


async def test_a_cancel_cascade_reaches_every_attached_descendant_across_every_crash() -> None:
    assert await crash_everywhere(root, workflows=[trunk, branch, leaf], drive=cancel_trunk) == (
        CASCADE
    )


@pytest.mark.parametrize("turns", TURNS)
async def test_a_cancel_cascade_is_not_lost_to_a_crash_after_the_cancel_returned(
    host: Host, turns: int
) -> None:
    async with host(workflows=[root, trunk, branch, leaf]) as t:
        run = await t.start(root, "r")
        await t.settle()
        trunk_run = t.get("r-trunk")
        await trunk_run.cancel()
        for _ in range(turns):
            await asyncio.sleep(0)
        await t.crash()
        assert await run.result() == ["r-trunk-branch", "r-trunk-branch-leaf"]
        await t.settle()
        for id in ("r-trunk", "r-trunk-branch", "r-trunk-branch-leaf"):
            assert (await t.get(id).describe()).status == "cancelled", id


# --- a handle means the id's latest run -------------------------------------------------------


@pytest.mark.parametrize("how", ["debounce", "full-queue"])
async def test_result_after_a_replace_through_a_queue_waits_for_the_new_run(
    host: Host, how: str
) -> None:
    q = fusee.Queue("one", concurrency=1)
    async with host(workflows=[echo, counter], queues=[q]) as t:
        first = await t.start(echo, "e-1", "first")
        assert await first.result() == "first"
        if how == "debounce":
            again = await t.start(
                echo, "e-1", "second", queue=q, debounce="5s", id_policy=fusee.IdPolicy.REPLACE
            )
        else:
            blocker = await t.start(counter, "blocker", queue=q)
            await t.settle()
            again = await t.start(echo, "e-1", "second", queue=q, id_policy=fusee.IdPolicy.REPLACE)
        assert (await again.describe()).status == "queued"
        result = asyncio.ensure_future(again.result())
        await t.settle()
        # Never the first run's: pending, or (the virtual clock may pass the
        # debounce while the engine settles) the second's.
        assert not result.done() or result.result() == "second"
        if how == "full-queue":
            assert not result.done()
            await blocker.signal(add, 1)
        assert await result == "second"
        assert await first.result() == "second"
