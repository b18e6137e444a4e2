"""OpenTelemetry for the engine: a span per run and per step attempt, and metrics.

Through the OpenTelemetry API only (the ``otel`` extra); the application
installs an SDK and its exporters, before it opens the engine, or hands the
engine its providers (``Engine.open(..., tracer_provider=, meter_provider=)``):
an engine looks for providers once, when it is made. With opentelemetry not
installed, or no tracer nor meter provider set then, nothing here runs past
one check per run (a flag; the run's `RunTelemetry` is None and the step
executor skips it), and commits are not timed.

What is emitted:

- ``fusee.run WORKFLOW``: a span per run's stay in this engine's memory, a
  child of the ``traceparent`` its `Start` carries (``Meta.trace``: the
  caller's current span in `Engine.start`, a Client caller's, kept with a
  queued run's item until its admission, or the parent run's span for a
  child; for a run started outside any span, its own first span, so that
  every stay of a run is in one trace). It ends when the run ends (status error for a
  failed run), when it is parked (``fusee.run.parked``) or when the engine
  closes. A run loaded again, after a crash or to wake it, opens a new span
  (``fusee.run.loaded`` says why: ``recovered`` or ``woken``) covering only
  what it does from then on: the part replayed from the journal is not
  emitted again, and the span a crash interrupted is lost with the process.
- ``fusee.step NAME``: a span per step attempt, a child of its run's span and
  the current span while the step function runs (so its own spans and
  outgoing calls nest under it). Each retry is its own span; an attempt that
  raised has status error and the exception as an event. A step replayed
  from the journal does not run, so it emits nothing.
- Metrics (meter ``fusee``): ``fusee.steps`` (steps done, by workflow, step
  and status), ``fusee.step.retries``, ``fusee.step.duration`` (s, per
  attempt), ``fusee.commits`` and ``fusee.commit.duration`` (s, per group
  commit), ``fusee.commit.records``, ``fusee.runs`` (by workflow and status:
  ``started`` and each end). `Telemetry.observe_queue_depth` is the hook for
  the queues' depth gauge.

The rule: telemetry only observes. Nothing here appends a record or changes
what a run does, so a run behaves the same with and without a provider.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from fusee.record import Start
from fusee.remote._trace import caller_trace

if TYPE_CHECKING:
    from fusee._runtime import StepCall
    from fusee.context import StepCtx

__all__ = ["RunTelemetry", "Telemetry", "caller_trace", "use_providers"]

try:
    from opentelemetry import context as _otel_context
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: Any = TraceContextTextMapPropagator()
    _AVAILABLE = True
except ImportError:  # the `otel` extra is not installed: telemetry is off
    _AVAILABLE = False

_SCOPE = "fusee"

# Providers that take precedence over OpenTelemetry's global ones (tests: the
# global providers can be set only once per process).
_overrides: dict[str, Any] = {}


@contextlib.contextmanager
def use_providers(tracer_provider: Any = None, meter_provider: Any = None) -> Iterator[None]:
    """Within the block, engines made use these providers instead of the global ones.

    A test hook: OpenTelemetry lets a process set its global providers once.

    Example:
        >>> with use_providers():
        ...     Telemetry().is_on
        False
    """
    saved = dict(_overrides)
    _overrides.update(tracer=tracer_provider, meter=meter_provider)
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)


def _tracer_provider() -> Any:
    if "tracer" in _overrides:
        return _overrides["tracer"]
    provider = _trace.get_tracer_provider()
    if isinstance(provider, _trace.ProxyTracerProvider | _trace.NoOpTracerProvider):
        return None
    return provider


def _meter_provider() -> Any:
    if "meter" in _overrides:
        return _overrides["meter"]
    provider = _metrics.get_meter_provider()
    # Until an application sets one, the API hands out its proxy (a no-op).
    if isinstance(provider, _metrics.NoOpMeterProvider) or type(provider).__name__.startswith(
        "_Proxy"
    ):
        return None
    return provider


def _traceparent(span_context_of: Any) -> bytes | None:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=span_context_of)
    value = carrier.get("traceparent")
    return value.encode() if value else None


def _context_of(trace: bytes | None) -> Any:
    if not trace:
        return None
    return _PROPAGATOR.extract({"traceparent": trace.decode(errors="replace")})


class _Instruments:
    """The metric instruments of one meter provider."""

    def __init__(self, provider: Any) -> None:
        meter = provider.get_meter(_SCOPE)
        self.meter = meter
        self.steps = meter.create_counter("fusee.steps", description="steps done, by status")
        self.retries = meter.create_counter(
            "fusee.step.retries", description="failed step attempts followed by a retry or pause"
        )
        self.step_s = meter.create_histogram(
            "fusee.step.duration", unit="s", description="the run time of each step attempt"
        )
        self.commits = meter.create_counter("fusee.commits", description="group commits")
        self.commit_s = meter.create_histogram(
            "fusee.commit.duration", unit="s", description="the time of each group commit"
        )
        self.records = meter.create_counter(
            "fusee.commit.records", description="records written by group commits"
        )
        self.runs = meter.create_counter(
            "fusee.runs", description="runs started and ended, by status"
        )


class Telemetry:
    """One engine's telemetry: the providers it found when made, and its commits.

    Example:
        >>> Telemetry().run(Start(1, "order-1", "checkout"), "started") is None
        True
    """

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        # Looked up once: asking OpenTelemetry for its providers reads the
        # environment, too much to do for every run.
        if _AVAILABLE and tracer_provider is None:
            tracer_provider = _tracer_provider()
        if _AVAILABLE and meter_provider is None:
            meter_provider = _meter_provider()
        self._tracer_provider = tracer_provider if _AVAILABLE else None
        meter_provider = meter_provider if _AVAILABLE else None
        self._instruments = _Instruments(meter_provider) if meter_provider is not None else None
        self.is_on = self._tracer_provider is not None or self._instruments is not None
        """Whether a tracer or meter provider was set when the engine was made."""
        self._queue_depth: list[Callable[[], Iterable[tuple[str, int]]]] = []

    def run(self, start: Start, how: str) -> RunTelemetry | None:
        """The telemetry of a run just started (``how``: ``started``) or loaded
        (``recovered``, ``woken``); None, costing nothing more, when off."""
        if not self.is_on:
            return None
        return RunTelemetry(start, how, self._tracer_provider, self._instruments)

    def caller_trace(self) -> bytes | None:
        """The ``traceparent`` of the caller's current span, for a run it starts (when tracing)."""
        if self._tracer_provider is None:
            return None
        return caller_trace()

    @contextlib.contextmanager
    def attached(self, trace: bytes | None) -> Iterator[None]:
        """Makes ``trace`` the current span's context in the block (a Client's start)."""
        if not _AVAILABLE or not trace:
            yield
            return
        token = _otel_context.attach(_context_of(trace))
        try:
            yield
        finally:
            _otel_context.detach(token)

    def commit_hook(self) -> Callable[[int, float], None] | None:
        """What the committer calls after each write (records, seconds); None when off."""
        return self.committed if self._instruments is not None else None

    def committed(self, records: int, seconds: float) -> None:
        """One group commit of ``records`` records took ``seconds``."""
        instruments = self._instruments
        if instruments is None:
            return
        instruments.commits.add(1)
        instruments.records.add(records)
        instruments.commit_s.record(seconds)

    def observe_queue_depth(self, source: Callable[[], Iterable[tuple[str, int]]]) -> None:
        """Reports ``source()``'s ``(queue name, runs waiting)`` pairs as ``fusee.queue.depth``.

        The hook for the queues: called once per queue set; a no-op when
        no meter provider is set.
        """
        instruments = self._instruments
        self._queue_depth.append(source)
        if instruments is None or len(self._queue_depth) > 1:
            return

        def observe(options: Any) -> Iterable[Any]:
            return [
                _metrics.Observation(depth, {"fusee.queue": name})
                for fn in self._queue_depth
                for name, depth in fn()
            ]

        instruments.meter.create_observable_gauge(
            "fusee.queue.depth", callbacks=[observe], description="runs waiting in each queue"
        )


