"""The caller's trace context, for a run it starts from another process.

Through the OpenTelemetry API only (the ``otel`` extra); without it, or
outside any span, a start carries no trace.
"""

from __future__ import annotations

from typing import Any

__all__ = ["caller_trace"]

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: Any = TraceContextTextMapPropagator()
    _AVAILABLE = True
except ImportError:  # the `otel` extra is not installed
    _AVAILABLE = False


def caller_trace() -> bytes | None:
    """The W3C ``traceparent`` of the caller's current span, or None (no span, no otel).

    Example:
        >>> caller_trace() is None
        True
    """
    if not _AVAILABLE or not _trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    value = carrier.get("traceparent")
    return value.encode() if value else None
