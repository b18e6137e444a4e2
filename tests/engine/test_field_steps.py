"""A step's coroutine in the field: one asyncio task from its first line to its end.

User code binds things to its task (anyio's cancel scopes, hence every
``httpx.AsyncClient`` call; ``asyncio.timeout``) and reads context
variables: whichever way the executor runs an attempt (the first at once
once its gate is durable, a retry, a step with a timeout, a recovered run),
the code sees one task and the same context. Every test runs on every
store, live and after a crash, and with ``Retry(attempts=1)`` wherever a
bogus failure of the first attempt would otherwise be retried away.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
from collections import Counter
from typing import Any

import anyio
import pydantic
import pytest

import fusee

from .conftest import Host, assert_steps_ran_once

pytestmark = pytest.mark.asyncio

ONCE = fusee.Retry(attempts=1, on_exhausted="fail")
# Set by the workflow before its steps; read by the steps.
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


class Seen:
    """What each step saw: its task at its first line and after an await, and a context variable."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.tasks: list[tuple[str, int, bool, bool]] = []  # (step, attempt, has task, same task)
        self.values: list[tuple[str, int, str, str]] = []  # (step, attempt, first line, after)

    async def record(self, name: str, fail_first: bool = False) -> str:
        s = fusee.current_step()
        assert s is not None
        self.calls[name] += 1
        first = asyncio.current_task()
        before = REQUEST_ID.get()
        await asyncio.sleep(0)
        after = asyncio.current_task()
        self.tasks.append((name, s.attempt, first is not None, first is after))
        self.values.append((name, s.attempt, before, REQUEST_ID.get()))
        if fail_first and s.attempt == 1:
            raise ConnectionError(f"{name}: the first attempt fails")
        return name


def seen_workflow(seen: Seen) -> Any:
    @fusee.workflow("seen")
    async def wf(ctx: fusee.Ctx, request: str) -> list[str]:
        REQUEST_ID.set(request)
        # Partials of an async method: async steps, whose first attempt
        # starts at once (a lambda is sync until seen to return a coroutine).
        out = [await ctx.step("first", functools.partial(seen.record, "first"), retry=ONCE)]
        read_only = functools.partial(seen.record, "read-only")
        out.append(await ctx.step("read-only", read_only, read_only=True))
        retried = functools.partial(seen.record, "retried", fail_first=True)
        out.append(await ctx.step("retried", retried, retry=fusee.Retry(attempts=2, initial="1s")))
        # A step with a timeout runs in a task from its start.
        out.append(await ctx.step("timed", functools.partial(seen.record, "timed"), timeout="1h"))
        # A lambda around an async call, on the loop once seen to return a coroutine.
        out.append(await ctx.step("lambda", lambda: seen.record("lambda"), retry=ONCE))
        await ctx.sleep("nap", "1h")
        # After the crash: this step runs in the recovered run.
        recovered = functools.partial(seen.record, "recovered")
        out.append(await ctx.step("recovered", recovered, retry=ONCE))
        return out

    return wf


async def test_a_step_sees_one_task_and_the_workflows_context_on_every_path(host: Host) -> None:
    seen = Seen()
    wf = seen_workflow(seen)
    expected = ["first", "read-only", "retried", "timed", "lambda", "recovered"]
    async with host(workflows=[wf]) as t:
        run = await t.start(wf, "s-1", "req-7")
        # A step bounded on the engine's clock does not hold advance(): its
        # end is awaited here, then the run's records.
        while "lambda" not in [name for name, *_ in seen.tasks]:
            await t.advance("1s")
        await t.settle()
        assert list(seen.calls) == ["first", "read-only", "retried", "timed", "lambda"]
        await t.crash()
        await t.advance("1h")
        assert await t.get("s-1").result() == expected
        await t.crash()
        assert await run.result() == expected
    assert seen.calls == {
        "first": 1,
        "read-only": 1,
        "retried": 2,
        "timed": 1,
        "lambda": 1,
        "recovered": 1,
    }
    assert [(name, attempt) for name, attempt, _, _ in seen.tasks] == [
        ("first", 1),
        ("read-only", 1),
        ("retried", 1),
        ("retried", 2),
        ("timed", 1),
        ("lambda", 1),
        ("recovered", 1),
    ]
    assert all(has and same for _, _, has, same in seen.tasks), seen.tasks
    # The workflow's context variable, at the first line and after an await.
    assert {(first, after) for *_, first, after in seen.values} == {("req-7", "req-7")}


async def test_a_step_that_returns_at_once_sees_its_own_task(host: Host) -> None:
    tasks: list[asyncio.Task[Any] | None] = []

    async def at_once() -> int:
        tasks.append(asyncio.current_task())
        return len(tasks)

    @fusee.workflow("at-once")
    async def wf(ctx: fusee.Ctx) -> list[int]:
        return [await ctx.step(f"s{i}", at_once, retry=ONCE) for i in range(3)]

    async with host(workflows=[wf]) as t:
        assert await t.execute(wf, "a-1") == [1, 2, 3]
        await t.crash()
        assert await t.get("a-1").result() == [1, 2, 3]
        assert_steps_ran_once(t)
    # Each step's own task: not the committer's, not the test's, not none.
    assert all(task is not None for task in tasks)
    assert len({id(task) for task in tasks}) == 3


