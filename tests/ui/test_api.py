"""The UI's JSON API and event streams, against stores of real runs on SQLite."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx2
import pytest
from starlette.testclient import TestClient

import fusee
from fusee._schedule import run_id
from fusee.remote import KEEP_INPUT
from fusee.ui import create_app, serve
from fusee.ui._timeline import iso

from .conftest import served
from .workflows import (
    GREETED,
    WORKFLOWS,
    add_bug_paused,
    add_greets,
    add_schedules,
    cancel_waiting,
    make_store,
    release,
    run_updated,
    start_waiting,
)

ALL_IDS = {*GREETED, "order-1", "ship-o1", "flaky-1", "boom-1"}


@pytest.fixture(scope="module")
def client(data: Path) -> Iterator[TestClient]:
    with TestClient(create_app(str(data)), base_url="http://127.0.0.1:8700") as c:
        yield c


def runs(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    r = client.get("/api/runs", params={"limit": 500, **params})
    assert r.status_code == 200, r.text
    page = r.json()
    assert page["next"] is None
    rows: list[dict[str, Any]] = page["runs"]
    return rows


def newest_first(rows: list[dict[str, Any]]) -> bool:
    keys = [(r["started_ms"], r["id"]) for r in rows]
    return keys == sorted(keys, reverse=True)


# --- listing -------------------------------------------------------------------------------------


def test_the_list_has_every_run_newest_first(client: TestClient) -> None:
    rows = runs(client)
    assert {r["id"] for r in rows} == ALL_IDS
    assert len(rows) == len(ALL_IDS)
    assert newest_first(rows)
    order = next(r for r in rows if r["id"] == "order-1")
    assert order["workflow"] == "gated"
    assert order["status"] == "completed"
    assert order["attributes"] == {"customer": "ada", "amount": 42}
    assert order["started_at"].endswith("+00:00")


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param({"status": "paused"}, {"flaky-1"}, id="status"),
        pytest.param({"status": "failed"}, {"boom-1"}, id="failed"),
        pytest.param({"workflow": "gated"}, {"order-1"}, id="workflow"),
        pytest.param({"attr": "customer=bo"}, set(GREETED[1::2]), id="attribute"),
        pytest.param({"attr": "amount=42"}, {"order-1"}, id="attribute-as-json"),
        pytest.param(
            {"workflow": "greet", "status": "completed"}, set(GREETED), id="workflow-and-status"
        ),
        pytest.param({"workflow": "nobody"}, set(), id="no-match"),
        pytest.param({"children": "0"}, ALL_IDS - {"ship-o1"}, id="top-level-only"),
        pytest.param({"children": "1"}, ALL_IDS, id="children-too"),
        pytest.param({"children": "0", "workflow": "ship"}, set(), id="a-child-workflow"),
    ],
)
def test_filters_narrow_the_list(
    client: TestClient, params: dict[str, str], expected: set[str]
) -> None:
    rows = runs(client, **params)
    assert {r["id"] for r in rows} == expected
    assert newest_first(rows)


def test_a_time_range_keeps_the_runs_started_within_it(client: TestClient) -> None:
    every = runs(client)
    by_id = {r["id"]: r for r in every}
    since, until = by_id["g-05"]["started_ms"], by_id["g-15"]["started_ms"]
    expected = {r["id"] for r in every if since <= r["started_ms"] <= until}
    assert {f"g-{n:02d}" for n in range(5, 16)} <= expected
    assert {r["id"] for r in runs(client, since=since, until=until)} == expected
    # ISO 8601 works as well as milliseconds.
    iso = by_id["g-05"]["started_at"]
    assert {r["id"] for r in runs(client, since=iso, until=until)} == expected


@pytest.mark.parametrize("limit", [pytest.param(1, id="one"), pytest.param(4, id="four")])
def test_pages_cover_the_list_without_duplicates_or_gaps(client: TestClient, limit: int) -> None:
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": limit}
        if after is not None:
            params["after"] = after
        page = client.get("/api/runs", params=params).json()
        assert len(page["runs"]) <= limit
        seen += [r["id"] for r in page["runs"]]
        pages += 1
        after = page["next"]
        if after is None:
            break
        assert len(page["runs"]) == limit
    assert seen == [r["id"] for r in runs(client)]
    assert pages == -(-len(ALL_IDS) // limit)


def test_pages_of_top_level_runs_skip_the_children_without_gaps(client: TestClient) -> None:
    seen: list[str] = []
    after = None
    while True:
        params: dict[str, Any] = {"limit": 1, "children": "0"}
        if after is not None:
            params["after"] = after
        page = client.get("/api/runs", params=params).json()
        seen += [r["id"] for r in page["runs"]]
        after = page["next"]
        if after is None:
            break
    assert seen == [r["id"] for r in runs(client) if r["parent"] is None]
    assert "ship-o1" not in seen


def test_pages_of_a_filter_stay_within_it(client: TestClient) -> None:
    first = client.get("/api/runs", params={"attr": "customer=ana", "limit": 5}).json()
    second = client.get(
        "/api/runs", params={"attr": "customer=ana", "limit": 5, "after": first["next"]}
    ).json()
    ids = [r["id"] for r in first["runs"] + second["runs"]]
    assert ids == [r["id"] for r in runs(client, attr="customer=ana")][:10]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"status": "nope"}, "is not a status", id="status"),
        pytest.param({"limit": "0"}, "from 1 to 500", id="limit"),
        pytest.param({"limit": "many"}, "from 1 to 500", id="limit-text"),
        pytest.param({"after": "not-a-cursor"}, "is not a cursor", id="cursor"),
        pytest.param({"since": "yesterday"}, "is not a time", id="time"),
        pytest.param({"attr": "customer"}, "KEY=VALUE", id="attribute"),
        pytest.param({"children": "no"}, "pass 1 to list child runs too", id="children"),
    ],
)
def test_bad_parameters_are_refused_with_a_message(
    client: TestClient, params: dict[str, str], message: str
) -> None:
    r = client.get("/api/runs", params=params)
    assert r.status_code == 400
    assert message in r.json()["error"]


# --- a run ---------------------------------------------------------------------------------------


def test_a_runs_timeline_has_its_steps_retries_timer_signal_and_child(client: TestClient) -> None:
    r = client.get("/api/runs/order-1")
    assert r.status_code == 200
    run = r.json()
    assert run["run"]["status"] == "completed"
    assert run["start"]["input"] == {"id": "o1", "amount": 42}
    assert run["outcome"]["status"] == "completed"
    assert run["outcome"]["result"] == "shipped FR-o1"
    ops = {op["seq"]: op for op in run["operations"]}
    assert [(op["kind"], op["name"]) for op in run["operations"]] == [
        ("attributes", "set_attributes"),
        ("step", "charge"),
        ("timer", "cool-off"),
        ("wait", "go"),
        ("child", "ship"),
    ]
    charge = ops[1]
    assert charge["status"] == "ok"
    assert charge["result"] == 42
    first, second = charge["attempts"]
    assert first["status"] == "failed"
    assert first["error"] == {"type": "ConnectionError", "message": "card network unreachable"}
    assert first["retry_at_ms"] >= run["run"]["started_ms"]
    assert second["status"] == "ok"
    assert second["due_ms"] == first["retry_at_ms"]
    timer = ops[2]
    assert timer["status"] == "fired"
    assert timer["fire_at_ms"] >= first["retry_at_ms"]
    wait = ops[3]
    assert (wait["status"], wait["result"]) == ("signalled", True)
    assert run["signals"] == [
        {
            "key": 0,
            "ordinal": 0,
            "lsn": run["signals"][0]["lsn"],
            "name": "go",
            "payload": True,
            "by": None,
            "consumed_by": 3,
            "handled": False,
            "set_aside": False,
        }
    ]
    child = ops[4]
    assert child["child"] == {"id": "ship-o1", "workflow": "ship", "detached": False}
    assert (child["status"], child["result"]) == ("ok", "FR-o1")
    assert [(n["id"], n["status"]) for n in run["children"]] == [("ship-o1", "completed")]
    [stream] = run["streams"]
    assert (stream["name"], stream["chunks"], stream["status"]) == ("log", 1, "ok")
    assert stream["tail"] == [{"offset": 0, "payload": "shipped FR-o1"}]
    # The times the records carry, in log order and never going back.
    anchors = run["anchors"]
    assert anchors[0] == [run["start"]["lsn"], run["run"]["started_ms"]]
    assert anchors[-1] == [run["outcome"]["lsn"], run["run"]["finished_ms"]]
    assert anchors == sorted(anchors)
    assert run["divergence"] is None


def test_a_cancelled_runs_wait_ends_cancelled_at_the_runs_end(tmp_path: Path) -> None:
    data = make_store(tmp_path)
    cancel_waiting(data, "order-9", "out of stock")
    with TestClient(create_app(str(data)), base_url="http://127.0.0.1") as c:
        run = c.get("/api/runs/order-9").json()
    assert run["outcome"]["status"] == "cancelled"
    assert run["outcome"]["error"]["message"] == "out of stock"
    wait = run["operations"][-1]
    assert (wait["kind"], wait["name"]) == ("wait", "go")
    assert wait["status"] == "cancelled"
    assert wait["end_lsn"] == run["outcome"]["lsn"]
    assert [op["status"] for op in run["operations"][:-1]] == ["set", "ok", "fired"]


def test_every_position_has_a_row_an_updates_too(tmp_path: Path) -> None:
    data = make_store(tmp_path)
    run_updated(data, "tally-1")
    with TestClient(create_app(str(data)), base_url="http://127.0.0.1") as c:
        run = c.get("/api/runs/tally-1").json()
    seqs = [op["seq"] for op in run["operations"]]
    assert seqs == list(range(len(seqs)))
    assert run["gaps"] == []
    [update] = run["updates"]
    row = next(op for op in run["operations"] if op["kind"] == "update")
    assert (row["name"], row["status"], row["result"], row["seq"]) == (
        "bump",
        "ok",
        3,
        update["seq"],
    )
    # The row spans the handler: from the update's arrival to its return.
    assert (row["first_lsn"], row["end_lsn"]) == (update["lsn"], update["done_lsn"])
    assert [op["name"] for op in run["operations"] if op["kind"] == "step"] == [
        "open",
        "add",
        "close",
    ]


def test_a_paused_run_shows_the_attempt_that_ran_out(client: TestClient) -> None:
    run = client.get("/api/runs/flaky-1").json()
    [op] = run["operations"]
    assert (op["name"], op["status"]) == ("call", "paused")
    [attempt] = op["attempts"]
    assert attempt["paused"] is True
    assert attempt["retry_at_ms"] is None
    assert attempt["error"]["message"] == "still down"
    assert run["outcome"] is None


def test_a_failed_run_shows_its_error(client: TestClient) -> None:
    run = client.get("/api/runs/boom-1").json()
    assert run["outcome"]["status"] == "failed"
    assert run["outcome"]["error"]["type"] == "KeyError"
    assert "sku" in run["outcome"]["error"]["message"]


def test_a_run_a_bug_paused_shows_the_traceback_its_row_keeps(tmp_path: Path) -> None:
    add_bug_paused(tmp_path, "bug-1")
    with TestClient(create_app(str(tmp_path)), base_url="http://127.0.0.1") as c:
        run = c.get("/api/runs/bug-1").json()
        listed = c.get("/api/runs", params={"status": "paused"}).json()["runs"]
    assert run["run"]["status"] == "paused"
    error = run["run"]["error"]
    assert error.startswith("Traceback (most recent call last):")
    assert error.rstrip().endswith("KeyError: 'sku'")
    assert run["outcome"] is None
    assert {r["id"]: r["error"] for r in listed}["bug-1"] == error


def test_a_child_names_its_parent(client: TestClient) -> None:
    run = client.get("/api/runs/ship-o1").json()
    assert run["run"]["parent"] == "order-1"
    assert run["start"]["parent"]["id"] == "order-1"
    assert run["start"]["parent"]["seq"] == 4


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/api/runs/nobody", id="run"),
        pytest.param("/api/runs/nobody/events", id="events"),
        pytest.param("/api/runs/order-1?run=999999", id="run-number"),
    ],
)
def test_an_unknown_run_is_404(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404
    assert "no run" in r.json()["error"] or "no records" in r.json()["error"]


def test_the_pages_and_their_files_are_served(client: TestClient) -> None:
    for path in ("/", "/runs/order-1"):
        r = client.get(path)
        assert r.status_code == 200
        assert '<script src="/static/app.js"' in r.text
    assert "EventSource" in client.get("/static/app.js").text
    assert client.get("/static/app.css").status_code == 200
    info = client.get("/api/info").json()
    assert info["actions"] == []
    assert "paused" in info["statuses"]


# --- security ------------------------------------------------------------------------------------


@pytest.fixture
def guarded(data: Path) -> Iterator[TestClient]:
    app = create_app(str(data), token="s3cret")
    with TestClient(app, base_url="http://ops.example:8700", follow_redirects=False) as c:
        yield c


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/", id="page"),
        pytest.param("/api/runs", id="api"),
        pytest.param("/api/runs/events", id="events"),
        pytest.param("/static/app.js", id="file"),
    ],
)
@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-token"),
        pytest.param({"Authorization": "Bearer wrong"}, id="wrong-token"),
        pytest.param({"Authorization": "s3cret"}, id="not-bearer"),
        pytest.param({"Cookie": "fusee_token=wrong"}, id="wrong-cookie"),
    ],
)
def test_with_a_token_a_request_without_it_is_401(
    guarded: TestClient, path: str, headers: dict[str, str]
) -> None:
    r = guarded.get(path, headers=headers)
    assert r.status_code == 401
    assert "token" in r.json()["error"]
    assert r.headers["www-authenticate"] == "Bearer"


def test_with_a_token_the_bearer_header_lets_a_request_in(guarded: TestClient) -> None:
    r = guarded.get("/api/runs", headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 200
    assert {x["id"] for x in r.json()["runs"]} <= ALL_IDS


def test_a_page_loaded_with_the_token_sets_a_cookie_and_drops_it_from_the_address(
    guarded: TestClient,
) -> None:
    r = guarded.get("/runs/order-1", params={"token": "s3cret", "run": "1"})
    assert r.status_code == 303
    assert r.headers["location"] == "/runs/order-1?run=1"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith("fusee_token=s3cret;")
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    for path in ("/runs/order-1", "/api/runs/order-1"):
        ok = guarded.get(path, headers={"Cookie": "fusee_token=s3cret"})
        assert ok.status_code == 200


def test_the_api_does_not_take_the_token_in_its_address(guarded: TestClient) -> None:
    assert guarded.get("/api/runs", params={"token": "s3cret"}).status_code == 401


def test_without_a_token_only_loopback_host_names_are_served(data: Path) -> None:
    with TestClient(create_app(str(data)), base_url="http://evil.example") as c:
        r = c.get("/api/runs")
        assert r.status_code == 403
        assert "--token" in r.json()["error"]
    for host in ("localhost:8700", "127.0.0.1", "[::1]:8700"):
        with TestClient(create_app(str(data)), base_url=f"http://{host}") as c:
            assert c.get("/api/info").status_code == 200, host


@pytest.mark.parametrize(
    "host", [pytest.param("0.0.0.0", id="any"), pytest.param("192.0.2.7", id="other")]
)
def test_serve_refuses_another_address_without_a_token(host: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="token"):
        serve(str(tmp_path), host=host)


def test_serve_says_when_there_is_no_store(tmp_path: Path) -> None:
    with pytest.raises(fusee.StoreError):
        serve(str(tmp_path / "none"), port=0)


# --- actions -------------------------------------------------------------------------------------


class Recorder:
    """Actions that keep what they are asked to do, and refuse an unknown run."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def _check(self, id: str) -> None:
        if id == "nobody":
            raise fusee.NotFound(f"no run {id!r}")

    async def signal(self, id: str, name: str, payload: Any) -> None:
        self._check(id)
        if name == "typed" and not isinstance(payload, bool):
            raise fusee.PayloadError("signal 'typed' takes a bool")
        self.calls.append(("signal", id, name, payload))

    async def cancel(self, id: str, reason: str) -> None:
        self._check(id)
        self.calls.append(("cancel", id, reason))

    async def resume(self, id: str) -> None:
        self._check(id)
        self.calls.append(("resume", id))

    async def fork(self, id: str, new_id: str, at: int | str, input: Any) -> None:
        self._check(id)
        if at == 99:
            raise ValueError("run has positions 0..3; 99 is not one of them")
        if new_id == "taken":
            raise fusee.AlreadyExists("run 'taken' exists")
        self.calls.append(("fork", id, new_id, at, input))

    async def schedule(
        self, name: str, action: str, fields: Mapping[str, Any] | None = None
    ) -> str | None:
        if name == "nobody":
            raise fusee.NotFound(f"no schedule {name!r}")
        self.calls.append(("schedule", name, action, *([dict(fields)] if fields else [])))
        return f"{name}/now" if action == "trigger" else None

    async def bulk(
        self, verb: str, filters: Mapping[str, Any], *, reason: str, dry_run: bool
    ) -> fusee.BulkResult:
        self.calls.append(("bulk", verb, dict(filters), reason, dry_run))
        return fusee.BulkResult(("order-1",), {"order-2": "it ended meanwhile"})


