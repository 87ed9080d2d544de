"""Expert demonstrations: the same tokens an agent produces when it acts like the expert."""

import asyncio

import pytest

from asyncrl.agents import ToolAgent
from asyncrl.config import EnvConfig
from asyncrl.envs.demonstrations import demonstration, expert_messages, privileged_messages
from asyncrl.envs.registry import build_environment
from asyncrl.envs.tasks import calculator_task, lookup_task
from asyncrl.rollout.episode import Episode, EpisodeLimits, EpisodeSpec
from asyncrl.testing.scripted_engine import ScriptedEngine
from asyncrl.tokenize import ByteTokenizer, ChatFormat
from asyncrl.types import FinishReason, Role, SamplingParams, TrajectoryStatus

FMT = ChatFormat("chatml", ByteTokenizer())
TASKS = [calculator_task("train", 4), lookup_task("train", 4)]


TEACHERS = {  # name: (the teacher's messages, the demonstration's mix)
    "bare": (expert_messages, {}),
    "verbose": (lambda task: expert_messages(task, verbose=True), {"verbose_fraction": 1.0}),
    "privileged": (privileged_messages, {"privileged_fraction": 1.0}),
}


@pytest.mark.parametrize("teacher", TEACHERS)
@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.family)
def test_demonstration_equals_an_episode_that_replays_the_teacher(task, teacher):
    messages, mix = TEACHERS[teacher]
    turns = [m for m in messages(task) if m.role == Role.ASSISTANT]
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
    demo = demonstration(task, FMT, **mix)
    assert traj.status == TrajectoryStatus.COMPLETED
    # The verifier wants the bare number; the privileged teacher's episodes are all correct.
    assert traj.reward == demo.reward == (0.0 if teacher == "verbose" else 1.0)
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


def test_the_mix_of_demonstrations_follows_the_configured_shares():
    tasks = [calculator_task("train", i) for i in range(400)]
    demos = [demonstration(t, FMT, tool_fraction=0.5, verbose_fraction=0.25) for t in tasks]
    texts = [FMT.tok.decode(list(d.tokens)) for d in demos]
    used = sum("<tool_call>" in t for t in texts)
    tools = used / len(texts)
    verbose = sum("(according to the tools)" in t for t in texts) / used
    assert abs(tools - 0.5) < 0.1 and abs(verbose - 0.25) < 0.1  # 400 fixed draws
    assert demos == [demonstration(t, FMT, tool_fraction=0.5, verbose_fraction=0.25) for t in tasks]


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.family)
def test_a_remark_is_trained_as_style_not_content(task):
    verbose = demonstration(task, FMT, content_only=True, verbose_fraction=1.0)
    bare = demonstration(task, FMT, content_only=True)
    kept = [t for t, m in zip(verbose.tokens, verbose.loss_mask, strict=True) if m]
    assert kept == [t for t, m in zip(bare.tokens, bare.loss_mask, strict=True) if m]
    full = demonstration(task, FMT, verbose_fraction=1.0)  # the whole-turn phase learns it
    assert "(according to the tools)" in FMT.tok.decode(
        [t for t, m in zip(full.tokens, full.loss_mask, strict=True) if m]
    )


def test_the_privileged_teacher_looks_up_one_item_and_changes_only_tasks_with_hidden_state():
    lookups = [lookup_task("train", i) for i in range(400)]
    demos = [demonstration(t, FMT, privileged_fraction=0.5) for t in lookups]
    calls = [FMT.tok.decode(list(d.tokens)).count('"name": "lookup"') for d in demos]
    assert set(calls) == {1, 2}
    assert abs(calls.count(1) / len(calls) - 0.5) < 0.1  # 400 fixed draws
    assert all(d.reward == 1.0 for d in demos)
    calculator = [calculator_task("train", i) for i in range(50)]
    assert [demonstration(t, FMT, privileged_fraction=1.0) for t in calculator] == [
        demonstration(t, FMT) for t in calculator
    ]
