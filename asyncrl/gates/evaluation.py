"""Held-out evaluation: the agent on a fixed task set through the same engine, agents and
environments as training, reduced to solve rates and the rates of every other ending.

Greedy evaluation runs each task once at temperature 0; sampled evaluation runs k samples per task.
Pure reduction (`summarize`) is separate from running the episodes (`run_episodes`).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from asyncrl.agents import Agent
from asyncrl.envs.base import Environment
from asyncrl.rollout.episode import Episode, EpisodeLimits, EpisodeSpec
from asyncrl.rollout.orchestrator import member_seed
from asyncrl.sampling.protocol import RolloutEngine
from asyncrl.types import SamplingParams, Task, Trajectory


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalSummary:
    episodes: int
    solve_rate: float  # share of episodes with reward 1 (pass@1 when one sample per task)
    mean_reward: float
    by_family: tuple[tuple[str, float], ...]
    statuses: tuple[tuple[str, int], ...]
    mean_turns: float
    mean_sampled_tokens: float


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


def summarize(tasks: Sequence[Task], results: Sequence[Sequence[Trajectory]]) -> EvalSummary:
    flat = [t for per_task in results for t in per_task]
    solved = [t.reward >= 1.0 for t in flat]
    families: dict[str, list[bool]] = collections.defaultdict(list)
    for task, per_task in zip(tasks, results, strict=True):
        families[task.family].extend(t.reward >= 1.0 for t in per_task)
    statuses = collections.Counter(t.status.value for t in flat)
    n = max(len(flat), 1)
    return EvalSummary(
        episodes=len(flat),
        solve_rate=sum(solved) / n,
        mean_reward=sum(t.reward for t in flat) / n,
        by_family=tuple(sorted((f, sum(v) / len(v)) for f, v in families.items())),
        statuses=tuple(sorted(statuses.items())),
        mean_turns=sum(t.turns for t in flat) / n,
        mean_sampled_tokens=sum(sum(t.loss_mask) for t in flat) / n,
    )
