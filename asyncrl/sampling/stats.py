"""Counters the engine keeps about its own work, read by benchmarks, metrics and traces."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class EngineStats:
    steps: int = 0
    step_seconds: float = 0.0
    busy_slot_steps: int = 0  # Σ over steps of slots decoding in that step
    prefill_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens served from a session's cached prefix
    prefill_seconds: float = 0.0
    completed: int = 0
    generated_tokens: int = 0
    publishes: int = 0

    def record_step(self, busy: int, seconds: float) -> None:
        self.steps += 1
        self.busy_slot_steps += busy
        self.step_seconds += seconds

    def record_prefill(self, computed: int, reused: int, seconds: float) -> None:
        self.prefill_tokens += computed
        self.reused_tokens += reused
        self.prefill_seconds += seconds
