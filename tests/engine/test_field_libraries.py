"""Steps written with real libraries: httpx, anyio, asyncio.timeout, asyncpg.

No stand-ins: httpx talks HTTP/1.1 to a server the test runs on loopback,
asyncpg to the tests' PostgreSQL server. Each test runs on every store, one
step live and one in the run recovered after a crash, with
``Retry(attempts=1)``: a first attempt that fails because the library saw
the wrong task (a cancel scope left in another task) fails the test. The
side effects are counted outside the engine: each step ran once.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import asyncpg
import httpx
import pytest
from _postgres import Cluster

import fusee

from .conftest import Host, assert_steps_ran_once

pytestmark = pytest.mark.asyncio

ONCE = fusee.Retry(attempts=1, on_exhausted="fail")


class LoopbackHTTP:
    """An HTTP/1.1 server on loopback that answers every request with JSON and counts them."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.url = ""
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:  # keep-alive: requests until the client closes
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                request_line, *lines = head.split("\r\n")
                method, target, _ = request_line.split(" ", 2)
                headers = {
                    name.strip().lower(): value.strip()
                    for name, _, value in (line.partition(":") for line in lines if line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.hits[target] += 1
                payload = json.dumps(
                    {
                        "method": method,
                        "path": target,
                        "key": headers.get("idempotency-key"),
                        "body": json.loads(body) if body else None,
                    }
                ).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[LoopbackHTTP]:
    http = LoopbackHTTP()
    await http.start()
    yield http
    await http.stop()


def client() -> httpx.AsyncClient:
    # trust_env=False: the machine's proxy settings are not the test's.
    return httpx.AsyncClient(trust_env=False, timeout=30)


async def live_and_recovered(host: Host, step: Callable[[str], Awaitable[Any]]) -> list[Any]:
    """Runs a workflow whose step ``step(name)`` runs once live and once after a crash.

    The first step runs in the first life; the run then sleeps, the engine
    crashes, and the second step runs in the recovered run. Returns what
    the two steps returned, after a second crash too.
    """

    @fusee.workflow("field")
    async def field(ctx: fusee.Ctx) -> list[Any]:
        # Partials of an async function: their first attempts start at once.
        first = await ctx.step("before-crash", functools.partial(step, "before-crash"), retry=ONCE)
        await ctx.sleep("nap", "1h")
        after = functools.partial(step, "after-crash")
        return [first, await ctx.step("after-crash", after, retry=ONCE)]

    async with host(workflows=[field]) as t:
        run = await t.start(field, "field-1")
        await t.advance("1m")
        await t.crash()
        await t.advance("1h")
        got: list[Any] = await run.result()
        await t.crash()
        assert await t.get("field-1").result() == got
        assert_steps_ran_once(t)
    return got


async def test_an_httpx_async_client_call_succeeds_on_its_first_attempt(
    host: Host, server: LoopbackHTTP
) -> None:
    async def charge(name: str) -> str:
        s = fusee.current_step()
        assert s is not None
        async with client() as http:
            r = await http.post(
                f"{server.url}/charge/{name}",
                json={"cents": 500},
                headers={"Idempotency-Key": s.key},
            )
            r.raise_for_status()
            return f"{r.json()['path']} {r.json()['key']} {r.json()['body']['cents']}"

    got = await live_and_recovered(host, charge)
    assert got == [
        "/charge/before-crash field-1/1/0 500",
        "/charge/after-crash field-1/1/2 500",
    ]
    assert server.hits == {"/charge/before-crash": 1, "/charge/after-crash": 1}


async def test_one_httpx_client_shared_by_the_steps_of_many_runs(
    host: Host, server: LoopbackHTTP
) -> None:
    # The way services hold a client: one for the process, its connection
    # pool (anyio locks inside) used by the tasks of many steps at once.
    async with client() as shared:

        async def fetch(n: int) -> int:
            r = await shared.get(f"{server.url}/item/{n}")
            r.raise_for_status()
            return len(str(r.json()["path"]))

        @fusee.workflow("fetch")
        async def fetch_wf(ctx: fusee.Ctx, n: int) -> int:
            return await ctx.step("fetch", functools.partial(fetch, n), retry=ONCE)

        async with host(workflows=[fetch_wf]) as t:
            runs = [await t.start(fetch_wf, f"f-{n}", n) for n in range(10)]
            got = [await run.result() for run in runs]
            await t.crash()
            assert [await t.get(f"f-{n}").result() for n in range(10)] == got
            assert_steps_ran_once(t)
    assert got == [len(f"/item/{n}") for n in range(10)]
    assert server.hits == {f"/item/{n}": 1 for n in range(10)}


async def _with_anyio_task_group(url: str) -> list[str]:
    got: list[str] = []

    async def get(http: httpx.AsyncClient, path: str) -> None:
        r = await http.get(f"{url}{path}")
        got.append(str(r.json()["path"]))

    with anyio.fail_after(30):
        async with client() as http, anyio.create_task_group() as tg:
            for part in ("a", "b"):
                tg.start_soon(get, http, f"/{part}")
    return sorted(got)


async def _with_asyncio_timeout(url: str) -> list[str]:
    async with asyncio.timeout(30), client() as http:
        r = await http.get(f"{url}/a")
        await asyncio.sleep(0)
        r2 = await http.get(f"{url}/b")
    return [str(r.json()["path"]), str(r2.json()["path"])]


async def _with_anyio_move_on(url: str) -> list[str]:
    got: list[str] = []
    with anyio.move_on_after(30) as scope:
        async with client() as http:
            for part in ("a", "b"):
                got.append(str((await http.get(f"{url}/{part}")).json()["path"]))
    assert not scope.cancelled_caught
    return got


AROUND = [
    pytest.param(_with_anyio_task_group, id="anyio-task-group-fail-after"),
    pytest.param(_with_asyncio_timeout, id="asyncio-timeout"),
    pytest.param(_with_anyio_move_on, id="anyio-move-on-after"),
]


@pytest.mark.parametrize("around", AROUND)
async def test_httpx_calls_inside_task_bound_scopes_succeed_on_the_first_attempt(
    host: Host, server: LoopbackHTTP, around: Callable[[str], Awaitable[list[str]]]
) -> None:
    async def step(name: str) -> list[str]:
        return await around(f"{server.url}/{name}")

    got = await live_and_recovered(host, step)
    assert got == [
        ["/before-crash/a", "/before-crash/b"],
        ["/after-crash/a", "/after-crash/b"],
    ]
    assert set(server.hits.values()) == {1}
    assert len(server.hits) == 4


@pytest.mark.parametrize("how", ["connect", "pool"])
async def test_asyncpg_in_a_step_succeeds_on_its_first_attempt(
    host: Host, postgres_cluster: Cluster, how: str
) -> None:
    table = postgres_cluster.new_name("field_")
    admin = await asyncpg.connect(postgres_cluster.dsn)
    await admin.execute(f"CREATE TABLE {table} (key text PRIMARY KEY, step text NOT NULL)")
    pool = await asyncpg.create_pool(postgres_cluster.dsn, min_size=1, max_size=2)
    attempts: Counter[str] = Counter()

    async def record(conn: Any, name: str) -> int:
        s = fusee.current_step()
        assert s is not None
        async with conn.transaction():
            await conn.execute(
                f"INSERT INTO {table} (key, step) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                s.key,
                name,
            )
            count: int = await conn.fetchval(f"SELECT count(*) FROM {table}", timeout=30)
        return count

    async def step(name: str) -> int:
        attempts[name] += 1
        if how == "pool":
            async with pool.acquire(timeout=30) as pooled:
                return await record(pooled, name)
        conn = await asyncpg.connect(postgres_cluster.dsn, timeout=30)
        try:
            return await record(conn, name)
        finally:
            await conn.close()

    try:
        assert await live_and_recovered(host, step) == [1, 2]
        rows = await admin.fetch(f"SELECT key, step FROM {table} ORDER BY key")
        assert [(r["key"], r["step"]) for r in rows] == [
            ("field-1/1/0", "before-crash"),
            ("field-1/1/2", "after-crash"),
        ]
        assert attempts == {"before-crash": 1, "after-crash": 1}
    finally:
        await pool.close()
        await admin.execute(f"DROP TABLE {table}")
        await admin.close()
