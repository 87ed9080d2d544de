"""Estimates with confidence intervals (pure functions): Wilson score intervals for rates, the
unbiased pass@k estimator, a normal interval for unbounded means.

Rates of independent episodes (greedy: one episode per task) get the Wilson score interval: the
p with (p̂ − p)² ≤ z² p(1 − p) / n. Means of per-task values in [0, 1] (pass@1 at a temperature,
c/n per task; pass@k per task) get the same interval with n = the number of tasks
(`wilson_mean`): a value in [0, 1] with mean p has variance at most p(1 − p), so the interval is
conservative whatever the spread of difficulty between tasks. Wilson over the n·k sampled
episodes instead would treat the k samples of one task as independent and be too narrow when
tasks differ in difficulty, which they do. Unlike a normal interval, a Wilson interval stays
inside [0, 1] and keeps its width at 0 % and 100 %.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist


@dataclass(frozen=True, slots=True)
class Estimate:
    value: float
    low: float
    high: float
    n: int  # independent units behind the estimate (episodes, or tasks for per-task means)

    def to_json(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n}

    @classmethod
    def from_json(cls, d: Mapping[str, float]) -> Estimate:
        return cls(float(d["value"]), float(d["low"]), float(d["high"]), int(d["n"]))

    def text(self, rate: bool = True) -> str:
        """`12.5% [4.1, 30.2]` for a rate; a mean (reward, turns, tokens) in its own units."""
        if not rate:
            return f"{self.value:.3g} [{self.low:.3g}, {self.high:.3g}]"
        return f"{percent(self.value)} [{100 * self.low:.1f}, {100 * self.high:.1f}]"


def percent(x: float) -> str:
    return f"{100 * x:.1f}%"


def is_rate(name: str) -> bool:
    """Whether a metric named like the gate's (`solve_rate`, `pass@k/calculator`) is a rate."""
    base = name.partition("/")[0]
    return base.endswith("_rate") or base.startswith("pass@")


def z_of(confidence: float) -> float:
    """The two-sided standard-normal quantile of a confidence level (0.95 -> 1.95996)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def _wilson(p: float, n: int, confidence: float) -> Estimate:
    if n == 0:
        return Estimate(0.0, 0.0, 1.0, 0)
    z = z_of(confidence)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n)


def wilson(successes: int, n: int, confidence: float) -> Estimate:
    """Rate of `successes` in `n` independent trials, with its Wilson score interval."""
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} is not in [0, n={n}]")
    return _wilson(successes / n if n else 0.0, n, confidence)


def wilson_mean(values: Sequence[float], confidence: float) -> Estimate:
    """Mean of per-unit values in [0, 1], with the Wilson interval over the units (conservative)."""
    if any(not 0.0 <= v <= 1.0 for v in values):
        raise ValueError("wilson_mean takes values in [0, 1]")
    n = len(values)
    return _wilson(sum(values) / n if n else 0.0, n, confidence)


def mean_interval(values: Sequence[float], confidence: float) -> Estimate:
    """Mean with a normal interval (sample standard deviation); for unbounded quantities."""
    n = len(values)
    if n == 0:
        return Estimate(0.0, 0.0, 0.0, 0)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / max(n - 1, 1)
    half = z_of(confidence) * math.sqrt(var / n)
    return Estimate(mean, mean - half, mean + half, n)


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn from n, of which c are correct, is correct): the unbiased
    estimator 1 − C(n−c, k) / C(n, k) of Chen et al. (2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
