"""The process `torture.py` kills: an engine serving the simulator's workload from stdin.

Run as ``python -m tests.sim.torture_worker TARGET STEP_LOG LIFE`` from the
repository root. It opens an engine on TARGET (an SQLite directory or a
``postgresql://`` URL) with ``durability="fsync"``, prints ``{"ready": 1}``,
and reads one JSON command a line, each handled on its own task:

    {"op": "start", "id": ..., "workflow": ..., "input": ...}   (ATTACH: a resend is harmless)
    {"op": "signal", "id": ..., "key": DEDUP, "value": ...}
    {"op": "update", "id": ..., "key": UPDATE_ID, "value": ...}
    {"op": "cancel", "id": ...}

It prints ``{"ack": OP, "id": ..., "key": ..., "result": ...}`` once a
command is durable, ``{"refused": OP, ...}`` when its run had ended,
``{"end": ID, "outcome": ...}`` once a top-level run's end is durable (again
at each start for runs already ended), and ``{"err": ...}`` for anything
unexpected. Every step attempt appends ``LIFE KEY`` to STEP_LOG before it
runs (a log kept outside the store). At the end of stdin it closes the
engine and exits.

The rule: a line is printed only after what it reports is durable, so what
the harness read must survive a SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any

import fusee

from . import workload

# FUSEE_TORTURE_TRACE=1: the engine's debug log, and every line said, on stderr.
TRACE = bool(os.environ.get("FUSEE_TORTURE_TRACE"))
log = logging.getLogger("fusee")


def say(**line: Any) -> None:
    if TRACE:
        log.debug("SAY %s", json.dumps(line))
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def dump_tasks(worker: Worker | None = None) -> None:
    for task in asyncio.all_tasks():
        sys.stderr.write(f"TASK {task.get_name()}\n")
        task.print_stack(limit=12, file=sys.stderr)
    if worker is not None:
        engine = worker.engine
        # The engine's view of each run whose end was not reported yet.
        for id in sorted(worker.watched - worker.reported):
            state = engine.runs.loaded(id)
            sys.stderr.write(
                f"WAITING {id}: loaded={state is not None}"
                f" run={getattr(state, 'run', None)}"
                f" end={getattr(getattr(state, 'driver', None), 'end', None)!r}"
                f" loading={engine.runs.is_loading(id)} owns={engine.owns(id)}"
                f" waiters={len(engine._results.get(id, []))} ended={id in engine._ends}\n"
            )
    sys.stderr.flush()


def outcome_of(value: Any = None, error: BaseException | None = None) -> Any:
    """A run's end as JSON: its value, or ``"raised TYPE"``."""
    if error is not None:
        return f"raised {type(error).__name__}"
    return value


class Worker:
    def __init__(self, engine: fusee.Engine) -> None:
        self.engine = engine
        self.watched: set[str] = set()
        self.reported: set[str] = set()
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
        self.reported.discard(id)
        try:
            value = await self.engine.get(id).result()
        except (fusee.WorkflowFailed, fusee.Cancelled, fusee.ChildFailed) as e:
            say(end=id, outcome=outcome_of(error=e))
        except Exception as e:
            say(err=f"result of {id}: {type(e).__name__}: {e}")
        else:
            say(end=id, outcome=outcome_of(value))
        self.reported.add(id)

    async def command(self, line: str) -> None:
        cmd = json.loads(line)
        op, id, key = cmd["op"], cmd["id"], cmd.get("key")
        run = self.engine.get(id)
        try:
            result: Any = None
            if op == "start":
                await self.engine.start(
                    cmd["workflow"],
                    id,
                    cmd["input"],
                    id_policy=fusee.IdPolicy.ATTACH,
                    queue=cmd.get("queue"),
                    key=cmd.get("qkey"),
                )
                self.watch(id)
            elif op == "signal":
                await run.signal(workload.msg, cmd["value"], dedup=key)
            elif op == "update":
                result = await run.update(workload.add, cmd["value"], id=key)
            else:
                await run.cancel("torture cancel")
        except fusee.FuseeError as e:
            if type(e).__name__ == "RunFinished" or "finished" in str(e) or "ended" in str(e):
                say(refused=op, id=id, key=key)
            elif op == "update" and "RunQueued" in f"{type(e).__name__}: {e}":
                # An update of a queued run is refused until it runs: not
                # acknowledged, so sent again later.
                say(queued=op, id=id, key=key)
            else:
                say(err=f"{op} {id} {key}: {type(e).__name__}: {e}")
            return
        except Exception as e:
            say(err=f"{op} {id} {key}: {type(e).__name__}: {e}")
            return
        say(ack=op, id=id, key=key, result=result)


async def main(target: str, step_log: str, life: int) -> None:
    if TRACE:
        logging.basicConfig(
            level=logging.DEBUG,
            format=f"%(asctime)s.%(msecs)03d L{life} %(message)s",
            datefmt="%H:%M:%S",
        )
        logging.getLogger("asyncio").setLevel(logging.WARNING)
    fd = os.open(step_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    # One write per line, with O_APPEND: a SIGKILL keeps every line written
    # (the page cache outlives the process), and lines never interleave.
    def log_step(key: str) -> None:
        os.write(fd, f"{life} {key}\n".encode())

    workload.step_log = log_step
    loop = asyncio.get_running_loop()
    # SIGUSR1: every task's stack on stderr (the harness asks when runs did not end).
    current: list[Worker | None] = [None]
    loop.add_signal_handler(signal.SIGUSR1, lambda: dump_tasks(current[0]))
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    # On Postgres, a short lease: a killed worker's runs move to the others
    # within seconds. Each life is a worker of its own name.
    engine = await fusee.Engine.open(
        target,
        workflows=workload.WORKFLOWS,
        queues=workload.queues(real_time=True),
        durability="fsync",
        park_after="100ms",
        lease=os.environ.get("FUSEE_TORTURE_LEASE", "2s"),
        worker=f"life-{life}",
    )
    worker = Worker(engine)
    current[0] = worker
    async for info in engine.list():
        if not info.id.endswith("-kid"):  # children are watched through their parents
            worker.watch(info.id)
    say(ready=1)
    while line := (await reader.readline()).decode().strip():
        worker.spawn(worker.command(line))
    for task in list(worker.tasks):
        task.cancel()
    await asyncio.gather(*worker.tasks, return_exceptions=True)
    await engine.close()
    os.close(fd)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
