# mypy: disable-error-code="import-not-found, untyped-decorator"
# The codes above are for the project's mypy run only, where restate and
# hypercorn are not installed: this module runs in bench/.venv-restate and
# nothing in the project's venv imports it. Checked against their own types with:
#   .venv/bin/mypy --python-executable bench/.venv-restate/bin/python \
#       bench/peers/restate_workloads.py
"""The Restate side of the peer benchmark: W1, W2 (with W5's timings) and W3.

Runs in bench/.venv-restate (restate-sdk and hypercorn, pinned by
bench/restate_compare.py), one workload per process, inside a network
namespace of its own with nothing but loopback (the harness starts it under
``unshare -rn``; `require_loopback_only` refuses to run anywhere else,
because the server tries to reach the internet when it starts).

The process starts, all on 127.0.0.1:

- the Restate server (the binary of the npm package, installed by the
  harness under bench/.restate-server), its data under ``--dir``;
- the Python SDK's workflows ``w1``, ``w2`` and ``w3``, served on the same
  event loop as the client by hypercorn (the ASGI server the SDK's docs and
  test harness use, with the SDK harness's HTTP/2 settings), and registered
  as a deployment through the server's admin API;
- the client: plain HTTP/1.1 to the ingress (see `request`). W1 and W3 call the
  workflow and wait for its result (``POST /w1/{id}/run``). W2 is "start
  200, then wait for each": 200 ``POST /w2/{id}/run/send`` at once (each
  answered once the invocation is durably accepted), then 200
  ``GET /restate/workflow/w2/{id}/attach`` at once.

A step is ``ctx.run_typed("s", add_one, i=i)``, a journaled action calling
the async ``add_one`` in the SDK's process; W3 gathers 500 of them with
``restate.gather``. The SDK resumes the handler only once the server has
acknowledged the action's result, that is, once it is in Restate's log.

Durability: the server runs with its defaults, as ``--dump-config`` of
1.7.12 shows them (the ``--production`` profile differs only in
``auto-provision``). The log (Bifrost) uses the ``replicated`` provider with
``default-replication = 1``, on this node's log-server role, whose RocksDB
WAL is fsynced (``log-server.rocksdb-disable-wal-fsync = false``); the
partition store is rebuilt from that log. So a journal entry, a ctx.run
result included, is fsynced before it is acknowledged, group-committed
across concurrent invocations. The only setting changed is
``disable-telemetry = true`` (no usage report: there is no network anyway),
and ``RESTATE_*`` / ``RUST_LOG`` are removed from the server's environment
so that nothing outside this file configures it.

CPU per step counts both processes: this one (SDK, hypercorn, client) and
the server's (all its threads, from /proc), over the timed region.

    unshare -rn sh -c 'ip link set lo up && exec bench/.venv-restate/bin/python \
        -m peers.restate_workloads W1 --store restate --dir DIR --steps 1000'
"""

# No ``from __future__ import annotations`` here, unlike the other sides: the
# SDK reads each step function's signature with ``eval_str=True`` on every
# ``ctx.run_typed``, and string annotations would make it compile them each time.

import asyncio
import contextlib
import ctypes
import importlib.metadata
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import restate
from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig

from peers._common import (
    WARMUP_PREFIX,
    WARMUP_STEPS,
    WARMUP_WORKFLOWS,
    StepClock,
    check_calls,
    emit,
    install_network_guard,
    latency_figures,
    parse_args,
)

WORKLOADS = ("W1", "W2", "W3")
STORES = ("restate",)

BENCH = Path(__file__).resolve().parent.parent
SERVER_PREFIX = BENCH / ".restate-server"

# Restate's default ports; free, since the namespace is new.
HOST = "127.0.0.1"
INGRESS_PORT = 8080
ADMIN_PORT = 9070
SERVICE_PORT = 9080

STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0

# Replaced after the warm-up, so only the timed run is counted.
clock = StepClock()


async def add_one(i: int) -> int:
    clock.tick()
    return i + 1


async def add_one_timed(k: int, i: int) -> int:
    clock.mark(k)
    return i + 1


w1 = restate.Workflow("w1")
w2 = restate.Workflow("w2")
w3 = restate.Workflow("w3")


@w1.main(name="run")
async def w1_run(ctx: restate.WorkflowContext, n: int) -> int:
    x = 0
    for i in range(n):
        x = await ctx.run_typed("s", add_one, i=i)
    return x


# The input is [workflow number, steps]: the number keys W5's timings.
@w2.main(name="run")
async def w2_run(ctx: restate.WorkflowContext, job: list[int]) -> int:
    k, n = job
    x = 0
    for i in range(n):
        x = await ctx.run_typed("s", add_one_timed, k=k, i=i)
    return x


