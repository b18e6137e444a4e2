"""examples/shop: orders charged once through a payment API that fails 30% of the time.

Every test talks to the fake payment API over HTTP (`PaymentServer`, on
127.0.0.1), through the services the workflows use; the workflows run live,
then from their journal at every record (`crash_everywhere`), or after a
`TestEngine.crash`, or on a real store behind the FastAPI front. The
engines run with the shop's settings (`examples.shop.settings`: encrypted
payloads, invoices in a blob directory, retention) unless a test says.
"""

from __future__ import annotations

import datetime
import os
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
from examples.shop import admin, services, settings, workflows
from examples.shop.api import create_app
from examples.shop.models import (
    Address,
    Approval,
    Item,
    Note,
    Order,
    OrderView,
    Receipt,
    Refund,
    Report,
    Settlement,
)
from examples.shop.payment_server import serving_in_a_process
from examples.shop.workflows import (
    approval,
    change_address,
    nightly,
    note,
    order,
    orders,
    refund,
    review_request,
    sales_report,
    settle,
    ship,
    status,
)
from fusee.engine._telemetry import use_providers
from fusee.store import MemoryStore
from fusee.testing import TestEngine, crash_everywhere

WORKFLOWS: list[fusee.WorkflowDef[Any, Any]] = [
    order,
    ship,
    settle,
    review_request,
    refund,
    sales_report,
]


def an_order(id: str, *, customer: str = "ana", qty: int = 1, price_cents: int = 2_500) -> Order:
    return Order(
        id=id,
        customer=customer,
        items=[Item(sku="LAMP", qty=qty, price_cents=price_cents)],
        address=Address(name=customer, city="Lyon"),
    )


SMALL = an_order("o-small")
LARGE = an_order("o-large", qty=2, price_cents=60_000)


@pytest.fixture(scope="module")
def payment_process() -> Iterator[str]:
    """The fake payment API's URL; it runs in a process of its own, one per module."""
    with serving_in_a_process() as url:
        yield url


@pytest.fixture
def payment_api(payment_process: str) -> str:
    """The fake payment API, its ledger emptied and its failures drawn from the seed again."""
    httpx.delete(f"{payment_process}/charges", timeout=10).raise_for_status()
    return payment_process


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


@pytest.fixture
def options(tmp_path: Path) -> dict[str, Any]:
    """The shop's engine settings (`settings.engine_options`), its blobs under ``tmp_path``."""
    return settings.engine_options(tmp_path)


def blob_files(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]


CRASHED = [pytest.param(False, id="live"), pytest.param(True, id="crashed")]


# --- the workflows, live and from their journal -------------------------------------------------


@pytest.mark.asyncio
async def test_a_small_order_ships_and_is_charged_once_at_every_crash(
    shop: str, options: dict[str, Any], tmp_path: Path
) -> None:
    receipt = await crash_everywhere(
        order, SMALL, id=SMALL.id, workflows=WORKFLOWS, engine_options=options
    )
    assert receipt.outcome == "shipped"
    assert receipt.tracking == "TRK-O-SMALL"
    # The invoice, read back from the blob store (its digest checked) at every replay.
    assert receipt.invoice_bytes is not None
    assert receipt.invoice_bytes > services.Billing.SCAN_BYTES
    assert blob_files(tmp_path)
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

    receipt = await crash_everywhere(order, LARGE, id=LARGE.id, workflows=WORKFLOWS, drive=review)
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
async def test_the_status_query_the_address_update_and_the_notes_survive_a_crash(
    shop: str,
) -> None:
    async with TestEngine(workflows=WORKFLOWS) as t:
        run = await t.start(order, LARGE.id, LARGE)
        await t.settle()
        view = await run.query(status)
        assert isinstance(view, OrderView)
        assert (view.stage, view.address.city) == ("awaiting approval", "Lyon")
        await run.signal(note, Note(text="ring twice"))  # the signal handler takes it
        nantes = Address(name="ana", city="Nantes")
        moved = await run.update(change_address, nantes, id="req-1")
        assert moved.address.city == "Nantes"
        assert moved.notes == ["ring twice"]
        assert moved.address_changed_by == "req-1"  # ctx.current_update() in the handler
        await t.crash()
        view = await run.query(status)
        assert view.address.city == "Nantes"  # the update replayed
        assert (view.notes, view.address_changed_by) == (["ring twice"], "req-1")
        # The same request again (its Idempotency-Key as the update's id): applied once.
        again = await run.update(change_address, Address(name="ana", city="Brest"), id="req-1")
        assert again.address.city == "Nantes"
        await run.signal(note, Note(text="fragile"))
        await run.signal(approval, Approval(approved=True, by="rev-1"))
        receipt = await run.result()
        parcel = await t.get(f"{LARGE.id}-ship").result()
        assert parcel.address.city == "Nantes"  # the child shipped to the new address
        assert parcel.notes == ["ring twice", "fragile"]  # with the notes, in journal order
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


