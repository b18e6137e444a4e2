"""SIGKILL: what an engine acknowledged survives the process being killed at any moment.

A worker process (`sigkill_worker.py`) serves 100 mixed workflows (steps,
sleeps of a few hundred ms, signals, children) on an SQLite store with
``durability="fsync"``; the test feeds it starts and signals over stdin and
kills it with SIGKILL at 20 moments a seeded random picks, restarting it each
time. After each kill it reads the store and checks that every acknowledged
start exists, every acknowledged signal is in its run's journal and every
reported result is recorded as reported; restarted workers report finished
runs again, and the values must not change. In the end every run completes
with its expected result.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fusee import _codec
from fusee.record import Done, Signal, Start, Status, decode
from fusee.store import SqliteStore

from .sigkill_worker import expected

pytestmark = pytest.mark.asyncio

WORKER = Path(__file__).with_name("sigkill_worker.py")
RUNS = 100
KILLS = 20
# Past the longest nap and the park time: the run is parked in its wait.
SIGNAL_LATER_S = 0.5


def _signal_of(n: int) -> int:
    return n * 7


class Ledger:
    """What the workers acknowledged and reported, over all their lives."""

    def __init__(self) -> None:
        self.starts: dict[str, float] = {}  # id -> when (loop time) first acknowledged
        self.signals: set[str] = set()
        self.results: dict[str, int] = {}
        self.errors: list[str] = []
        self.ready = asyncio.Event()

    def take(self, line: str) -> None:
        words = line.split()
        if words == ["READY"]:
            self.ready.set()
        elif words[:2] == ["ACK", "start"]:
            self.starts.setdefault(words[2], asyncio.get_running_loop().time())
        elif words[:2] in (["ACK", "signal"], ["FINISHED", "signal"]):
            self.signals.add(words[2])
        elif words[0] == "RESULT":
            id, value = words[1], int(words[2])
            if id.endswith("-kid"):
                return
            if id in self.results and self.results[id] != value:
                self.errors.append(f"{id} reported {value} after {self.results[id]}")
            self.results[id] = value
        else:
            self.errors.append(line)


class Life:
    """One worker process, and the task reading what it prints."""

    def __init__(self, proc: asyncio.subprocess.Process, ledger: Ledger) -> None:
        self.proc = proc
        self.sent: set[tuple[str, str]] = set()
        self.reader = asyncio.ensure_future(self._read(ledger))

    async def _read(self, ledger: Ledger) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            ledger.take(line.decode().strip())

    def send(self, command: str, id: str, arg: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{command} {id} {arg}\n".encode())
        self.sent.add((command, id))

    async def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        await self.reader


async def _spawn(directory: Path, ledger: Ledger, log: Path) -> Life:
    ledger.ready.clear()
    with log.open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            str(directory),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )
    life = Life(proc, ledger)
    await asyncio.wait_for(ledger.ready.wait(), 60)
    return life


async def _feed(life: Life, ledger: Ledger, runs: int) -> None:
    """Sends every command of the first ``runs`` runs not yet acknowledged.

    A signal goes once its run's start is acknowledged: at once for even runs
    (it waits in the run's buffer), after a while for odd ones (it wakes the
    run parked in its wait, whose next step then runs).
    """
    loop = asyncio.get_running_loop()
    while True:
        for n in range(runs):
            id = f"run-{n}"
            if id not in ledger.starts and ("start", id) not in life.sent:
                life.send("start", id, n)
            elif (
                id in ledger.starts
                and id not in ledger.signals
                and ("signal", id) not in life.sent
                and (n % 2 == 0 or loop.time() - ledger.starts[id] > SIGNAL_LATER_S)
            ):
                life.send("signal", id, _signal_of(n))
            else:
                continue
            await asyncio.sleep(0.003)
        await asyncio.sleep(0.01)


@contextmanager
def _feeding(life: Life, ledger: Ledger, runs: int = RUNS) -> Iterator[None]:
    task = asyncio.ensure_future(_feed(life, ledger, runs))
    try:
        yield
    finally:
        task.cancel()


async def _check_store(directory: Path, ledger: Ledger) -> None:
    store = SqliteStore(directory, readonly=True)
    await store.open()
    try:
        for id in ledger.starts:
            row = await store.get(id)
            assert row is not None, f"acknowledged start of {id} is lost"
            first = decode((await store.load(id))[0][1])
            assert isinstance(first, Start)
            assert _codec.decode(first.input) == int(id.split("-")[1])
        for id in ledger.signals:
            journal = [decode(data) for _, data in await store.load(id)]
            got = [r for r in journal if isinstance(r, Signal) and r.name == "go"]
            assert len(got) == 1, f"acknowledged signal to {id} is recorded {len(got)} times"
        for id, value in ledger.results.items():
            row = await store.get(id)
            assert row is not None
            assert row.status == "completed", f"{id} reported {value} but is {row.status}"
            done = decode((await store.load(id))[-1][1])
            assert isinstance(done, Done)
            assert done.status is Status.OK
            assert _codec.decode(done.payload) == value
    finally:
        await store.close()


@pytest.mark.timeout(300)
async def test_what_was_acknowledged_survives_sigkill_at_random_moments(tmp_path: Path) -> None:
    rng = random.Random(20_240_601)
    directory = tmp_path / "store"
    log = tmp_path / "worker.log"
    ledger = Ledger()
    for kill in range(KILLS):
        life = await _spawn(directory, ledger, log)
        # A few more runs each life, so that every kill finds work in flight:
        # starts, signals, steps, sleeps, children, parked runs waking.
        with _feeding(life, ledger, runs=(kill + 1) * RUNS // KILLS):
            await asyncio.sleep(rng.uniform(0.02, 0.6))
        await life.kill()
        assert not ledger.errors, (ledger.errors, log.read_text())
        await _check_store(directory, ledger)

    life = await _spawn(directory, ledger, log)
    with _feeding(life, ledger):
        for _ in range(6000):
            if len(ledger.results) == RUNS:
                break
            await asyncio.sleep(0.01)
    assert life.proc.stdin is not None
    life.proc.stdin.close()
    assert await asyncio.wait_for(life.proc.wait(), 60) == 0, log.read_text()
    await life.reader
    assert not ledger.errors, (ledger.errors, log.read_text())
    assert ledger.results == {f"run-{n}": expected(n, _signal_of(n)) for n in range(RUNS)}, (
        log.read_text()
    )
    await _check_store(directory, ledger)
