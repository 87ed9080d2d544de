"""Expert demonstrations: the same tokens an agent produces when it acts like the expert."""

import asyncio

import pytest

from asyncrl.agents import ToolAgent
from asyncrl.config import EnvConfig
from asyncrl.envs.demonstrations import demonstration, expert_messages
from asyncrl.envs.registry import build_environment
from asyncrl.envs.tasks import calculator_task, lookup_task
from asyncrl.rollout.episode import Episode, EpisodeLimits, EpisodeSpec
from asyncrl.testing.scripted_engine import ScriptedEngine
from asyncrl.tokenize import ByteTokenizer, ChatFormat
from asyncrl.types import FinishReason, Role, SamplingParams, TrajectoryStatus

FMT = ChatFormat("chatml", ByteTokenizer())
TASKS = [calculator_task("train", 4), lookup_task("train", 4)]


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.family)
def test_demonstration_equals_an_episode_that_replays_the_expert(task):
    turns = [m for m in expert_messages(task) if m.role == Role.ASSISTANT]
    replies = [([*FMT.body(m), FMT.end_of_turn], FinishReason.STOP) for m in turns]
    counter = iter(replies)
    engine = ScriptedEngine(lambda request: next(counter))
    spec = EpisodeSpec(
        episode_id="e",
        group_id="g",
        task=task,
        sampling=SamplingParams(max_tokens=200, stop_tokens=FMT.stop_tokens),
    )
    env = build_environment(task, EnvConfig())
    traj = asyncio.run(Episode(spec, engine, ToolAgent(FMT), env, EpisodeLimits()).run())
    demo = demonstration(task, FMT)
    assert traj.status == TrajectoryStatus.COMPLETED and traj.reward == 1.0
    assert traj.tokens[: len(demo.tokens)] == demo.tokens
    assert traj.loss_mask[: len(demo.tokens)] == demo.loss_mask


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.family)
def test_content_mask_keeps_argument_values_and_answers_only(task):
    demo = demonstration(task, FMT, content_only=True)
    full = demonstration(task, FMT)
    assert demo.tokens == full.tokens
    assert all(f >= c for f, c in zip(full.loss_mask, demo.loss_mask, strict=True))
    kept = FMT.tok.decode([t for t, m in zip(demo.tokens, demo.loss_mask, strict=True) if m])
    values = []
    for m in expert_messages(task):
        if m.role == Role.ASSISTANT:
            values += [str(v) for c in m.tool_calls for v in c.arguments().values()]
            values += [m.content] if m.content else []
    assert kept == "".join(values)
