"""`fusee replay`: journals replayed against changed code."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import cli_workflows as wfs

import fusee
from fusee.cli._modules import import_module

from .conftest import MODULE, cli, engine_on

V1 = """
import fusee

@fusee.workflow("order")
async def order(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("reserve", lambda: n)
    await ctx.sleep("wait", "1h")
    return a
"""

V2 = """
import fusee

@fusee.workflow("order")
async def order(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("reserve", lambda: n)
    b = await ctx.step("charge", lambda: n)
    await ctx.sleep("wait", "1h")
    return a + b
"""


def test_replay_lists_each_divergence_with_its_position_and_line(tmp_path: Path) -> None:
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    v1, v2 = tmp_path / "v1" / "order_v1.py", tmp_path / "v2" / "order_v2.py"
    v1.write_text(V1)
    v2.write_text(V2)
    data = tmp_path / "data"

    async def make() -> None:
        async with engine_on(data) as engine:
            await engine.execute(wfs.greet, "g-1", "ana")
        order = _load(v1).order
        async with await fusee.Engine.open(data, workflows=[order], durability="none") as engine:
            await engine.start(order, "o-1", 1)
            await _until_timer(engine, "o-1")

    asyncio.run(make())
    code, out, _ = cli("replay", str(v1), "--data", str(data))
    assert code == 0, out
    assert "ok" in out
    assert "skipped" in out

    code, out, _ = cli("replay", str(v2), "--data", str(data))
    assert code == 1
    assert "diverged" in out
    assert "o-1" in out
    assert "journal position 1" in out
    assert f"{v2}:7" in out.replace("\n", "")

    code, out, _ = cli("replay", str(v2), "--data", str(data), "--json", "--id", "o-1")
    report = json.loads(out)
    assert report["problems"] == 1
    (o1,) = report["runs"]
    assert (o1["id"], o1["outcome"], o1["seq"]) == ("o-1", "diverged", 1)
    assert o1["location"] == f"{v2}:7"
    assert "step 'charge'" in o1["message"] or "step 'reserve'" in o1["message"]

    code, out, _ = cli("replay", MODULE, "--data", str(data), "--json")
    report = json.loads(out)
    assert code == 1  # o-1's workflow 'order' is unknown to that module, and o-1 is unfinished
    assert {r["id"]: r["outcome"] for r in report["runs"]} == {
        "g-1": "ok",
        "o-1": "unknown workflow",
    }


def _load(path: Path) -> Any:
    return import_module(str(path))


async def _until_timer(engine: fusee.Engine, id: str) -> None:
    from fusee.record import Timer, decode

    while not any(isinstance(decode(d), Timer) for _, d in await engine.store.load(id)):
        await asyncio.sleep(0.01)
