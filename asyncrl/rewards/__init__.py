"""Reward functions: pure `(task, answer text) -> float`, no model, no I/O.

Answers are compared as numbers when both sides parse as numbers (so "391.0" matches "391"),
otherwise as trimmed, case-folded text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from fractions import Fraction

from asyncrl.types import Task

RewardFn = Callable[[Task, str], float]

_NUMBER = re.compile(r"^[-+]?\d+(\.\d+)?$")


def normalize(text: str) -> str | Fraction:
    t = text.strip().rstrip(".").replace(",", "")
    if _NUMBER.match(t):
        return Fraction(t)
    return t.casefold()


def exact_match(task: Task, answer: str) -> float:
    return 1.0 if normalize(answer) == normalize(task.answer) else 0.0


def format_ok(task: Task, answer: str) -> float:
    """1 when the answer is a bare number (the built-in tasks' answer format)."""
    return 1.0 if _NUMBER.match(answer.strip().replace(",", "")) else 0.0


def combined(weights: Mapping[str, float], parts: Mapping[str, RewardFn]) -> RewardFn:
    """Weighted sum of named reward functions."""

    def reward(task: Task, answer: str) -> float:
        return sum(weights[name] * fn(task, answer) for name, fn in parts.items())

    return reward


def reward_parts(task: Task, answer: str) -> tuple[tuple[str, float], ...]:
    """The built-in tasks' reward: exact match; the format part is reported, not rewarded."""
    return (("exact_match", exact_match(task, answer)), ("format", format_ok(task, answer)))
