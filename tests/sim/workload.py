"""The simulator's workflows and queues: steps with retries, fan-out, timers, signals, children.

Every knob (how often a step fails, how long it takes to finish, how long a
timer sleeps) comes in the run's input, which the seed chose: the workflows
themselves hold no randomness, so replay sees the same code path.

The rule: a step's outcome depends only on its input and `StepCtx.attempt`,
never on anything the simulator changes later, so a step run again after a
crash returns what it returned before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import fusee

__all__ = [
    "WORKFLOWS",
    "add",
    "expected_of_sender",
    "expected_of_steps",
    "msg",
    "queues",
    "sim_cancellable",
    "sim_inbox",
    "sim_parent",
    "sim_sender",
    "sim_steps",
    "sim_tree",
    "step_log",
    "tree_ids",
]

msg = fusee.signal("msg", int)
"""An item for `sim_inbox` (a value of 0 or more), or -1: stop and return."""

add = fusee.update("add", int)
"""Adds to `sim_inbox`'s total; returns the new total."""

STOP = -1

step_log: Callable[[str], None] | None = None
"""Called with `StepCtx.key` as each step attempt starts, when set (the torture's
worker sets it to keep a log outside the store; the simulator reads
`TestEngine.step_log` instead)."""


async def work(s: fusee.StepCtx, value: int, fails: int, turns: int) -> int:
    """A step body: fails its first ``fails`` attempts, then takes ``turns`` loop turns.

    The turns let steps started together finish in a seed-chosen order.
    """
    if step_log is not None:
        step_log(s.key)
    for _ in range(turns):
        await asyncio.sleep(0)
    if s.attempt <= fails:
        raise RuntimeError(f"seeded failure of attempt {s.attempt}")
    return value


def _retry(fails: int) -> fusee.Retry:
    # Enough attempts that a seeded failure never pauses the run.
    return fusee.Retry(attempts=fails + 2, initial="1s", backoff=2.0, max_interval="20s")


def _step(ctx: fusee.Ctx, name: str, spec: dict[str, Any]) -> asyncio.Future[int]:
    value, fails, turns = spec["value"], spec["fails"], spec["turns"]

    # An async function, not a lambda returning a coroutine: the engine then
    # runs it on the loop (no thread), so a seed's interleaving repeats.
    async def body(s: fusee.StepCtx) -> int:
        return await work(s, value, fails, turns)

    return ctx.step(name, body, retry=_retry(fails))


def _constant(ctx: fusee.Ctx, name: str, value: int) -> asyncio.Future[int]:
    async def body(s: fusee.StepCtx) -> int:
        if step_log is not None:
            step_log(s.key)
        return value

    return ctx.step(name, body)


def expected_of_steps(spec: dict[str, Any]) -> int:
    """What `sim_steps` returns for ``spec``."""
    return sum(int(s["value"]) for s in [*spec["steps"], *spec["fan"]])


@fusee.workflow("sim_steps")
async def sim_steps(ctx: fusee.Ctx, spec: dict[str, Any]) -> int:
    """Steps one after another with sleeps between, then a fan-out of steps at once."""
    total = 0
    for i, step in enumerate(spec["steps"]):
        total += await _step(ctx, f"s{i}", step)
        if spec["sleeps"][i]:
            await ctx.sleep(f"nap{i}", spec["sleeps"][i])
    fanned = await asyncio.gather(*[_step(ctx, f"f{i}", s) for i, s in enumerate(spec["fan"])])
    return total + sum(fanned)


@fusee.workflow("sim_parent")
async def sim_parent(ctx: fusee.Ctx, spec: dict[str, Any]) -> int:
    """A step, then a child `sim_steps` (through the queue ``kid_queue`` names, if any), a step."""
    first = await _step(ctx, "before", spec["before"])
    kid_id = f"{ctx.info.id}-kid"
    queue = spec.get("kid_queue")
    if queue is None:
        kid = await ctx.child(sim_steps, kid_id, spec["child"])
    else:
        kid = await ctx.child(sim_steps, kid_id, spec["child"], queue=queue)
    return first + kid + await _step(ctx, "after", spec["after"])


