"""The page's actions go to the serving worker through a Client (`fusee ui`)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import httpx2
import pytest

import fusee
from fusee.cli import main
from fusee.record import Signal, decode
from fusee.remote import KEEP_INPUT
from fusee.ui import create_app
from fusee.ui._actions import ClientActions

from .conftest import served

go = fusee.signal("go", int)


@fusee.workflow("ui-waiter")
async def waiter(ctx: fusee.Ctx) -> int:
    got = await ctx.wait_for(go)
    return got or 0


@fusee.workflow("ui-flaky")
async def flaky(ctx: fusee.Ctx) -> str:
    def boom() -> str:
        raise RuntimeError("down")

    try:
        await ctx.wait_for(go, timeout="1h")
    except fusee.Cancelled:
        return "cancelled"
    return await ctx.step("boom", boom, retry=fusee.Retry(attempts=1))


def counting(name: str) -> fusee.WorkflowDef[None, Any]:
    """A workflow made by a factory: its signal lives in the closure, so only its wait knows
    the signal's type."""
    count = fusee.signal(f"{name}-count", int)

    @fusee.workflow(name)
    async def flow(ctx: fusee.Ctx) -> Any:
        return await ctx.wait_for(count)

    return flow


counter = counting("ui-counter")


@pytest.mark.asyncio
async def test_a_signal_from_the_page_that_does_not_fit_is_refused_or_set_aside(
    tmp_path: Path,
) -> None:
    async with await fusee.Engine.open(
        tmp_path, workflows=[waiter, counter], durability="none"
    ) as engine:
        waiting = await engine.start(waiter, "w-1")
        counting_run = await engine.start(counter, "c-1")
        app = create_app(str(tmp_path), actions=ClientActions(str(tmp_path)))
        with served(app) as url:
            async with httpx2.AsyncClient(base_url=url, timeout=30) as http:
                # The engine knows `go` (its workflow's module defines it).
                bad = await http.post("/api/runs/w-1/signal", json={"name": "go", "payload": "5"})
                assert bad.status_code == 422
                assert "does not fit the signal's type int" in bad.json()["error"]
                ok = await http.post("/api/runs/w-1/signal", json={"name": "go", "payload": 5})
                assert ok.status_code == 200
                assert await waiting.result() == 5
                # Nobody but the wait knows `ui-counter-count`: set aside there.
                for payload in ("five", 5):
                    sent = await http.post(
                        "/api/runs/c-1/signal",
                        json={"name": "ui-counter-count", "payload": payload},
                    )
                    assert sent.status_code == 200
                assert await counting_run.result() == 5
                page = (await http.get("/api/runs/c-1")).json()
        assert [(s["payload"], s["set_aside"], s["consumed_by"]) for s in page["signals"]] == [
            ("five", True, None),
            (5, False, 0),
        ]


@pytest.mark.asyncio
async def test_signal_cancel_and_resume_from_the_page_reach_the_run(tmp_path: Path) -> None:
    async with await fusee.Engine.open(
        tmp_path, workflows=[waiter, flaky], durability="none"
    ) as engine:
        signalled = await engine.start(waiter, "w-1")
        cancelled = await engine.start(flaky, "f-1")
        actions = ClientActions(str(tmp_path))
        try:
            await actions.signal("w-1", "go", 5)
            assert await signalled.result() == 5
            await actions.cancel("f-1", "from the page")
            assert await cancelled.result() == "cancelled"
            with pytest.raises(fusee.NotFound):
                await actions.cancel("nobody", "x")
            # A fork at the wait: the copy is the start alone; it waits anew.
            await actions.fork("w-1", "w-2", 0, KEEP_INPUT)
            await actions.signal("w-2", "go", 7)
            assert await engine.get("w-2").result() == 7
        finally:
            await actions.close()


def test_fusee_ui_refuses_another_address_without_a_token(tmp_path: Path) -> None:
    async def make() -> None:
        async with await fusee.Engine.open(tmp_path, workflows=[waiter], durability="none"):
            pass

    asyncio.run(make())
    out, err = io.StringIO(), io.StringIO()
    code = main(["ui", "--data", str(tmp_path), "--host", "0.0.0.0"], stdout=out, stderr=err)
    assert code == 1
    assert "token" in err.getvalue()


@pytest.mark.asyncio
async def test_a_signal_to_a_finished_run_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    async with await fusee.Engine.open(tmp_path, workflows=[waiter], durability="none") as engine:
        run = await engine.start(waiter, "w-1")
        await run.signal(go, 5)
        assert await run.result() == 5
        app = create_app(str(tmp_path), actions=ClientActions(str(tmp_path)))
        with served(app) as url:
            async with httpx2.AsyncClient(timeout=30) as http:
                r = await http.post(f"{url}/api/runs/w-1/signal", json={"name": "go", "payload": 6})
                cancel = await http.post(f"{url}/api/runs/w-1/cancel", json={})
        records = [decode(data) for _, data in await engine.store.load("w-1")]
    assert r.status_code == 409, r.text
    assert "has finished (completed)" in r.json()["error"], r.json()
    assert cancel.status_code == 409, cancel.text
    # Nothing was recorded: the run's one signal is the one it took.
    assert len([r for r in records if isinstance(r, Signal)]) == 1
