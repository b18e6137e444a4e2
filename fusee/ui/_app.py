"""The ASGI app behind ``fusee ui``: the JSON API, its event streams, the page's files.

The app opens its store read-only once, at startup, and reads it as the
``fusee`` command does; it changes runs only through the `Actions` it is
given (none by default: then it has no route that writes anything).

The rule: nothing here loads a store's whole contents. Lists are paged in
the store (a cursor, a limit), and an event stream polls only what its page
shows: the first page of its filters, or one run's journal from its last
record on.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import datetime
import hmac
import json
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, Final, Protocol

from starlette.applications import Starlette
from starlette.datastructures import Headers, QueryParams
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from fusee._payloads import DEFAULT_WARN_RECORDS, too_many_records
from fusee._queue import stats_json
from fusee._schedule import spec_text
from fusee.engine import BulkResult
from fusee.errors import FuseeError, NotFound, PayloadError
from fusee.remote import KEEP_INPUT, queue_stats
from fusee.remote._versions import version_lines
from fusee.store import RUN_STATUSES, RunRow, ScheduleRow, Store, load_journal, open_store
from fusee.store._redact import shown_target
from fusee.ui._timeline import Timeline, iso, row_json

__all__ = ["Actions", "build_app", "open_readonly"]

STATIC: Final = Path(__file__).parent / "static"
POLL_S: Final = 0.5
"""How often an event stream looks at the store."""
KEEPALIVE_S: Final = 15.0
"""A comment line this often keeps proxies from closing a quiet stream."""
MAX_LIMIT: Final = 500
DEFAULT_LIMIT: Final = 50
MAX_WATCHED_IDS: Final = 500
SCAN_BATCHES: Final = 10
"""A page of top-level runs reads this many store pages at most, past the children."""
ACTIONS: Final = ("signal", "cancel", "resume", "fork", "schedule", "bulk")
"""What an app with `Actions` may do (``GET /api/info``'s ``actions``)."""
SCHEDULE_VERBS: Final = ("create", "update", "delete", "pause", "resume", "trigger")
BULK_VERBS: Final = ("cancel", "resume")
# The schedule actions whose body holds arguments.
_WITH_FIELDS: Final = ("create", "update")
# A run's tree of children is read this deep and this wide, at most.
TREE_DEPTH: Final = 3
TREE_NODES: Final = 100
COOKIE: Final = "fusee_token"
# Without a token the app answers only to these host names: a web page that
# rebinds its own DNS name to 127.0.0.1 cannot read the API through the
# browser of the person running `fusee ui`.
LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


class Actions(Protocol):
    """What the page may do to runs; ``fusee ui`` passes a `fusee.Client`'s.

    Each method raises `fusee.NotFound` for an unknown run, `fusee.PayloadError`
    for a payload that does not fit, and another `fusee.FuseeError` when the
    run cannot take it (it has finished): the API answers 404, 422 and 409.
    """

    async def signal(self, id: str, name: str, payload: Any) -> None:
        """Sends signal ``name`` with ``payload`` (JSON data) to run ``id``."""
        ...

    async def cancel(self, id: str, reason: str) -> None:
        """Cancels run ``id``."""
        ...

    async def resume(self, id: str) -> None:
        """Gives run ``id``'s paused steps a fresh retry budget."""
        ...

    async def fork(self, id: str, new_id: str, at: int | str, input: Any) -> None:
        """Starts ``new_id`` from run ``id``'s journal before position ``at``.

        ``input`` is JSON data, or `fusee.remote.KEEP_INPUT` for the old run's.
        A bad position raises ValueError (answered 400); a taken ``new_id``
        `fusee.AlreadyExists` (409).
        """
        ...

    async def schedule(
        self, name: str, action: str, fields: Mapping[str, Any] | None = None
    ) -> str | None:
        """Creates, updates, deletes, pauses, resumes or triggers (``action``) schedule ``name``.

        ``fields`` are a create's: ``workflow`` and `fusee.Schedule`'s
        arguments (``cron`` or ``every``, ``input``, ...), or an update's:
        the arguments it changes (``client.schedules.update``'s). Returns the id of
        the run a trigger started (None for the others). An unknown schedule
        raises `fusee.NotFound` (answered 404), a bad argument ValueError (400).
        """
        ...

    async def bulk(
        self, verb: str, filters: Mapping[str, Any], *, reason: str, dry_run: bool
    ) -> BulkResult:
        """Cancels or resumes (``verb``) every run ``filters`` match (`fusee.Client.cancel_many`).

        ``filters`` holds ``cancel_many``'s: ``status``, ``workflow``,
        ``attributes``, ``started_from`` and ``started_to``.
        """
        ...


def open_readonly(target: str) -> Store:
    """The store ``target`` names, opened to read only (as the ``fusee`` command does).

    Example:
        >>> type(open_readonly("./data")).__name__
        'SqliteStore'
    """
    return open_store(target, readonly=True)


class _BadRequest(Exception):
    """A query parameter the API refuses: answered 400 with this message."""


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


# --- query parameters ----------------------------------------------------------------------------


def encode_cursor(row: RunRow) -> str:
    """An opaque page cursor: where the next page starts, after ``row``.

    Example:
        >>> decode_cursor(encode_cursor(RunRow("a", 1, "wf", "running", 5)))
        (5, 'a')
    """
    text = json.dumps([row.started_ms, row.id], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    """The ``(started_ms, id)`` a cursor from `encode_cursor` holds.

    Raises:
        _BadRequest: The text is not such a cursor.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = json.loads(raw)
    except (binascii.Error, ValueError):
        value = None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or type(value[0]) is not int
        or not isinstance(value[1], str)
    ):
        raise _BadRequest(f"after={cursor!r} is not a cursor; pass the 'next' of a page")
    return value[0], value[1]


def _time_ms(name: str, text: str | None) -> int | None:
    """``since``/``until``: milliseconds since the epoch, or ISO 8601 (UTC when no offset)."""
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise _BadRequest(
            f"{name}={text!r} is not a time; pass milliseconds since the epoch or ISO 8601 "
            "(like 2024-05-01T12:00:00Z)"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    return int(t.timestamp() * 1000)


def _attributes(pairs: list[str]) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise _BadRequest(f"attr takes KEY=VALUE (VALUE as JSON, or text), not {pair!r}")
        try:
            out[key] = json.loads(text)
        except ValueError:
            out[key] = text
    return out or None


def _filters(q: QueryParams) -> dict[str, Any]:
    """The `Store.list` arguments a request's filters name."""
    status = q.get("status") or None
    if status is not None and status not in RUN_STATUSES:
        raise _BadRequest(
            f"status={status!r} is not a status; use one of {', '.join(sorted(RUN_STATUSES))}"
        )
    return {
        "status": status,
        "workflow": q.get("workflow") or None,
        "attributes": _attributes(q.getlist("attr")),
        "started_from_ms": _time_ms("since", q.get("since")),
        "started_to_ms": _time_ms("until", q.get("until")),
    }


def _with_children(q: QueryParams) -> bool:
    """``children``: 1 lists child runs too (the default), 0 top-level runs only."""
    text = q.get("children") or "1"
    if text not in ("0", "1"):
        raise _BadRequest(f"children={text!r}: pass 1 to list child runs too, 0 to leave them out")
    return text == "1"


def _limit(q: QueryParams) -> int:
    text = q.get("limit") or str(DEFAULT_LIMIT)
    try:
        limit = int(text)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise _BadRequest(f"limit={text!r}: pass a number from 1 to {MAX_LIMIT}")
    return limit


# --- the guard -----------------------------------------------------------------------------------


def _hostname(headers: Headers) -> str:
    host = headers.get("host", "")
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class _Guard:
    """Checks every request: the token when there is one, the host name when not.

    A page loaded with ``?token=T`` gets the token as a cookie and is sent
    on to the same address without it, so the token does not stay in the
    address bar, the history, or a screenshot.
    """

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    def _has_token(self, headers: Headers, given: str | None) -> bool:
        assert self.token is not None
        want = self.token.encode()
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer " and hmac.compare_digest(auth[7:].strip().encode(), want):
            return True
        cookies = headers.get("cookie", "")
        for part in cookies.split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and hmac.compare_digest(urllib.parse.unquote(value).encode(), want):
                return True
        return given is not None and hmac.compare_digest(given.encode(), want)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if self.token is None:
            if _hostname(headers) not in LOOPBACK_HOSTS:
                response: Response = _error(
                    403,
                    f"this fusee ui serves 127.0.0.1 only, not host {headers.get('host', '')!r}; "
                    "to serve other addresses run it with a token (fusee ui --host H --token T)",
                )
                await response(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        query = QueryParams(scope.get("query_string", b""))
        path: str = scope["path"]
        page = scope["method"] == "GET" and not path.startswith("/api/")
        given = query.get("token") if page else None
        if self._has_token(headers, None):
            await self.app(scope, receive, send)
            return
        if given is not None and self._has_token(headers, given):
            rest = urllib.parse.urlencode([(k, v) for k, v in query.multi_items() if k != "token"])
            response = RedirectResponse(path + (f"?{rest}" if rest else ""), status_code=303)
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict", path="/")
            await response(scope, receive, send)
            return
        response = _error(
            401,
            "this fusee ui needs its token: send 'Authorization: Bearer TOKEN', "
            "or open the page once as /?token=TOKEN",
        )
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)


# --- reading runs --------------------------------------------------------------------------------


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


async def _page(store: Store, q: QueryParams) -> dict[str, Any]:
    filters = _filters(q)
    limit = _limit(q)
    cursor = q.get("after")
    after = decode_cursor(cursor) if cursor else None
    if not _with_children(q):
        return await _top_level_page(store, filters, limit, after)
    # One row more than the page says whether there is a next page.
    rows = await store.list(**filters, limit=limit + 1, newest_first=True, after=after)
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "runs": [row_json(r) for r in rows],
        "next": encode_cursor(rows[-1]) if more and rows else None,
    }


async def _top_level_page(
    store: Store, filters: dict[str, Any], limit: int, after: tuple[int, str] | None
) -> dict[str, Any]:
    """A page of the runs that have no parent.

    A store lists by start time, children and all: the page reads on past
    the children, `SCAN_BATCHES` reads at most, so that a store of many
    children and few parents answers at once too. A page cut short so
    holds fewer runs than its limit, and its ``next`` goes on from where it
    stopped.
    """
    kept: list[RunRow] = []
    for _ in range(SCAN_BATCHES):
        rows = await store.list(**filters, limit=limit + 1, newest_first=True, after=after)
        for row in rows:
            if row.parent is None:
                kept.append(row)
                if len(kept) > limit:
                    return {
                        "runs": [row_json(r) for r in kept[:limit]],
                        "next": encode_cursor(kept[limit - 1]),
                    }
        if len(rows) <= limit:
            return {"runs": [row_json(r) for r in kept], "next": None}
        after = (rows[-1].started_ms, rows[-1].id)
    return {"runs": [row_json(r) for r in kept], "next": encode_cursor(rows[-1])}


def _divergence(row: RunRow) -> dict[str, Any] | None:
    """A diverged run's determinism error, where the store keeps it."""
    if row.status != "diverged":
        return None
    # A store that keeps the error's text has it on the row.
    error = getattr(row, "error", None)
    return {
        "error": None if error is None else str(error),
        "note": None
        if error is not None
        else "this store does not keep the determinism error; `fusee replay MODULE --id "
        f"{row.id}` prints it with its code line",
    }


async def _journal(store: Store, row: RunRow, run: int) -> Timeline:
    timeline = Timeline()
    for lsn, data in await load_journal(store, row, run):
        timeline.add(lsn, data)
    return timeline


async def _children(store: Store, timeline: Timeline) -> list[dict[str, Any]]:
    """The tree of a run's children, read from their journals (bounded)."""
    budget = [TREE_NODES]

    async def level(t: Timeline, depth: int) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = []
        kids = [op for op in t.ops.values() if op["kind"] == "child" and "child" in op]
        rows = await asyncio.gather(*(store.get(op["child"]["id"]) for op in kids))
        for op, row in zip(kids, rows, strict=True):
            if budget[0] <= 0:
                break
            budget[0] -= 1
            child = op["child"]
            node: dict[str, Any] = {
                "key": child["id"],
                "id": child["id"],
                "workflow": child["workflow"],
                "seq": op["seq"],
                "detached": child["detached"],
                "status": row.status if row is not None else "not started",
                "children": [],
                "more": False,
            }
            if row is not None:
                if depth < TREE_DEPTH:
                    with contextlib.suppress(NotFound):
                        inner = await _journal(store, row, row.run)
                        node["children"] = await level(inner, depth + 1)
                else:
                    # Deeper levels are on the child's own page.
                    node["more"] = True
            nodes.append(node)
        return nodes

    return await level(timeline, 1)


def _tree_ids(nodes: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for n in nodes:
        out.append(n["id"])
        out.extend(_tree_ids(n["children"]))
    return out


async def _tree_statuses(store: Store, ids: list[str]) -> list[str | None]:
    rows = await asyncio.gather(*(store.get(i) for i in ids))
    return [r.status if r is not None else None for r in rows]


def _tree_status_of(nodes: list[dict[str, Any]]) -> list[str | None]:
    out: list[str | None] = []
    for n in nodes:
        out.append(None if n["status"] == "not started" else n["status"])
        out.extend(_tree_status_of(n["children"]))
    return out


def _run_number(q: QueryParams, row: RunRow) -> int:
    text = q.get("run")
    if not text:
        return row.run
    try:
        return int(text)
    except ValueError:
        raise _BadRequest(f"run={text!r} is not a run number") from None


async def _detail(
    store: Store, row: RunRow, run: int, warn_records: int = DEFAULT_WARN_RECORDS
) -> tuple[dict[str, Any], Timeline]:
    timeline = await _journal(store, row, run)
    detail = {
        "run": row_json(row),
        "journal_run": run,
        "divergence": _divergence(row),
        **timeline.json(),
        "children": await _children(store, timeline),
        "journal_warning": _journal_warning(row, run, timeline.records, warn_records),
    }
    return detail, timeline


def _journal_warning(row: RunRow, run: int, records: int, limit: int) -> str | None:
    """The engine's ``warn_records`` warning, for a run's page (None under the limit)."""
    if records <= limit:
        return None
    return too_many_records(row.id, run, records, limit)


# --- endpoints -----------------------------------------------------------------------------------


def _handles_bad_requests(
    fn: Callable[[Request], Any],
) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        try:
            response: Response = await fn(request)
        except _BadRequest as e:
            return _error(400, str(e))
        return response

    endpoint.__name__ = fn.__name__
    return endpoint


async def _index(request: Request) -> Response:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


async def _info(request: Request) -> Response:
    actions = request.app.state.actions
    from fusee._version import __version__

    return JSONResponse(
        {
            "version": __version__,
            "target": request.app.state.target,
            "actions": ACTIONS if actions is not None else [],
            "statuses": sorted(RUN_STATUSES),
        }
    )


async def _list_runs(request: Request) -> Response:
    return JSONResponse(await _page(_store(request), request.query_params))


async def _queues(request: Request) -> Response:
    items = await _store(request).queue_items()
    return JSONResponse(stats_json(queue_stats(items)))


def schedule_json(row: ScheduleRow) -> dict[str, Any]:
    """A schedule's row as the API serves it, with its times in ms and ISO 8601.

    Its spec's durations read as written (``every 1h``), and its last tick
    is null until it has ticked.

    Example:
        >>> schedule_json(ScheduleRow("nightly", "report", "every 60000ms"))["spec"]
        'every 1m'
    """
    tick_ms = row.ticked_ms or None
    return {
        "name": row.name,
        "workflow": row.workflow,
        "spec": spec_text(row.spec),
        "paused": row.paused,
        "removed": row.removed,
        "dynamic": row.dynamic,
        "last_run": row.last_run or None,
        # 0 stands for "none yet" in the row.
        "last_tick_at": iso(tick_ms),
        "next_at": iso(row.next_ms or None),
        "buffered_at": iso(row.buffered_ms or None),
        "last_tick_ms": tick_ms,
        "next_ms": row.next_ms or None,
        "buffered_ms": row.buffered_ms or None,
    }


async def _versions(request: Request) -> Response:
    store = _store(request)
    rows = await store.unfinished()
    workers: dict[str, str] | None = None
    listed = getattr(store, "workers", None)
    if listed is not None:
        workers = dict(await listed())
    else:
        # One engine serves an SQLite store: the page asks it (if it acts on runs).
        ask = getattr(request.app.state.actions, "serving_version", None)
        version = await ask() if ask is not None else None
        if version is not None:
            workers = {"the serving engine": version}
    return JSONResponse([line.as_json() for line in version_lines(rows, workers)])


async def _schedules(request: Request) -> Response:
    rows = await _store(request).schedules()
    return JSONResponse([schedule_json(r) for r in rows])


async def _schedule_act(request: Request) -> Response:
    actions: Actions = request.app.state.actions
    name = request.path_params["name"]
    verb = request.path_params["verb"]
    if verb not in SCHEDULE_VERBS:
        return _error(
            404,
            f"no schedule action {verb!r}; there are create, update, delete, pause, resume"
            " and trigger",
        )
    # JSON even without arguments: a foreign page's form cannot post it.
    body = await _body(request)
    try:
        run_id = await actions.schedule(name, verb, body if verb in _WITH_FIELDS else None)
    except ValueError as e:
        return _error(400, str(e))
    except NotFound as e:
        return _error(404, str(e))
    except FuseeError as e:
        return _error(409, str(e))
    answer: dict[str, Any] = {"ok": True, "schedule": name, "action": verb}
    if run_id is not None:
        answer["run_id"] = run_id
    return JSONResponse(answer)


def _ms_time(ms: int | None) -> datetime.datetime | None:
    return None if ms is None else datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


async def _bulk_act(request: Request) -> Response:
    """``POST /api/bulk/cancel|resume``: every run the body's filters (the list's) match."""
    actions: Actions = request.app.state.actions
    verb = request.path_params["verb"]
    if verb not in BULK_VERBS:
        return _error(404, f"no bulk action {verb!r}; there are cancel and resume")
    body = await _body(request)
    status = body.get("status") or None
    if status is not None and status not in RUN_STATUSES:
        raise _BadRequest(
            f"status={status!r} is not a status; use one of {', '.join(sorted(RUN_STATUSES))}"
        )
    attr = body.get("attr") or []
    pairs = [attr] if isinstance(attr, str) else attr
    if not isinstance(pairs, list) or not all(isinstance(p, str) for p in pairs):
        raise _BadRequest('attr takes "KEY=VALUE" or a list of them')
    since, until = body.get("since"), body.get("until")
    filters = {
        "status": status,
        "workflow": body.get("workflow") or None,
        "attributes": _attributes(pairs),
        "started_from": _ms_time(_time_ms("since", None if since is None else str(since))),
        "started_to": _ms_time(_time_ms("until", None if until is None else str(until))),
    }
    reason = str(body.get("reason") or "cancelled from the fusee ui")
    dry_run = bool(body.get("dry_run"))
    try:
        result = await actions.bulk(verb, filters, reason=reason, dry_run=dry_run)
    except ValueError as e:
        return _error(400, str(e))
    except FuseeError as e:
        return _error(409, str(e))
    return JSONResponse(
        {
            "ok": True,
            "action": verb,
            "dry_run": dry_run,
            "count": len(result.done),
            "ids": list(result.done),
            "skipped": dict(result.skipped),
        }
    )


async def _get_run(request: Request) -> Response:
    store = _store(request)
    id = request.path_params["id"]
    row = await store.get(id)
    if row is None:
        return _error(404, f"no run {id!r} in this store")
    run = _run_number(request.query_params, row)
    try:
        detail, _ = await _detail(store, row, run, request.app.state.warn_records)
    except NotFound:
        return _error(404, f"run {run} of {id!r} has no records in this store")
    return JSONResponse(detail)


def _event(kind: str, data: Any, id: int | None = None) -> bytes:
    head = f"id: {id}\n" if id is not None else ""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"{head}event: {kind}\ndata: {text}\n\n".encode()


def _sse(body: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        body,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _ticks(request: Request) -> AsyncIterator[bool]:
    """Yields every `POLL_S` until the client goes away (True: time for a keepalive)."""
    loop = asyncio.get_running_loop()
    quiet_until = loop.time() + KEEPALIVE_S
    while not await request.is_disconnected():
        now = loop.time()
        keepalive = now >= quiet_until
        if keepalive:
            quiet_until = now + KEEPALIVE_S
        yield keepalive
        await asyncio.sleep(POLL_S)


async def _run_events(request: Request) -> Response:
    store = _store(request)
    id = request.path_params["id"]
    row = await store.get(id)
    if row is None:
        return _error(404, f"no run {id!r} in this store")
    run = _run_number(request.query_params, row)
    # A reconnecting EventSource says what it has; a first connection, its `after`.
    seen_text = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    try:
        seen = int(seen_text)
    except ValueError:
        raise _BadRequest(f"after={seen_text!r} is not an LSN") from None
    try:
        entries = await load_journal(store, row, run)
    except NotFound:
        return _error(404, f"run {run} of {id!r} has no records in this store")
    follow_latest = request.query_params.get("run") is None

    async def body() -> AsyncIterator[bytes]:
        t = Timeline()
        marked = False
        for lsn, data in entries:
            if lsn > seen and not marked:
                t.mark()
                marked = True
            t.add(lsn, data)
        if not marked:
            t.mark()
        # The first event always carries the row and the tree of children:
        # they may have changed since the client read the run.
        sent_row: dict[str, Any] | None = None
        tree: list[dict[str, Any]] | None = None
        statuses: list[str | None] = []
        async for keepalive in _ticks(request):
            latest = await store.get(id)
            if latest is None:
                yield _event("gone", {"id": id})
                return
            for lsn, data in await load_journal(store, latest, run, after_lsn=t.last_lsn):
                t.add(lsn, data)
            changes = t.changes() or {}
            latest_json = row_json(latest)
            if latest_json != sent_row:
                changes["run"] = sent_row = latest_json
                changes["divergence"] = _divergence(latest)
            ids = _tree_ids(tree or [])
            if (
                tree is None
                or "operations" in changes
                or (ids and await _tree_statuses(store, ids) != statuses)
            ):
                fresh = await _children(store, t)
                if fresh != tree:
                    tree = changes["children"] = fresh
                statuses = _tree_status_of(fresh)
            if changes:
                yield _event("run", changes, t.last_lsn)
            elif keepalive:
                yield b": keepalive\n\n"
            if latest.run != run and follow_latest:
                # Continued as new, or replaced: the page loads the new run.
                yield _event("reset", {"id": id, "run": latest.run})
                return

    return _sse(body())


async def _runs_events(request: Request) -> Response:
    store = _store(request)
    q = request.query_params
    filters = _filters(q)
    limit = _limit(q)
    children = _with_children(q)
    watched = [i for i in q.get("ids", "").split(",") if i][:MAX_WATCHED_IDS]

    async def body() -> AsyncIterator[bytes]:
        sent: dict[str, dict[str, Any]] = {}
        async for keepalive in _ticks(request):
            top = await store.list(**filters, limit=limit, newest_first=True)
            extra = await asyncio.gather(*(store.get(i) for i in watched))
            rows = {r.id: r for r in top if children or r.parent is None}
            for r in extra:
                if r is not None:
                    rows.setdefault(r.id, r)
            changed = []
            for r in rows.values():
                j = row_json(r)
                if sent.get(r.id) != j:
                    changed.append(j)
                    sent[r.id] = j
            if len(sent) > 4 * (limit + len(watched)):
                keep = set(rows)
                sent = {k: v for k, v in sent.items() if k in keep}
            if changed:
                changed.sort(key=lambda j: (j["started_ms"], j["id"]), reverse=True)
                yield _event("runs", {"runs": changed})
            elif keepalive:
                yield b": keepalive\n\n"

    return _sse(body())


async def _body(request: Request) -> dict[str, Any]:
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        # A form a foreign page posts cannot be JSON without a preflight the
        # app never answers: this keeps other sites from acting on runs.
        raise _BadRequest("send the action's arguments as JSON (Content-Type: application/json)")
    try:
        value = await request.json()
    except ValueError as e:
        raise _BadRequest(f"the body is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise _BadRequest("the body must be a JSON object")
    return value


async def _act(request: Request) -> Response:
    actions: Actions = request.app.state.actions
    id = request.path_params["id"]
    verb = request.path_params["verb"]
    body = await _body(request)
    try:
        if verb == "signal":
            name = body.get("name")
            if not isinstance(name, str) or not name:
                raise _BadRequest('a signal needs its name: {"name": ..., "payload": ...}')
            await actions.signal(id, name, body.get("payload"))
        elif verb == "cancel":
            await actions.cancel(id, str(body.get("reason") or "cancelled from the fusee ui"))
        elif verb == "resume":
            await actions.resume(id)
        elif verb == "fork":
            new_id, at = body.get("new_id"), body.get("at")
            if not isinstance(new_id, str) or not new_id or not isinstance(at, int | str):
                raise _BadRequest(
                    'a fork needs the new id and a position: {"new_id": ..., "at": N or a '
                    'step name, "input": ... (optional: the old run\'s)}'
                )
            await actions.fork(id, new_id, at, body.get("input", KEEP_INPUT))
            # The answer names the run the fork started (the page opens it).
            return JSONResponse({"ok": True, "id": new_id, "from": id, "action": verb})
        else:
            return _error(404, f"no action {verb!r}; there are signal, cancel, resume and fork")
    except ValueError as e:
        return _error(400, str(e))
    except NotFound as e:
        return _error(404, str(e))
    except PayloadError as e:
        return _error(422, str(e))
    except FuseeError as e:
        return _error(409, str(e))
    return JSONResponse({"ok": True, "id": id, "action": verb})


def build_app(
    target: str,
    *,
    token: str | None,
    readonly_store: Callable[[str], Store],
    actions: Actions | None,
    warn_records: int = DEFAULT_WARN_RECORDS,
) -> Starlette:
    """The app `fusee.ui.create_app` returns (see there)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        store = readonly_store(target)
        await store.open()
        app.state.store = store
        try:
            yield
        finally:
            await store.close()
            # The actions' client was connected on this loop: closed on it.
            close = getattr(actions, "close", None)
            if close is not None:
                await close()

    routes = [
        Route("/", _index),
        Route("/runs/{id:path}", _index),
        Route("/queues", _index),
        Route("/schedules", _index),
        Route("/api/info", _info),
        Route("/api/runs", _handles_bad_requests(_list_runs)),
        Route("/api/runs/events", _handles_bad_requests(_runs_events)),
        Route("/api/runs/{id:path}/events", _handles_bad_requests(_run_events)),
        Route("/api/runs/{id:path}", _handles_bad_requests(_get_run)),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    if actions is not None:
        routes.insert(
            8,
            Route(
                "/api/runs/{id:path}/{verb:str}",
                _handles_bad_requests(_act),
                methods=["POST"],
            ),
        )
    routes.append(Route("/api/queues", _handles_bad_requests(_queues)))
    routes.append(Route("/api/schedules", _handles_bad_requests(_schedules)))
    routes.append(Route("/api/versions", _handles_bad_requests(_versions)))
    if actions is not None:
        routes.append(
            Route(
                "/api/schedules/{name}/{verb:str}",
                _handles_bad_requests(_schedule_act),
                methods=["POST"],
            )
        )
        routes.append(
            Route("/api/bulk/{verb:str}", _handles_bad_requests(_bulk_act), methods=["POST"])
        )
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(_Guard, token=token)])
    # Shown in the page's header and GET /api/info: never with a password.
    app.state.target = shown_target(target)
    app.state.actions = actions
    app.state.warn_records = warn_records
    return app
