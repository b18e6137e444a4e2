"""examples/fastapi_app.py: the app's Client starts, pays and reads orders the workers run."""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg
import pytest
from _postgres import Cluster
from example_runner import run_example


def check(out: str, workers: int) -> None:
    assert out.count("worker ready") == workers
    # Right after its start the run is running, or already waiting for its
    # payment (suspended): the worker's first turn races the answer.
    assert re.search(r"POST /orders/o-1: 201 \{'id': 'o-1', 'status': '(running|suspended)'\}", out)
    assert "POST /orders/o-1 again: 409 {'detail': 'that order exists'}" in out
    # The payment, then its retry, applied once.
    assert out.count("POST /orders/o-1/paid: 200 {'id': 'o-1', 'paid': 'pay-77'}") == 2
    assert (
        "GET /orders/o-1?wait=1: {'id': 'o-1', 'result': {'status': 'shipped', "
        "'payment': 'pay-77', 'label': 'FR-A1-2'}}"
    ) in out
    assert "GET /orders/o-2: {'id': 'o-2', 'status': 'suspended'}" in out


def test_the_app_starts_pays_and_ships_an_order_through_the_worker(tmp_path: Path) -> None:
    check(run_example("fastapi_app", cwd=tmp_path), workers=1)


@pytest.mark.asyncio
async def test_on_postgres_two_workers_serve_the_app(
    tmp_path: Path, postgres_cluster: Cluster
) -> None:
    name = postgres_cluster.new_name("fastapi_")
    conn = await asyncpg.connect(postgres_cluster.dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = postgres_cluster.dsn_for(name)
    check(run_example("fastapi_app", url, cwd=tmp_path), workers=2)
