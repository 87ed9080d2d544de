"""Held-out evaluation: the agent on a fixed task set through the same engine, agents and
environments as training, reduced to rates with confidence intervals and the reasons of failure.

Every evaluation runs each task once greedily (temperature 0) and, unless `samples` is 0, `samples`
times at `temperature` (1 in the default gate config). `summarize` reduces them, overall and per
task family, to the greedy solve rate (pass@1 at T = 0), pass@1 at the temperature and the
unbiased pass@k (k = `samples`), each with its interval (metrics/intervals.py), and to the failure
breakdown of the greedy and of the sampled episodes (gates/failures.py). Running the episodes
(`run_episodes`, `evaluate_heldout`) is separate from the pure reduction (`summarize`).
`EvalSummary` is a frozen record that round-trips through `asyncrl.records`; `row()` flattens it
into the numbers the tracker logs and the learning curve plots (metrics/plots.py).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from asyncrl.agents import Agent
from asyncrl.envs.base import Environment
from asyncrl.gates.failures import FailureCounts, breakdown, solved
from asyncrl.metrics.intervals import Estimate, pass_at_k, wilson, wilson_mean
from asyncrl.rollout.episode import Episode, EpisodeLimits, EpisodeSpec
from asyncrl.rollout.orchestrator import member_seed
from asyncrl.sampling.protocol import RolloutEngine
from asyncrl.types import SamplingParams, Task, Trajectory, TrajectoryStatus

ALL = "all"  # the family name of the overall rates


@dataclass(frozen=True, slots=True, kw_only=True)
class Rates:
    """One population's rates (every task, or one family's), each with its interval."""

    family: str  # a task family, or ALL
    tasks: int
    greedy: Estimate  # solve rate at temperature 0 (one episode per task; Wilson over tasks)
    sampled: Estimate | None  # pass@1 at the temperature: mean over tasks of c/k (wilson_mean)
    pass_k: Estimate | None  # unbiased pass@k averaged over tasks (wilson_mean)
    greedy_failures: FailureCounts  # failed greedy episodes by reason
    sampled_failures: FailureCounts  # failed sampled episodes by reason (zeros without samples)


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalSummary:
    samples: int  # sampled episodes per task, the k of pass@k (0: greedy only)
    temperature: float  # of the sampled episodes
    confidence: float  # of every interval
    overall: Rates
    families: tuple[Rates, ...]  # sorted by family name
    mean_reward: float  # greedy episodes
    mean_turns: float  # greedy episodes
    mean_sampled_tokens: float  # greedy episodes
    statuses: tuple[tuple[TrajectoryStatus, int], ...]  # greedy episodes per status

    @property
    def episodes(self) -> int:
        """Greedy episodes (one per task)."""
        return self.overall.tasks

    @property
    def solve_rate(self) -> float:
        """The greedy solve rate (pass@1 at temperature 0)."""
        return self.overall.greedy.value

    @property
    def by_family(self) -> tuple[tuple[str, float], ...]:
        """Greedy solve rate per family."""
        return tuple((r.family, r.greedy.value) for r in self.families)

    def estimates(self) -> dict[str, Estimate]:
        """Every rate by name: `solve_rate`, `pass@1_sampled`, `pass@k`, and the same names
        suffixed `/<family>` per family."""
        out = {}
        for r in (self.overall, *self.families):
            suffix = "" if r.family == ALL else f"/{r.family}"
            named = (("solve_rate", r.greedy), ("pass@1_sampled", r.sampled), ("pass@k", r.pass_k))
            out.update({name + suffix: e for name, e in named if e is not None})
        return out

    def row(self) -> dict[str, float]:
        """Flat numbers for the tracker: each estimate as `<name>`, `<name>_low`, `<name>_high`
        (family ones as `<name>/<family>`, `<name>_low/<family>`, ...), failure counts as
        `failed/<reason>` and `failed_sampled/<reason>`, greedy statuses as `status/<status>`."""
        out = {
            "tasks": float(self.overall.tasks),
            "episodes": float(self.episodes),
            "samples": float(self.samples),
            "temperature": self.temperature,
            "confidence": self.confidence,
            "mean_reward": self.mean_reward,
        }
        for key, e in self.estimates().items():
            name, _, family = key.partition("/")
            suffix = f"/{family}" if family else ""
            out[key] = e.value
            out[f"{name}_low{suffix}"] = e.low
            out[f"{name}_high{suffix}"] = e.high
        out.update({f"failed/{r}": float(n) for r, n in self.overall.greedy_failures})
        if self.samples:
            out.update({f"failed_sampled/{r}": float(n) for r, n in self.overall.sampled_failures})
        out.update({f"status/{s}": float(n) for s, n in self.statuses})
        return out


def _rates(
    family: str,
    greedy: Sequence[Trajectory],
    sampled: Sequence[Sequence[Trajectory]],
    samples: int,
    confidence: float,
) -> Rates:
    has_samples = samples > 0
    per_task = [(len(s), sum(map(solved, s))) for s in sampled] if has_samples else []
    return Rates(
        family=family,
        tasks=len(greedy),
        greedy=wilson(sum(map(solved, greedy)), len(greedy), confidence),
        sampled=wilson_mean([c / n for n, c in per_task], confidence) if has_samples else None,
        pass_k=(
            wilson_mean([pass_at_k(n, c, samples) for n, c in per_task], confidence)
            if has_samples
            else None
        ),
        greedy_failures=breakdown(greedy),
        sampled_failures=breakdown(t for s in sampled for t in s),
    )


def summarize(
    tasks: Sequence[Task],
    greedy: Sequence[Sequence[Trajectory]],
    sampled: Sequence[Sequence[Trajectory]] = (),
    *,
    temperature: float = 1.0,
    confidence: float = 0.95,
) -> EvalSummary:
    """Reduce per-task episodes (same order as `tasks`): one greedy episode per task, and k
    sampled ones per task (none at all: a greedy-only summary)."""
    if any(len(g) != 1 for g in greedy) or len(greedy) != len(tasks):
        raise ValueError("summarize takes exactly one greedy episode per task")
    samples = len(sampled[0]) if sampled else 0
    if sampled and (len(sampled) != len(tasks) or any(len(s) != samples for s in sampled)):
        raise ValueError("summarize takes the same number of sampled episodes for each task")
    flat = [g[0] for g in greedy]
    per_family: dict[str, list[int]] = collections.defaultdict(list)
    for i, task in enumerate(tasks):
        per_family[task.family].append(i)

    def rates(family: str, idx: Sequence[int]) -> Rates:
        chosen = [sampled[i] for i in idx] if sampled else []
        return _rates(family, [flat[i] for i in idx], chosen, samples, confidence)

    n = max(len(flat), 1)
    statuses = collections.Counter(t.status for t in flat)
    return EvalSummary(
        samples=samples,
        temperature=temperature,
        confidence=confidence,
        overall=rates(ALL, range(len(flat))),
        families=tuple(rates(f, idx) for f, idx in sorted(per_family.items())),
        mean_reward=sum(t.reward for t in flat) / n,
        mean_turns=sum(t.turns for t in flat) / n,
        mean_sampled_tokens=sum(sum(t.loss_mask) for t in flat) / n,
        statuses=tuple(sorted(statuses.items())),
    )


async def run_episodes(
    engine: RolloutEngine,
    tasks: Sequence[Task],
    *,
    make_env: Callable[[Task], Environment],
    make_agent: Callable[[], Agent],
    limits: EpisodeLimits,
    sampling: SamplingParams,
    samples: int = 1,
    concurrency: int = 64,
    seed: int = 0,
    tag: str = "eval",
) -> list[list[Trajectory]]:
    """`samples` episodes per task (distinct seeds), up to `concurrency` at once."""
    gate = asyncio.Semaphore(concurrency)

    async def one(task: Task, k: int) -> Trajectory:
        async with gate:
            spec = EpisodeSpec(
                episode_id=f"{tag}/{task.id}/{k}",
                group_id=f"{tag}/{task.id}",
                task=task,
                sampling=replace(sampling, seed=member_seed(seed, task.id, k, 0)),
            )
            return await Episode(spec, engine, make_agent(), make_env(task), limits).run()

    flat = await asyncio.gather(*(one(t, k) for t in tasks for k in range(samples)))
    return [list(flat[i * samples : (i + 1) * samples]) for i in range(len(tasks))]


async def evaluate_heldout(
    engine: RolloutEngine,
    tasks: Sequence[Task],
    *,
    make_env: Callable[[Task], Environment],
    make_agent: Callable[[], Agent],
    limits: EpisodeLimits,
    sampling: SamplingParams,
    samples: int,
    confidence: float,
    concurrency: int = 64,
    seed: int = 0,
    tag: str = "eval",
) -> EvalSummary:
    """Greedy episodes of every task, then `samples` episodes per task at `sampling`'s
    temperature (0: greedy only), summarized."""
    if samples < 0 or (samples and sampling.temperature <= 0):
        raise ValueError(f"samples={samples} at temperature={sampling.temperature}")
    common = dict(
        make_env=make_env,
        make_agent=make_agent,
        limits=limits,
        concurrency=concurrency,
        seed=seed,
    )
    greedy_params = replace(sampling, temperature=0.0)
    greedy = await run_episodes(
        engine, tasks, sampling=greedy_params, samples=1, tag=f"{tag}-greedy", **common
    )
    sampled = []
    if samples:
        sampled = await run_episodes(
            engine, tasks, sampling=sampling, samples=samples, tag=f"{tag}-sampled", **common
        )
    return summarize(
        tasks, greedy, sampled, temperature=sampling.temperature, confidence=confidence
    )
