"""W6: replay speed through the driver and the workflow code.

A 10,000-step journal (one workflow, sequential steps) is recorded live on
the memory store, then replayed from its journal by a fresh driver, as after
a crash or when a parked run wakes. Prints JSON lines (medians).

    python bench/replay.py [--steps N] [--repeat R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import fusee
from fusee._driver import RunDriver
from fusee._runtime import StepCall
from fusee.errors import DeterminismError
from fusee.record import Done, Record, Status, decode


@fusee.workflow("w6")
async def w6(ctx: fusee.Ctx, n: int) -> int:
    x = 0
    for i in range(n):
        x = await ctx.step("s", lambda i=i: i + 1)
    return x


class _ReplayOnly:
    def __init__(self) -> None:
        self.lsn = 1 << 40

    def now_ms(self) -> int:
        return 0

    def append(self, driver: RunDriver, record: Record) -> int:
        # Only the end: the journal was replayed without it.
        assert isinstance(record, Done), f"replay appended {record}"
        self.lsn += 1
        return self.lsn

    def append_step(
        self, driver: RunDriver, seq: int, name: str, attempt: int, status: Status, payload: bytes
    ) -> int:
        raise AssertionError("replay recorded a step's result")

    def run_step(self, driver: RunDriver, call: StepCall) -> None:
        raise AssertionError("replay ran a step")

    def stuck(self, driver: RunDriver, error: DeterminismError) -> None:
        raise error

    def turned(self, driver: RunDriver) -> None:
        return None

    def child_dropped(self, driver: RunDriver, seq: int, child: str) -> None:
        return None


async def record(n: int) -> list[bytes]:
    async with await fusee.Engine.open("memory", workflows=[w6], watchdog=None) as engine:
        assert await engine.execute(w6, "w6-1", n) == n
        return [data for _, data in await engine.store.load("w6-1")]


def replay(journal: list[bytes]) -> tuple[float, float]:
    """Seconds to replay: (decoding included, driver and code only)."""
    t0 = time.perf_counter()
    records = [decode(b) for b in journal[:-1]]  # without Done: the code runs to its end
    t1 = time.perf_counter()
    driver = RunDriver(_ReplayOnly(), w6, records, len(records))
    driver.start()
    t2 = time.perf_counter()
    assert not driver.machine.is_replaying()
    driver.close()
    return t2 - t0, t2 - t1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    journal = asyncio.run(record(args.steps))
    runs = [replay(journal) for _ in range(args.repeat)]
    n = args.steps
    out: list[tuple[str, Any, str]] = [
        (
            "W6 replay through driver and code, deliveries/s",
            n / statistics.median(r[1] for r in runs),
            ">= 100000",
        ),
        (
            "W6 replay with decoding, deliveries/s",
            n / statistics.median(r[0] for r in runs),
            ">= 100000",
        ),
    ]
    for name, value, goal in out:
        print(
            json.dumps(
                {
                    "bench": "replay",
                    "figure": name,
                    "value": round(value),
                    "goal": goal,
                    "steps": n,
                    "repeat": args.repeat,
                }
            )
        )


if __name__ == "__main__":
    main()
