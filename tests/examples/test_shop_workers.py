"""examples/shop on Postgres: two `fusee worker` processes, one SIGKILLed amid 50 orders.

The workers are the command a user runs (``fusee worker
examples.shop.workflows --setup examples.shop.services:connected --codecs
examples.shop.settings:codecs --version R --retention 30d``: the payloads
are compressed and encrypted, the runs pinned to the workers' release); the
payment API runs in a process of its own, so its counts survive the kill;
the test places the orders through a `fusee.Client`, as the web front does.
Every order must complete, and the payment API must count exactly one
charge per order: the runs the killed worker held are taken over and their
charge steps, run again, reuse their idempotency keys.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import asyncpg
import httpx
import pytest
from _postgres import Cluster
from engine.conftest import eventually
from example_runner import ROOT

import fusee
from examples.shop import settings
from examples.shop.models import Address, Item, Order, Receipt
from examples.shop.payment_server import serving_in_a_process
from examples.shop.workflows import order, orders
from fusee.store._postgres_sql import shard_of
from fusee.store.postgres import PostgresStore

ORDERS = 50
CUSTOMERS = 10
# Short leases: the killed worker's shards move within seconds.
LEASE = "2s"
# The store's shard count (the default).
SHARDS = 64
# Both workers run one release (SHOP_RELEASE), as a deploy of it does.
RELEASE = "2026.12.1"


class WorkerProcess:
    """``fusee worker`` serving the shop, its output read as it comes."""

    def __init__(self, name: str, store: str, payment_url: str) -> None:
        self.name = name
        env = {**os.environ, "SHOP_PAYMENT_URL": payment_url, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fusee",
                "worker",
                "examples.shop.workflows",
                "--setup",
                "examples.shop.services:connected",
                "--codecs",
                "examples.shop.settings:codecs",
                "--version",
                RELEASE,
                "--retention",
                settings.RETENTION,
                "--store",
                store,
                "--lease",
                LEASE,
                "--name",
                name,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._reader.join(30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@contextmanager
def workers(store: str, payment_url: str, *names: str) -> Iterator[list[WorkerProcess]]:
    with ExitStack() as stack:
        started = []
        for name in names:
            w = WorkerProcess(name, store, payment_url)
            stack.callback(w.stop)
            started.append(w)
        yield started


async def charged(payment_url: str) -> dict[str, int]:
    async with httpx.AsyncClient(base_url=payment_url, timeout=10) as http:
        answer = await http.get("/charges")
    by_order: dict[str, int] = answer.json()["by_order"]
    return by_order


async def shard_owners(store_url: str) -> dict[int, str]:
    """Each shard's live owner (the workers share one version: one lane of shards)."""
    store = PostgresStore(store_url, readonly=True)
    try:
        await store.open()
    except fusee.StoreError:  # no worker has created it yet
        return {}
    try:
        leases = await store.leases()
    finally:
        await store.close()
    # A lane's shard s is slot lane * SHARDS + s (docs/deploys.md).
    return {slot % SHARDS: owner for slot, (owner, _, live) in leases.items() if owner and live}


def an_order(n: int) -> Order:
    customer = f"c{n % CUSTOMERS}"
    return Order(
        id=f"o-{n}",
        customer=customer,
        items=[Item(sku=f"SKU-{n}", qty=1 + n % 3, price_cents=1_000 + n)],
        address=Address(name=customer, city="Lyon"),
    )


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_two_workers_one_killed_amid_fifty_orders_complete_each_with_one_charge(
    postgres_cluster: Cluster,
) -> None:
    name = postgres_cluster.new_name("shop_")
    conn = await asyncpg.connect(postgres_cluster.dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    store = postgres_cluster.dsn_for(name)
    placed = [an_order(n) for n in range(ORDERS)]

    with serving_in_a_process() as payment_url, workers(store, payment_url, "w1", "w2") as ws:
        doomed, survivor = ws
        # Both hold shards before the orders come: the kill leaves runs behind.
        await eventually(
            lambda: _both_own(store), "both workers holding shards:\n" + doomed.output, within_s=60
        )
        async with await fusee.Client.connect(store, codecs=settings.codecs()) as client:

            async def place() -> list[fusee.Run[Any]]:
                return [
                    await client.start(order, o.id, o, queue=orders, key=o.customer) for o in placed
                ]

            # The kill comes while the orders are still being placed and run.
            placing = asyncio.ensure_future(place())
            await eventually(
                lambda: _at_least(payment_url, ORDERS // 10),
                "a tenth of the orders charged",
                within_s=60,
            )
            owners = await shard_owners(store)
            doomed.proc.kill()  # SIGKILL: no cleanup, its leases run out
            doomed.proc.wait(30)
            before_kill = len(survivor.lines)
            charged_at_kill = set(await charged(payment_url))
            runs = await placing
            receipts = [
                Receipt.model_validate(await asyncio.wait_for(run.result(), 120)) for run in runs
            ]
            final = await charged(payment_url)
            versions = {(await run.describe()).version for run in runs}
        survivor_output = survivor.output
        after_kill = "\n".join(survivor.lines[before_kill:])

    assert doomed.proc.returncode == -signal.SIGKILL
    # The killed worker held orders not charged yet: the survivor took them over.
    orphans = [
        o.id
        for o in placed
        if owners.get(shard_of(o.id, SHARDS)) == "w1" and o.id not in charged_at_kill
    ]
    assert orphans, (owners, charged_at_kill)
    assert "worker w2 took shards" in after_kill, survivor_output  # and w2 took its runs over
    assert [r.outcome for r in receipts] == ["shipped"] * ORDERS, survivor_output
    assert [r.order_id for r in receipts] == [o.id for o in placed]
    # Exactly one charge per order, however many attempts and lives each took.
    assert final == {o.id: 1 for o in placed}
    assert len({r.charge_id for r in receipts}) == ORDERS
    assert versions == {RELEASE}


async def _both_own(store: str) -> bool:
    return set((await shard_owners(store)).values()) == {"w1", "w2"}


async def _at_least(payment_url: str, count: int) -> bool:
    return len(await charged(payment_url)) >= count
