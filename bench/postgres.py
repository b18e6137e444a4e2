"""fusee on Postgres: W2 with 1 and 2 worker processes beside DBOS, and a dead worker's takeover.

One throwaway Postgres server (tests/_postgres.py: 127.0.0.1, ``fsync=on``)
serves every figure of a run, each repetition on a database of its own:

- W2 (200 workflows started at once, 10 sequential steps each, steps/s from
  the first start to the last result, after a small warm-up):
  - fusee embedded: one process, one engine holding every shard, starting
    the runs itself (`peers.fusee_workloads`), as DBOS's side does;
  - fusee with 1 and with 2 worker processes (`_pg_worker.py`), the runs
    started and their results read by a `fusee.Client` in this process
    (every start a command through the store's inbox, every result read
    from the store), timed once the workers share the shards;
  - DBOS Transact (pinned in peers/compare.py, in bench/.venv-dbos) on a
    Postgres system database of the same server (`peers.dbos_workloads`).
  Repetitions are interleaved (each system once, then again), figures are
  medians, and a ratio is the median of one over the median of the other.
- Takeover: 2 workers; 60 ``park`` runs each wait for a signal after a
  step; one worker is SIGKILLed and every run signalled; the figure is the
  time from the kill until the other worker has ended the second step of
  each of the dead worker's runs (its lease ran out, the shards were taken
  over, the runs recovered from their journals and the signals applied).

The rule: every server and process this starts is stopped by it, even when
a figure fails (``finally``); a DBOS that cannot be installed costs its
rows only, with a note saying why.

    python bench/postgres.py [--repeat N] [--quick] [--clients] [--workflows N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg

import fusee

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from _postgres import Cluster  # noqa: E402
from peers._common import RESULT_TAG  # noqa: E402
from peers.compare import DBOS_VERSION, SetupError, child_env, ensure_dbos_venv  # noqa: E402

from fusee.store.postgres import PostgresStore, shard_of  # noqa: E402

WORKER = HERE / "_pg_worker.py"
BENCH = "postgres"
NOISE = "shared 2-core VM, noisy: compare figures within this run"
go = fusee.signal("go", int)


def log(message: str) -> None:
    print(f"postgres: {message}", file=sys.stderr, flush=True)


class Worker:
    """One worker process (`_pg_worker.py`)."""

    def __init__(self, url: str, name: str, lease: str, steps_log: Path) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), url, name, lease, str(steps_log)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    async def ready(self) -> None:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 120)
        if line.strip() != "ready":
            raise RuntimeError(f"worker {self.name} did not start (exit {self.proc.poll()})")

    async def stop(self) -> None:
        """Closes its stdin (it gives its shards back and exits); kills it if it hangs."""
        if self.proc.poll() is not None:
            return
        try:
            await asyncio.to_thread(self.proc.communicate, "", 60)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate()


class Server:
    """The throwaway server, handing out a fresh database per figure."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def new_database(self, prefix: str) -> str:
        name = self.cluster.new_name(prefix)
        conn = await asyncpg.connect(self.cluster.dsn)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        return self.cluster.dsn_for(name)


def process_cpu_s(pid: int) -> float:
    """The CPU time process ``pid`` has used so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu_s(cluster: Cluster) -> float:
    """The CPU time the server's processes have used so far (those alive now), in seconds."""
    pid = int((cluster.data / "postmaster.pid").read_text().split()[0])
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # After the command's closing parenthesis: state, ppid, ..., utime (12th), stime.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(stat.parent.name) == pid or int(fields[1]) == pid:
                ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


async def owners(url: str) -> dict[int, str | None]:
    """Each shard's live owner (None: free, or its lease ran out), for every shard."""
    store = PostgresStore(url, readonly=True)
    await store.open()
    try:
        leases = await store.leases()
    finally:
        await store.close()
    return {s: o if live else None for s, (o, _, live) in leases.items()}


async def until(check: Callable[[], Any], what: str, within_s: float = 60.0) -> Any:
    deadline = time.monotonic() + within_s
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {within_s:g} s")
        await asyncio.sleep(0.05)


async def start_workers(url: str, n: int, lease: str, steps_log: Path) -> list[Worker]:
    workers: list[Worker] = []
    try:
        for i in range(n):
            workers.append(Worker(url, f"w{i + 1}", lease, steps_log))
        for w in workers:
            await w.ready()

        async def shared() -> bool:
            held = await owners(url)
            counts = [list(held.values()).count(w.name) for w in workers]
            # Every shard held, in fair shares: no give-back in the timed run.
            return sum(counts) == len(held) > 0 and max(counts) - min(counts) <= 1

        await until(shared, f"{n} workers sharing the shards")
    except BaseException:
        for w in workers:
            w.kill()
        raise
    return workers


