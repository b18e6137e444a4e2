"""`fusee list` and `fusee result`, read from a store an engine writes."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import cli_workflows as wfs
import pytest

import fusee
from fusee.record import Start, encode
from fusee.store import Entry, RunRow, SqliteStore

from .conftest import acli, cli, engine_on, one_line_error


@pytest.mark.asyncio
async def test_list_shows_runs_and_filters_them_while_the_engine_writes(tmp_path: Path) -> None:
    async with engine_on(tmp_path) as engine:
        await engine.execute(wfs.greet, "g-ana", "ana")
        await engine.execute(wfs.greet, "g-bo", "bo")
        await engine.start(wfs.gated, "gated-1", wfs.Order("o1", 5))

        code, out, _ = await acli("list", "--data", str(tmp_path))
        assert code == 0
        assert "g-ana" in out
        assert "g-bo" in out
        assert "gated-1" in out
        assert "completed" in out

        code, out, _ = await acli("list", "--data", str(tmp_path), "--attr", "customer=ana")
        assert "g-ana" in out
        assert "g-bo" not in out

        code, out, _ = await acli("--data", str(tmp_path), "list", "--json", "--workflow", "greet")
        rows = json.loads(out)
        # Newest first.
        assert [r["id"] for r in rows] == ["g-bo", "g-ana"]
        assert rows[1]["status"] == "completed"
        assert rows[1]["attributes"] == {"customer": "ana"}
        assert rows[1]["finished_at"] is not None

        code, out, _ = await acli(
            "list", "--data", str(tmp_path), "--json", "--status", "completed"
        )
        assert {r["id"] for r in json.loads(out)} == {"g-ana", "g-bo"}
        code, out, _ = await acli("list", "--data", str(tmp_path), "--json", "--limit", "1")
        assert len(json.loads(out)) == 1
        code, out, _ = await acli("list", "--data", str(tmp_path), "--attr", "amount=5", "--json")
        assert [r["id"] for r in json.loads(out)] == ["gated-1"]
        code, out, _ = await acli("list", "--data", str(tmp_path), "--workflow", "nope")
        assert code == 0
        assert "no runs match" in out


@pytest.mark.asyncio
async def test_result_prints_the_result_or_the_error(tmp_path: Path) -> None:
    async with engine_on(tmp_path) as engine:
        await engine.execute(wfs.greet, "g-1", "ana")
        with pytest.raises(fusee.WorkflowFailed):
            await engine.execute(wfs.boom, "b-1")
        run = await engine.start(wfs.gated, "c-1", wfs.Order("o1", 5))
        await run.cancel("changed my mind")
        with pytest.raises(fusee.Cancelled):
            await run.result()
        await engine.start(wfs.gated, "w-1", wfs.Order("o2", 5))

        code, out, _ = await acli("result", "g-1", "--data", str(tmp_path))
        assert (code, json.loads(out)) == (0, "hello ana")
        code, out, _ = await acli("result", "g-1", "--data", str(tmp_path), "--json")
        assert json.loads(out) == {
            "id": "g-1",
            "run": 1,
            "status": "completed",
            "result": "hello ana",
        }

        code, out, err = await acli("result", "b-1", "--data", str(tmp_path))
        assert code == 1
        assert "failed: KeyError: 'sku'" in one_line_error(err)
        code, out, _ = await acli("result", "b-1", "--data", str(tmp_path), "--json")
        assert code == 1
        assert json.loads(out)["error"]["type"] == "KeyError"

        code, _, err = await acli("result", "c-1", "--data", str(tmp_path))
        assert code == 1
        assert "cancelled: Cancelled: changed my mind" in one_line_error(err)

        code, _, err = await acli("result", "w-1", "--data", str(tmp_path))
        assert code == 1
        assert "pass --wait" in one_line_error(err)
        code, _, err = await acli(
            "result", "w-1", "--wait", "--timeout", "0.2", "--data", str(tmp_path)
        )
        assert code == 1
        assert "did not finish within 0.2s" in one_line_error(err)


@pytest.mark.asyncio
async def test_result_wait_returns_once_the_run_finishes(tmp_path: Path) -> None:
    async with engine_on(tmp_path) as engine:
        run = await engine.start(wfs.gated, "w-1", wfs.Order("o2", 5))
        argv = ["result", "w-1", "--wait", "--timeout", "30", "--data", str(tmp_path)]
        waiter = asyncio.create_task(acli(*argv))
        await run.signal(wfs.go, False)
        code, out, _ = await asyncio.wait_for(waiter, 30)
    assert (code, json.loads(out)) == (0, "rejected")


async def _rows_started_at(data: Path, started_ms: dict[str, int]) -> None:
    """A store whose runs started at the given times (and nothing else in their journals)."""
    store = SqliteStore(data, durability="none")
    await store.open()
    try:
        for lsn, (id, ms) in enumerate(started_ms.items(), start=1):
            start = Start(run=lsn, id=id, wtype="greet", started_ms=ms)
            await store.append(
                [Entry(lsn, id, lsn, encode(start))], [RunRow(id, lsn, "greet", "running", ms)]
            )
    finally:
        await store.close()


def test_list_limit_shows_the_newest_runs_first(tmp_path: Path) -> None:
    day_ms = 86_400_000
    asyncio.run(
        _rows_started_at(tmp_path, {"old": 1 * day_ms, "mid": 2 * day_ms, "new": 3 * day_ms})
    )
    code, out, _ = cli("list", "--limit", "2", "--json", "--data", str(tmp_path))
    assert code == 0
    assert [r["id"] for r in json.loads(out)] == ["new", "mid"]
    code, out, _ = cli("list", "--limit", "1", "--data", str(tmp_path))
    assert "new" in out
    assert "old" not in out
    assert "mid" not in out


@pytest.mark.parametrize(
    ("bounds", "ids"),
    [
        pytest.param(["--since", "1970-01-02T12:00:00+00:00"], ["now", "new", "mid"], id="since"),
        pytest.param(
            ["--until", "1970-01-03T00:00:00+00:00"], ["mid", "old"], id="until-inclusive"
        ),
        pytest.param(
            ["--since", "1970-01-02T12:00Z", "--until", "1970-01-03T12:00Z"], ["mid"], id="both"
        ),
        pytest.param(["--since", "1h"], ["now"], id="duration-ago"),
    ],
)
def test_list_since_and_until_bound_the_start_time(
    tmp_path: Path, bounds: list[str], ids: list[str]
) -> None:
    day_ms = 86_400_000
    now_ms = int(time.time() * 1000)
    runs = {"old": 1 * day_ms, "mid": 2 * day_ms, "new": 3 * day_ms, "now": now_ms}
    asyncio.run(_rows_started_at(tmp_path, runs))
    code, out, err = cli("list", *bounds, "--json", "--data", str(tmp_path))
    assert code == 0, err
    assert [r["id"] for r in json.loads(out)] == ids


def test_list_refuses_a_time_bound_it_cannot_read(tmp_path: Path) -> None:
    asyncio.run(_rows_started_at(tmp_path, {"a": 1}))
    code, _, err = cli("list", "--since", "yesterday-ish", "--data", str(tmp_path))
    assert code == 1
    assert "--since takes an ISO 8601 date" in one_line_error(err)


@pytest.mark.asyncio
async def test_fork_starts_a_new_run_from_a_journal_before_a_position(tmp_path: Path) -> None:
    data = str(tmp_path)
    async with engine_on(tmp_path) as engine:
        assert await engine.execute(wfs.greet, "g-1", "ana") == "hello ana"
        code, out, err = await acli(
            "fork", "g-1", "g-2", "--at", "1", "--input", '"bo"', "--data", data
        )
        assert (code, out.strip()) == (0, "run 'g-1' forked as 'g-2'"), err
        # The greet step (position 1) runs again, on the new input.
        assert await engine.get("g-2").result() == "hello bo"
        code, _, err = await acli("fork", "g-1", "g-3", "--at", "greet", "--data", data)
        assert code == 0, err
        assert await engine.get("g-3").result() == "hello ana"
        for argv, message in [
            (("g-1", "g-4", "--at", "7"), "positions 0..2"),
            (("g-1", "g-4", "--at", "nope"), "no operation named 'nope'"),
            (("g-1", "g-2", "--at", "0"), "run 'g-2' exists"),
            (("nobody", "g-4", "--at", "0"), "nobody"),
        ]:
            code, _, err = await acli("fork", *argv, "--data", data)
            assert code == 1
            assert message in one_line_error(err)
        assert await engine.store.get("g-4") is None


@pytest.mark.asyncio
async def test_list_at_80_columns_shows_every_status_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    async with engine_on(tmp_path) as engine:
        for n in range(3):
            await engine.execute(wfs.greet, f"greet-customer-{n}-of-the-spring-sale", "ana")
        waiting = await engine.start(wfs.gated, "order-2026-12-03-0001", wfs.Order("o1", 5))
        await waiting.signal(wfs.go, True)
        await waiting.result()
        cancelled = await engine.start(wfs.gated, "order-2026-12-03-0002", wfs.Order("o2", 7))
        await cancelled.cancel("out of stock")
        with pytest.raises(fusee.Cancelled):
            await cancelled.result()
    code, out, err = await acli("list", "--data", str(tmp_path))
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out, out
    words = out.split()
    assert words.count("completed") == 5  # three greets, an order and its child
    assert words.count("cancelled") == 1
