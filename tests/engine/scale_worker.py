"""A worker process for the multi-worker tests: ``python scale_worker.py URL NAME LEASE LOG``.

Serves `job` and `slow` on the Postgres store at URL as worker NAME, with
shard leases of LEASE, until its stdin closes (then it stops, giving its
shards back); prints ``ready`` once its engine is open. Every step appends
``NAME ID STEP begin|end`` to the file LOG, so the test can tell which
worker ran which step, and how often.
"""

from __future__ import annotations

import asyncio
import os
import sys

import fusee

go = fusee.signal("go", int)
NAME = sys.argv[2] if len(sys.argv) > 2 else "worker"
LOG = sys.argv[4] if len(sys.argv) > 4 else os.devnull


def note(id: str, step: str, what: str) -> None:
    # One small O_APPEND write per line: lines of several processes never interleave.
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{NAME} {id} {step} {what}\n".encode())
    finally:
        os.close(fd)


def logged(id: str, step: str, value: int) -> int:
    note(id, step, "begin")
    note(id, step, "end")
    return value


async def slow_work(id: str, value: int) -> int:
    """A step that takes a second (in flight when the test stops its worker)."""
    note(id, "work", "begin")
    await asyncio.sleep(1.0)
    note(id, "work", "end")
    return value


@fusee.workflow("job")
async def job(ctx: fusee.Ctx, n: int) -> int:
    id = ctx.info.id
    a = await ctx.step("a", lambda: logged(id, "a", n))
    await ctx.sleep("nap", "200ms")
    got = await ctx.wait_for(go, timeout="5m") or 0
    b = await ctx.step("b", lambda: logged(id, "b", got))
    return a + b


@fusee.workflow("slow")
async def slow(ctx: fusee.Ctx, n: int) -> int:
    id = ctx.info.id
    return await ctx.step("work", lambda: slow_work(id, n))


async def main(url: str, lease: str) -> None:
    async with await fusee.Engine.open(
        url, workflows=[job, slow], durability="fsync", lease=lease, worker=NAME
    ):
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[3]))
