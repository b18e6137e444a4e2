"""Payload codecs and offload (issue 35): W2 with 1 KiB results under Zstd + Encrypt, and
W2 with 1 MiB results offloaded to a blob directory against kept in the journal.

- codecs: W2 (``--workflows`` x ``--steps``, all started at once) whose steps
  return a 1 KiB payload, with ``codecs=[Zstd(), Encrypt(...)]`` against none,
  on the memory store and on SQLite (fsync), each pair measured alternately in
  one repetition (the machine's drift cancels out); the figure is the median
  ratio (goal: within 1.3x).
- offload: a smaller W2 (``--big-workflows`` x ``--big-steps``) whose steps
  return 1 MiB, on SQLite, offloaded (``offload_over="256KiB"``, the default
  blob directory) against journaled (``offload_over`` above 1 MiB).

Prints one JSON line per figure, as `bench/run.py` collects them.

    python bench/payloads.py [--repeat N] [--workflows N] [--steps N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from typing import Any

import fusee
from fusee.codecs import Encrypt, Zstd

KIB = 1024
# Text that compresses as a JSON document does (repeated keys, varying values).
SMALL = ("".join(f'{{"sku": "A{i:04d}", "qty": {i % 7}}}, ' for i in range(40)))[:KIB]
BIG = os.urandom(KIB * KIB // 2).hex()  # 1 MiB that does not compress


def _chain() -> list[fusee.PayloadCodec]:
    return [Zstd(level=3), Encrypt(keys={"k1": os.urandom(32)}, active="k1")]


async def _step(value: str) -> str:
    return value


def _workflow(name: str, value: str) -> fusee.WorkflowDef[int, int]:
    @fusee.workflow(name)
    async def w2(ctx: fusee.Ctx, steps: int) -> int:
        for i in range(steps):
            got = await ctx.step("s", lambda i=i: _step(value))
            if len(got) != len(value):
                raise RuntimeError(f"step {i} returned {len(got)} characters")
        return steps

    return w2


W2_SMALL = _workflow("w2-1kib", SMALL)
W2_BIG = _workflow("w2-1mib", BIG)


async def _once(
    target: str, wf: fusee.WorkflowDef[int, int], workflows: int, steps: int, **options: Any
) -> float:
    """Seconds of one W2 of ``wf``, from the first start to the last result."""
    durability = "none" if target == "memory" else "fsync"
    async with await fusee.Engine.open(
        target, workflows=[wf], durability=durability, **options
    ) as engine:
        await engine.execute(wf, "warm-up", 2)
        t0 = time.perf_counter()
        runs = [await engine.start(wf, f"r{k}", steps) for k in range(workflows)]
        for run in runs:
            if await run.result() != steps:
                raise RuntimeError(f"run {run.id} returned a wrong result")
        return time.perf_counter() - t0


def _run(target: str, wf: fusee.WorkflowDef[int, int], n: int, steps: int, **kw: Any) -> float:
    if target == "sqlite":
        with tempfile.TemporaryDirectory(prefix="fusee-bench-") as d:
            return asyncio.run(_once(d, wf, n, steps, **kw))
    return asyncio.run(_once(target, wf, n, steps, **kw))


def _row(figure: str, ratios: list[float], repeat: int, goal: str | None = None) -> str:
    row: dict[str, Any] = {
        "bench": "payloads",
        "figure": figure,
        "value": round(statistics.median(ratios), 3),
        **({"goal": goal} if goal else {}),
        "repeat": repeat,
        "values": [round(x, 3) for x in ratios],
    }
    return json.dumps(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--big-workflows", type=int, default=10)
    parser.add_argument("--big-steps", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    for target in ("memory", "sqlite"):
        ratios = []
        for r in range(args.repeat):
            pair: list[tuple[str, dict[str, Any]]] = [
                ("none", {}),
                ("codecs", {"codecs": _chain()}),
            ]
            times: dict[str, float] = {}
            for name, options in pair if r % 2 == 0 else pair[::-1]:
                times[name] = _run(target, W2_SMALL, args.workflows, args.steps, **options)
            ratios.append(times["codecs"] / times["none"])
        print(
            _row(
                f"W2 1 KiB results, Zstd + Encrypt / no codecs, {target} (ratio)",
                ratios,
                args.repeat,
                "<= 1.3",
            ),
            flush=True,
        )

    ratios, offloaded_s = [], []
    for r in range(args.repeat):
        big: list[tuple[str, dict[str, Any]]] = [
            ("journaled", {"offload_over": 2 * KIB * KIB}),
            ("offloaded", {}),
        ]
        times = {}
        for name, options in big if r % 2 == 0 else big[::-1]:
            times[name] = _run("sqlite", W2_BIG, args.big_workflows, args.big_steps, **options)
        ratios.append(times["offloaded"] / times["journaled"])
        offloaded_s.append(times["offloaded"])
    print(_row("W2 1 MiB results on SQLite, offloaded / journaled (ratio)", ratios, args.repeat))
    mib = args.big_workflows * args.big_steps / statistics.median(offloaded_s)
    print(
        json.dumps(
            {
                "bench": "payloads",
                "figure": "W2 1 MiB results offloaded to a blob directory (MiB of results/s)",
                "value": round(mib, 1),
                "repeat": args.repeat,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