@fusee.workflow("sim_inbox")
async def sim_inbox(ctx: fusee.Ctx, state: dict[str, Any]) -> dict[str, Any]:
    """Collects `msg` items until a stop, continuing as new every ``per`` items.

    `add` updates add to a total carried across runs. Returns the items
    received (sorted) and the total.
    """
    got: list[int] = list(state["got"])
    total = [int(state["total"])]

    def on_add(value: int) -> int:
        total[0] += value
        return total[0]

    ctx.on_update(add, on_add)
    fresh = 0
    while True:
        value = await ctx.wait_for(msg)
        if value is None or value == STOP:
            return {"got": sorted(got), "total": total[0]}
        got.append(value)
        fresh += 1
        if fresh >= state["per"]:
            await _constant(ctx, "checkpoint", len(got))
            ctx.continue_as_new({"got": got, "total": total[0], "per": state["per"]})


@fusee.workflow("sim_cancellable")
async def sim_cancellable(ctx: fusee.Ctx, spec: dict[str, Any]) -> int:
    """A step, a long sleep, a step; cancelled, it runs a compensation step and re-raises."""
    done = await _step(ctx, "book", spec["book"])
    try:
        await ctx.sleep("hold", spec["hold"])
        return done + await _step(ctx, "confirm", spec["confirm"])
    except fusee.Cancelled:
        await _constant(ctx, "refund", done)
        raise


@fusee.workflow("sim_box")
async def sim_box(ctx: fusee.Ctx) -> int:
    """Waits for one `msg` item and returns it."""
    return await ctx.wait_for(msg) or 0


@fusee.workflow("sim_sender")
async def sim_sender(ctx: fusee.Ctx, spec: dict[str, Any]) -> int:
    """A step, then `ctx.send` of an item to an inbox, then a step: a message between runs.

    Its ``shape`` says how the send meets a child: ``"child_send"`` starts a
    `sim_box` child and sends it the item in the same turn (the box's start
    and the send in one outbox), adding what the box got; ``"after_child"``
    sends once a child `sim_steps` returned, adding its result.
    """
    first = await _step(ctx, "before", spec["before"])
    shape = spec.get("shape", "plain")
    got = 0
    if shape == "child_send":
        box = f"{ctx.info.id}-box"
        handle = ctx.child(sim_box, box)
        ctx.send(box, msg, spec["item"])
        got = await handle
    elif shape == "after_child":
        got = await ctx.child(sim_steps, f"{ctx.info.id}-kid", spec["child"])
    if shape != "child_send":
        ctx.send(spec["target"], msg, spec["item"])
    return first + got + await _step(ctx, "after", spec["after"])


def expected_of_sender(spec: dict[str, Any]) -> int:
    """What `sim_sender` returns for ``spec``."""
    want = int(spec["before"]["value"]) + int(spec["after"]["value"])
    shape = spec.get("shape", "plain")
    if shape == "child_send":
        want += int(spec["item"])
    elif shape == "after_child":
        want += expected_of_steps(spec["child"])
    return want


@fusee.workflow("sim_branch")
async def sim_branch(ctx: fusee.Ctx, spec: dict[str, Any]) -> int:
    """The middle of a `sim_tree`: waits for its attached `sim_cancellable` leaf."""
    return await ctx.child(sim_cancellable, f"{ctx.info.id}-leaf", spec)


@fusee.workflow("sim_tree")
async def sim_tree(ctx: fusee.Ctx, spec: dict[str, Any]) -> int:
    """A parent with a tree of attached children (branch, then leaf): a cancel goes down it."""
    return await ctx.child(sim_branch, f"{ctx.info.id}-branch", spec)


def tree_ids(id: str) -> list[str]:
    """The descendants of `sim_tree` run ``id``."""
    return [f"{id}-branch", f"{id}-branch-leaf"]


WORKFLOWS: list[fusee.WorkflowDef[Any, Any]] = [
    sim_steps,
    sim_parent,
    sim_inbox,
    sim_cancellable,
    sim_sender,
    sim_box,
    sim_branch,
    sim_tree,
]


def queues(*, real_time: bool = False) -> list[fusee.Queue]:
    """The queues some starts go through (`Workload` picks them; the engine is given these).

    ``simq`` bounds runs of any kind, two at a time (four on the torture's
    wall clock) and one per key, and its admissions per minute (per second
    on the wall clock);
    ``kidq`` holds the children of parents that ``simq`` admitted (a child
    waiting for its parent's own queue could wait forever); ``inboxq``
    holds inboxes, which run until the simulator stops them.
    """
    # On the wall clock, more at once: the torture's epochs drain their queues in seconds.
    concurrency, rate = (4, (20, "1s")) if real_time else (2, (4, "1m"))
    return [
        fusee.Queue("simq", concurrency=concurrency, per_key=1, rate=rate),
        fusee.Queue("kidq", concurrency=2),
        fusee.Queue("inboxq", concurrency=3),
    ]
