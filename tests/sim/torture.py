"""`make torture`: SIGKILLs of real worker processes over the simulator's workload.

Run as ``python -m tests.sim.torture [--minutes 10] [--lanes 3] [--store URL]``
from the repository root. Each lane runs epochs one after another: an epoch
starts worker processes (`torture_worker.py`) on a fresh SQLite directory,
feeds each one starts, signals, updates and cancels (with dedup ids; what
was not acknowledged is resent to the next process), and SIGKILLs it at a
random moment, up to ``--kills-per-epoch`` times; after each kill it reads
the store and runs the simulator's checkers (acknowledged starts, signals
and updates journaled once, reported results unchanged, no record after an
end, every record decodes). Then a last process runs without kills: every
run must end, each with what its input and messages say, and no step whose
result was durable at a kill may have run after it (the workers log every
step attempt to a file, outside the store).

It stops by itself after ``--minutes``, prints its figures as JSON lines
(kills, runs, faults, violations) and appends them to bench/RESULTS.md
under "Torture" (``--no-record`` to skip). ``--store postgresql://...``
runs it on Postgres instead (one lane: the run ids are prefixed per epoch),
and ``--postgres`` on a throwaway server of its own (tests/_postgres.py);
``--workers N`` (Postgres) runs N worker processes at once in each epoch,
sharing the shards by lease: each kill takes one of them, a new one joins,
and commands go to any of them (the engine routes them to the run's owner).

The rule: a checker only counts what a worker printed, and a worker prints
only what is durable, so any violation is the engine's, not the harness's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import random
import signal
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fusee import _codec
from fusee.errors import NotFound
from fusee.record import Done, Signal, Start, Status, Step, Update, decode
from fusee.remote import dedup_key
from fusee.store import open_store

from .simulator import Workload as SpecMaker
from .simulator import _Op, behind_stops, check_outcomes, check_queue
from .workload import STOP, queues

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "RESULTS.md"


class Ledger:
    """What the workers of one epoch acknowledged and reported, over all their lives."""

    def __init__(self) -> None:
        self.ops: dict[tuple[str, str, str], _Op] = {}
        self.ends: dict[str, Any] = {}
        self.violations: list[str] = []
        self.ready = asyncio.Event()

    def violation(self, checker: str, detail: str) -> None:
        text = f"[{checker}] {detail}"
        if text not in self.violations:
            self.violations.append(text)

    def add(self, op: _Op) -> _Op:
        return self.ops.setdefault((op.kind, op.id, str(op.key)), op)

    def take(self, line: str) -> None:
        msg = json.loads(line)
        if "ready" in msg:
            self.ready.set()
        elif "ack" in msg or "refused" in msg:
            kind = msg.get("ack") or msg["refused"]
            key = msg["key"] if kind != "start" else None
            op = next(
                (
                    o
                    for o in self.ops.values()
                    if o.kind == kind and o.id == msg["id"] and (key is None or o.key == key)
                ),
                None,
            )
            if op is None:
                self.violation("harness", f"a worker acknowledged what was never sent: {line}")
            elif "ack" in msg:
                if kind == "update" and op.acked and op.result != msg["result"]:
                    self.violation(
                        "acked_update",
                        f"update {op.key} of {op.id} answered {msg['result']} after {op.result}",
                    )
                op.acked, op.result = True, msg["result"]
            else:
                op.refused = True
        elif "queued" in msg:
            pass  # an update of a queued run, refused until it runs: resent later
        elif "end" in msg:
            id, outcome = msg["end"], msg["outcome"]
            if id in self.ends and self.ends[id] != outcome:
                self.violation(
                    "result_changed", f"{id} reported {outcome!r} after {self.ends[id]!r}"
                )
            self.ends.setdefault(id, outcome)
        else:
            self.violation("caller_error", str(msg.get("err", line)))


class Life:
    """One worker process, and the task reading what it prints."""

    def __init__(self, proc: asyncio.subprocess.Process, ledger: Ledger) -> None:
        self.proc = proc
        self.reader = asyncio.ensure_future(self._read(ledger))

    async def _read(self, ledger: Ledger) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            ledger.take(line.decode())

    def send(self, op: _Op) -> None:
        assert self.proc.stdin is not None
        cmd: dict[str, Any] = {"op": op.kind, "id": op.id}
        if op.kind == "start":
            cmd |= {"workflow": op.key, "input": op.value, "queue": op.queue, "qkey": op.qkey}
        elif op.kind in ("signal", "update"):
            cmd |= {"key": op.key, "value": op.value}
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        await self.reader

    async def finish(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        code = await asyncio.wait_for(self.proc.wait(), 60)
        await self.reader
        return code


class Epoch:
    """One store, its workers' lives, its ledger and its checks."""

    def __init__(self, target: str, steps: Path, rng: random.Random, prefix: str) -> None:
        self.target = target
        self.steps = steps
        self.rng = rng
        self.specs = SpecMaker(rng, real_time=True, prefix=prefix)
        self.prefix = prefix
        self.ledger = Ledger()
        self.counter = 0
        self.durable_at_kill: list[set[tuple[str, int, int]]] = []
        self.seen_ends: dict[str, tuple[int, int, bytes]] = {}
        self.diagnosed: set[str] = set()
        # The items each inbox's journals hold behind a stop (at the last check).
        self.behind: dict[str, set[int]] = {}
        self.kills = 0
        self.faults: dict[str, int] = {}
        self.checks = 0

    async def spawn(self, life: int, log: Path) -> Life:
        self.ledger.ready.clear()
        with log.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.sim.torture_worker",
                self.target,
                str(self.steps),
                str(life),
                cwd=ROOT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
            )
        w = Life(proc, self.ledger)
        await asyncio.wait_for(self.ledger.ready.wait(), 60)
        return w

    def _started(self, workflow: str) -> list[_Op]:
        return [o for o in self.ledger.ops.values() if o.kind == "start" and o.key == workflow]

    def _fault(self, name: str) -> None:
        self.faults[name] = self.faults.get(name, 0) + 1

    def act(self, lives: list[Life]) -> None:
        """Sends one seed-chosen command (or resends one not acknowledged) to one of ``lives``."""
        rng = self.rng
        w = rng.choice(lives)
        move = rng.choices(
            ["start", "signal", "update", "cancel", "stop", "resend"], [3, 4, 2, 1, 0.3, 2]
        )[0]
        inboxes = [o.id for o in self._started("sim_inbox") if o.acked]
        self.counter += 1
        n = self.counter
        op: _Op | None = None
        if move == "start":
            op = self.specs.new_start(n, inboxes)
        elif move in ("signal", "update", "stop") and inboxes:
            target = rng.choice(inboxes)
            if move == "signal":
                op = _Op("signal", target, f"item-{n}", n)
            elif move == "update":
                op = _Op("update", target, f"u-{n}", rng.randint(1, 9))
            else:
                op = _Op("signal", target, "stop-early", STOP)
        elif move == "cancel":
            targets = [o.id for o in self._started("sim_cancellable") if o.acked]
            if targets:
                op = _Op("cancel", rng.choice(targets), "cancel", None)
        elif move == "resend":
            todo = [o for o in self.ledger.ops.values() if not o.acked and not o.refused]
            if todo:
                op = rng.choice(todo)
                self._fault("resend")
        if op is not None:
            w.send(self.ledger.add(op))

    async def feed(self, lives: list[Life], seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.act(lives)
            await asyncio.sleep(self.rng.uniform(0.002, 0.02))

    async def resend_all(self, w: Life, bound_s: float = 10) -> None:
        """Sends ``w`` every command not acknowledged yet, once: a live worker answers each.

        (Sent again and again, as a caller that timed out would, they would
        only pile up duplicates in the inbox behind the ones in flight.)
        """
        end = time.monotonic() + bound_s
        sent: set[int] = set()
        while time.monotonic() < end:
            todo = [o for o in self.ledger.ops.values() if not o.acked and not o.refused]
            if not todo:
                return
            for op in todo:
                if id(op) not in sent:
                    sent.add(id(op))
                    w.send(op)
            await asyncio.sleep(0.05)

    async def wait_ends(self, ids: list[str], bound_s: float) -> None:
        end = time.monotonic() + bound_s
        while time.monotonic() < end and not all(id in self.ledger.ends for id in ids):
            await asyncio.sleep(0.05)

    async def diagnose(self, id: str) -> None:
        """Appends what the store holds of ``id`` to the lane's ``diagnosis.txt`` (Postgres)."""
        if "://" not in self.target or id in self.diagnosed:
            return
        self.diagnosed.add(id)
        import asyncpg

        conn = await asyncpg.connect(self.target)
        try:
            lines = [f"== {id}"]
            for r in await conn.fetch(
                "SELECT shard, lsn, run, data FROM fusee.journal WHERE id = $1 ORDER BY lsn", id
            ):
                rec = decode(r["data"])
                lines.append(
                    f"  shard {r['shard']} lsn {r['lsn']} run {r['run']} {type(rec).__name__}"
                    f" {getattr(rec, 'seq', '')} {str(rec)[:160]}"
                )
            for table in ("runs", "queue_items"):
                for r in await conn.fetch(f"SELECT * FROM fusee.{table} WHERE id = $1", id):
                    lines.append(f"  {table}: {dict(r)}")
            for r in await conn.fetch("SELECT * FROM fusee.shard_leases ORDER BY shard"):
                lines.append(f"  lease: {dict(r)}")
        finally:
            await conn.close()
        with (self.steps.parent / "diagnosis.txt").open("a") as f:
            f.write("\n".join(lines) + "\n")

    async def check(self) -> set[tuple[str, int, int]]:
        """The store checkers; returns the steps whose results are durable."""
        ledger = self.ledger
        durable: set[tuple[str, int, int]] = set()
        # What was acknowledged before the store is read: with several
        # workers, the ones not killed go on acknowledging while it is, and
        # what they acknowledge then may be past what the read saw.
        acked = {key for key, op in ledger.ops.items() if op.acked}
        store = open_store(self.target, readonly=True)
        await store.open()
        try:
            # Read before the journals: a run whose item is active here either
            # has no journal yet or has one by the time its journal is read.
            items = await store.queue_items(done=True)
            by_id: dict[str, list[list[Any]]] = {}
            for id, run in await _journal_keys(self.target, self.prefix):
                try:
                    entries = await store.load(id, run)
                except NotFound:
                    continue
                records = []
                for lsn, data in entries:
                    try:
                        records.append(decode(data))
                    except Exception as e:
                        ledger.violation("decodes", f"record {lsn} of {id}/{run}: {e}")
                by_id.setdefault(id, []).append(records)
                for i, rec in enumerate(records):
                    if isinstance(rec, Step):
                        durable.add((id, run, rec.seq))
                    if isinstance(rec, Done) and i != len(records) - 1:
                        after = [type(r).__name__ for r in records[i + 1 :]]
                        ledger.violation("after_end", f"{id}/{run} has {after} after its Done")
                        await self.diagnose(id)
                if records and isinstance(records[-1], Done):
                    done = records[-1]
                    if done.status is not Status.CONTINUED:
                        end = (run, int(done.status), done.payload)
                        if self.seen_ends.setdefault(id, end) != end:
                            ledger.violation("result_changed", f"the end of {id} changed")
                        reported = ledger.ends.get(id)
                        ok = done.status is Status.OK and reported is not None
                        if ok and reported != _codec.decode(done.payload):
                            ledger.violation(
                                "result_changed",
                                f"{id} reported {reported!r}, journaled otherwise",
                            )
            self.behind = behind_stops(by_id)
            for q in queues(real_time=True):
                check_queue(q, [i for i in items if i.queue == q.name], ledger.violation)
            # A queued run (or one admitted and not started yet) has no
            # journal, and a queued one holds its signals in its item.
            active = {i.id: i for i in items if i.state != "done"}
            for key, op in ledger.ops.items():
                journals = by_id.get(op.id, [])
                item = active.get(op.id)
                if op.kind == "start" and key in acked and item is not None and not journals:
                    continue
                if op.kind == "start" and key in acked:
                    if await store.get(op.id) is None or not journals:
                        ledger.violation(
                            "acked_start", f"the acknowledged start of {op.id} is lost"
                        )
                    for records in journals:
                        if not records or not isinstance(records[0], Start):
                            ledger.violation(
                                "acked_start", f"a journal of {op.id} has no Start first"
                            )
                elif op.kind in ("signal", "update"):
                    if op.kind == "signal":
                        k = dedup_key(op.key)
                        counts = [
                            sum(1 for r in rs if isinstance(r, Signal) and r.dedup == k)
                            for rs in journals
                        ]
                        if item is not None:
                            held = [_codec.decode(data)[1] for data in item.signals]
                            counts.append(min(1, held.count(k)))
                    else:
                        counts = [
                            sum(1 for r in rs if isinstance(r, Update) and r.id == op.key)
                            for rs in journals
                        ]
                    if any(c > 1 for c in counts):
                        ledger.violation(
                            f"acked_{op.kind}",
                            f"{op.kind} {op.key} to {op.id} is journaled {max(counts)} times",
                        )
                    if key in acked and not any(counts):
                        ledger.violation(
                            f"acked_{op.kind}",
                            f"acknowledged {op.kind} {op.key} to {op.id} is in no journal",
                        )
        finally:
            await store.close()
        return durable

    async def _completed(self, ids: list[str]) -> set[str]:
        """Those of ``ids`` whose row in the store says completed."""
        store = open_store(self.target, readonly=True)
        await store.open()
        try:
            rows = [await store.get(id) for id in ids]
        finally:
            await store.close()
        return {r.id for r in rows if r is not None and r.status == "completed"}

    async def checked(self) -> None:
        """Runs the store checkers, then marks the step log: a step logged after the mark
        whose result the check found durable ran again."""
        self.durable_at_kill.append(await self.check())
        with self.steps.open("a") as log:
            log.write(f"# check {self.checks}\n")
        self.checks += 1

    def check_steps(self) -> None:
        if not self.steps.exists():
            return
        done: list[set[tuple[str, int, int]]] = []
        for line in self.steps.read_text().splitlines():
            if line.startswith("# check "):
                done.append(self.durable_at_kill[int(line.split()[2])])
                continue
            life_text, key = line.split(" ", 1)
            id, run, seq = key.rsplit("/", 2)
            step = (id, int(run), int(seq))
            for n, durable in enumerate(done):
                if step in durable:
                    self.ledger.violation(
                        "step_ran_again",
                        f"step {key} ran in life {life_text}, after check {n} found it durable",
                    )
                    break

    async def run(self, kills: int, deadline: float, log: Path, workers: int = 1) -> None:
        rng = self.rng
        life = 0
        lives: list[Life] = []
        while self.kills < kills and time.monotonic() < deadline:
            while len(lives) < workers:
                lives.append(await self.spawn(life, log))
                life += 1
            await self.feed(lives, rng.uniform(0.03, 0.35) * workers)
            w = lives.pop(rng.randrange(len(lives)))
            await w.kill()
            self.kills += 1
            await self.checked()
        # Faults stop: the workers left (and new ones) must end every run.
        while len(lives) < workers:
            lives.append(await self.spawn(life, log))
            life += 1
        w = lives[0]
        await self.resend_all(w)
        starts = [o for o in self.ledger.ops.values() if o.kind == "start" and o.acked]
        others = [o.id for o in starts if o.key != "sim_inbox"]
        # Senders end before their inboxes are stopped, so that each send
        # finds its inbox waiting: queued ones may wait their turn a while.
        await self.wait_ends(others, 60)
        # A sender whose item is not delivered before the stops may find its
        # inbox ended: only those whose row says completed then (a row says
        # so once its outbox is empty: its send confirmed) must have
        # delivered their item.
        ended_before_stops = await self._completed([o.id for o in self._started("sim_sender")])
        for op in self._started("sim_inbox"):
            if op.acked:
                w.send(self.ledger.add(_Op("signal", op.id, "stop", STOP)))
                if rng.random() < 0.3:
                    self.counter += 1
                    w.send(
                        self.ledger.add(_Op("signal", op.id, f"item-{self.counter}", self.counter))
                    )
        await self.resend_all(w)
        await self.wait_ends([o.id for o in starts], 20)
        if any(o.id not in self.ledger.ends for o in starts):
            for each in lives:  # what they wait for, in the log
                with contextlib.suppress(ProcessLookupError):
                    each.proc.send_signal(signal.SIGUSR1)
            await asyncio.sleep(1)
        for w in lives:
            code = await w.finish()
            if code != 0:
                self.ledger.violation("harness", f"a last worker exited with {code}; see {log}")
        for op in starts:
            if op.id not in self.ledger.ends:
                self.ledger.violation(
                    "never_finished", f"run {op.id} did not end once kills stopped"
                )
        await self.checked()
        self.check_steps()

        def sender_ok(id: str) -> bool:
            return id in ended_before_stops

        ops = list(self.ledger.ops.values())
        check_outcomes(ops, self.ledger.ends, sender_ok, self.ledger.violation, self.behind)


async def _journal_keys(target: str, prefix: str) -> list[tuple[str, int]]:
    """Every (id, run) with records in the store (the Store protocol cannot list them)."""
    if "://" in target:
        import asyncpg

        conn = await asyncpg.connect(target)
        try:
            rows = await conn.fetch(
                "SELECT DISTINCT id, run FROM fusee.journal WHERE id LIKE $1", prefix + "%"
            )
        finally:
            await conn.close()
        return sorted((r["id"], int(r["run"])) for r in rows)
    path = Path(target) / "fusee.db"
    if not path.exists():
        return []
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return sorted(db.execute("SELECT DISTINCT id, run FROM journal").fetchall())
    finally:
        db.close()


async def torture(
    minutes: float,
    lanes: int,
    kills_per_epoch: int,
    store: str | None,
    seed: int,
    tmp: Path,
    workers: int = 1,
) -> dict[str, Any]:
    deadline = time.monotonic() + minutes * 60
    # An epoch's last process needs up to a minute to end its runs.
    margin = min(60.0, minutes * 20)
    totals: dict[str, Any] = {"kills": 0, "epochs": 0, "runs": 0, "acked": 0, "violations": []}
    faults: dict[str, int] = {}
    tag = f"{os.getpid()}-"

    async def lane(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        e = 0
        while time.monotonic() < deadline - margin:
            e += 1
            # Per run of the harness too: a store given by URL may hold an earlier one's.
            prefix = f"{tag}l{n}e{e}-" if store else ""
            target = store or str(tmp / f"lane{n}-epoch{e}")
            epoch = Epoch(target, tmp / f"lane{n}-epoch{e}.steps", rng, prefix)
            await epoch.run(kills_per_epoch, deadline - margin, tmp / f"lane{n}.log", workers)
            totals["kills"] += epoch.kills
            totals["epochs"] += 1
            ops = epoch.ledger.ops.values()
            totals["runs"] += sum(1 for o in ops if o.kind == "start" and o.acked)
            totals["acked"] += sum(1 for o in ops if o.acked)
            for name, count in epoch.faults.items():
                faults[name] = faults.get(name, 0) + count
            for v in epoch.ledger.violations:
                totals["violations"].append(f"lane {n} epoch {e}: {v}")
            print(
                json.dumps(
                    {
                        "lane": n,
                        "epoch": e,
                        "kills": epoch.kills,
                        "violations": len(epoch.ledger.violations),
                        **({"found": epoch.ledger.violations} if epoch.ledger.violations else {}),
                    }
                ),
                flush=True,
            )

    await asyncio.gather(*(lane(n) for n in range(lanes)))
    totals["faults"] = {"sigkill": totals["kills"], **faults}
    return totals


def _record(figures: dict[str, Any], command: str) -> None:
    text = RESULTS.read_text() if RESULTS.exists() else ""
    heading = "## Torture"
    block = [
        f"### {datetime.date.today().isoformat()}, {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "",
        f"Command: `{command}`",
        "",
        "```",
        *(json.dumps({k: v}) for k, v in figures.items()),
        "```",
        "",
    ]
    if heading not in text:
        text = (
            text.rstrip("\n")
            + f"\n\n{heading}\n\n"
            + (
                "SIGKILLs of real worker processes over the simulator's mixed workload "
                "(tests/sim/torture.py), checked after every kill; not part of CI.\n\n"
            )
        )
    RESULTS.write_text(text.rstrip("\n") + "\n\n" + "\n".join(block))


def _by_checker(violations: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in violations:
        checker = v.split("[", 1)[1].split("]", 1)[0]
        counts[checker] = counts.get(checker, 0) + 1
    return dict(sorted(counts.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.sim.torture", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--minutes", type=float, default=10, help="stop after this long (default 10)"
    )
    parser.add_argument("--lanes", type=int, default=4, help="epochs run side by side (SQLite)")
    parser.add_argument("--kills-per-epoch", type=int, default=40)
    parser.add_argument("--store", help="a postgresql:// URL (default: fresh SQLite directories)")
    parser.add_argument(
        "--postgres", action="store_true", help="on a throwaway Postgres server of its own"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="worker processes at once per epoch (Postgres)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--keep", type=Path, help="keep the epochs' files (logs, step logs) in this directory"
    )
    parser.add_argument(
        "--no-record", action="store_true", help="do not append to bench/RESULTS.md"
    )
    args = parser.parse_args(argv)
    if args.workers > 1 and not (args.store or args.postgres):
        parser.error("--workers needs Postgres (--store URL or --postgres): SQLite has one writer")
    with contextlib.ExitStack() as stack:
        if args.postgres:
            sys.path.insert(0, str(ROOT / "tests"))
            from _postgres import Cluster

            args.store = stack.enter_context(Cluster()).dsn
        lanes = 1 if args.store else args.lanes
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            tmp = str(args.keep)
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="fusee-torture-"))
        figures = asyncio.run(
            torture(
                args.minutes,
                lanes,
                args.kills_per_epoch,
                args.store,
                args.seed,
                Path(tmp),
                args.workers,
            )
        )
    violations = figures.pop("violations")
    summary = {
        "kills": figures["kills"],
        "runs": figures["runs"],
        "acknowledged": figures["acked"],
        "epochs": figures["epochs"],
        "faults": figures["faults"],
        "violations": len(violations),
        "violations_by_checker": _by_checker(violations),
        "store": "postgres" if args.store else "sqlite",
        "workers": args.workers,
    }
    for key, value in summary.items():
        print(json.dumps({key: value}))
    for v in violations:
        print(json.dumps({"violation": v}))
    if not args.no_record:
        command = (
            f"make torture MINUTES={args.minutes:g}"
            + (
                (" TORTURE_STORE=postgres" if args.postgres else " TORTURE_STORE=...")
                if args.store
                else ""
            )
            + (f" TORTURE_WORKERS={args.workers}" if args.workers > 1 else "")
        )
        _record(summary, command)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
