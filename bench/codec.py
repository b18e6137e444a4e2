"""Micro-benchmark of the payload codec on W7's Order (5 items, a datetime, a UUID).

Prints one JSON line per figure, as `bench/run.py` collects them: ``value``
is the median time of fusee's operation in µs; ``peer`` is msgspec's msgpack
``Encoder`` / ``Decoder(Order)`` on the same value in msgspec's own format
(it writes datetimes and UUIDs differently from the journal's ext codes),
measured alternately in the same run, and ``ratio`` is ours over theirs.

    python bench/codec.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit
from typing import Any

import msgspec
from _workloads import Order, order

from fusee._codec import decode, decoder_for, encode


def _best_us(stmt: str, env: dict[str, Any], number: int = 5_000) -> float:
    # The best of three short runs: noise on a shared machine only adds time.
    return min(timeit.repeat(stmt, number=number, repeat=3, globals=env)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="samples per figure (median)")
    args = parser.parse_args()

    value = order(7)
    wire = encode(value)
    assert decode(wire, Order) == value
    theirs_encode = msgspec.msgpack.Encoder().encode
    theirs_decode = msgspec.msgpack.Decoder(Order).decode
    env: dict[str, Any] = {
        "value": value,
        "wire": wire,
        "encode": encode,
        "decode_order": decoder_for(Order),
        "their_wire": theirs_encode(value),
        "their_encode": theirs_encode,
        "their_decode": theirs_decode,
    }
    figures = [
        ("encode Order, µs", "encode(value)", "their_encode(value)", "msgspec Encoder"),
        (
            "decode Order to its type, µs",
            "decode_order(wire)",
            "their_decode(their_wire)",
            "msgspec Decoder(Order)",
        ),
    ]
    for figure, stmt, peer_stmt, peer in figures:
        ours, theirs = [], []
        for _ in range(args.repeat):
            ours.append(_best_us(stmt, env))
            theirs.append(_best_us(peer_stmt, env))
        ratio = statistics.median(a / b for a, b in zip(ours, theirs, strict=True))
        row = {
            "bench": "codec",
            "figure": figure,
            "value": round(statistics.median(ours), 3),
            "repeat": args.repeat,
            "peer": peer,
            "peer_value": round(statistics.median(theirs), 3),
            "ratio": round(ratio, 2),
        }
        print(json.dumps(row, ensure_ascii=False), flush=True)
        # The ratio is the figure to compare across runs: a loaded stretch of
        # this shared VM slows both sides of it.
        ratio_row = {
            "bench": "codec",
            "figure": f"{figure.removesuffix(', µs')}, ratio to {peer}",
            "value": round(ratio, 2),
            "repeat": args.repeat,
        }
        print(json.dumps(ratio_row, ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
