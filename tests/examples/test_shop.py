"""examples/shop: orders charged once through a payment API that fails 30% of the time.

Every test talks to the fake payment API over HTTP (`PaymentServer`, on
127.0.0.1), through the services the workflows use; the workflows run live,
then from their journal at every record (`crash_everywhere`), or on a real
store behind the FastAPI front.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from engine.conftest import eventually
from example_runner import ROOT
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import fusee
from examples.shop import services
from examples.shop.api import create_app
from examples.shop.models import Address, Approval, Item, Order, OrderView, Receipt, Settlement
from examples.shop.payment_server import serving_in_a_process
from examples.shop.workflows import (
    approval,
    change_address,
    nightly,
    order,
    orders,
    settle,
    ship,
    status,
)
from fusee.engine._telemetry import use_providers
from fusee.store import MemoryStore
from fusee.testing import TestEngine, crash_everywhere

WORKFLOWS: list[fusee.WorkflowDef[Any, Any]] = [order, ship, settle]


def an_order(id: str, *, customer: str = "ana", qty: int = 1, price_cents: int = 2_500) -> Order:
    return Order(
        id=id,
        customer=customer,
        items=[Item(sku="LAMP", qty=qty, price_cents=price_cents)],
        address=Address(name=customer, city="Lyon"),
    )


SMALL = an_order("o-small")
LARGE = an_order("o-large", qty=2, price_cents=60_000)


@pytest.fixture
def payment_api() -> Iterator[str]:
    """The fake payment API's URL; it runs in a process of its own."""
    with serving_in_a_process() as url:
        yield url


@pytest_asyncio.fixture
async def shop(payment_api: str) -> AsyncIterator[str]:
    """The payment API, and the services connected to it (what a worker's setup does)."""
    async with services.connected(payment_api):
        yield payment_api


def counts(url: str) -> dict[str, Any]:
    """What the payment API counted, read over HTTP."""
    answer = httpx.get(f"{url}/charges", timeout=10)
    answer.raise_for_status()
    got: dict[str, Any] = answer.json()
    return got


def charges(url: str) -> dict[str, int]:
    """The charges the payment API made, by order."""
    by_order: dict[str, int] = counts(url)["by_order"]
    return by_order


# --- the workflows, live and from their journal -------------------------------------------------


@pytest.mark.asyncio
async def test_a_small_order_ships_and_is_charged_once_at_every_crash(
    shop: str,
) -> None:
    receipt = await crash_everywhere(order, SMALL, id=SMALL.id, workflows=[ship])
    assert receipt.outcome == "shipped"
    assert receipt.tracking == "TRK-O-SMALL"
    # One charge, whatever the crashes and the API's failures: every run of
    # the step, in every life, charged under the step's idempotency key.
    assert charges(shop) == {"o-small": 1}
    assert counts(shop)["failures"] > 0  # the retries were real


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("decision", "outcome", "charged"),
    [
        pytest.param(Approval(approved=True, by="rev-1"), "shipped", 1, id="approved"),
        pytest.param(Approval(approved=False, by="rev-1"), "rejected", 0, id="rejected"),
        pytest.param(None, "expired", 0, id="no-answer-in-two-days"),
    ],
)
async def test_a_large_order_waits_for_its_approval(
    shop: str, decision: Approval | None, outcome: str, charged: int
) -> None:
    async def review(t: TestEngine, run: fusee.Run[Receipt]) -> None:
        if decision is not None:
            await run.signal(approval, decision, dedup="the-review")

    receipt = await crash_everywhere(order, LARGE, id=LARGE.id, workflows=[ship], drive=review)
    assert receipt.outcome == outcome
    assert charges(shop).get(LARGE.id, 0) == charged


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "crash", [pytest.param(False, id="live"), pytest.param(True, id="crashed")]
)
async def test_an_order_past_its_deadline_is_cancelled_and_its_stock_released(crash: bool) -> None:
    async with TestEngine(workflows=WORKFLOWS) as t:
        # A day to decide, where the approval waits two: the deadline comes first.
        run = await t.start(order, LARGE.id, LARGE, timeout="1d")
        await t.advance("12h")
        if crash:
            await t.crash()
        await t.advance("13h")
        with pytest.raises(fusee.Cancelled, match="deadline exceeded"):
            await run.result()
        assert len(t.step_log) == 2  # reserve, then release; never charged
        assert (await run.describe()).status == "cancelled"