def test_actions_reach_the_actions_object(data: Path) -> None:
    actions = Recorder()
    app = create_app(str(data), actions=actions)
    with TestClient(app, base_url="http://127.0.0.1") as c:
        assert c.get("/api/info").json()["actions"] == [
            "signal",
            "cancel",
            "resume",
            "fork",
            "schedule",
            "bulk",
        ]
        ok = c.post("/api/runs/order-1/signal", json={"name": "go", "payload": True})
        assert ok.json() == {"ok": True, "id": "order-1", "action": "signal"}
        assert c.post("/api/runs/order-1/cancel", json={}).status_code == 200
        assert c.post("/api/runs/flaky-1/resume", json={}).status_code == 200
        assert c.post("/api/runs/nobody/resume", json={}).status_code == 404
        bad = c.post("/api/runs/order-1/signal", json={"name": "typed", "payload": 3})
        assert bad.status_code == 422
        form = c.post("/api/runs/order-1/cancel", data={"reason": "x"})
        assert form.status_code == 400
        assert c.post("/api/runs/order-1/explode", json={}).status_code == 404
        fork = c.post("/api/runs/order-1/fork", json={"new_id": "order-2", "at": 2})
        # The answer names the new run, and the run it was forked from.
        assert fork.json() == {"ok": True, "id": "order-2", "from": "order-1", "action": "fork"}
        fork = c.post("/api/runs/order-1/fork", json={"new_id": "o-3", "at": "go", "input": 5})
        assert fork.status_code == 200
        assert c.post("/api/runs/order-1/fork", json={"at": 1}).status_code == 400
        assert c.post("/api/runs/order-1/fork", json={"new_id": "x", "at": 99}).status_code == 400
        taken = c.post("/api/runs/order-1/fork", json={"new_id": "taken", "at": 1})
        assert taken.status_code == 409
        assert c.post("/api/runs/nobody/fork", json={"new_id": "x", "at": 0}).status_code == 404
    assert actions.calls == [
        ("signal", "order-1", "go", True),
        ("cancel", "order-1", "cancelled from the fusee ui"),
        ("resume", "flaky-1"),
        ("fork", "order-1", "order-2", 2, KEEP_INPUT),
        ("fork", "order-1", "o-3", "go", 5),
    ]


