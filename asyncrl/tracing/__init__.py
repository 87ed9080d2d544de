"""Perfetto traces of the whole loop: the writer (process-wide tracer) and our reader/validator."""

from asyncrl.tracing.writer import (
    NullTracer,
    PerfettoTracer,
    Tracer,
    flow_id,
    get,
    install,
    span,
    tracing,
)

__all__ = [
    "NullTracer",
    "PerfettoTracer",
    "Tracer",
    "flow_id",
    "get",
    "install",
    "span",
    "tracing",
]
