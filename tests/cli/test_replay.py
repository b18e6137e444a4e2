"""`fusee replay`: journals replayed against changed code."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import cli_workflows as wfs

import fusee
from fusee.cli._modules import import_module
from fusee.record import Record, Timer, Wait, decode
from fusee.remote._versions import derived_version

from .conftest import MODULE, cli, engine_on

V1 = """
import fusee

@fusee.workflow("order")
async def order(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("reserve", lambda: n)
    await ctx.sleep("wait", "1h")
    return a
"""

# The new code takes the old code's runs over (versioning="auto"): its replay must pass.
V2 = """
import fusee

@fusee.workflow("order", versioning="auto")
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
    assert "1 finished run(s) not replayed" in out
    assert "g-1" not in out
    code, out, _ = cli("replay", str(v1), "--all", "--data", str(data))
    assert code == 0, out
    assert "skipped" in out
    assert "g-1 (run 1, greet, completed)" in out

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
    assert {r["id"]: r["outcome"] for r in report["runs"]} == {"o-1": "unknown workflow"}
    assert report["not_replayed"] == 1
    code, out, _ = cli("replay", MODULE, "--data", str(data), "--json", "--all")
    report = json.loads(out)
    assert code == 1
    assert {r["id"]: r["outcome"] for r in report["runs"]} == {
        "g-1": "ok",
        "o-1": "unknown workflow",
    }
    assert report["not_replayed"] == 0


WAIT_V1 = """
import fusee

go = fusee.signal("go", bool)

@fusee.workflow("order")
async def order(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("reserve", lambda: n)
    await ctx.wait_for(go)
    return await ctx.step("ship", lambda: a)
"""

# After the wait, another step: a finished run diverges, a waiting one does not.
WAIT_V2 = WAIT_V1.replace('"ship"', '"charge"').replace(
    '@fusee.workflow("order")', '@fusee.workflow("order", versioning="auto")'
)
# The same change to a pinned workflow: its runs stay on the version they started on.
WAIT_PINNED_V2 = WAIT_V1.replace('"ship"', '"charge"')


def _finished_and_waiting(tmp_path: Path) -> tuple[Path, Path]:
    """A store with run 'o-done' (finished under WAIT_V1) and 'o-open' (waiting); WAIT_V2's file."""
    v1, v2 = tmp_path / "wait_v1.py", tmp_path / "wait_v2.py"
    v1.write_text(WAIT_V1)
    v2.write_text(WAIT_V2)
    data = tmp_path / "data"

    async def make() -> None:
        mod = _load(v1)
        async with await fusee.Engine.open(
            data, workflows=[mod.order], durability="none"
        ) as engine:
            done = await engine.start(mod.order, "o-done", 1)
            await done.signal(mod.go, True)
            assert await done.result() == 1
            await engine.start(mod.order, "o-open", 2)
            await _until(engine, "o-open", Wait)

    asyncio.run(make())
    return data, v2


def test_replay_counts_only_unfinished_runs_by_default(tmp_path: Path) -> None:
    data, v2 = _finished_and_waiting(tmp_path)
    code, out, _ = cli("replay", str(v2), "--data", str(data), "--json")
    report = json.loads(out)
    assert code == 0, out
    assert [(r["id"], r["outcome"]) for r in report["runs"]] == [("o-open", "ok")]
    assert report["runs"][0]["status"] in ("running", "suspended")
    assert (report["problems"], report["not_replayed"]) == (0, 1)

    code, out, _ = cli("replay", str(v2), "--data", str(data))
    assert code == 0, out
    assert "o-done" not in out
    assert "1 unfinished run(s) replayed against the code: no divergence" in out


def test_replay_all_replays_finished_runs_and_shows_each_status(tmp_path: Path) -> None:
    data, v2 = _finished_and_waiting(tmp_path)
    code, out, _ = cli("replay", str(v2), "--all", "--data", str(data))
    assert code == 1
    (done_line,) = [ln for ln in out.splitlines() if "o-done" in ln]
    assert "diverged" in done_line
    assert "(run 1, order, completed)" in done_line
    (open_line,) = [ln for ln in out.splitlines() if "o-open" in ln]
    assert open_line.split()[0] == "ok"
    assert "running" in open_line or "suspended" in open_line
    assert "2 run(s) replayed: 1 problem(s)" in out


def test_replay_skips_a_run_pinned_to_another_version_unless_the_code_deploys_as_it(
    tmp_path: Path,
) -> None:
    data, _ = _finished_and_waiting(tmp_path)
    pinned = tmp_path / "wait_pinned_v2.py"
    pinned.write_text(WAIT_PINNED_V2)
    code, out, _ = cli("replay", str(pinned), "--data", str(data), "--json")
    assert code == 0, out
    (run,) = json.loads(out)["runs"]
    assert (run["id"], run["outcome"]) == ("o-open", "skipped")
    assert run["message"].startswith("pinned to version ")
    started_on = derived_version([_load(tmp_path / "wait_v1.py").order])
    code, out, _ = cli(
        "replay", str(pinned), "--data", str(data), "--json", "--version", started_on
    )
    assert code == 0, out
    assert [(r["id"], r["outcome"]) for r in json.loads(out)["runs"]] == [("o-open", "ok")]


def _load(path: Path) -> Any:
    return import_module(str(path))


async def _until_timer(engine: fusee.Engine, id: str) -> None:
    await _until(engine, id, Timer)


async def _until(engine: fusee.Engine, id: str, kind: type[Record]) -> None:
    """Waits until run ``id``'s journal holds a record of ``kind``."""
    while not any(isinstance(decode(d), kind) for _, d in await engine.store.load(id)):
        await asyncio.sleep(0.01)