def test_a_bulk_action_takes_the_lists_filters_and_says_what_it_did(data: Path) -> None:
    actions = Recorder()
    app = create_app(str(data), actions=actions)
    with TestClient(app, base_url="http://127.0.0.1") as c:
        body = {"status": "suspended", "workflow": "gated", "attr": "customer=ada"}
        dry = c.post("/api/bulk/cancel", json={**body, "since": 1000, "dry_run": True})
        assert dry.json() == {
            "ok": True,
            "action": "cancel",
            "dry_run": True,
            "count": 1,
            "ids": ["order-1"],
            "skipped": {"order-2": "it ended meanwhile"},
        }
        assert c.post("/api/bulk/resume", json={"until": "2026-01-01T00:00:00Z"}).status_code == 200
        assert c.post("/api/bulk/cancel", json={"status": "nope"}).status_code == 400
        assert c.post("/api/bulk/delete", json={}).status_code == 404
        assert c.post("/api/bulk/cancel", data={"status": "running"}).status_code == 400
    utc = datetime.UTC
    assert actions.calls == [
        (
            "bulk",
            "cancel",
            {
                "status": "suspended",
                "workflow": "gated",
                "attributes": {"customer": "ada"},
                "started_from": datetime.datetime(1970, 1, 1, 0, 0, 1, tzinfo=utc),
                "started_to": None,
            },
            "cancelled from the fusee ui",
            True,
        ),
        (
            "bulk",
            "resume",
            {
                "status": None,
                "workflow": None,
                "attributes": None,
                "started_from": None,
                "started_to": datetime.datetime(2026, 1, 1, tzinfo=utc),
            },
            "cancelled from the fusee ui",
            False,
        ),
    ]


