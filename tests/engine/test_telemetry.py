"""OpenTelemetry (fusee/engine/_telemetry.py): spans per run and attempt, metrics, traceparent.

Checked with the SDK's in-memory span exporter and metric reader, on every
store, live and after a crash.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import fusee
from fusee.engine._telemetry import Telemetry, caller_trace, use_providers
from fusee.record import Start, decode
from fusee.store import MemoryStore

from .conftest import Host

pytestmark = pytest.mark.asyncio

go = fusee.signal("go", int)
TRIES: dict[str, int] = {}


@dataclass
class Otel:
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    tracer: TracerProvider

    def finished(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        data = self.metrics.get_metrics_data()
        assert data is not None
        return [
            (dict(p.attributes or {}), getattr(p, "value", None) or getattr(p, "count", None))
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == metric
            for p in m.data.data_points
        ]


@pytest.fixture
def otel() -> Iterator[Otel]:
    TRIES.clear()
    spans = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(spans))
    metrics = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[metrics])
    with use_providers(tracer, meter):
        yield Otel(spans, metrics, tracer)
    tracer.shutdown()
    meter.shutdown()


@fusee.workflow("traced")
async def traced(ctx: fusee.Ctx, key: str) -> int:
    def flaky() -> int:
        TRIES[key] = TRIES.get(key, 0) + 1
        if TRIES[key] < 3:
            raise ConnectionError(f"try {TRIES[key]} fails")
        return 10

    a = await ctx.step("a", lambda: 1)
    b = await ctx.step("flaky", flaky, retry=fusee.Retry(attempts=5, initial="10ms"))
    got = await ctx.wait_for(go)
    assert got is not None
    return a + b + got + await ctx.step("last", lambda: 0)


@fusee.workflow("kid")
async def kid(ctx: fusee.Ctx) -> str:
    return await ctx.step("play", lambda: "ok")


@fusee.workflow("parent")
async def parent(ctx: fusee.Ctx) -> str:
    return await ctx.child(kid, f"{ctx.info.id}-kid")


async def test_a_run_has_a_span_and_each_attempt_its_own_under_it(host: Host, otel: Otel) -> None:
    async with host(workflows=[traced]) as t:
        run = await t.start(traced, "t-1", "t-1")
        await run.signal(go, 100)
        assert await run.result() == 111
    (run_span,) = otel.finished("fusee.run traced")
    assert run_span.attributes is not None
    assert run_span.attributes["fusee.run.id"] == "t-1"
    assert run_span.attributes["fusee.run.status"] == "completed"
    flaky = otel.finished("fusee.step flaky")
    assert [s.attributes["fusee.step.attempt"] for s in flaky if s.attributes] == [1, 2, 3]
    assert [s.status.status_code for s in flaky] == [StatusCode.ERROR] * 2 + [StatusCode.UNSET]
    assert [e.name for e in flaky[0].events] == ["exception"]
    steps = [s for s in otel.spans.get_finished_spans() if s.name.startswith("fusee.step")]
    assert len(steps) == 5
    for span in steps:
        assert span.parent is not None
        assert span.parent.span_id == run_span.context.span_id
        assert span.context.trace_id == run_span.context.trace_id


async def test_a_replayed_run_emits_no_second_span_for_what_it_had_done(
    host: Host, otel: Otel
) -> None:
    async with host(workflows=[traced]) as t:
        run = await t.start(traced, "t-2", "t-2")
        await t.settle()  # a and flaky done, waiting for go
        await t.crash()
        await run.signal(go, 1)
        assert await run.result() == 12
        await t.crash()  # the finished run is not loaded, nor traced, again
        assert await run.result() == 12
    names = [s.name for s in otel.spans.get_finished_spans()]
    assert names.count("fusee.step a") == 1
    assert names.count("fusee.step flaky") == 3
    assert names.count("fusee.step last") == 1
    # The span the crash interrupted is lost; the run's span after it says it
    # was loaded again: by recovery, or by the signal when its row said
    # "suspended" before the crash (recovery then leaves it parked).
    (run_span,) = otel.finished("fusee.run traced")
    assert run_span.attributes is not None
    assert run_span.attributes["fusee.run.loaded"] in ("recovered", "woken")
    (last,) = otel.finished("fusee.step last")
    assert last.parent is not None
    assert last.parent.span_id == run_span.context.span_id


async def test_the_callers_span_is_carried_on_start_into_the_run_and_its_children(
    host: Host, otel: Otel
) -> None:
    tracer = otel.tracer.get_tracer("test")
    async with host(workflows=[parent, kid]) as t:
        with tracer.start_as_current_span("request") as request:
            run = await t.start(parent, "p-1")
            assert caller_trace() is not None
        assert await run.result() == "ok"
        records = [decode(d) for _, d in await t.engine.store.load("p-1-kid")]
    start = records[0]
    assert isinstance(start, Start)
    assert start.meta is not None
    assert start.meta.trace
    (parent_span,) = otel.finished("fusee.run parent")
    (kid_span,) = otel.finished("fusee.run kid")
    trace_id = request.get_span_context().trace_id
    assert parent_span.parent is not None
    assert parent_span.parent.span_id == request.get_span_context().span_id
    assert kid_span.parent is not None
    assert kid_span.parent.span_id == parent_span.context.span_id
    assert {parent_span.context.trace_id, kid_span.context.trace_id} == {trace_id}


async def test_a_client_start_carries_the_callers_span(otel: Otel) -> None:
    tracer = otel.tracer.get_tracer("test")
    store = MemoryStore()
    await store.open()
    engine = fusee.Engine(store, [kid])
    await engine.recover()
    try:
        async with await fusee.Client.connect(store) as client:
            with tracer.start_as_current_span("web request") as request:
                run = await client.start(kid, "k-1")
            assert await run.result() == "ok"
    finally:
        await engine.close()
    (kid_span,) = otel.finished("fusee.run kid")
    assert kid_span.parent is not None
    assert kid_span.parent.span_id == request.get_span_context().span_id


async def test_metrics_count_steps_retries_commits_and_runs(host: Host, otel: Otel) -> None:
    async with host(workflows=[traced]) as t:
        run = await t.start(traced, "t-3", "t-3")
        await run.signal(go, 1)
        await run.result()
    steps = otel.points("fusee.steps")
    assert sum(v for attrs, v in steps if attrs["fusee.step.outcome"] == "ok") == 3
    assert sum(v for _, v in otel.points("fusee.step.retries")) == 2
    assert sum(v for _, v in otel.points("fusee.commits")) >= 1
    assert sum(v for _, v in otel.points("fusee.commit.duration")) >= 1
    runs = {attrs["fusee.status"]: v for attrs, v in otel.points("fusee.runs")}
    assert runs == {"started": 1, "completed": 1}


async def test_without_a_provider_a_run_carries_no_telemetry(host: Host) -> None:
    with use_providers(None, None):
        assert not Telemetry().is_on
        async with host(workflows=[traced]) as t:
            run = await t.start(traced, "t-4", "t-4")
            await t.settle()
            state = t.engine.runs.loaded("t-4")
            assert state is not None
            assert state.telemetry is None
            assert t.engine.committer.on_write is None
            await run.signal(go, 1)
            assert await run.result() == 12
        assert trace.get_current_span().get_span_context().is_valid is False


async def test_a_fork_opens_a_run_span_that_names_the_run_it_was_forked_from(
    host: Host, otel: Otel
) -> None:
    async with host(workflows=[kid]) as t:
        run = await t.start(kid, "k-1")
        await run.result()
        assert await (await run.fork("k-2", at=0)).result() == "ok"
    spans = {
        s.attributes["fusee.run.id"]: s for s in otel.finished("fusee.run kid") if s.attributes
    }
    forked = spans["k-2"].attributes
    assert forked is not None
    assert (forked["fusee.run.loaded"], forked["fusee.run.forked_from"]) == ("forked", "k-1")
    assert len(otel.finished("fusee.step play")) == 2
    runs = [(attrs["fusee.status"], v) for attrs, v in otel.points("fusee.runs")]
    assert sorted(runs) == [("completed", 2), ("started", 2)]


# --- one trace per run, through parking, waking, queues and crashes ------------------------------

mail = fusee.Queue("mail", concurrency=1)


@fusee.workflow("napper")
async def napper(ctx: fusee.Ctx) -> int:
    total = 0
    for i in range(3):
        # Parked after `park_after`, woken by its timer: a new stay each time.
        await ctx.sleep(f"nap-{i}", "1h")
        total += await ctx.step(f"work-{i}", lambda: 1)
    return total


@pytest.mark.parametrize(
    "queued", [pytest.param(False, id="direct"), pytest.param(True, id="queued")]
)
@pytest.mark.parametrize(
    "in_span", [pytest.param(False, id="no-caller-span"), pytest.param(True, id="caller-span")]
)
async def test_every_span_of_a_run_woken_and_recovered_shares_the_trace_of_its_start(
    host: Host, queued: bool, in_span: bool
) -> None:
    # Through public API only: the providers are handed to the engine.
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    caller = provider.get_tracer("test")
    async with host(workflows=[napper], queues=[mail], tracer_provider=provider) as t:
        with contextlib.ExitStack() as scope:
            request = (
                scope.enter_context(caller.start_as_current_span("request")) if in_span else None
            )
            run = await t.start(napper, "n-1", queue=mail if queued else None)
        await t.advance("2h30m")  # parked and woken twice, parked again
        assert not t.is_loaded("n-1")
        await t.crash()
        assert await run.result() == 3
        await t.crash()
        assert await run.result() == 3
    provider.shutdown()
    mine = [s for s in spans.get_finished_spans() if s.name != "request"]
    stays = [s for s in mine if s.name == "fusee.run napper"]
    loaded = [str((s.attributes or {}).get("fusee.run.loaded", "started")) for s in stays]
    # A stay per wake (its timers, and the dev profile's result() after the crash).
    assert loaded[0] == "started"
    assert len(loaded) >= 4
    assert set(loaded[1:]) <= {"woken", "recovered"}
    assert len([s for s in mine if s.name.startswith("fusee.step")]) == 3
    assert len({s.context.trace_id for s in mine}) == 1
    first = next(s for s in stays if "fusee.run.loaded" not in (s.attributes or {}))
    if request is not None:
        assert mine[0].context.trace_id == request.get_span_context().trace_id
        assert first.parent is not None
        assert first.parent.span_id == request.get_span_context().span_id
    else:
        # The run's first span roots its trace; its later stays hang under it.
        assert first.parent is None
        for stay in stays:
            assert stay is first or (stay.parent and stay.parent.span_id == first.context.span_id)


@fusee.workflow("rounds")
async def rounds(ctx: fusee.Ctx, n: int) -> int:
    await ctx.sleep("rest", "1h")  # parked, then woken
    await ctx.step("work", lambda: n)
    if n < 2:
        ctx.continue_as_new(n + 1)
    return n


async def test_the_runs_an_id_continues_as_new_share_the_trace_of_its_first_start(
    host: Host,
) -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    async with host(workflows=[rounds], tracer_provider=provider) as t:
        run = await t.start(rounds, "r-1", 0)
        await t.advance("90m")  # the second run is parked
        await t.crash()
        assert await run.result() == 2
        await t.crash()
        assert await run.result() == 2
    provider.shutdown()
    finished = spans.get_finished_spans()
    numbers = {(s.attributes or {}).get("fusee.run.number") for s in finished}
    assert numbers >= {1, 2, 3}
    assert len([s for s in finished if s.name == "fusee.step work"]) == 3
    assert len({s.context.trace_id for s in finished}) == 1


@fusee.workflow("parent-of-napper")
async def parent_of_napper(ctx: fusee.Ctx, queued: bool) -> int:
    return await ctx.child(napper, "n-child", queue=mail if queued else None)


@pytest.mark.parametrize(
    "queued", [pytest.param(False, id="direct"), pytest.param(True, id="queued")]
)
async def test_a_child_run_queued_or_not_shares_its_parents_trace(host: Host, queued: bool) -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    async with host(
        workflows=[parent_of_napper, napper], queues=[mail], tracer_provider=provider
    ) as t:
        run = await t.start(parent_of_napper, "p-1", queued)
        await t.advance("2h30m")  # the child parked and woken twice
        await t.crash()
        assert await run.result() == 3
        await t.crash()
        assert await run.result() == 3
    provider.shutdown()
    finished = spans.get_finished_spans()
    assert {s.name for s in finished} >= {"fusee.run parent-of-napper", "fusee.run napper"}
    assert len({s.context.trace_id for s in finished}) == 1