@pytest.mark.asyncio
async def test_an_orders_payloads_are_encrypted_and_its_invoice_is_an_encrypted_blob(
    shop: str, options: dict[str, Any], tmp_path: Path
) -> None:
    async with TestEngine(workflows=WORKFLOWS, **options) as t:
        receipt = await t.execute(order, SMALL.id, SMALL)
        store = t.store
    assert receipt.invoice_bytes is not None
    blobs = blob_files(tmp_path)
    assert len(blobs) == 1  # the invoice; the order and its other values stay in the journal
    assert b"%PDF" not in blobs[0].read_bytes()  # compressed, then encrypted
    # A reader without the shop's key (a process not given its codecs) cannot read them.
    async with TestEngine(workflows=WORKFLOWS, store=store, blobs=options["blobs"]) as other:
        with pytest.raises(fusee.PayloadError, match="aes-gcm"):
            await other.get(SMALL.id).result()
    # One with them, after the restart, reads the receipt.
    async with TestEngine(workflows=WORKFLOWS, store=store, **options) as again:
        assert await again.get(SMALL.id).result() == receipt


@pytest.mark.asyncio
@pytest.mark.parametrize("crash", CRASHED)
async def test_a_review_is_asked_seven_days_after_an_order_ships(shop: str, crash: bool) -> None:
    async with TestEngine(workflows=WORKFLOWS) as t:
        await t.execute(order, SMALL.id, SMALL)
        review = t.get(f"{SMALL.id}-review")
        info = await review.describe()
        assert info.status == "queued"  # a delayed start, recorded now
        week = datetime.datetime(2026, 1, 8, tzinfo=datetime.UTC)  # the order ends on day 0
        assert info.wake_at is not None
        assert week <= info.wake_at < week + datetime.timedelta(minutes=1)
        if crash:
            await t.crash()
        await t.advance("6d")
        assert (await review.describe()).status == "queued"
        await t.advance("1d")
        assert (await review.result()).startswith("msg-ana-")


@pytest.mark.asyncio
@pytest.mark.parametrize("crash", CRASHED)
async def test_a_refund_pays_back_once_and_cancels_the_waiting_review_request(
    shop: str, crash: bool
) -> None:
    async with TestEngine(workflows=WORKFLOWS) as t:
        receipt = await t.execute(order, SMALL.id, SMALL)
        assert receipt.charge_id is not None
        asked = Refund(order_id=SMALL.id, charge_id=receipt.charge_id, reason="arrived broken")
        run = await t.start(refund, f"{SMALL.id}-refund", asked)
        if crash:
            await t.crash()
        assert (await run.result()).startswith("re_")
        with pytest.raises(fusee.Cancelled, match="order refunded: arrived broken"):
            await t.get(f"{SMALL.id}-review").result()  # dropped before it started
        await t.advance("8d")
        assert (await t.get(f"{SMALL.id}-review").describe()).status == "cancelled"
    assert counts(shop)["refunds_by_order"] == {SMALL.id: 1}


@pytest.mark.asyncio
@pytest.mark.parametrize("crash", CRASHED)
async def test_a_bug_in_the_orders_code_pauses_it_until_the_fix_is_deployed_and_resumed(
    shop: str, monkeypatch: pytest.MonkeyPatch, crash: bool
) -> None:
    def bad_deploy(o: Order) -> bool:
        raise KeyError("total_cents")

    monkeypatch.setattr(workflows, "needs_approval", bad_deploy)
    async with TestEngine(workflows=WORKFLOWS, on_pause="wait") as t:
        run = await t.start(order, SMALL.id, SMALL)
        await t.settle()
        info = await run.describe()
        assert info.status == "paused"
        assert info.error is not None
        assert "KeyError" in info.error
        if crash:
            await t.crash()  # replayed on the same code: paused again
            await t.settle()
            assert (await run.describe()).status == "paused"
        monkeypatch.undo()  # the fix, deployed
        await run.resume()
        assert (await run.result()).outcome == "shipped"
        # Its first step (the reservation), recorded before the bug, ran once.
        steps = [key for _, key in t.step_log if key[0] == SMALL.id]
        assert steps.count(min(steps)) == 1
    assert charges(shop) == {SMALL.id: 1}