def test_without_actions_nothing_is_posted(client: TestClient) -> None:
    r = client.post("/api/runs/order-1/cancel", json={})
    assert r.status_code in (404, 405)
    r = client.post("/api/schedules/nightly-greet/pause", json={})
    assert r.status_code in (404, 405)


# --- schedules -----------------------------------------------------------------------------------


def test_the_schedules_route_gives_the_stores_schedule_rows(tmp_path: Path) -> None:
    data = make_store(tmp_path)
    add_schedules(data)
    with TestClient(create_app(str(data)), base_url="http://127.0.0.1") as c:
        r = c.get("/api/schedules")
    assert r.status_code == 200, r.text
    rows = r.json()
    assert [s["name"] for s in rows] == ["hourly-greet", "nightly-greet"]
    nightly = rows[1]
    assert nightly["workflow"] == "greet"
    assert nightly["spec"].startswith("cron 0 2 * * * Europe/Paris")
    assert (nightly["paused"], nightly["removed"], nightly["last_run"]) == (False, False, None)
    # Its times, each twice (ms and ISO 8601), or null for "none yet".
    for field in ("last_tick", "next", "buffered"):
        ms, at = nightly[f"{field}_ms"], nightly[f"{field}_at"]
        assert (ms is None) == (at is None)


def test_a_schedules_last_tick_is_its_tick_and_its_spec_reads_as_written(tmp_path: Path) -> None:
    data = make_store(tmp_path)
    add_schedules(data)
    with TestClient(create_app(str(data)), base_url="http://127.0.0.1") as c:
        before = {s["name"]: s for s in c.get("/api/schedules").json()}
    hourly = before["hourly-greet"]
    assert hourly["spec"] == "every 1h; overlap buffer_one; catch_up 0s"
    # Opened, not ticked: the time it was first opened is no tick.
    assert (hourly["last_tick_ms"], hourly["last_tick_at"]) == (None, None)
    tick_ms = in_an_hour(data)
    with TestClient(create_app(str(data)), base_url="http://127.0.0.1") as c:
        after = {s["name"]: s for s in c.get("/api/schedules").json()}
    hourly = after["hourly-greet"]
    assert hourly["last_tick_ms"] == tick_ms
    assert hourly["last_tick_at"] == iso(tick_ms)
    assert hourly["last_run"] == run_id("hourly-greet", tick_ms)


