"""Micro-benchmark of journal records: construct, encode and decode.

Prints one JSON line per figure, as `bench/run.py` collects them: ``value``
is the median time of fusee's operation in µs, ``goal`` the target where
there is one; ``peer`` names the nearest bare job measured alternately in the
same run (msgpack on the record's field tuple, a plain slotted class), and
``ratio`` is the median of ours over theirs: the figure to compare across
machines.

    python bench/record.py [--repeat N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import timeit
from typing import Any

import msgpack

from fusee.record import Record, Start, Status, Step, StepTime, decode, encode

STEP = Step(1, 0, "charge", 1, Status.OK, b"\x01")
STEP_TIMED = Step(1, 0, "charge", 1, Status.OK, b"\x01", StepTime(1000, 250))
START = Start(run=1, id="order-1", wtype="checkout", input=b"\xc0" * 64)
OK = Status.OK


class _PlainStep:
    """A mutable slotted class with Step's fields: the floor for construction."""

    __slots__ = ("attempt", "name", "payload", "run", "seq", "status", "time")

    def __init__(
        self,
        run: int,
        seq: int,
        name: str,
        attempt: int,
        status: Status,
        payload: bytes,
        time: StepTime | None = None,
    ) -> None:
        self.run = run
        self.seq = seq
        self.name = name
        self.attempt = attempt
        self.status = status
        self.payload = payload
        self.time = time


def _best_us(stmt: str, env: dict[str, Any], number: int = 20_000) -> float:
    # The best of three short runs: noise on a shared machine only adds time.
    return min(timeit.repeat(stmt, number=number, repeat=3, globals=env)) / number * 1e6


def _compare(stmt: str, peer: str, env: dict[str, Any], repeat: int) -> tuple[float, float, float]:
    """Medians of ``stmt`` and ``peer`` in µs, and the median of their ratios.

    The two are sampled alternately so that a noisy stretch of the machine
    slows both sides of a ratio, not one.
    """
    ours, theirs = [], []
    for _ in range(repeat):
        ours.append(_best_us(stmt, env))
        theirs.append(_best_us(peer, env))
    ratio = statistics.median(a / b for a, b in zip(ours, theirs, strict=True))
    return statistics.median(ours), statistics.median(theirs), ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9, help="samples per figure (median)")
    args = parser.parse_args()

    packer = msgpack.Packer(use_bin_type=True)
    env: dict[str, Any] = {
        "Step": Step,
        "PlainStep": _PlainStep,
        "OK": OK,
        "encode": encode,
        "decode": decode,
        "pack": packer.pack,
        "unpackb": msgpack.unpackb,
    }
    # (figure, statement, goal, peer, peer statement)
    figures: list[tuple[str, str, str, str, str]] = [
        (
            "construct Step, µs",
            "Step(1, 0, 'charge', 1, OK, b'\\x01')",
            "<= 0.8",
            "plain slotted class",
            "PlainStep(1, 0, 'charge', 1, OK, b'\\x01')",
        ),
    ]
    cases: list[tuple[str, Record, str, str]] = [
        ("Step", STEP, "<= 1.2", "<= 2.5"),
        ("Step with time", STEP_TIMED, "", ""),
        ("Start", START, "", ""),
    ]
    for i, (label, record, encode_goal, decode_goal) in enumerate(cases):
        wire = encode(record)
        env[f"record{i}"] = record
        env[f"wire{i}"] = wire
        env[f"fields{i}"] = dataclasses.astuple(record)
        env[f"body{i}"] = wire[6:]
        figures += [
            (
                f"encode {label}, µs",
                f"encode(record{i})",
                encode_goal,
                "msgpack pack of fields",
                f"pack(fields{i})",
            ),
            (
                f"decode {label}, µs",
                f"decode(wire{i})",
                decode_goal,
                "msgpack unpackb of fields",
                f"unpackb(body{i}, use_list=False)",
            ),
        ]

    for figure, stmt, goal, peer, peer_stmt in figures:
        ours, theirs, ratio = _compare(stmt, peer_stmt, env, args.repeat)
        row: dict[str, object] = {"bench": "record", "figure": figure, "value": round(ours, 3)}
        if goal:
            row["goal"] = goal
        row.update(
            repeat=args.repeat, peer=peer, peer_value=round(theirs, 3), ratio=round(ratio, 2)
        )
        print(json.dumps(row, ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
