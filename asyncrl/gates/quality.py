"""Quality metrics with confidence intervals, and the gate decision (pure functions).

`quality_metrics` reduces held-out episodes (greedy: one per task; sampled: k per task) to named
`Estimate`s, each with a confidence interval: rates use Wilson score intervals over episodes,
pass@k is the unbiased estimator (Chen et al. 2021) averaged over tasks with a normal interval over
tasks, means use a normal interval.

`decide(candidate, champion, cfg)` lists every check with its value, bound and verdict:
- absolute: the greedy solve rate must reach `min_solve_rate` (a hard bar on the estimate);
- gain (when `min_gain` > 0): it must exceed the solve rate of the model training started from by
  `min_gain` (a run that did not improve its starting model fails; no recorded start fails too);
- regression, per metric against the champion: a candidate fails only when the difference is
  worse than the tolerance beyond its interval (the whole interval of candidate − champion lies
  past −tolerance), so noise never fails a run and a real regression always shows up as one;
- first run (no champion): regression checks are recorded as passed, with the reason.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

from asyncrl.config.ops import GateConfig
from asyncrl.types import Trajectory, TrajectoryStatus

# Metrics and which way is better (+1 higher, -1 lower, 0 informational: never gated).
DIRECTION: dict[str, int] = {
    "solve_rate": +1,
    "pass@1_sampled": +1,
    "pass@k": +1,
    "mean_reward": +1,
    "format_error_rate": -1,
    "truncation_rate": -1,
    "timeout_rate": -1,
    "tool_error_rate": -1,
    "mean_turns": 0,
    "mean_tokens": 0,
}
TRUNCATED = {TrajectoryStatus.TRUNCATED_TOKENS, TrajectoryStatus.TRUNCATED_STEPS}


@dataclass(frozen=True, slots=True)
class Estimate:
    value: float
    low: float
    high: float
    n: int

    def to_json(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n}

    @classmethod
    def from_json(cls, d: Mapping[str, float]) -> Estimate:
        return cls(float(d["value"]), float(d["low"]), float(d["high"]), int(d["n"]))


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson(successes: int, n: int, confidence: float) -> Estimate:
    if n == 0:
        return Estimate(0.0, 0.0, 1.0, 0)
    z, p = _z(confidence), successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n)


def mean_interval(values: Sequence[float], confidence: float) -> Estimate:
    n = len(values)
    if n == 0:
        return Estimate(0.0, 0.0, 0.0, 0)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / max(n - 1, 1)
    half = _z(confidence) * math.sqrt(var / n)
    return Estimate(mean, mean - half, mean + half, n)


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn from n, of which c are correct, is correct)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _rate(flags: Sequence[bool], confidence: float) -> Estimate:
    return wilson(sum(flags), len(flags), confidence)


def _format_error(t: Trajectory) -> bool:
    parts = dict(t.reward_parts)
    return t.status == TrajectoryStatus.INVALID_ACTION or (
        t.status == TrajectoryStatus.COMPLETED and parts.get("format", 1.0) < 1.0
    )


def quality_metrics(
    greedy: Sequence[Sequence[Trajectory]],
    sampled: Sequence[Sequence[Trajectory]],
    confidence: float,
) -> dict[str, Estimate]:
    """Named estimates from per-task greedy and sampled episodes (same task order)."""
    g = [t for per in greedy for t in per]
    s = [t for per in sampled for t in per]
    both = g + s
    k = max((len(per) for per in sampled), default=1)
    per_task = [pass_at_k(len(per), sum(t.reward >= 1 for t in per), k) for per in sampled]
    return {
        "solve_rate": _rate([t.reward >= 1 for t in g], confidence),
        "pass@1_sampled": _rate([t.reward >= 1 for t in s], confidence),
        "pass@k": mean_interval(per_task, confidence),
        "mean_reward": mean_interval([t.reward for t in g], confidence),
        "format_error_rate": _rate([_format_error(t) for t in both], confidence),
        "truncation_rate": _rate([t.status in TRUNCATED for t in both], confidence),
        "timeout_rate": _rate([t.status == TrajectoryStatus.TIMEOUT for t in both], confidence),
        "tool_error_rate": _rate(
            [t.status == TrajectoryStatus.TOOL_ERROR for t in both], confidence
        ),
        "mean_turns": mean_interval([float(t.turns) for t in g], confidence),
        "mean_tokens": mean_interval([float(sum(t.loss_mask)) for t in g], confidence),
    }


def status_counts(results: Sequence[Sequence[Trajectory]]) -> dict[str, int]:
    return dict(collections.Counter(t.status.value for per in results for t in per))


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    name: str
    value: float | None  # None: nothing to measure (e.g. no recorded start)
    bound: str
    passed: bool
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class GateReport:
    passed: bool
    checks: tuple[Check, ...]
    champion: str | None  # the champion's run id, None on the first run

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)


def decide(
    candidate: Mapping[str, Estimate],
    champion: Mapping[str, Estimate] | None,
    cfg: GateConfig,
    champion_id: str | None = None,
    start_solve_rate: float | None = None,
) -> GateReport:
    checks = []
    solve = candidate["solve_rate"]
    checks.append(
        Check(
            name="solve_rate >= min_solve_rate",
            value=round(solve.value, 4),
            bound=f">= {cfg.min_solve_rate}",
            passed=solve.value >= cfg.min_solve_rate,
            detail=f"interval [{solve.low:.3f}, {solve.high:.3f}] over {solve.n} episodes",
        )
    )
    if cfg.min_gain > 0:
        known = start_solve_rate is not None
        checks.append(
            Check(
                name="solve_rate gain over start >= min_gain",
                value=round(solve.value - start_solve_rate, 4) if known else None,
                bound=f">= {cfg.min_gain}",
                passed=known and solve.value - start_solve_rate >= cfg.min_gain,
                detail=(
                    f"start {start_solve_rate:.4f} → {solve.value:.4f}"
                    if known
                    else "no recorded solve rate of the model training started from"
                ),
            )
        )
    z = _z(cfg.confidence)
    for name, direction in DIRECTION.items():
        if direction == 0 or name not in candidate:
            continue
        if champion is None or name not in champion:
            checks.append(
                Check(
                    name=f"{name} regression",
                    value=round(candidate[name].value, 4),
                    bound="no champion yet",
                    passed=True,
                    detail="first run: nothing to regress against",
                )
            )
            continue
        c, h = candidate[name], champion[name]
        # Signed improvement (positive = better) and its interval from the two intervals.
        diff = direction * (c.value - h.value)
        se = math.hypot((c.high - c.low) / (2 * z), (h.high - h.low) / (2 * z))
        upper = diff + z * se
        tol = cfg.max_regression
        passed = upper >= -tol
        checks.append(
            Check(
                name=f"{name} regression",
                value=round(c.value, 4),
                bound=f"champion {h.value:.4f}, tolerance {tol}",
                passed=passed,
                detail=(
                    f"change {diff:+.4f} (better is +), interval [{diff - z * se:+.4f}, "
                    f"{upper:+.4f}]" + ("" if passed else f": worse than -{tol} beyond noise")
                ),
            )
        )
    return GateReport(
        passed=all(c.passed for c in checks), checks=tuple(checks), champion=champion_id
    )