async def _anyio_scope() -> str:
    with anyio.CancelScope():
        await asyncio.sleep(0)
    with anyio.move_on_after(3600) as scope:
        await asyncio.sleep(0)
    return f"scope ok, cancelled={scope.cancelled_caught}"


async def _anyio_task_group() -> str:
    got: list[int] = []

    async def child(n: int) -> None:
        await asyncio.sleep(0)
        got.append(n)

    async with anyio.create_task_group() as tg:
        for n in range(3):
            tg.start_soon(child, n)
    return f"group ok: {sorted(got)}"


async def _asyncio_timeout() -> str:
    async with asyncio.timeout(3600):
        await asyncio.sleep(0)
    return "timeout ok"


BOUND = [
    pytest.param(_anyio_scope, "scope ok, cancelled=False", id="anyio-cancel-scope"),
    pytest.param(_anyio_task_group, "group ok: [0, 1, 2]", id="anyio-task-group"),
    pytest.param(_asyncio_timeout, "timeout ok", id="asyncio-timeout"),
]


@pytest.mark.parametrize(("body", "expected"), BOUND)
async def test_task_bound_code_succeeds_on_its_first_attempt(
    host: Host, body: Any, expected: str
) -> None:
    calls: list[str] = []

    async def step() -> str:
        calls.append("step")
        return str(await body())

    @fusee.workflow("bound")
    async def wf(ctx: fusee.Ctx) -> list[str]:
        first = await ctx.step("first", step, retry=ONCE)
        await ctx.sleep("nap", "1h")
        return [first, await ctx.step("second", step, retry=ONCE)]

    async with host(workflows=[wf]) as t:
        run = await t.start(wf, "b-1")
        await t.advance("1m")
        assert calls == ["step"]
        await t.crash()
        await t.advance("1h")
        assert await run.result() == [expected, expected]
        await t.crash()
        assert await t.get("b-1").result() == [expected, expected]
        assert calls == ["step", "step"]
        assert_steps_ran_once(t)


async def test_a_dropped_step_that_suspended_on_its_first_attempt_is_cancelled(
    host: Host,
) -> None:
    cancelled: list[bool] = []
    started = asyncio.Event()

    async def slow(s: fusee.StepCtx) -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(s.cancelled.is_set())
            raise
        return "never"

    @fusee.workflow("drop")
    async def wf(ctx: fusee.Ctx) -> str:
        i, _ = await fusee.select(ctx.step("slow", slow, retry=ONCE), ctx.sleep("nap", "1m"))
        return ["stepped", "slept"][i]

    async with host(workflows=[wf]) as t:
        run = await t.start(wf, "d-1")
        await started.wait()
        await t.advance("1m")
        assert await run.result() == "slept"
        await t.settle()
        assert cancelled == [True]
        await t.crash()
        assert await t.get("d-1").result() == "slept"
        assert cancelled == [True]


# --- result types through wrappers ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Tracking:
    number: str


class Parcel(pydantic.BaseModel):
    sku: str
    weight_g: int


class Shipping:
    """A service object, as user code has: its methods are the steps."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def label(self, shipment: str) -> Tracking:
        self.calls["label"] += 1
        return Tracking(f"T-{shipment}")

    def parcels(self, shipment: str) -> list[Parcel]:
        self.calls["parcels"] += 1
        return [Parcel(sku=f"{shipment}-{i}", weight_g=100 * i) for i in range(2)]

    async def by_carrier(self) -> dict[str, Tracking]:
        self.calls["by_carrier"] += 1
        return {"ups": Tracking("U-1")}

    def __call__(self, shipment: str) -> Parcel:
        self.calls["call"] += 1
        return Parcel(sku=shipment, weight_g=1)


def traced(fn: Any) -> Any:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        return await fn(*args, **kwargs)

    return wrapper


async def test_a_step_result_is_typed_through_partials_methods_wrappers_and_objects(
    host: Host,
) -> None:
    shipping = Shipping()

    @fusee.workflow("ship")
    async def ship(ctx: fusee.Ctx, shipment: str) -> list[str]:
        tracking = await ctx.step("label", functools.partial(shipping.label, shipment))
        parcels = await ctx.step("parcels", functools.partial(shipping.parcels, shipment))
        carriers = await ctx.step("carriers", traced(shipping.by_carrier))
        parcel = await ctx.step("call", functools.partial(shipping, shipment), inline=True)
        assert isinstance(tracking, Tracking)
        assert all(isinstance(p, Parcel) for p in parcels)
        assert isinstance(carriers["ups"], Tracking)
        assert isinstance(parcel, Parcel)
        return [tracking.number, *(p.sku for p in parcels), carriers["ups"].number, parcel.sku]

    expected = ["T-s-1", "s-1-0", "s-1-1", "U-1", "s-1"]
    async with host(workflows=[ship]) as t:
        assert await t.execute(ship, "sh-1", "s-1") == expected
        await t.crash()
        assert await t.get("sh-1").result() == expected
        assert_steps_ran_once(t)
    assert shipping.calls == {"label": 1, "parcels": 1, "by_carrier": 1, "call": 1}
