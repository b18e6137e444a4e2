"""Every Ctx operation, live and replayed from its journal after a crash at every record."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import uuid
from typing import Any

import pytest

import fusee
from fusee.testing import TestEngine, crash_everywhere

pytestmark = pytest.mark.asyncio

review = fusee.signal("review", bool)
status_q = fusee.query("status")
bump = fusee.update("bump", int)


@dataclasses.dataclass(frozen=True)
class Order:
    id: str
    amount: int


async def add_one(i: int) -> int:
    return i + 1


@fusee.workflow("steps")
async def steps_wf(ctx: fusee.Ctx, n: int) -> list[int]:
    out = []
    for i in range(n):
        out.append(await ctx.step("inc", lambda i=i: add_one(i)))
    return out


async def test_sequential_steps_survive_a_crash_anywhere() -> None:
    assert await crash_everywhere(steps_wf, 5) == [1, 2, 3, 4, 5]


@fusee.workflow("mixed-steps")
async def mixed_steps(ctx: fusee.Ctx, order: Order) -> dict[str, Any]:
    sync = await ctx.step("sync", lambda: order.amount * 2)
    inline = await ctx.step("inline", lambda: order.id.upper(), inline=True)
    keyed = await ctx.step("keyed", lambda s: s.key)

    async def typed() -> Order:
        return Order(order.id, order.amount + 1)

    obj = await ctx.step("typed", typed)
    return {"sync": sync, "inline": inline, "keyed": keyed, "typed": obj.amount}


async def test_steps_take_sync_async_and_step_ctx_callables() -> None:
    got = await crash_everywhere(mixed_steps, Order("o-1", 5))
    assert got["sync"] == 10
    assert got["inline"] == "O-1"
    assert got["keyed"].startswith("crash-everywhere/")
    assert got["keyed"].endswith("/2")
    assert got["typed"] == 6


async def test_step_results_are_decoded_to_the_annotated_type_live_too() -> None:
    seen: list[Any] = []

    @fusee.workflow("typed-result")
    async def wf(ctx: fusee.Ctx) -> None:
        async def make() -> Order:
            return Order("x", 1)

        seen.append(await ctx.step("make", make))

    async with TestEngine(workflows=[wf]) as t:
        await t.execute(wf, "t-1")
    # Live, then once more: the dev profile replays the journal at the end.
    assert seen == [Order("x", 1), Order("x", 1)]


@fusee.workflow("gather")
async def gather_wf(ctx: fusee.Ctx, n: int) -> list[int]:
    return list(await asyncio.gather(*(ctx.step("s", lambda i=i: add_one(i)) for i in range(n))))


async def test_gathered_steps_survive_a_crash_anywhere() -> None:
    assert await crash_everywhere(gather_wf, 8) == list(range(1, 9))


@fusee.workflow("sleeper")
async def sleeper(ctx: fusee.Ctx) -> list[str]:
    t0 = ctx.now()
    await ctx.sleep("cool-off", "10m")
    await asyncio.sleep(60)
    t1 = ctx.now()
    return [t0.isoformat(), t1.isoformat()]


async def test_sleeps_are_durable_timers_on_virtual_time() -> None:
    t0, t1 = await crash_everywhere(sleeper)
    gap = datetime.datetime.fromisoformat(t1) - datetime.datetime.fromisoformat(t0)
    assert gap >= datetime.timedelta(minutes=11)


async def test_a_sleep_wakes_only_when_time_is_advanced() -> None:
    async with TestEngine(workflows=[sleeper]) as t:
        run = await t.start(sleeper, "s-1")
        await t.advance("5m")
        assert (await run.describe()).status == "suspended"
        await t.advance("6m")
        assert (await run.describe()).status in ("completed", "suspended", "running")
        await run.result()
        assert (await run.describe()).status == "completed"


@fusee.workflow("values")
async def values_wf(ctx: fusee.Ctx) -> list[Any]:
    values = [ctx.now().isoformat(), ctx.random(), str(ctx.uuid4())]
    ctx.on_query(status_q, lambda _: values)
    await ctx.sleep("hold", "1h")
    return values


async def test_recorded_values_replay_equal() -> None:
    async with TestEngine(workflows=[values_wf]) as t:
        run = await t.start(values_wf, "v-1")
        await t.settle()
        before = await run.query(status_q)
        await t.crash()
        assert await run.result() == before
    now, r, u = before
    assert 0 <= r < 1
    assert uuid.UUID(u).version == 4
    assert datetime.datetime.fromisoformat(now).tzinfo is not None


@fusee.workflow("approval")
async def approval(ctx: fusee.Ctx, timeout: str) -> str:
    ok = await ctx.wait_for(review, timeout=timeout)
    return "timed out" if ok is None else ("approved" if ok else "rejected")


async def test_a_wait_gets_its_signal() -> None:
    async def drive(t: TestEngine, run: fusee.Run[str]) -> None:
        await run.signal(review, True, dedup="r-1")

    assert await crash_everywhere(approval, "1d", drive=drive) == "approved"


async def test_a_wait_times_out_to_none() -> None:
    assert await crash_everywhere(approval, "1h") == "timed out"


async def test_a_signal_sent_before_the_wait_is_buffered() -> None:
    @fusee.workflow("late-wait")
    async def late_wait(ctx: fusee.Ctx) -> list[bool | None]:
        await ctx.sleep("first", "1h")
        return [await ctx.wait_for(review), await ctx.wait_for(review, timeout="1s")]

    async with TestEngine(workflows=[late_wait]) as t:
        run = await t.start(late_wait, "b-1")
        await run.signal(review, False)
        await run.signal(review, True)
        await run.signal(review, True, dedup="once")
        await run.signal(review, True, dedup="once")
        await t.crash()
        assert await run.result() == [False, True]


@fusee.workflow("child")
async def child_wf(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("double", lambda: n * 2)


@fusee.workflow("parent")
async def parent_wf(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.child(child_wf, f"{ctx.info.id}-child", n)
    await ctx.child(child_wf, f"{ctx.info.id}-detached", 1, detached=True)
    return a + 1


async def test_children_deliver_their_results() -> None:
    assert await crash_everywhere(parent_wf, 20, workflows=[child_wf]) == 41


async def test_a_failing_child_raises_child_failed() -> None:
    @fusee.workflow("bad-child")
    async def bad_child(ctx: fusee.Ctx) -> None:
        raise ValueError("no stock")

    @fusee.workflow("watcher")
    async def watcher(ctx: fusee.Ctx) -> str:
        try:
            await ctx.child(bad_child, "bc-1")
        except fusee.ChildFailed as e:
            return str(e)
        return "no error"

    got = await crash_everywhere(watcher, workflows=[bad_child])
    assert got == "child run 'bc-1' failed: workflow failed: ValueError: no stock"


async def test_send_signals_another_run() -> None:
    @fusee.workflow("sender")
    async def sender(ctx: fusee.Ctx) -> None:
        ctx.send("receiver-1", review, True)

    async with TestEngine(workflows=[sender, approval]) as t:
        receiver = await t.start(approval, "receiver-1", "1d")
        await t.execute(sender, "sender-1")
        assert await receiver.result() == "approved"


async def test_patched_takes_the_new_branch_for_new_runs_only() -> None:
    @fusee.workflow("versioned")
    async def old(ctx: fusee.Ctx) -> str:
        await ctx.step("a", lambda: 1)
        await ctx.sleep("wait", "1h")
        return "old"

    @fusee.workflow("versioned")
    async def new(ctx: fusee.Ctx) -> str:
        branch = "new" if ctx.patched("fix") else "old"
        await ctx.step("a", lambda: 1)
        await ctx.sleep("wait", "1h")
        return branch

    async with TestEngine(workflows=[old]) as t:
        await t.start(old, "v-1")
        await t.advance("1m")
        store = t.store
        await t.crash()
    async with TestEngine(workflows=[new], store=store) as t2:
        assert await t2.get("v-1").result() == "old"
        assert await t2.execute(new, "v-2") == "new"


async def test_attributes_are_listed() -> None:
    @fusee.workflow("tagged")
    async def tagged(ctx: fusee.Ctx, who: str) -> None:
        ctx.set_attributes({"customer": who})

    async with TestEngine(workflows=[tagged]) as t:
        await t.execute(tagged, "t-ana", "ana")
        await t.execute(tagged, "t-bo", "bo")
        ids = [i.id async for i in t.list(attributes={"customer": "ana"})]
        assert ids == ["t-ana"]
        assert (await t.get("t-bo").describe()).attributes == {"customer": "bo"}


@fusee.workflow("streamer")
async def streamer(ctx: fusee.Ctx, n: int) -> int:
    async with ctx.stream("tokens") as out:
        for i in range(n):
            await out.append(f"t{i}")
            await ctx.sleep("gap", "1s")
    return n


async def test_a_stream_is_read_live_and_replays_without_duplicates() -> None:
    assert await crash_everywhere(streamer, 3) == 3
    async with TestEngine(workflows=[streamer]) as t:
        run = await t.start(streamer, "st-1", 3)
        got = []

        async def read() -> None:
            async for tok in run.stream("tokens"):
                got.append(tok)

        reader = asyncio.create_task(read())
        await run.result()
        await asyncio.wait_for(reader, 5)
        assert got == ["t0", "t1", "t2"]


@fusee.workflow("cart")
async def cart(ctx: fusee.Ctx) -> int:
    items: list[int] = []

    def validate(n: int) -> None:
        if n <= 0:
            raise ValueError("quantity must be positive")

    async def add(n: int) -> int:
        await ctx.step("price", lambda: n)
        items.append(n)
        return sum(items)

    ctx.on_query(status_q, lambda _: {"items": list(items)})
    ctx.on_update(bump, add, validator=validate)
    await ctx.wait_for(review)
    return sum(items)


async def test_updates_queries_and_validators() -> None:
    async with TestEngine(workflows=[cart]) as t:
        run = await t.start(cart, "c-1")
        assert await run.update(bump, 2) == 2
        assert await run.update(bump, 3) == 5
        with pytest.raises(fusee.FuseeError, match="quantity must be positive"):
            await run.update(bump, -1)
        assert await run.query(status_q) == {"items": [2, 3]}
        await t.crash()
        assert await run.query(status_q) == {"items": [2, 3]}
        await run.signal(review, True)
        assert await run.result() == 5
        assert await run.query(status_q) == {"items": [2, 3]}


async def test_await_completion_waits_for_the_token() -> None:
    tokens: list[str] = []

    @fusee.workflow("callback")
    async def callback(ctx: fusee.Ctx) -> Any:
        return await ctx.await_completion("approval", lambda s: tokens.append(s.token or ""))

    async with TestEngine(workflows=[callback]) as t:
        run = await t.start(callback, "cb-1")
        await t.settle()
        assert len(tokens) == 1
        await t.crash()
        await t.complete(tokens[-1], {"ok": True})
        assert await run.result() == {"ok": True}
    assert len(tokens) == 1


async def test_continue_as_new_starts_a_fresh_run() -> None:
    @fusee.workflow("loop")
    async def loop_wf(ctx: fusee.Ctx, n: int) -> int:
        await ctx.sleep("tick", "1h")
        if n < 3:
            ctx.continue_as_new(n + 1)
        return n

    async with TestEngine(workflows=[loop_wf]) as t:
        run = await t.start(loop_wf, "l-1", 0)
        assert await run.result() == 3
        assert (await run.describe()).status == "completed"


@fusee.workflow("race")
async def race(ctx: fusee.Ctx) -> list[Any]:
    i, v = await fusee.select(ctx.wait_for(review), ctx.sleep("deadline", "1h"))
    try:
        w = await asyncio.wait_for(ctx.step("slow", lambda: "done"), timeout=30)
    except TimeoutError:
        w = "timeout"
    return [i, v, w]


async def test_races_replay_the_same_winner() -> None:
    assert await crash_everywhere(race) == [1, None, "done"]


@fusee.workflow("saga")
async def saga(ctx: fusee.Ctx) -> str:
    try:
        await ctx.step("reserve", lambda: "r")
        await ctx.wait_for(review)
        return "shipped"
    except fusee.Cancelled:
        await ctx.step("release", lambda: "released")
        return "compensated"


async def test_cancellation_runs_compensation_and_replays_it() -> None:
    async def drive(t: TestEngine, run: fusee.Run[str]) -> None:
        await t.settle()
        await run.cancel("customer left")

    assert await crash_everywhere(saga, drive=drive) == "compensated"


async def test_an_uncaught_cancellation_cancels_the_run() -> None:
    @fusee.workflow("stuck")
    async def stuck_wf(ctx: fusee.Ctx) -> None:
        await ctx.wait_for(review)

    async with TestEngine(workflows=[stuck_wf]) as t:
        run = await t.start(stuck_wf, "x-1")
        await run.cancel("no longer needed")
        with pytest.raises(fusee.Cancelled, match="no longer needed"):
            await run.result()
        assert (await run.describe()).status == "cancelled"


async def test_a_failing_workflow_raises_workflow_failed() -> None:
    @fusee.workflow("boom")
    async def boom(ctx: fusee.Ctx) -> None:
        await ctx.step("ok", lambda: 1)
        raise KeyError("sku")

    async with TestEngine(workflows=[boom]) as t:
        with pytest.raises(fusee.WorkflowFailed) as e:
            await t.execute(boom, "b-1")
        assert e.value.type == "KeyError"
        assert "boom" in e.value.traceback


async def test_info_and_journal_size() -> None:
    @fusee.workflow("who")
    async def who(ctx: fusee.Ctx) -> list[Any]:
        await ctx.step("a", lambda: 1)
        return [ctx.info.id, ctx.info.workflow, ctx.journal_size()]

    assert await crash_everywhere(who, id="me") == ["me", "who", 1]


@pytest.mark.parametrize(
    ("duration", "ok"),
    [
        pytest.param("500ms", True, id="ms"),
        pytest.param(datetime.timedelta(seconds=2), True, id="timedelta"),
        pytest.param(3, True, id="seconds"),
        pytest.param("5 minutes", False, id="words"),
    ],
)
async def test_durations_are_checked(duration: Any, ok: bool) -> None:
    @fusee.workflow("dur")
    async def dur(ctx: fusee.Ctx) -> str:
        try:
            await ctx.sleep("s", duration)
        except ValueError as e:
            return str(e)
        return "slept"

    async with TestEngine(workflows=[dur]) as t:
        got = await t.execute(dur, "d-1")
    assert (got == "slept") is ok
    if not ok:
        assert "invalid duration '5 minutes'" in got
