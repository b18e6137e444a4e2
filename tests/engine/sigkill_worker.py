"""The process `test_sigkill.py` kills: an engine serving commands from stdin.

Run as ``python sigkill_worker.py DIRECTORY``. It opens an engine on an
SQLite store in DIRECTORY (``durability="fsync"``), prints ``READY``, and
reads commands, one a line, each handled on its own:

    start ID N      start run ID of `mixed` with input N (ATTACH: a resend is harmless)
    signal ID V     send signal ``go`` with V to run ID (deduplicated by ID)

It prints ``ACK start ID`` / ``ACK signal ID`` once the command is durable,
``RESULT ID VALUE`` once a run's end is durable (also, at each start, for
every run already finished), and ``ERR ...`` for anything unexpected. At the
end of stdin it closes the engine and exits.

The rule: a line is printed only after what it reports is durable, so
whatever the test saw printed must survive a SIGKILL.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any

import fusee

go = fusee.signal("go", int)


@fusee.workflow("kid")
async def kid(ctx: fusee.Ctx, n: int) -> int:
    await ctx.sleep("grow", "150ms")
    return await ctx.step("work", lambda: n * 1000)


async def slow_call(n: int) -> int:
    await asyncio.sleep(0.1)  # an outside call: a kill often lands while it runs
    return n * 100


@fusee.workflow("mixed")
async def mixed(ctx: fusee.Ctx, n: int) -> int:
    total = await ctx.step("a", lambda: n)
    await ctx.sleep("nap", f"{100 + 100 * (n % 3)}ms")
    total += await ctx.wait_for(go) or 0
    if n % 2 == 0:
        total += await ctx.child(kid, f"{ctx.info.id}-kid", n)
    return total + await ctx.step("b", lambda: slow_call(n))


def expected(n: int, signal: int) -> int:
    """What run ``mixed(n)`` returns when signalled ``signal``."""
    return n + signal + (n * 1000 if n % 2 == 0 else 0) + n * 100


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Worker:
    def __init__(self, engine: fusee.Engine) -> None:
        self.engine = engine
        self.watched: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def watch(self, id: str) -> None:
        if id not in self.watched:
            self.watched.add(id)
            self.spawn(self.report(id))

    async def report(self, id: str) -> None:
        try:
            value = await self.engine.get(id).result()
        except Exception as e:
            say(f"ERR result {id} {type(e).__name__}: {e}")
            return
        say(f"RESULT {id} {value}")

    async def command(self, line: str) -> None:
        words = line.split()
        try:
            if words[0] == "start":
                id, n = words[1], int(words[2])
                await self.engine.start(mixed, id, n, id_policy=fusee.IdPolicy.ATTACH)
                say(f"ACK start {id}")
                self.watch(id)
            elif words[0] == "signal":
                id, value = words[1], int(words[2])
                try:
                    await self.engine.get(id).signal(go, value, dedup=f"go-{id}")
                except fusee.FuseeError as e:
                    if "has finished" not in str(e):
                        raise
                    # It could only finish by taking this signal: sent before.
                    say(f"FINISHED signal {id}")
                    return
                say(f"ACK signal {id}")
            else:
                say(f"ERR unknown command {line!r}")
        except Exception as e:
            say(f"ERR {line} {type(e).__name__}: {e}")


async def main(directory: str) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    engine = await fusee.Engine.open(
        directory, workflows=[mixed, kid], durability="fsync", park_after="100ms"
    )
    worker = Worker(engine)
    async for info in engine.list(workflow="mixed"):
        worker.watch(info.id)
    say("READY")
    while line := (await reader.readline()).decode().strip():
        worker.spawn(worker.command(line))
    for task in list(worker.tasks):
        task.cancel()
    await asyncio.gather(*worker.tasks, return_exceptions=True)
    await engine.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