@pytest.mark.asyncio
@pytest.mark.parametrize("crash", CRASHED)
async def test_closing_the_shop_cancels_the_queued_orders_and_a_dry_run_cancels_none(
    shop: str, crash: bool
) -> None:
    first = an_order("o-1", customer="ana", qty=2, price_cents=60_000)  # awaits its approval
    queued = [an_order("o-2", customer="ana"), an_order("o-3", customer="ana")]
    async with TestEngine(workflows=WORKFLOWS, queues=[orders]) as t:
        runs = [
            await t.start(order, o.id, o, queue=orders, key=o.customer) for o in (first, *queued)
        ]
        await t.settle()
        if crash:
            await t.crash()
        would = await admin.close(t.engine, dry_run=True)
        assert would.done == ("o-2", "o-3")
        assert [(await r.describe()).status for r in runs[1:]] == ["queued", "queued"]
        closed = await admin.close(t.engine)
        assert closed.done == ("o-2", "o-3")
        for run in runs[1:]:
            with pytest.raises(fusee.Cancelled, match="shop closed"):
                await run.result()
        assert (await runs[0].describe()).status == "suspended"  # not queued: left alone
    assert charges(shop) == {}


@pytest.mark.asyncio
async def test_a_sales_report_made_at_run_time_reports_the_day_before_each_tick(
    shop: str,
) -> None:
    async with TestEngine(workflows=WORKFLOWS) as t:  # from 2026-01-01 00:00 UTC
        await t.schedules.create(
            "sales-report-ops", sales_report, cron="0 6 * * *", input="ops@shop.example"
        )
        await t.execute(order, SMALL.id, SMALL)
        await t.advance("6h")
        first: Report = await t.get("sales-report-ops-2026-01-01T06:00:00+00:00").result()
        await t.crash()  # the schedule is in the store: it ticks on after a restart
        await t.advance("1d")
        second: Report = await t.get("sales-report-ops-2026-01-02T06:00:00+00:00").result()
    assert first == Report(
        day="2025-12-31", charges=1, total_cents=SMALL.total_cents, sent_to="ops@shop.example"
    )
    assert second.day == "2026-01-01"


