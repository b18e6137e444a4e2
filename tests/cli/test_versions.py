"""`fusee versions`: unfinished runs per engine version, the workers of each, orphans warned of."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from _postgres import Cluster

import fusee

from .conftest import acli

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", bool)


@fusee.workflow("held")
async def held(ctx: fusee.Ctx) -> bool | None:
    return await ctx.wait_for(go)


def by_version(out: str) -> dict[Any, dict[str, Any]]:
    return {line["version"]: line for line in json.loads(out)}


async def test_versions_on_sqlite_asks_the_serving_engine_and_warns_of_a_version_without_one(
    tmp_path: Path,
) -> None:
    data = str(tmp_path)
    async with await fusee.Engine.open(
        data, workflows=[held], durability="none", version="v1"
    ) as engine:
        await engine.start(held, "h-1")
    async with await fusee.Engine.open(data, workflows=[held], durability="none", version="v2"):
        code, out, err = await acli("versions", "--data", data, "--json")
        assert code == 0, err
        lines = by_version(out)
        assert lines["v2"] == {
            "version": "v2",
            "runs": 0,
            "workers": ["the serving engine"],
            "warning": None,
        }
        assert (lines["v1"]["runs"], lines["v1"]["workers"]) == (1, [])
        assert "no worker runs it" in lines["v1"]["warning"]
        code, out, err = await acli("versions", "--data", data)
        assert code == 0, err
        assert "the serving engine" in out
        assert "1 unfinished run(s) started on version 'v1' and no worker runs it" in err
    code, out, _ = await acli("versions", "--data", data, "--json")
    assert by_version(out)["v1"]["runs"] == 1


async def test_versions_on_postgres_lists_each_live_worker_under_its_version(
    postgres_cluster: Cluster,
) -> None:
    name = postgres_cluster.new_name("versions_")
    conn = await asyncpg.connect(postgres_cluster.dsn)
    try:
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    url = postgres_cluster.dsn_for(name)
    old = await fusee.Engine.open(
        url, workflows=[held], durability="none", version="v1", worker="old-1"
    )
    try:
        await old.start(held, "h-1")
        async with await fusee.Engine.open(
            url, workflows=[held], durability="none", version="v2", worker="new-1"
        ):
            code, out, err = await acli("versions", "--store", url, "--json")
            assert code == 0, err
            lines = by_version(out)
            assert (lines["v1"]["runs"], lines["v1"]["workers"]) == (1, ["old-1"])
            assert lines["v2"]["workers"] == ["new-1"]
            assert [line["warning"] for line in lines.values()] == [None, None]
            await old.close()
            code, out, err = await acli("versions", "--store", url, "--json")
            assert "no worker runs it" in by_version(out)["v1"]["warning"]
    finally:
        await old.close()
