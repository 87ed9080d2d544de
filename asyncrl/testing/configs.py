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


# The smallest engine the micro model allows (a replica that serves, not one that decodes much):
# one prefill shape and one decode window to compile.
TINY_ENGINE_OVERRIDES: tuple[str, ...] = (
    "env.max_context=64",
    "rollout.prefill_buckets=[16]",
    "rollout.attention_windows=[64]",
    "rollout.engine_slots=1",
    "rollout.max_concurrency=4",
    "rollout.max_tokens=16",
    "env.max_response_tokens=16",
    "learner.max_response_length=32",
)


def micro_config(*overrides: str) -> RunConfig:
    """The micro model (≈0.1M parameters) with limits that fit it."""
    return load_config(None, [*MICRO_OVERRIDES, *overrides])


def model_config(preset: str = "micro", **fields: object) -> ModelConfig:
    return from_dict(ModelConfig, {"preset": preset, **fields})
