"""The fusee side of the peer benchmark: W1, W2 (with W5's timings) and W3.

Runs in the project's venv, one workload per process, written against the
public API of DESIGN.md ("Public API"). Two stores: ``sqlite-fsync`` (the
embedded default in the directory it is given, ``durability="fsync"``),
``memory``, and ``postgres`` (``--url``, ``durability="fsync"``: one worker
on a Postgres database, run by bench/postgres.py).

The API is reached through the `Fusee` protocol below rather than a plain
``import fusee``, so that this file type-checks before the engine exists;
`load_fusee` turns an engine that is not there yet into ``EXIT_MISSING``
(the harness prints "fusee: not available (engine missing)"). Anything that
goes wrong once the API is there is a failure, reported as one.

    python -m peers.fusee_workloads W1 --store sqlite-fsync --dir DIR --steps 1000
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from peers._common import (
    WARMUP_PREFIX,
    WARMUP_STEPS,
    WARMUP_WORKFLOWS,
    StepClock,
    check_calls,
    emit,
    emit_missing,
    install_network_guard,
    latency_figures,
    parse_args,
)

WORKLOADS = ("W1", "W2", "W3")
STORES = ("sqlite-fsync", "memory", "postgres")

T = TypeVar("T")


# A workflow definition (fusee.WorkflowDef): the workloads only pass it on.
Workflow = Any


class Ctx(Protocol):
    """The slice of `fusee.Ctx` the workloads call."""

    def step(self, name: str, fn: Callable[..., Awaitable[T]], /) -> Awaitable[T]: ...


class Run(Protocol):
    def result(self) -> Awaitable[object]: ...


class Engine(Protocol):
    async def __aenter__(self) -> Engine: ...

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any, /) -> None: ...

    def start(self, workflow: Workflow, id: str, input: Any, /) -> Awaitable[Run]: ...

    def execute(self, workflow: Workflow, id: str, input: Any, /) -> Awaitable[object]: ...


class EngineClass(Protocol):
    def open(
        self, target: str, *, workflows: Sequence[Workflow], durability: str = ...
    ) -> Awaitable[Engine]: ...


WorkflowFn = Callable[[Ctx, Any], Awaitable[Any]]


class Fusee(Protocol):
    """The slice of the `fusee` module the workloads use (DESIGN.md, "Public API").

    The real module satisfies it (``f: Fusee = fusee`` type-checks), which is
    what keeps this file honest while it cannot import fusee directly.
    """

    @property
    def Engine(self) -> EngineClass: ...

    def workflow(self, name: str, /) -> Callable[[WorkflowFn], Workflow]: ...


class EngineMissing(Exception):
    """fusee, or the part of its API the benchmark needs, is not there yet."""


def load_fusee() -> Fusee:
    """Import fusee and check that its public API is there.

    Raises:
        EngineMissing: fusee does not import, or lacks a name the workloads use.
    """
    try:
        mod = importlib.import_module("fusee")
    except (ImportError, AttributeError) as e:
        # AttributeError too: while the engine is being written, a module
        # may name what a sibling does not define yet.
        raise EngineMissing(f"fusee does not import: {type(e).__name__}: {e}") from e
    missing = [n for n in ("workflow", "Ctx", "Engine") if not hasattr(mod, n)]
    if missing:
        raise EngineMissing(f"fusee {version_of(mod)} has no {', '.join(missing)}")
    return cast(Fusee, mod)


def version_of(mod: object) -> str:
    return str(getattr(mod, "__version__", "?"))


# Replaced after the warm-up, so only the timed run is counted.
clock = StepClock()


async def add_one(i: int) -> int:
    clock.tick()
    return i + 1


async def add_one_timed(k: int, i: int) -> int:
    clock.mark(k)
    return i + 1


@dataclass(frozen=True, slots=True)
class Workflows:
    w1: Workflow
    w2: Workflow
    w3: Workflow

    def all(self) -> list[Workflow]:
        return [self.w1, self.w2, self.w3]


def define(fusee: Fusee) -> Workflows:
    """The three workflows, defined once fusee is known to be there.

    Steps are written the way the design's examples write them, a lambda
    returning the coroutine (``i=i`` binds each gathered step to its own
    ``i``; a defaulted parameter is not taken for the `StepCtx`).
    """

    @fusee.workflow("w1")
    async def w1(ctx: Ctx, n: int) -> int:
        x = 0
        for i in range(n):
            x = await ctx.step("s", lambda i=i: add_one(i))
        return x

    # The input is [workflow number, steps]: the number keys W5's timings.
    @fusee.workflow("w2")
    async def w2(ctx: Ctx, job: list[int]) -> int:
        k, n = job
        x = 0
        for i in range(n):
            x = await ctx.step("s", lambda k=k, i=i: add_one_timed(k, i))
        return x

    @fusee.workflow("w3")
    async def w3(ctx: Ctx, n: int) -> list[int]:
        return list(
            await asyncio.gather(*(ctx.step("s", lambda i=i: add_one(i)) for i in range(n)))
        )

    return Workflows(w1, w2, w3)


async def workload(
    engine: Engine, wf: Workflows, name: str, prefix: str, workflows: int, steps: int
) -> None:
    if name == "W1":
        result = await engine.execute(wf.w1, f"{prefix}w1", steps)
        if result != steps:
            raise RuntimeError(f"W1 returned {result!r}, expected {steps}")
    elif name == "W2":
        # "Started at once": all starts issued together, as DBOS's side does.
        runs = await asyncio.gather(
            *(engine.start(wf.w2, f"{prefix}w2-{k}", [k, steps]) for k in range(workflows))
        )
        for run in runs:
            result = await run.result()
            if result != steps:
                raise RuntimeError(f"W2 returned {result!r}, expected {steps}")
    else:
        result = await engine.execute(wf.w3, f"{prefix}w3", steps)
        if result != list(range(1, steps + 1)):
            raise RuntimeError(f"W3 returned a wrong result: {result!r:.80}")


async def main(argv: list[str]) -> None:
    global clock
    install_network_guard()
    args = parse_args(argv, workloads=WORKLOADS, stores=STORES)
    try:
        fusee = load_fusee()
    except EngineMissing as e:
        emit_missing(str(e))
    wf = define(fusee)
    if args.store == "memory":
        opening = fusee.Engine.open("memory", workflows=wf.all())
    elif args.store == "postgres":
        # One worker holding every shard of a fresh database (bench/postgres.py).
        opening = fusee.Engine.open(args.url, workflows=wf.all(), durability="fsync")
    else:
        opening = fusee.Engine.open(args.directory, workflows=wf.all(), durability="fsync")
    async with await opening as engine:
        warm_steps = min(WARMUP_STEPS, args.steps)
        warm_workflows = min(WARMUP_WORKFLOWS, args.workflows)
        await workload(engine, wf, args.workload, WARMUP_PREFIX, warm_workflows, warm_steps)
        clock = StepClock()
        t0, c0 = time.perf_counter(), time.process_time()
        await workload(engine, wf, args.workload, "", args.workflows, args.steps)
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    total = args.steps * args.workflows
    extra: dict[str, float] = {}
    if args.workload == "W2":
        extra = latency_figures(clock.gaps_ms(args.workflows, args.steps))
    check_calls(clock, total)
    meta = {"system": "fusee", "version": version_of(fusee), "python": sys.version.split()[0]}
    emit(args, seconds, cpu_seconds, total, extra, meta)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