async def w2_split(
    cluster: Cluster, url: str, workers: int, runs: int, steps: int, tmp: Path
) -> dict[str, float]:
    """W2 split between ``workers`` engines, each starting the runs of its shards.

    Returns:
        steps/s, and the CPU per step of the workers and of the server.
    """
    crew = await start_workers(url, workers, "10s", tmp / "steps.log")
    try:

        async def w2(prefix: str, count: int) -> list[dict[str, int]]:
            for w in crew:
                assert w.proc.stdin is not None
                w.proc.stdin.write(f"w2 {prefix} {count} {steps}\n")
                w.proc.stdin.flush()
            answers = []
            for w in crew:
                assert w.proc.stdout is not None
                line = await asyncio.wait_for(asyncio.to_thread(w.proc.stdout.readline), 600)
                if not line.startswith("{"):
                    raise RuntimeError(f"worker {w.name} failed W2 (exit {w.proc.poll()})")
                answers.append(json.loads(line))
            if sum(a["runs"] for a in answers) != count:
                raise RuntimeError(f"the workers started {answers}, not {count} runs in all")
            return answers

        await w2("warm-", 10)
        server_before = server_cpu_s(cluster)
        answers = await w2("run-", runs)
        server = server_cpu_s(cluster) - server_before
        seconds = (max(a["t1_ns"] for a in answers) - min(a["t0_ns"] for a in answers)) / 1e9
        total = runs * steps
        return {
            "steps_per_s": total / seconds,
            "worker_cpu_us_per_step": sum(a["cpu_ns"] for a in answers) / 1e3 / total,
            "server_cpu_us_per_step": server * 1e6 / total,
        }
    finally:
        for w in crew:
            await w.stop()


async def w2_by_client(
    cluster: Cluster, url: str, workers: int, runs: int, steps: int, tmp: Path
) -> dict[str, float]:
    """W2 served by ``workers`` processes and driven by a Client.

    Returns:
        steps/s; the CPU per step of the workers, of the server and of this
        process (the Client); the seconds until every start was answered.
    """
    crew = await start_workers(url, workers, "10s", tmp / "steps.log")
    try:
        async with await fusee.Client.connect(url) as client:
            started_s = 0.0

            async def w2(prefix: str, count: int) -> None:
                nonlocal started_s
                t0 = time.perf_counter()
                started: list[fusee.Run[Any]] = await asyncio.gather(
                    *(client.start("w2", f"{prefix}w2-{k}", [k, steps]) for k in range(count))
                )
                started_s = time.perf_counter() - t0
                for run in started:
                    if (got := await run.result()) != steps:
                        raise RuntimeError(f"W2 returned {got!r}, expected {steps}")

            await w2("warm-", 2)
            cpu = [process_cpu_s(w.proc.pid) for w in crew]
            server, own = server_cpu_s(cluster), time.process_time()
            t0 = time.perf_counter()
            await w2("", runs)
            seconds = time.perf_counter() - t0
            total = runs * steps
            worker_s = sum(process_cpu_s(w.proc.pid) for w in crew) - sum(cpu)
            return {
                "steps_per_s": total / seconds,
                "worker_cpu_us_per_step": worker_s * 1e6 / total,
                "server_cpu_us_per_step": (server_cpu_s(cluster) - server) * 1e6 / total,
                "client_cpu_us_per_step": (time.process_time() - own) * 1e6 / total,
                "starts_answered_s": started_s,
            }
    finally:
        for w in crew:
            await w.stop()


def side_env(system: str) -> dict[str, str]:
    env = child_env()
    if system == "fusee":
        # The fusee this process runs (a worktree on PYTHONPATH), not the installed one.
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(Path(fusee.__file__).parent.parent)])
    return env


