"""Quality metrics with confidence intervals, and the gate decision (pure functions).

`quality_metrics` reduces held-out episodes (greedy: one per task; sampled: k per task) to named
`Estimate`s, each with a confidence interval (metrics/intervals.py): the greedy solve rate with the
Wilson interval over tasks; pass@1 at the gate's temperature and the unbiased pass@k (Chen et al.
2021), per-task means with the (conservative) Wilson interval over tasks; other rates Wilson over
episodes; means a normal interval. Given the tasks, the same three rates per family
(`solve_rate/<family>`, ...). The reasons the greedy episodes failed (gates/failures.py) come as
rates `failed/<reason>` (informational, never gated).

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

from asyncrl.config.ops import GateConfig
from asyncrl.gates.evaluation import ALL, summarize
from asyncrl.gates.failures import breakdown
from asyncrl.metrics.intervals import Estimate, mean_interval, pass_at_k, wilson, z_of
from asyncrl.types import Task, Trajectory, TrajectoryStatus

__all__ = ["Check", "Estimate", "GateReport", "decide", "pass_at_k", "quality_metrics", "wilson"]

# Metrics and which way is better (+1 higher, -1 lower, 0 informational: never gated). Metrics
# not listed (per family, failure reasons) are informational too.
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
    tasks: Sequence[Task] | None = None,
) -> dict[str, Estimate]:
    """Named estimates from per-task greedy and sampled episodes (same task order); per family
    too when `tasks` are given."""
    g = [t for per in greedy for t in per]
    s = [t for per in sampled for t in per]
    both = g + s
    anonymous = [Task(id=str(i), family=ALL, prompt="", answer="") for i in range(len(greedy))]
    summary = summarize(
        anonymous if tasks is None else tasks, greedy, sampled, confidence=confidence
    )
    rates = summary.estimates()
    failed = {f"failed/{r}": wilson(n, len(g), confidence) for r, n in breakdown(g)}
    return {
        **{k: v for k, v in rates.items() if "/" not in k},
        "mean_reward": mean_interval([t.reward for t in g], confidence),
        "format_error_rate": _rate([_format_error(t) for t in both], confidence),
        "truncation_rate": _rate([t.status in TRUNCATED for t in both], confidence),
        "timeout_rate": _rate([t.status == TrajectoryStatus.TIMEOUT for t in both], confidence),
        "tool_error_rate": _rate(
            [t.status == TrajectoryStatus.TOOL_ERROR for t in both], confidence
        ),
        "mean_turns": mean_interval([float(t.turns) for t in g], confidence),
        "mean_tokens": mean_interval([float(sum(t.loss_mask)) for t in g], confidence),
        **{k: v for k, v in rates.items() if "/" in k and tasks is not None},
        **failed,
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
    z = z_of(cfg.confidence)
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