@w3.main(name="run")
async def w3_run(ctx: restate.WorkflowContext, n: int) -> list[int]:
    futures = [ctx.run_typed("s", add_one, i=i) for i in range(n)]
    await restate.gather(*futures)
    return [await f for f in futures]


APP = restate.app(services=[w1, w2, w3])


def require_loopback_only() -> None:
    """Refuse to run unless loopback is this network namespace's only interface."""
    names = sorted(name for _, name in socket.if_nameindex())
    if names != ["lo"]:
        raise RuntimeError(
            f"network interfaces {names}: run this inside `unshare -rn` with only "
            "loopback up (bench/restate_compare.py does), the Restate server dials out"
        )


def server_binary() -> Path:
    """The restate-server binary the npm package installed for this platform."""
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine()
    )
    osname = {"linux": "linux", "darwin": "darwin"}.get(sys.platform, sys.platform)
    binary = (
        SERVER_PREFIX
        / "node_modules"
        / "@restatedev"
        / f"restate-server-{osname}-{arch}"
        / "bin"
        / "restate-server"
    )
    if not binary.exists():
        raise RuntimeError(f"{binary} is missing: bench/restate_compare.py installs it")
    return binary


def _die_with_parent() -> None:
    # The server must not outlive this process (a harness timeout kills only us).
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def start_server(binary: Path, directory: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESTATE_") and k != "RUST_LOG"}
    env["RESTATE_DISABLE_TELEMETRY"] = "true"
    log = (directory / "restate-server.log").open("wb")
    try:
        return subprocess.Popen(
            [
                str(binary),
                "--no-logo",
                "--base-dir",
                str(directory / "restate-data"),
                "--bind-ip",
                HOST,
                "--listen-mode",
                "tcp",
                "--log-disable-ansi-codes",
                "true",
            ],
            cwd=directory,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
    finally:
        log.close()


def stop_server(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is not None:
        return
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def server_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the ")" closing the name: state is field 3, utime 14, stime 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_log_tail(directory: Path, lines: int = 15) -> str:
    try:
        text = (directory / "restate-server.log").read_text(errors="replace")
    except OSError:
        return "(no server log)"
    return "\n".join(text.splitlines()[-lines:])


async def wait_healthy(server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    for port, path in ((INGRESS_PORT, "/restate/health"), (ADMIN_PORT, "/health")):
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"restate-server exited with {server.returncode}")
            with contextlib.suppress(OSError):
                if (await request("GET", port, path)).status == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"restate-server not healthy at :{port}{path} in time")
            await asyncio.sleep(0.05)


async def register() -> dict[str, Any]:
    """Register the SDK's endpoint as a deployment; retried while hypercorn binds."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    body = {"uri": f"http://{HOST}:{SERVICE_PORT}"}
    while True:
        res = await request("POST", ADMIN_PORT, "/deployments", body)
        if res.status in (200, 201):
            return dict(res.json())
        if time.monotonic() > deadline:
            raise RuntimeError(f"could not register the deployment: {res.status} {res.body!r}")
        await asyncio.sleep(0.1)


def hypercorn_config() -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [f"{HOST}:{SERVICE_PORT}"]
    # As the SDK's own harness serves it: one HTTP/2 stream per invocation,
    # and no limit that would make the server reconnect.
    config.h2_max_concurrent_streams = 2147483647
    config.keep_alive_max_requests = 2147483647
    config.keep_alive_timeout = 2147483647
    config.accesslog = None
    config.errorlog = None
    return config


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def request(method: str, port: int, path: str, payload: Any = None) -> Response:
    """One HTTP/1.1 request on a connection of its own, to 127.0.0.1.

    The client is this much standard library rather than httpx: httpx's pool
    costs about as much CPU per request as Restate's SDK does per step (its
    anyio backend even retries a failing ``import sniffio`` on every request),
    and that cost, on the event loop the workflows run on, is no part of
    Restate. A loopback connect is tens of microseconds.
    """
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
            "Accept: application/json\r\nConnection: close\r\n"
        )
        body = b""
        if payload is not None:
            body = json.dumps(payload).encode()
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        writer.write(head.encode() + b"\r\n" + body)
        status = int((await reader.readline()).split()[1])
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while size := int((await reader.readline()).split(b";")[0], 16):
                chunks.append(await reader.readexactly(size))
                await reader.readexactly(2)
            data = b"".join(chunks)
        elif "content-length" in headers:
            data = await reader.readexactly(int(headers["content-length"]))
        else:
            data = await reader.read()
        return Response(status, data)
    finally:
        writer.close()


def _result(res: Response, what: str) -> Any:
    if res.status != 200:
        raise RuntimeError(f"{what}: {res.status} {res.body.decode(errors='replace')}")
    return res.json()


async def call(workflow: str, key: str, arg: Any) -> Any:
    path = f"/{workflow}/{key}/run"
    return _result(await request("POST", INGRESS_PORT, path, arg), path)


async def send(workflow: str, key: str, arg: Any) -> None:
    path = f"/{workflow}/{key}/run/send"
    res = await request("POST", INGRESS_PORT, path, arg)
    if res.status not in (200, 202):
        raise RuntimeError(f"{path}: {res.status} {res.body.decode(errors='replace')}")


async def attach(workflow: str, key: str) -> Any:
    path = f"/restate/workflow/{workflow}/{key}/attach"
    return _result(await request("GET", INGRESS_PORT, path), path)


async def workload(name: str, prefix: str, workflows: int, steps: int) -> None:
    if name == "W1":
        result = await call("w1", f"{prefix}w1", steps)
        if result != steps:
            raise RuntimeError(f"W1 returned {result!r}, expected {steps}")
    elif name == "W2":
        # "Started at once": all sends issued together, as the other sides do;
        # then every result, waited for together.
        keys = [f"{prefix}w2-{k}" for k in range(workflows)]
        await asyncio.gather(*(send("w2", key, [k, steps]) for k, key in enumerate(keys)))
        results = await asyncio.gather(*(attach("w2", key) for key in keys))
        for result in results:
            if result != steps:
                raise RuntimeError(f"W2 returned {result!r}, expected {steps}")
    else:
        result = await call("w3", f"{prefix}w3", steps)
        if result != list(range(1, steps + 1)):
            raise RuntimeError(f"W3 returned a wrong result: {result!r:.80}")


async def recorded_steps() -> int:
    """Run entries the timed run left in Restate's journals (its SQL admin API)."""
    query = (
        "SELECT count(*) AS n FROM sys_journal WHERE entry_type = 'Command: Run' "
        "AND id IN (SELECT id FROM sys_invocation "
        f"WHERE target_service_key NOT LIKE '{WARMUP_PREFIX}%')"
    )
    rows = _result(await request("POST", ADMIN_PORT, "/query", {"query": query}), "/query")
    return int(rows["rows"][0]["n"])


def server_version(binary: Path) -> str:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True)
    return out.stdout.split()[-1]


