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
        # `\d` and `$` also let through non-ASCII digits and one trailing newline: Fraction's
        # own parser reads those; a plain ASCII decimal skips it (a few µs per call, on every
        # episode's end).
        return _decimal(t) if t.isascii() and t[-1] != "\n" else Fraction(t)
    return t.casefold()


def _decimal(t: str) -> Fraction:
    """`Fraction(t)` for an ASCII `[-+]?digits(.digits)?`, computed as Fraction computes it
    (the whole and fractional digits read by `int` separately, so the same digit limit applies)."""
    sign = -1 if t[0] == "-" else 1
    whole, _, frac = (t[1:] if t[0] in "+-" else t).partition(".")
    if not frac:
        return Fraction(sign * int(whole))
    scale = 10 ** len(frac)
    return Fraction(sign * (int(whole) * scale + int(frac)), scale)


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
