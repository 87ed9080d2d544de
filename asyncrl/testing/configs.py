"""Tiny run configurations for tests: small enough to compile and run in seconds on a CPU."""

from __future__ import annotations

from asyncrl.config import ModelConfig, RunConfig, from_dict, load_config

MICRO_OVERRIDES: tuple[str, ...] = (
    "model.preset=micro",
    "env.max_context=256",
    # One prefill shape and one attention window (= max_context): an engine compiles two
    # programs instead of nine, and on the micro model the wider shapes cost nothing to run.
    # Tests of bucketing itself (tests/test_engine.py) set several.
    "rollout.prefill_buckets=[256]",
    "rollout.attention_windows=[256]",
    "rollout.max_tokens=32",
    "rollout.group_size=4",
    "rollout.max_concurrency=8",
    "rollout.engine_slots=8",
    "env.max_response_tokens=96",
    "learner.max_response_length=128",
    "learner.batch_size=8",
)


def micro_config(*overrides: str) -> RunConfig:
    """The micro model (≈0.1M parameters) with limits that fit it."""
    return load_config(None, [*MICRO_OVERRIDES, *overrides])


def model_config(preset: str = "micro", **fields: object) -> ModelConfig:
    return from_dict(ModelConfig, {"preset": preset, **fields})
