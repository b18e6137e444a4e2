"""CPU instructions per step on the memory store, counted by valgrind: a noise-free figure.

Wall-clock figures on a shared VM swing by ±50%; instruction counts do not
(callgrind counts the same total for the same program and input, whatever
else the machine does). Each workload runs twice under
``valgrind --tool=callgrind``, with N and 3N steps; the difference over 2N
is what one more step costs, start-up and imports cancelled out.

- W1: one workflow, sequential steps.
- W2: workflows of 10 sequential steps, all started at once.
- W7: W1 whose steps return an `Order` (5 items, a datetime, a UUID),
  decoded to its type.
- codec: the payload codec alone, encoding an `Order` and decoding it to
  its type, as a W7 step does once each; over W7, the codec's share of a
  W7 step.
- msgspec: msgspec's own ``Encoder`` and ``Decoder(Order)`` on the same
  values, in its own format: the codec's pair over this one is the codec row.

Needs valgrind (``apt-get install valgrind``); without it, says so on stderr
and prints nothing. A child process runs the workload:

    python bench/instructions.py [--steps N]
    python bench/instructions.py --child W1 1000      # what valgrind runs
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys

from _workloads import ORDERS, Order, orders, sequential

import fusee
from fusee._codec import decoder_for, encode


async def child(workload: str, steps: int) -> None:
    if workload == "codec":
        decode_order = decoder_for(Order)
        for k in range(steps):
            decode_order(encode(ORDERS[k % len(ORDERS)]))
        return
    if workload == "msgspec":
        # msgspec's own encode and decode of the same values, in its own format.
        import msgspec

        encode_theirs = msgspec.msgpack.Encoder().encode
        decode_theirs = msgspec.msgpack.Decoder(Order).decode
        for k in range(steps):
            decode_theirs(encode_theirs(ORDERS[k % len(ORDERS)]))
        return
    async with await fusee.Engine.open("memory", workflows=[sequential, orders]) as engine:
        await engine.execute(sequential, "warm-up", 20)
        await engine.execute(orders, "warm-up-orders", 20)
        if workload == "W7":
            await engine.execute(orders, "w7", steps)
            return
        if workload == "W1":
            await engine.execute(sequential, "w1", steps)
            return
        runs = await asyncio.gather(
            *(engine.start(sequential, f"w2-{k}", 10) for k in range(steps // 10))
        )
        for run in runs:
            await run.result()


GOALS = {"W1": "<= 60000", "W2": "<= 80000"}


def instructions(valgrind: str, workload: str, steps: int) -> int:
    """Instructions callgrind counts for a whole child process running ``steps`` steps."""
    out = subprocess.run(
        [
            valgrind,
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--child",
            workload,
            str(steps),
        ],
        capture_output=True,
        text=True,
        check=True,
        # String hashes vary per process otherwise, and with them dict probes.
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    found = re.search(r"Collected\s*:\s*(\d+)", out.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no total:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.child[0], int(args.child[1])))
        return
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("instructions: valgrind is not installed; no figures", file=sys.stderr)
        return
    n = args.steps
    workloads = ("W1", "W2", "W7", "codec", "msgspec")
    jobs = [(w, k) for w in workloads for k in (n, 3 * n)]
    # Two at a time: callgrind's counts do not depend on what runs beside it.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        counts = dict(zip(jobs, pool.map(lambda j: instructions(valgrind, *j), jobs), strict=True))
    per_step = {w: (counts[(w, 3 * n)] - counts[(w, n)]) / (2 * n) for w in workloads}
    for workload in workloads[:3]:
        row: dict[str, object] = {
            "bench": "instructions",
            "figure": f"{workload} on the memory store, instructions per step (callgrind)",
            "value": round(per_step[workload]),
        }
        if workload in GOALS:
            row["goal"] = GOALS[workload]
        row.update(repeat=1, steps=[n, 3 * n])
        print(json.dumps(row))
    print(
        json.dumps(
            {
                "bench": "instructions",
                "figure": "W7 payload codec: encode + decode to Order, instructions (callgrind)",
                "value": round(per_step["codec"]),
                "repeat": 1,
                "steps": [n, 3 * n],
            }
        )
    )
    # The codec's pair over msgspec's own pair of the same values (issue 33).
    row = {
        "bench": "instructions",
        "figure": "payload codec / msgspec's own, encode + decode of the Order (callgrind)",
        "value": round(per_step["codec"] / per_step["msgspec"], 2),
        "goal": "<= 2",
        "msgspec": round(per_step["msgspec"]),
        "repeat": 1,
    }
    print(json.dumps(row))
    # The codec's own instructions over a whole W7 step's: the same count
    # (callgrind), with the step's one encode and one decode run alone.
    share = per_step["codec"] / per_step["W7"] * 100
    row = {
        "bench": "instructions",
        "figure": "W7 codec share of a step, %",
        "value": round(share, 1),
        "repeat": 1,
    }
    print(json.dumps(row))
    # W7 over W1: what the payload costs a step in all (codec, records, store).
    row = {
        "bench": "instructions",
        "figure": "W7 payload share of a step, (W7 - W1) / W7, %",
        "value": round((per_step["W7"] - per_step["W1"]) / per_step["W7"] * 100, 1),
        "repeat": 1,
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