@pytest.mark.asyncio
async def test_the_status_query_and_the_address_update_survive_a_crash(
    shop: str,
) -> None:
    async with TestEngine(workflows=WORKFLOWS) as t:
        run = await t.start(order, LARGE.id, LARGE)
        await t.settle()
        view = await run.query(status)
        assert isinstance(view, OrderView)
        assert (view.stage, view.address.city) == ("awaiting approval", "Lyon")
        moved = await run.update(change_address, Address(name="ana", city="Nantes"))
        assert moved == OrderView(id=LARGE.id, stage="awaiting approval", address=moved.address)
        assert moved.address.city == "Nantes"
        await t.crash()
        view = await run.query(status)
        assert view.address.city == "Nantes"  # the update replayed
        await run.signal(approval, Approval(approved=True, by="rev-1"))
        receipt = await run.result()
        parcel = await t.get(f"{LARGE.id}-ship").result()
        assert parcel.address.city == "Nantes"  # the child shipped to the new address
        assert receipt.charge_id is not None
        with pytest.raises(fusee.FuseeError, match=r"has finished|has left the warehouse"):
            await run.update(change_address, Address(name="ana", city="Paris"))
    assert charges(shop) == {LARGE.id: 1}


@pytest.mark.asyncio
async def test_a_customers_orders_go_one_at_a_time_through_the_queue(
    shop: str,
) -> None:
    first = an_order("o-1", customer="ana", qty=2, price_cents=60_000)  # waits for approval
    second = an_order("o-2", customer="ana")
    other = an_order("o-3", customer="bo")
    async with TestEngine(workflows=WORKFLOWS, queues=[orders]) as t:
        runs = [
            await t.start(order, o.id, o, queue=orders, key=o.customer)
            for o in (first, second, other)
        ]
        assert (await runs[2].result()).outcome == "shipped"  # another customer: not held up
        assert (await runs[1].describe()).status == "queued"  # behind ana's first order
        await t.crash()
        await runs[0].signal(approval, Approval(approved=True, by="rev-1"))
        assert [(await r.result()).outcome for r in runs[:2]] == ["shipped", "shipped"]
    assert charges(shop) == {"o-1": 1, "o-2": 1, "o-3": 1}


@pytest.mark.asyncio
async def test_the_nightly_settlement_runs_at_two_and_counts_the_days_charges(
    shop: str,
) -> None:
    async with TestEngine(workflows=WORKFLOWS, schedules=[nightly]) as t:  # from 00:00 UTC
        await t.execute(order, SMALL.id, SMALL)
        await t.advance("2h")
        settlement: Settlement = await t.get(
            "nightly-settlement-2026-01-01T02:00:00+00:00"
        ).result()
    assert settlement == Settlement(charges=1, total_cents=SMALL.total_cents)


@pytest.mark.asyncio
async def test_the_settlement_replays_at_every_crash(shop: str) -> None:
    assert await crash_everywhere(settle, id="settle") == Settlement(charges=0, total_cents=0)


# --- the web front: FastAPI on a Client, a worker beside it -------------------------------------


@pytest_asyncio.fixture(
    params=[pytest.param("memory", id="memory"), pytest.param("sqlite", id="sqlite")]
)
async def front(
    request: pytest.FixtureRequest, shop: str, tmp_path: Path
) -> AsyncIterator[httpx.AsyncClient]:
    """The app (lifespan entered) on a store an engine of this process serves."""
    store: Any
    if request.param == "memory":
        store = MemoryStore()
        await store.open()
        engine = fusee.Engine(store, WORKFLOWS, queues=[orders], schedules=[nightly])
        await engine.recover()
    else:
        store = str(tmp_path)
        engine = await fusee.Engine.open(
            store, workflows=WORKFLOWS, queues=[orders], schedules=[nightly], durability="none"
        )
    app = create_app(store)
    async with (
        engine,
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as http,
    ):
        yield http


