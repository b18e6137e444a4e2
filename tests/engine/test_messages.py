"""Messages checked at every door: a payload that does not fit never fails a run.

A signal whose definition the engine knows (those of its workflows' modules)
is refused with `fusee.PayloadError` before anything is recorded; one it
cannot check is recorded, and the wait it does not fit sets it aside and
goes on. Queries and updates answer with the types their definitions (or
handlers) declare. Every test runs on every store, live and after a crash.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pydantic
import pytest

import fusee
from fusee.record import Signal, Update, Waited, decode
from fusee.testing import TestEngine, crash_everywhere

from .conftest import Host, assert_steps_ran_once

pytestmark = pytest.mark.asyncio

approval = fusee.signal("approval", bool)


@fusee.workflow("paid-order")
async def paid_order(ctx: fusee.Ctx, amount: int) -> str:
    charge = await ctx.step("charge-card", lambda: f"ch-{amount}")
    approved = await ctx.wait_for(approval)
    return f"{charge} {'shipped' if approved else 'refunded'}"


def gated(name: str, payload_type: type[Any]) -> fusee.WorkflowDef[None, Any]:
    """A workflow made by a factory: its signal's definition lives in the closure only,
    so no door knows it but the wait itself."""
    go = fusee.signal(f"{name}-go", payload_type)

    @fusee.workflow(name)
    async def flow(ctx: fusee.Ctx) -> Any:
        await ctx.step("reserve", lambda: "held")
        return await ctx.wait_for(go)

    return flow


counted = gated("counted", int)


async def journal(t: TestEngine, id: str) -> list[Any]:
    store = t.engine.store
    row = await store.get(id)
    assert row is not None
    return [decode(data) for _, data in await store.load(id, row.run)]


async def signals_of(t: TestEngine, id: str) -> list[Signal]:
    return [r for r in await journal(t, id) if isinstance(r, Signal)]


# --- doors that know the definition ---------------------------------------------------------------


@pytest.mark.parametrize(
    "definition",
    [
        pytest.param(approval, id="typed"),
        pytest.param(fusee.signal("approval"), id="by-name"),
    ],
)
async def test_a_wrongly_typed_signal_is_refused_before_it_is_recorded_and_the_order_goes_on(
    host: Host, definition: fusee.SignalDef[Any]
) -> None:
    async with host(workflows=[paid_order]) as t:
        run = await t.start(paid_order, "order-1", 40)
        with pytest.raises(fusee.PayloadError, match=r"does not fit.*bool"):
            await run.signal(definition, "yes please")
        assert await signals_of(t, "order-1") == []
        await t.settle()  # the card is charged: its step's result is durable
        await t.crash()
        with pytest.raises(fusee.PayloadError, match="nothing was recorded"):
            await run.signal(definition, {"approved": True})
        assert (await run.describe()).status in ("running", "suspended")
        await run.signal(definition, True)
        assert await run.result() == "ch-40 shipped"
        await t.crash()
        assert await run.result() == "ch-40 shipped"
        assert [s.payload for s in await signals_of(t, "order-1")] == [approval.encode(True)]
        assert_steps_ran_once(t)


async def test_a_signal_sent_by_ctx_send_is_refused_at_the_sender_or_the_receiver(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    @fusee.workflow("clerk")
    async def clerk(ctx: fusee.Ctx, target: str) -> str:
        try:
            ctx.send(target, approval, "yes")  # type: ignore[misc]
        except fusee.PayloadError:
            refused = "refused here"
        await ctx.step("file", lambda: None)
        # Sent by name: the receiving engine knows the type, and refuses it.
        ctx.send(target, fusee.signal("approval"), "yes")
        await ctx.step("file-again", lambda: None)
        ctx.send(target, approval, True)
        return refused

    caplog.set_level(logging.WARNING, logger="fusee")
    async with host(workflows=[paid_order, clerk]) as t:
        order = await t.start(paid_order, "order-2", 7)
        assert await t.execute(clerk, "clerk-1", "order-2") == "refused here"
        assert await order.result() == "ch-7 shipped"
        await t.crash()
        assert await order.result() == "ch-7 shipped"
        assert [s.payload for s in await signals_of(t, "order-2")] == [approval.encode(True)]
        assert "was not delivered" in caplog.text
        assert "does not fit the signal's type bool" in caplog.text
        assert_steps_ran_once(t)


# --- a wait that does not take what it cannot read ------------------------------------------------


async def test_a_signal_no_door_could_check_is_set_aside_at_the_wait_which_goes_on(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    by_name = fusee.signal("counted-go")
    caplog.set_level(logging.WARNING, logger="fusee")
    async with host(workflows=[counted]) as t:
        run = await t.start(counted, "c-1")
        await run.signal(by_name, "three")
        await t.settle()  # the wait has begun, and set it aside
        assert (await run.describe()).status == "suspended"
        assert "set aside signal 'counted-go' #0" in caplog.text
        await t.crash()
        # Recovered, the wait sets it aside again, and takes the next that fits.
        await run.signal(by_name, [3])
        assert (await run.describe()).status in ("running", "suspended")
        await run.signal(by_name, 3)
        assert await run.result() == 3
        await t.crash()
        assert await run.result() == 3
        records = await journal(t, "c-1")
        assert [r.outcome.ordinal for r in records if isinstance(r, Waited)] == [2]
        assert len([r for r in records if isinstance(r, Signal)]) == 3
        assert_steps_ran_once(t)


async def test_a_set_aside_signal_stays_set_aside_through_a_crash_at_every_record() -> None:
    by_name = fusee.signal("counted-go")

    async def drive(t: TestEngine, run: fusee.Run[Any]) -> None:
        await run.signal(by_name, "three", dedup="bad")
        await run.signal(by_name, 3, dedup="good")

    assert await crash_everywhere(counted, drive=drive) == 3


async def test_a_set_aside_signal_is_taken_by_a_later_wait_whose_type_it_fits(host: Host) -> None:
    @fusee.workflow("two-minds")
    async def two_minds(ctx: fusee.Ctx) -> list[Any]:
        first = await ctx.wait_for(fusee.signal("answer", int))
        second = await ctx.wait_for(fusee.signal("answer", str))
        return [first, second]

    by_name = fusee.signal("answer")
    async with host(workflows=[two_minds]) as t:
        run = await t.start(two_minds, "m-1")
        await run.signal(by_name, "later")
        await t.crash()
        await run.signal(by_name, 1)
        assert await run.result() == [1, "later"]
        await t.crash()
        assert await run.result() == [1, "later"]


# --- typed answers --------------------------------------------------------------------------------


class Basket(pydantic.BaseModel):
    items: list[str]
    total_cents: int


@dataclasses.dataclass(frozen=True)
class Progress:
    done: int
    total: int


basket_q = fusee.query("basket", Basket)
progress_q = fusee.query("progress", Progress)
plain_q = fusee.query("basket")
add_item = fusee.update("add-item", str)


@fusee.workflow("shop")
async def shop(ctx: fusee.Ctx) -> int:
    items: list[str] = []

    def added(item: str) -> Basket:
        items.append(item)
        return Basket(items=list(items), total_cents=100 * len(items))

    ctx.on_query(basket_q, lambda _: Basket(items=list(items), total_cents=100 * len(items)))
    ctx.on_query(progress_q, lambda _: Progress(len(items), 3))
    ctx.on_update(add_item, added)
    await ctx.wait_for(fusee.signal("checkout", None))
    return len(items)


async def test_query_answers_and_update_results_decode_to_their_declared_types(host: Host) -> None:
    async with host(workflows=[shop]) as t:
        run = await t.start(shop, "s-1")
        # No result_type on the update: its handler's annotation decides.
        assert await run.update(add_item, "tea") == Basket(items=["tea"], total_cents=100)
        assert await run.query(basket_q) == Basket(items=["tea"], total_cents=100)
        assert await run.query(progress_q) == Progress(1, 3)
        assert await run.query(plain_q) == {"items": ["tea"], "total_cents": 100}
        await t.crash()
        assert await run.update(add_item, "jam") == Basket(items=["tea", "jam"], total_cents=200)
        assert await run.query(progress_q) == Progress(2, 3)
        # Sent by name with a payload its handler cannot take: refused, unrecorded.
        with pytest.raises(fusee.PayloadError, match="does not fit the type its handler takes"):
            await run.update(fusee.update("add-item"), 3)
        assert await run.query(progress_q) == Progress(2, 3)
        await run.signal(fusee.signal("checkout", None))
        assert await run.result() == 2
        assert not [
            r
            for r in await journal(t, "s-1")
            if isinstance(r, Update) and r.payload == add_item.encode(3)
        ]
        # A finished run answers from its journal, typed the same.
        assert await run.query(basket_q) == Basket(items=["tea", "jam"], total_cents=200)
