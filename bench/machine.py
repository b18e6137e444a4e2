"""Micro-benchmark of the journal machine: live steps and replay.

Live: one run's begin_step / complete / next / encode cycle over N steps,
the work the engine does per step outside the step function and the disk.
Replay: the journal of that run decoded and replayed (begin_step / next).
Prints one JSON line per figure (medians of several repetitions).

    python bench/machine.py [--steps N] [--repeat R]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

from fusee.machine import DeliverLive, RunMachine, StepCompleted
from fusee.record import Record, Start, Status, decode, encode

START = Start(run=1, id="bench", wtype="bench", input=b"\xc0")


def live(steps: int) -> tuple[float, list[bytes]]:
    """Seconds for ``steps`` live steps through the queued path; the encoded journal."""
    m = RunMachine.fresh(START, 1)
    journal = [encode(START)]
    append = journal.append
    run = m.run()
    ok = Status.OK
    t0 = time.perf_counter()
    for i in range(steps):
        seq, _ = m.begin_step("step")
        m.complete(seq, StepCompleted(ok, i.to_bytes(4, "little")))
        n = m.next()
        assert type(n) is DeliverLive
        append(encode(n.record.record(run, n.seq, n.outcome)))
    return time.perf_counter() - t0, journal


def live_fast(steps: int) -> float:
    """Seconds for ``steps`` live steps through the lone-step fast path (take_live_step)."""
    m = RunMachine.fresh(START, 1)
    run = m.run()
    ok = Status.OK
    out: list[bytes] = []
    append = out.append
    from fusee.machine import Outcome

    t0 = time.perf_counter()
    for i in range(steps):
        seq, _ = m.begin_step("step")
        rec = m.take_live_step(seq)
        assert rec is not None
        append(encode(rec.record(run, seq, Outcome(ok, i.to_bytes(4, "little")))))
    return time.perf_counter() - t0


def replay(journal: list[bytes]) -> tuple[float, float]:
    """Seconds to replay ``journal``: (decode included, machine only)."""
    t0 = time.perf_counter()
    records: list[Record] = [decode(b) for b in journal]
    t1 = time.perf_counter()
    m = RunMachine(records, len(records))
    delivered = 0
    for _ in range(len(records) - 1):
        m.begin_step("step")
        m.next()
        delivered += 1
    t2 = time.perf_counter()
    assert delivered == len(journal) - 1
    assert not m.is_replaying()
    return t2 - t0, t2 - t1


def median(f: Callable[[], float], repeat: int) -> float:
    return statistics.median(f() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n = args.steps
    journal = live(n)[1]
    live_s = median(lambda: live(n)[0], args.repeat)
    fast_s = median(lambda: live_fast(n), args.repeat)
    replays = [replay(journal) for _ in range(args.repeat)]
    with_decode = statistics.median(r[0] for r in replays)
    machine_only = statistics.median(r[1] for r in replays)
    figures = [
        ("live step (queued path), µs/step", live_s / n * 1e6, "<= 6"),
        ("live step (take_live_step fast path), µs/step", fast_s / n * 1e6, "<= 6"),
        ("replay with decode, deliveries/s", n / with_decode, ">= 300000"),
        ("replay, machine only, deliveries/s", n / machine_only, ">= 300000"),
    ]
    for name, value, goal in figures:
        print(
            json.dumps(
                {
                    "bench": "machine",
                    "figure": name,
                    "value": round(value, 2),
                    "goal": goal,
                    "steps": n,
                    "repeat": args.repeat,
                }
            )
        )


if __name__ == "__main__":
    main()