@pytest.mark.asyncio
async def test_the_front_places_approves_moves_and_reads_orders(
    front: httpx.AsyncClient, shop: str
) -> None:
    for o in (SMALL, LARGE):
        placed = await front.post("/orders", json=o.model_dump())
        assert placed.status_code == 201, placed.text
    again = await front.post("/orders", json=SMALL.model_dump())
    assert (again.status_code, again.json()) == (409, {"detail": "order o-small exists"})

    receipt = await front.get(f"/orders/{SMALL.id}/receipt", params={"timeout": 60})
    assert Receipt.model_validate(receipt.json()).outcome == "shipped"

    # Waiting for approval: a receipt asked with a short timeout answers 504.
    async def awaiting() -> bool:
        return bool((await front.get(f"/orders/{LARGE.id}")).json()["stage"] == "awaiting approval")

    await eventually(awaiting, "the large order awaiting its approval")
    late = await front.get(f"/orders/{LARGE.id}/receipt", params={"timeout": 0.05})
    assert late.status_code == 504
    assert late.headers["Retry-After"] == "5"
    moved = await front.patch(f"/orders/{LARGE.id}/address", json={"name": "ana", "city": "Nantes"})
    assert moved.json()["address"] == {"name": "ana", "city": "Nantes"}
    yes = {"approved": True, "by": "rev-1"}
    for _ in range(2):  # a retried approval decides once
        approved = await front.post(f"/orders/{LARGE.id}/approval", json=yes)
        assert approved.status_code == 200
    receipt = await front.get(f"/orders/{LARGE.id}/receipt", params={"timeout": 60})
    assert Receipt.model_validate(receipt.json()).outcome == "shipped"

    refused = await front.patch(f"/orders/{SMALL.id}/address", json={"name": "a", "city": "b"})
    assert refused.status_code == 409
    assert (await front.get("/orders/nope")).status_code == 404
    closed = await front.post(f"/orders/{SMALL.id}/approval", json=yes)
    assert closed.status_code == 409
    assert charges(shop) == {SMALL.id: 1, LARGE.id: 1}


def test_the_demo_ships_one_order_rejects_one_and_charges_once_each(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "examples.shop"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "POST /orders o-1 again: 409 order o-1 exists" in out
    assert "o-1: shipped ch_" in out
    assert "o-2: shipped ch_" in out
    assert "o-3: rejected None None" in out
    assert "PATCH /orders/o-1/address: 409" in out
    assert "charges by order: {'o-1': 1, 'o-2': 1}" in out


@pytest.mark.asyncio
async def test_an_orders_trace_runs_from_the_request_to_each_charge_attempt(
    shop: str, tmp_path: Path
) -> None:
    spans = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(spans))
    app = create_app(str(tmp_path))
    # A worker sets its providers before its engine opens (its setup hook
    # runs first): the engine looks for them once, when it opens.
    with use_providers(tracer):
        async with (
            await fusee.Engine.open(
                tmp_path, workflows=WORKFLOWS, queues=[orders], durability="none"
            ),
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://shop"
            ) as http,
        ):
            with tracer.get_tracer("shop-tests").start_as_current_span("POST /orders") as request:
                assert (await http.post("/orders", json=SMALL.model_dump())).status_code == 201
            got = await http.get(f"/orders/{SMALL.id}/receipt", params={"timeout": 60})
            assert got.json()["outcome"] == "shipped"
    tracer.shutdown()
    finished = spans.get_finished_spans()
    (run,) = [s for s in finished if s.name == "fusee.run order"]
    (child,) = [s for s in finished if s.name == "fusee.run ship"]
    attempts = [s for s in finished if s.name == "fusee.step charge"]
    assert run.parent is not None
    assert child.parent is not None
    # One trace: the request's span, the order's run, its charge attempts, its child.
    assert run.parent.span_id == request.get_span_context().span_id
    assert run.context is not None
    assert child.parent.span_id == run.context.span_id
    assert attempts, [s.name for s in finished]
    assert {a.parent.span_id for a in attempts if a.parent} == {run.context.span_id}
    trace_id = request.get_span_context().trace_id
    assert {s.context.trace_id for s in (run, child, *attempts) if s.context} == {trace_id}