class RunTelemetry:
    """The spans and metrics of one run's stay in memory (made by `Telemetry.run`)."""

    __slots__ = ("_attempts", "_instruments", "_tracer", "_workflow", "span")

    def __init__(self, start: Start, how: str, tracer_provider: Any, instruments: Any) -> None:
        self._workflow = start.wtype
        self._instruments: _Instruments | None = instruments
        self._attempts: dict[StepCtx, tuple[Any, float]] = {}
        self._tracer: Any = None
        self.span: Any = None
        if instruments is not None and how == "started":
            instruments.runs.add(1, {"fusee.workflow": start.wtype, "fusee.status": "started"})
        if tracer_provider is None:
            return
        self._tracer = tracer_provider.get_tracer(_SCOPE)
        attributes: dict[str, Any] = {
            "fusee.run.id": start.id,
            "fusee.run.number": start.run,
            "fusee.workflow": start.wtype,
        }
        if how != "started":
            attributes["fusee.run.loaded"] = how
        if start.parent is not None:
            attributes["fusee.run.parent"] = start.parent.id
        self.span = self._tracer.start_span(
            f"fusee.run {start.wtype}",
            context=_context_of(start.meta.trace if start.meta is not None else None),
            attributes=attributes,
        )

    def traceparent(self) -> bytes | None:
        """The ``traceparent`` of this run's span (for a child's `Start`)."""
        if self.span is None:
            return None
        return _traceparent(_trace.set_span_in_context(self.span))

    def attempt_started(self, call: StepCall, sctx: StepCtx) -> None:
        """Step ``call``'s attempt ``sctx`` begins (live: replayed steps do not run)."""
        span = None
        if self._tracer is not None:
            span = self._tracer.start_span(
                f"fusee.step {call.name}",
                context=_trace.set_span_in_context(self.span),
                attributes={
                    "fusee.step.name": call.name,
                    "fusee.step.seq": call.seq,
                    "fusee.step.attempt": sctx.attempt,
                    "fusee.step.key": sctx.key,
                },
            )
        self._attempts[sctx] = (span, time.perf_counter())

    def enter(self, sctx: StepCtx) -> object:
        """Makes attempt ``sctx``'s span the current one; returns what `leave` takes."""
        got = self._attempts.get(sctx)
        if got is None or got[0] is None:
            return None
        return _otel_context.attach(_trace.set_span_in_context(got[0]))

    def leave(self, token: object) -> None:
        """Undoes `enter`."""
        if token is not None:
            _otel_context.detach(token)  # type: ignore[arg-type]

    def attempt_ended(self, sctx: StepCtx, error: BaseException | None, outcome: str) -> None:
        """Attempt ``sctx`` ended: ``ok``, ``failed`` (for good), ``retry``, ``paused``,
        ``cancelled`` (the run no longer wants it) or ``waiting`` (an await_completion's
        token is out)."""
        got = self._attempts.pop(sctx, None)
        if got is None:
            return
        span, began = got
        instruments = self._instruments
        if instruments is not None:
            attrs = {"fusee.workflow": self._workflow, "fusee.step.outcome": outcome}
            instruments.step_s.record(time.perf_counter() - began, attrs)
            if outcome in ("ok", "failed"):
                instruments.steps.add(1, attrs)
            elif outcome in ("retry", "paused"):
                instruments.retries.add(1, attrs)
        if span is None:
            return
        span.set_attribute("fusee.step.outcome", outcome)
        if error is not None:
            span.record_exception(error)
            span.set_status(
                _trace.Status(_trace.StatusCode.ERROR, f"{type(error).__name__}: {error}")
            )
        span.end()

    def ended(self, status: str) -> None:
        """The run ended with ``status`` (a `fusee.RunStatus` value)."""
        if self._instruments is not None:
            self._instruments.runs.add(
                1, {"fusee.workflow": self._workflow, "fusee.status": status}
            )
        span, self.span = self.span, None
        if span is not None:
            span.set_attribute("fusee.run.status", status)
            if status == "failed":
                span.set_status(_trace.Status(_trace.StatusCode.ERROR, "the workflow failed"))
            span.end()

    def forked(self, from_id: str) -> None:
        """This run was just made as a fork of run ``from_id`` (its first load)."""
        if self._instruments is not None:
            self._instruments.runs.add(
                1, {"fusee.workflow": self._workflow, "fusee.status": "started"}
            )
        if self.span is not None:
            self.span.set_attribute("fusee.run.loaded", "forked")
            self.span.set_attribute("fusee.run.forked_from", from_id)

    def lose(self) -> None:
        """The process dies (a simulated crash): nothing in flight is emitted."""
        self.span = None
        self._tracer = None
        self._instruments = None
        self._attempts.clear()

    def unloaded(self, why: str) -> None:
        """The run leaves memory unfinished: ``parked``, or the engine ``closed``."""
        span, self.span = self.span, None
        if span is not None:
            span.set_attribute(f"fusee.run.{why}", True)
            span.end()