def side(python: Path, system: str, url: str, runs: int, steps: int) -> dict[str, Any]:
    """One W2 repetition by a peer-harness side in a process of its own (its result line)."""
    directory = tempfile.mkdtemp(prefix=f"pg-{system}-")
    cmd = [str(python), "-m", f"peers.{system}_workloads", "W2", "--store", "postgres"]
    cmd += ["--dir", directory, "--url", url, "--steps", str(steps), "--workflows", str(runs)]
    try:
        proc = subprocess.run(
            cmd, cwd=directory, env=side_env(system), capture_output=True, text=True, timeout=900
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    for text in proc.stdout.splitlines():
        if text.startswith("{") and RESULT_TAG in text:
            line: dict[str, Any] = json.loads(text)
            if line.get("ok"):
                return line
    tail = "\n".join(proc.stderr.strip().splitlines()[-12:]) or "(no output)"
    raise RuntimeError(f"{system} W2 on Postgres failed (exit {proc.returncode}):\n{tail}")


async def takeover(url: str, lease: str, runs: int, tmp: Path) -> float:
    """Seconds from SIGKILL of one of 2 workers until the other moved each of its runs on."""
    steps_log = tmp / f"takeover-{lease}.log"

    def ended(step: str) -> dict[str, tuple[str, int]]:
        out: dict[str, tuple[str, int]] = {}
        if steps_log.exists():
            for line in steps_log.read_text().splitlines():
                name, id, what, ns = line.split()
                if what == step:
                    out[id] = (name, int(ns))
        return out

    ids = [f"park-{i}" for i in range(runs)]
    crew = await start_workers(url, 2, lease, steps_log)
    try:
        async with await fusee.Client.connect(url) as client:
            await asyncio.gather(*(client.start("park", id, i) for i, id in enumerate(ids)))
            await until(lambda: len(ended("a")) == runs, "every run's first step")
            held = await owners(url)
            count = len(held)  # every shard, held or not: the shard count
            victim, survivor = crew
            theirs = [id for id in ids if held.get(shard_of(id, count)) == victim.name]
            killed_ns = time.time_ns()
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.communicate()
            signals = [asyncio.ensure_future(client.get(id).signal(go, 1)) for id in ids]
            try:

                def moved() -> bool:
                    done = ended("b")
                    return all(id in done for id in theirs)

                await until(moved, "the dead worker's runs moving on", within_s=120)
                await asyncio.gather(*signals)
            finally:
                for s in signals:
                    s.cancel()
            done = ended("b")
            wrong = [id for id in theirs if done[id][0] != survivor.name]
            if wrong:
                raise RuntimeError(f"runs {wrong[:3]} moved on on the dead worker")
            return (max(done[id][1] for id in theirs) - killed_ns) / 1e9
    finally:
        for w in crew:
            if w.proc.poll() is None:
                await w.stop()


def row(figure: str, values: Sequence[float], digits: int, **more: Any) -> dict[str, Any]:
    return {
        "bench": BENCH,
        "figure": figure,
        "value": round(statistics.median(values), digits),
        "repeat": len(values),
        "values": [round(v, digits) for v in values],
        **more,
    }


def ratio(
    figure: str, ours: Sequence[float], theirs: Sequence[float], goal: str, **more: Any
) -> dict[str, Any]:
    value = statistics.median(ours) / statistics.median(theirs)
    return {
        "bench": BENCH,
        "figure": figure,
        "value": round(value, 2),
        "goal": goal,
        "repeat": min(len(ours), len(theirs)),
        "note": f"of medians over repetitions interleaved in one run; {NOISE}",
        **more,
    }


# A W2 configuration: one repetition on a fresh database (URL, runs, steps, tmp) -> figures.
Config = Callable[[str, int, int, Path], Awaitable[dict[str, float]]]


async def measure(
    cluster: Cluster, repeat: int, runs: int, steps: int, clients_only: bool = False
) -> list[dict[str, Any]]:
    server = Server(cluster)
    dbos_python: Path | None = None
    dbos_note = ""
    try:
        if clients_only:
            raise SetupError("--clients: the Client rows and the fusee rows beside them only")
        dbos_python = ensure_dbos_venv()
    except SetupError as e:
        dbos_note = f"DBOS not measured: {e}".splitlines()[0]
        log(dbos_note)
    figures: dict[str, list[dict[str, float]]] = {}
    versions: dict[str, str] = {}

    def peer_side(python: Path, system: str) -> Config:
        async def one(url: str, runs: int, steps: int, tmp: Path) -> dict[str, float]:
            line = await asyncio.to_thread(side, python, system, url, runs, steps)
            versions[system] = str(line["meta"].get("version"))
            got = line["figures"]
            return {"steps_per_s": got["steps_per_s"], "cpu_us_per_step": got["cpu_us_per_step"]}

        return one

    def split(n: int) -> Config:
        return lambda url, r, s, tmp: w2_split(cluster, url, n, r, s, tmp)

    def by_client(n: int) -> Config:
        return lambda url, r, s, tmp: w2_by_client(cluster, url, n, r, s, tmp)

    configs: dict[str, Config] = {
        "embedded": peer_side(Path(sys.executable), "fusee"),
        "split 1": split(1),
        "split 2": split(2),
        "client 1": by_client(1),
        "client 2": by_client(2),
    }
    if dbos_python is not None:
        configs["dbos"] = peer_side(dbos_python, "dbos")
    load = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        # Interleaved: a noisy spell of the machine falls on every configuration alike.
        for rep in range(repeat):
            for key, config in configs.items():
                url = await server.new_database(key.replace(" ", "_") + "_")
                figures.setdefault(key, []).append(await config(url, runs, steps, tmp))
            done = ", ".join(f"{k} {v[-1]['steps_per_s']:,.0f}" for k, v in figures.items())
            log(f"W2 rep {rep + 1}/{repeat}, steps/s: {done}")
        takeovers: dict[str, list[float]] = {}
        for lease, times in () if clients_only else (("2s", repeat), ("10s", 1)):
            for _ in range(times):
                url = await server.new_database("takeover_")
                takeovers.setdefault(lease, []).append(await takeover(url, lease, 60, tmp))
                log(f"takeover, lease {lease}: {takeovers[lease][-1]:.2f} s")
    loads = {"load_1m_at_start": load, "load_1m_at_end": round(os.getloadavg()[0], 2)}
    common = {"size": {"steps": steps, "workflows": runs}, "note": NOISE, **loads}
    dbos = f"DBOS {versions.get('dbos', DBOS_VERSION)}"
    titles = {
        "embedded": "fusee embedded, 1 engine starting its runs (as DBOS's side)",
        "split 1": "fusee 1 worker process starting the runs",
        "split 2": "fusee 2 worker processes, each starting the runs of its shards",
        "client 1": "fusee 1 worker process, runs started by a Client",
        "client 2": "fusee 2 worker processes, runs started by a Client",
        "dbos": f"{dbos}, same server, a database of its own",
    }
    steps_per_s = {k: [f["steps_per_s"] for f in v] for k, v in figures.items()}
    rows = []
    for key, values in figures.items():
        more = {
            metric: round(
                statistics.median(f[metric] for f in values), 3 if metric.endswith("_s") else 1
            )
            for metric in values[0]
            if metric != "steps_per_s"
        }
        rows.append(row(f"W2 steps/s, {titles[key]}", steps_per_s[key], 1, **more, **common))
    sps = steps_per_s
    if "dbos" in figures:
        rows += [
            ratio(f"W2 ratio fusee embedded / {dbos}", sps["embedded"], sps["dbos"], ">= 10"),
            ratio(f"W2 ratio fusee 2 workers / {dbos}", sps["split 2"], sps["dbos"], ">= 10"),
        ]
    else:
        rows.append({"bench": BENCH, "figure": "W2 steps/s, DBOS", "value": "-", "note": dbos_note})
    rows.append(ratio("W2 ratio 2 workers / 1 worker", sps["split 2"], sps["split 1"], "", **loads))
    rows += [
        ratio(
            "W2 ratio 2 / 1 worker, by a Client",
            sps["client 2"],
            sps["client 1"],
            ">= 1.6",
            **loads,
        ),
        # The Client's cost: embedded over the best of the Client's rows.
        ratio(
            "W2 ratio fusee embedded / started by a Client",
            sps["embedded"],
            max(sps["client 1"], sps["client 2"], key=statistics.median),
            "<= 1.5",
            **loads,
        ),
    ]
    for lease, times_s in takeovers.items():
        goal_s = float(lease.rstrip("s")) + 1
        rows.append(
            row(f"takeover: SIGKILL to all its runs moved on, lease {lease}, s", times_s, 2,
                goal=f"<= {goal_s:g}", runs=60, note=NOISE)
        )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="20 workflows, 1 repetition")
    parser.add_argument(
        "--clients",
        action="store_true",
        help="W2 by a Client beside fusee's own rows only (no DBOS, no takeover)",
    )
    parser.add_argument("--workflows", type=int, default=200)
    args = parser.parse_args()
    repeat, runs = (1, 20) if args.quick else (args.repeat, args.workflows)
    try:
        cluster = Cluster()
    except RuntimeError as e:  # no server installed: nothing to measure
        log(f"no Postgres figures: {e}")
        return
    with cluster:
        for r in asyncio.run(measure(cluster, repeat, runs, 10, args.clients)):
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