@pytest.mark.asyncio
async def test_an_order_finishes_on_the_release_it_started_on(
    shop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOP_RELEASE", "2026.12.1")
    async with TestEngine(workflows=WORKFLOWS, version=settings.release()) as t:
        await t.start(order, LARGE.id, LARGE)
        await t.settle()
        store = t.store
    # The next release is deployed: the order waiting for its approval stays on its own.
    monkeypatch.setenv("SHOP_RELEASE", "2026.12.2")
    async with TestEngine(workflows=WORKFLOWS, store=store, version=settings.release()) as t2:
        with pytest.raises(fusee.UnknownWorkflow, match=r"2026\.12\.1"):
            await t2.get(LARGE.id).signal(approval, Approval(approved=True, by="rev-1"))
        new = await t2.execute(order, SMALL.id, SMALL)
        assert new.outcome == "shipped"
        assert (await t2.get(SMALL.id).describe()).version == "2026.12.2"
    # A worker of its release takes it to its end.
    monkeypatch.setenv("SHOP_RELEASE", "2026.12.1")
    async with TestEngine(workflows=WORKFLOWS, store=store, version=settings.release()) as t1:
        run = t1.get(LARGE.id)
        await run.signal(approval, Approval(approved=True, by="rev-1"))
        assert (await run.result()).outcome == "shipped"
        assert (await run.describe()).version == "2026.12.1"
    assert charges(shop) == {LARGE.id: 1, SMALL.id: 1}


@pytest.mark.asyncio
@pytest.mark.parametrize("crash", CRASHED)
async def test_finished_orders_and_their_invoices_are_deleted_thirty_days_after_they_end(
    shop: str, options: dict[str, Any], tmp_path: Path, crash: bool
) -> None:
    async with TestEngine(workflows=WORKFLOWS, **options) as t:
        await t.execute(order, SMALL.id, SMALL)
        assert blob_files(tmp_path)
        await t.advance("7d")  # the review request runs and ends
        if crash:
            await t.crash()
        await t.advance("22d")
        assert (await t.get(SMALL.id).describe()).status == "completed"  # ended 29 days ago
        # The engine sweeps every 30 hours (1/24 of the retention): by day 39,
        # the review request (ended on day 7) is 32 days old too.
        await t.advance("10d")
        for id in (SMALL.id, f"{SMALL.id}-ship", f"{SMALL.id}-review"):
            with pytest.raises(fusee.NotFound):
                await t.get(id).describe()
    assert blob_files(tmp_path) == []


def test_the_key_comes_from_the_environment_or_a_file_and_production_needs_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("SHOP_KEY", "SHOP_KEY_FILE", "SHOP_KEY_ID", "SHOP_ENV"):
        monkeypatch.delenv(name, raising=False)
    assert settings.key() == ("dev", settings.DEV_KEY)
    secret = os.urandom(32)
    (tmp_path / "shop_key").write_text(secret.hex() + "\n")
    monkeypatch.setenv("SHOP_KEY_FILE", str(tmp_path / "shop_key"))
    assert settings.key() == ("k1", secret)
    monkeypatch.setenv("SHOP_KEY", "not hex")
    with pytest.raises(RuntimeError, match="64 hex digits"):
        settings.key()
    monkeypatch.delenv("SHOP_KEY")
    monkeypatch.delenv("SHOP_KEY_FILE")
    monkeypatch.setenv("SHOP_ENV", "production")
    with pytest.raises(RuntimeError, match="set SHOP_KEY"):
        settings.codecs()


# --- the web front: FastAPI on a Client, a worker beside it -------------------------------------


@pytest_asyncio.fixture(
    params=[pytest.param("memory", id="memory"), pytest.param("sqlite", id="sqlite")]
)
async def front(
    request: pytest.FixtureRequest, shop: str, tmp_path: Path
) -> AsyncIterator[httpx.AsyncClient]:
    """The app (lifespan entered) on a store an engine of this process serves."""
    store: Any
    options = settings.engine_options(tmp_path)
    if request.param == "memory":
        store = MemoryStore()
        await store.open()
        engine = fusee.Engine(store, WORKFLOWS, queues=[orders], schedules=[nightly], **options)
        await engine.recover()
    else:
        store = str(tmp_path)
        engine = await fusee.Engine.open(
            store,
            workflows=WORKFLOWS,
            queues=[orders],
            schedules=[nightly],
            durability="none",
            **options,
        )
    app = create_app(store)
    async with (
        engine,
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as http,
    ):
        yield http


@pytest.mark.asyncio
async def test_the_front_places_approves_moves_notes_refunds_and_reads_orders(
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
    unshipped = await front.post(f"/orders/{LARGE.id}/refund", json={"reason": "too slow"})
    assert unshipped.status_code == 409
    nantes = {"name": "ana", "city": "Nantes"}
    for _ in range(2):  # a retried request moves it once, and adds its note once
        moved = await front.patch(
            f"/orders/{LARGE.id}/address", json=nantes, headers={"Idempotency-Key": "req-1"}
        )
        assert moved.json()["address"] == nantes
        assert moved.json()["address_changed_by"] == "req-1"
        noted = await front.post(
            f"/orders/{LARGE.id}/notes",
            json={"text": "ring twice"},
            headers={"Idempotency-Key": "n-1"},
        )
        assert noted.status_code == 200
    empty = {"Idempotency-Key": ""}
    refused = await front.patch(f"/orders/{LARGE.id}/address", json=nantes, headers=empty)
    assert refused.status_code == 422, refused.text
    refused = await front.post(f"/orders/{LARGE.id}/notes", json={"text": "?"}, headers=empty)
    assert refused.status_code == 422, refused.text
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
    assert (await front.get(f"/orders/{LARGE.id}")).json()["notes"] == ["ring twice"]

    refunded = await front.post(f"/orders/{SMALL.id}/refund", json={"reason": "arrived broken"})
    assert refunded.status_code == 201, refunded.text
    assert refunded.json()["refund"].startswith("re_")
    twice = await front.post(f"/orders/{SMALL.id}/refund", json={"reason": "arrived broken"})
    assert (twice.status_code, twice.json()) == (
        409,
        {"detail": "order o-small is refunded already"},
    )
    assert (await front.post("/orders/nope/refund", json={"reason": "?"})).status_code == 404

    report = {"name": "ops", "cron": "0 6 * * *", "to": "ops@shop.example"}
    assert (await front.post("/reports", json=report)).status_code == 201
    assert (await front.post("/reports", json=report)).status_code == 409
    bad = await front.post("/reports", json={**report, "name": "x", "cron": "at six"})
    assert bad.status_code == 422
    assert charges(shop) == {SMALL.id: 1, LARGE.id: 1}
    assert counts(shop)["refunds_by_order"] == {SMALL.id: 1}


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
    assert "o-2: notes ['leave it with the neighbour'], address changed by req-7" in out
    assert "invoices in the blob store: 2" in out
    assert "POST /orders/o-1/refund: 201 re_" in out
    assert "o-1-review: cancelled (order refunded: arrived broken)" in out
    assert "o-2-review: queued" in out
    assert "sales report to ops@shop.example: 2 charge(s)" in out
    assert "shop closed: cancelled ['o-5']" in out
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
                tmp_path,
                workflows=WORKFLOWS,
                queues=[orders],
                durability="none",
                **settings.engine_options(tmp_path),
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