def in_an_hour(data: Path) -> int:
    """Runs a test engine on ``data`` an hour past now: hourly-greet ticks; the tick."""
    from fusee.store import SqliteStore
    from fusee.testing import TestEngine

    from .workflows import SCHEDULES, in_thread

    ticked: list[int] = []

    async def tick() -> None:
        now_ms = int(time.time() * 1000)
        async with TestEngine(
            workflows=WORKFLOWS,
            store=SqliteStore(data, durability="none"),
            schedules=SCHEDULES,
            start_ms=now_ms,
        ) as t:
            await t.advance("1h")
            await t.settle()
            ticked.append((now_ms // 3_600_000 + 1) * 3_600_000)

    in_thread(tick)
    return ticked[0]


def test_the_versions_route_counts_unfinished_runs_per_version(tmp_path: Path) -> None:
    data = make_store(tmp_path)
    start_waiting(data, "old-1", version="v-old")
    with TestClient(create_app(str(data)), base_url="http://127.0.0.1") as c:
        lines = {line["version"]: line for line in c.get("/api/versions").json()}
    # No actions, so no way to ask the serving engine: who serves is unknown, no warning.
    assert lines["v-old"] == {"version": "v-old", "runs": 1, "workers": [], "warning": None}


def test_an_empty_store_has_no_schedules(client: TestClient) -> None:
    assert client.get("/api/schedules").json() == []


def test_schedule_actions_reach_the_actions_object(data: Path) -> None:
    actions = Recorder()
    with TestClient(create_app(str(data), actions=actions), base_url="http://127.0.0.1") as c:
        assert c.post("/api/schedules/nightly/pause", json={}).json() == {
            "ok": True,
            "schedule": "nightly",
            "action": "pause",
        }
        assert c.post("/api/schedules/nightly/resume", json={}).status_code == 200
        trigger = c.post("/api/schedules/nightly/trigger", json={})
        assert trigger.json()["run_id"] == "nightly/now"
        assert c.post("/api/schedules/nobody/pause", json={}).status_code == 404
        assert c.post("/api/schedules/nightly/explode", json={}).status_code == 404
        assert c.post("/api/schedules/nightly/pause", data={"x": "1"}).status_code == 400
        assert c.get("/api/schedules/nightly/pause").status_code == 405
        made = c.post("/api/schedules/often/create", json={"workflow": "greet", "every": "1h"})
        assert made.status_code == 200
        changed = c.post("/api/schedules/often/update", json={"every": "2h", "input": "dee"})
        assert changed.json() == {"ok": True, "schedule": "often", "action": "update"}
        assert c.post("/api/schedules/often/delete", json={}).status_code == 200
    assert actions.calls == [
        ("schedule", "nightly", "pause"),
        ("schedule", "nightly", "resume"),
        ("schedule", "nightly", "trigger"),
        ("schedule", "often", "create", {"workflow": "greet", "every": "1h"}),
        ("schedule", "often", "update", {"every": "2h", "input": "dee"}),
        ("schedule", "often", "delete"),
    ]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        pytest.param("GET", "/queues", id="queues-page"),
        pytest.param("GET", "/schedules", id="schedules-page"),
        pytest.param("GET", "/api/queues", id="queues"),
        pytest.param("GET", "/api/schedules", id="schedules"),
        pytest.param("POST", "/api/schedules/nightly/trigger", id="schedule-action"),
        pytest.param("POST", "/api/runs/order-1/signal", id="signal"),
        pytest.param("POST", "/api/runs/order-1/cancel", id="cancel"),
        pytest.param("POST", "/api/runs/flaky-1/resume", id="resume"),
    ],
)
def test_with_a_token_the_views_and_actions_need_it(data: Path, method: str, path: str) -> None:
    actions = Recorder()
    app = create_app(str(data), token="s3cret", actions=actions)
    body = {"name": "go", "payload": True}
    with TestClient(app, base_url="http://ops.example:8700", follow_redirects=False) as c:
        denied = c.request(method, path, json=body)
        assert denied.status_code == 401, denied.text
        assert actions.calls == []
        ok = c.request(method, path, json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200, ok.text
    assert len(actions.calls) == (1 if method == "POST" else 0)


# --- event streams -------------------------------------------------------------------------------


def events(response: httpx2.Response) -> Iterator[tuple[str, dict[str, Any]]]:
    """The ``(event, data)`` pairs of a Server-Sent Events response, as they come."""
    kind, data = "message", ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data += line[6:]
        elif line == "" and data:
            yield kind, json.loads(data)
            kind, data = "message", ""


def test_the_runs_stream_sends_a_run_that_starts(tmp_path: Path) -> None:
    data = make_store(tmp_path)
    with (
        served(create_app(str(data))) as url,
        httpx2.Client(timeout=30) as http,
        http.stream("GET", f"{url}/api/runs/events", params={"limit": 5}) as r,
    ):
        assert r.headers["content-type"].startswith("text/event-stream")
        stream = events(r)
        kind, first = next(stream)
        assert kind == "runs"
        assert len(first["runs"]) == 5
        add_greets(data, "g-live")
        kind, later = next(stream)
        assert kind == "runs"
        assert [x["id"] for x in later["runs"]] == ["g-live"]
        assert later["runs"][0]["status"] == "completed"


def test_a_runs_stream_sends_the_changes_of_its_journal(tmp_path: Path) -> None:
    data = make_store(tmp_path)
    start_waiting(data, "order-2")
    with TestClient(create_app(str(data)), base_url="http://127.0.0.1") as c:
        before = c.get("/api/runs/order-2").json()
    assert before["operations"][-1]["status"] == "waiting"
    assert before["outcome"] is None
    with (
        served(create_app(str(data))) as url,
        httpx2.Client(timeout=30) as http,
        http.stream(
            "GET", f"{url}/api/runs/order-2/events", params={"after": before["last_lsn"]}
        ) as r,
    ):
        stream = events(r)
        kind, first = next(stream)
        assert kind == "run"
        # Nothing new yet: the row and the children, which the client may lack.
        assert first["run"]["id"] == "order-2"
        assert "operations" not in first
        release(data, "order-2")
        got: dict[int, dict[str, Any]] = {}
        for kind, change in stream:
            assert kind == "run"
            for op in change.get("operations", []):
                got[op["seq"]] = op
            if change.get("outcome"):
                break
        assert change["outcome"]["result"] == "shipped FR-order-2"
        assert got[3]["status"] == "signalled"
        assert got[4]["child"]["id"] == "ship-order-2"
        assert 1 not in got  # the retried step did not change: not sent again