@contextlib.contextmanager
def running_server(binary: Path, directory: Path) -> Iterator[subprocess.Popen[bytes]]:
    server = start_server(binary, directory)
    try:
        yield server
    except BaseException:
        print(f"restate-server log (tail):\n{server_log_tail(directory)}", file=sys.stderr)
        raise
    finally:
        stop_server(server)


async def main(argv: list[str]) -> None:
    global clock
    install_network_guard()
    args = parse_args(argv, workloads=WORKLOADS, stores=STORES)
    require_loopback_only()
    directory = Path(args.directory).resolve()
    binary = server_binary()
    version = server_version(binary)
    stop = asyncio.Event()
    with running_server(binary, directory) as server:
        service = asyncio.create_task(serve(APP, hypercorn_config(), shutdown_trigger=stop.wait))
        try:
            await wait_healthy(server)
            deployment = await register()
            warm_steps = min(WARMUP_STEPS, args.steps)
            warm_workflows = min(WARMUP_WORKFLOWS, args.workflows)
            await workload(args.workload, WARMUP_PREFIX, warm_workflows, warm_steps)
            clock = StepClock()
            s0 = server_cpu_seconds(server.pid)
            t0, c0 = time.perf_counter(), time.process_time()
            await workload(args.workload, "", args.workflows, args.steps)
            seconds, own_cpu = time.perf_counter() - t0, time.process_time() - c0
            server_cpu = server_cpu_seconds(server.pid) - s0
            recorded = await recorded_steps()
        finally:
            stop.set()
            await service
    total = args.steps * args.workflows
    extra: dict[str, float] = {}
    if args.workload == "W2":
        extra = latency_figures(clock.gaps_ms(args.workflows, args.steps))
    check_calls(clock, total)
    if recorded != total:
        raise RuntimeError(f"Restate journaled {recorded} runs, expected {total}")
    extra["server_cpu_us_per_step"] = server_cpu / total * 1e6
    extra["sdk_cpu_us_per_step"] = own_cpu / total * 1e6
    meta: dict[str, Any] = {
        "system": "restate",
        "version": version,
        "sdk": importlib.metadata.version("restate-sdk"),
        "hypercorn": importlib.metadata.version("hypercorn"),
        "deployment": deployment.get("id", "?"),
        "python": sys.version.split()[0],
    }
    emit(args, seconds, own_cpu + server_cpu, total, extra, meta)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
