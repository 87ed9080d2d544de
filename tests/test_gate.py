"""The quality gate and held-out evaluation: intervals against hand-computed values, pass@k, the
failure breakdown of scripted episodes, the evaluation record, decide() on hand-built cases, the
champion registry, and the stage failing a damaged checkpoint."""

import asyncio
import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from asyncrl import records
from asyncrl.agents import ToolAgent
from asyncrl.config import EnvConfig
from asyncrl.config.ops import GateConfig
from asyncrl.envs.registry import build_environment
from asyncrl.gates.champion import ChampionRegistry, RegistryError
from asyncrl.gates.evaluation import EvalSummary, evaluate_heldout, summarize
from asyncrl.gates.failures import Failure, failure_of
from asyncrl.gates.quality import Estimate, decide, pass_at_k, quality_metrics, wilson
from asyncrl.metrics.intervals import wilson_mean
from asyncrl.metrics.plots import interval_series, learning_curve
from asyncrl.metrics.tracker import JsonlTracker, read_jsonl
from asyncrl.rollout.episode import EpisodeLimits
from asyncrl.testing.scripted_engine import ScriptedEngine
from asyncrl.testing.trajectories import fixed_trajectory
from asyncrl.tokenize import ByteTokenizer, ChatFormat
from asyncrl.types import FinishReason, SamplingParams, Task, ToolCall, TrajectoryStatus

CFG = GateConfig(min_solve_rate=0.3, max_regression=0.05, confidence=0.95)
HAND = 1e-4  # tolerance on interval ends computed by hand to 4 decimals


def test_wilson_interval_matches_hand_computation():
    e = wilson(8, 10, 0.95)  # p = 0.8, z = 1.95996
    z = 1.959964
    centre = (0.8 + z * z / 20) / (1 + z * z / 10)
    half = z * np.sqrt(0.8 * 0.2 / 10 + z * z / 400) / (1 + z * z / 10)
    assert e.value == 0.8
    assert e.low == pytest.approx(centre - half, abs=1e-6)
    assert e.high == pytest.approx(centre + half, abs=1e-6)
    assert wilson(0, 0, 0.95) == Estimate(0.0, 0.0, 1.0, 0)
    # Textbook values: 8/10 -> [0.4902, 0.9433]; 0/10 -> [0, z²/(n+z²)] = [0, 0.2775].
    assert (e.low, e.high) == pytest.approx((0.4902, 0.9433), abs=HAND)
    assert (wilson(0, 10, 0.95).low, wilson(0, 10, 0.95).high) == pytest.approx(
        (0, 0.2775), abs=HAND
    )
    assert (wilson(10, 10, 0.95).low, wilson(10, 10, 0.95).high) == pytest.approx(
        (0.7225, 1), abs=HAND
    )
    with pytest.raises(ValueError, match="successes"):
        wilson(11, 10, 0.95)


def test_wilson_ends_solve_the_score_equation():
    """(p̂ − p)² = z² p(1 − p) / n at both ends (away from the clamps at 0 and 1)."""
    z = 1.959964
    for successes, n in ((1, 7), (3, 9), (40, 100), (199, 200)):
        e = wilson(successes, n, 0.95)
        for p in (e.low, e.high):
            assert (e.value - p) ** 2 == pytest.approx(z * z * p * (1 - p) / n, rel=1e-6)


def test_wilson_mean_is_the_interval_over_units_of_their_mean():
    # Mean 0.625 over 4 tasks: centre (0.625 + z²/8) / (1 + z²/4) = 0.5637, half-width 0.3444.
    e = wilson_mean([1.0, 0.5, 0.0, 1.0], 0.95)
    assert (e.value, e.n) == (0.625, 4)
    assert (e.low, e.high) == pytest.approx((0.2194, 0.9081), abs=HAND)
    # Conservative: wider than Wilson over the 4·k episodes behind the same mean (k = 2 here).
    assert e.high - e.low > wilson(5, 8, 0.95).high - wilson(5, 8, 0.95).low
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        wilson_mean([1.5], 0.95)


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - (3 / 4) * (2 / 3))  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 0, 4)  # fewer samples than k: no estimate (it used to say 1.0)


def _ended(status, reward=0.0, well_formed=True):
    parts = (("exact_match", reward), ("format", 1.0 if well_formed else 0.0))
    return replace(fixed_trajectory(), status=status, reward=reward, reward_parts=parts)


def test_each_ending_fails_for_exactly_one_reason():
    S = TrajectoryStatus
    assert failure_of(_ended(S.COMPLETED, 1.0)) is None
    assert failure_of(_ended(S.COMPLETED)) == Failure.WRONG_ANSWER
    assert failure_of(_ended(S.COMPLETED, well_formed=False)) == Failure.MALFORMED_ANSWER
    assert failure_of(replace(_ended(S.COMPLETED), reward_parts=())) == Failure.WRONG_ANSWER
    expected = {
        S.TRUNCATED_STEPS: Failure.NO_ANSWER,
        S.TRUNCATED_TOKENS: Failure.TRUNCATED,
        S.INVALID_ACTION: Failure.MALFORMED_CALL,
        S.TOOL_ERROR: Failure.TOOL_ERROR,
        S.TIMEOUT: Failure.TIMEOUT,
        S.ENV_ERROR: Failure.ENV_ERROR,
        S.CANCELLED: Failure.CANCELLED,
    }
    assert set(expected) == set(S) - {S.COMPLETED}  # every other status has its reason
    for status, reason in expected.items():
        assert failure_of(_ended(status)) == reason


TOK = ByteTokenizer()
FMT = ChatFormat("chatml", TOK)
END = FMT.end_of_turn


def _answer(text):
    return [*TOK.encode(text), END], FinishReason.STOP


def _call(expression):
    call = ToolCall(name="calculator", arguments_json=json.dumps({"expression": expression}))
    return [*FMT.tool_call_tokens(call), END], FinishReason.STOP


# What the scripted model does on each task, greedy (T = 0) and on sample k (T > 0); the answer
# of every task is 4164. Greedy: 1 solved of 7. Sampled, 3 per task: c0 3/3, l2 1/3, others 0/3.
BEHAVIOUR = {
    "calculator/0": lambda greedy, k: _answer("4164"),  # solved
    "calculator/1": lambda greedy, k: _answer("12"),  # wrong_answer
    "calculator/2": lambda greedy, k: _answer("4164 (from the tools)"),  # malformed_answer
    "calculator/3": lambda greedy, k: _call("1+1"),  # tools until the step limit: no_answer
    "lookup/0": lambda greedy, k: _answer("9" * 300),  # past max_response_tokens: truncated
    "lookup/1": lambda greedy, k: ([FMT.call_open, *TOK.encode("{bad"), END], FinishReason.STOP),
    "lookup/2": lambda greedy, k: _answer("4164" if not greedy and k == 0 else "7"),
}


def _script(request):
    _, family, index, k = request.session.split("/")
    return BEHAVIOUR[f"{family}/{index}"](request.params.temperature == 0, int(k))


def _scripted_evaluation(samples=3) -> tuple[list[Task], EvalSummary]:
    tasks = [
        Task(id=name, family=name.split("/")[0], prompt="347*12=?", answer="4164")
        for name in BEHAVIOUR
    ]
    env = EnvConfig(malformed_tool_call="terminate")
    summary = asyncio.run(
        evaluate_heldout(
            ScriptedEngine(_script),
            tasks,
            make_env=lambda t: build_environment(t, env),
            make_agent=lambda: ToolAgent(FMT),
            limits=EpisodeLimits(max_steps=2, max_response_tokens=160),
            sampling=SamplingParams(max_tokens=400, temperature=1.0, stop_tokens=(END,)),
            samples=samples,
            confidence=0.95,
        )
    )
    return tasks, summary


def _counts(failures):
    return {str(reason): n for reason, n in failures if n}


def test_scripted_evaluation_counts_every_failure_and_its_rates_by_hand():
    _, s = _scripted_evaluation()
    assert (s.samples, s.temperature, s.episodes) == (3, 1.0, 7)
    assert _counts(s.overall.greedy_failures) == {
        "wrong_answer": 2,  # calculator/1, lookup/2
        "malformed_answer": 1,
        "no_answer": 1,
        "truncated": 1,
        "malformed_call": 1,
    }
    assert _counts(s.overall.sampled_failures) == {
        "wrong_answer": 3 + 2,
        "malformed_answer": 3,
        "no_answer": 3,
        "truncated": 3,
        "malformed_call": 3,
    }
    # Greedy 1/7: Wilson [0.0257, 0.5131]. Sampled pass@1: mean of c/3 = (1 + 1/3)/7 = 4/21, Wilson
    # over the 7 tasks [0.0420, 0.5583]. pass@3: (1 + 1)/7 (a task with c > 0 of n = k = 3 passes),
    # [0.0822, 0.6411].
    o = s.overall
    assert (o.greedy.value, o.greedy.n) == (1 / 7, 7)
    assert (o.greedy.low, o.greedy.high) == pytest.approx((0.0257, 0.5131), abs=HAND)
    assert (o.sampled.value, o.sampled.n) == (pytest.approx(4 / 21), 7)
    assert (o.sampled.low, o.sampled.high) == pytest.approx((0.0420, 0.5583), abs=HAND)
    assert o.pass_k.value == pytest.approx(2 / 7)
    assert (o.pass_k.low, o.pass_k.high) == pytest.approx((0.0822, 0.6411), abs=HAND)
    calc, look = s.families
    assert (calc.family, calc.tasks, look.family, look.tasks) == ("calculator", 4, "lookup", 3)
    assert (calc.greedy.value, calc.sampled.value, calc.pass_k.value) == (0.25, 0.25, 0.25)
    assert (look.greedy.value, look.pass_k.value) == (0.0, pytest.approx(1 / 3))
    assert look.sampled.value == pytest.approx(1 / 9)
    assert _counts(look.greedy_failures) == {"wrong_answer": 1, "truncated": 1, "malformed_call": 1}
    assert s.solve_rate == 1 / 7 and s.by_family == (("calculator", 0.25), ("lookup", 0.0))
    statuses = {str(k): n for k, n in s.statuses}
    assert statuses == {
        "completed": 4,
        "truncated_steps": 1,
        "truncated_tokens": 1,
        "invalid_action": 1,
    }


def test_the_evaluation_record_round_trips_and_its_row_feeds_the_curve(tmp_path):
    tasks, s = _scripted_evaluation()
    data = json.loads(json.dumps(records.encode(s)))
    assert records.decode(EvalSummary, data) == s
    greedy_only = summarize(tasks, [[t] for t in [_ended(TrajectoryStatus.COMPLETED)] * 7])
    assert greedy_only.overall.sampled is None and greedy_only.samples == 0
    assert records.decode(EvalSummary, records.encode(greedy_only)) == greedy_only
    row = s.row()
    assert row["failed/wrong_answer"] == 2 and row["failed_sampled/wrong_answer"] == 5
    assert (row["pass@k/lookup"], row["pass@k_low/lookup"]) == (
        s.families[1].pass_k.value,
        s.families[1].pass_k.low,
    )
    tracker = JsonlTracker(tmp_path / "metrics.jsonl")
    tracker.log(0, {"solve_rate": 0.25, "episodes": 8.0}, kind="eval")  # a row without intervals
    tracker.log(10, row, kind="eval")
    tracker.close()
    rows = read_jsonl(tmp_path / "metrics.jsonl", kind="eval")
    _, lows, highs = interval_series(rows, "solve_rate")
    old = wilson(2, 8, 0.95)  # the interval of an old row comes from its episodes
    assert lows == pytest.approx([100 * old.low, 100 * s.overall.greedy.low])
    assert highs == pytest.approx([100 * old.high, 100 * s.overall.greedy.high])
    _, lows, highs = interval_series(rows[1:], "pass@k")
    assert (lows, highs) == ([100 * s.overall.pass_k.low], [100 * s.overall.pass_k.high])
    assert learning_curve(tmp_path / "metrics.jsonl", tmp_path / "curve.png").stat().st_size > 0


def test_gate_metrics_carry_families_and_failure_rates():
    greedy = [[_ended(TrajectoryStatus.COMPLETED, 1.0)], [_ended(TrajectoryStatus.TIMEOUT)]]
    sampled = [
        [_ended(TrajectoryStatus.COMPLETED, 1.0)] * 2,
        [_ended(TrajectoryStatus.TIMEOUT)] * 2,
    ]
    two = [
        Task(id="a", family="calculator", prompt="", answer="1"),
        Task(id="b", family="lookup", prompt="", answer="1"),
    ]
    m = quality_metrics(greedy, sampled, 0.95, tasks=two)
    assert m["solve_rate"] == wilson(1, 2, 0.95)
    assert m["solve_rate/calculator"] == wilson(1, 1, 0.95)
    assert m["pass@k/lookup"] == wilson(0, 1, 0.95)
    assert m["failed/timeout"] == wilson(1, 2, 0.95) and m["failed/wrong_answer"].value == 0
    assert "solve_rate/calculator" not in quality_metrics(greedy, sampled, 0.95)


def rates(solve, n=400, **others):
    """A metric set whose rates have Wilson intervals for n episodes."""
    out = {"solve_rate": wilson(round(solve * n), n, 0.95)}
    for name, value in others.items():
        out[name] = wilson(round(value * n), n, 0.95)
    return out


def by_name(report):
    return {c.name: c for c in report.checks}


def test_decide_passes_a_candidate_as_good_as_the_champion():
    report = decide(rates(0.6, timeout_rate=0.01), rates(0.58, timeout_rate=0.01), CFG, "old")
    assert report.passed and report.champion == "old"
    assert {c.name for c in report.checks} >= {"solve_rate >= min_solve_rate"}


def test_decide_fails_below_the_absolute_bar():
    report = decide(rates(0.2), None, CFG)
    assert not report.passed
    assert [c.name for c in report.failed] == ["solve_rate >= min_solve_rate"]


def test_decide_fails_a_real_regression_and_names_it():
    report = decide(rates(0.45, timeout_rate=0.2), rates(0.7, timeout_rate=0.01), CFG, "old")
    failed = {c.name for c in report.failed}
    assert failed == {"solve_rate regression", "timeout_rate regression"}
    assert "beyond noise" in by_name(report)["solve_rate regression"].detail


def test_decide_ignores_a_drop_within_noise():
    # 5 points worse on 40 episodes: the interval of the difference reaches well past -0.05.
    report = decide(rates(0.55, n=40), rates(0.6, n=40), CFG, "old")
    assert report.passed
    # The same drop measured on 4000 episodes is within tolerance too (0.05 allowed)...
    assert decide(rates(0.55, n=4000), rates(0.6, n=4000), CFG, "old").passed
    # ...but 10 points on 4000 episodes is a regression.
    assert not decide(rates(0.5, n=4000), rates(0.6, n=4000), CFG, "old").passed


def test_decide_first_run_has_nothing_to_regress_against():
    report = decide(rates(0.5), None, CFG)
    assert report.passed and report.champion is None
    assert by_name(report)["solve_rate regression"].bound == "no champion yet"


def _model_dir(tmp_path, name, payload):
    d = tmp_path / name
    d.mkdir()
    (d / "model.safetensors").write_bytes(payload)
    (d / "config.json").write_text("{}")
    return d


def _digest(directory: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(directory.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_promotion_is_atomic_never_overwrites_and_rolls_back(tmp_path, where, request):
    uri = str(tmp_path / "champion")
    if where == "gcs":
        uri = f"{request.getfixturevalue('gcs_bucket')}/champion-{tmp_path.name}"
    registry = ChampionRegistry(uri)
    assert registry.current() is None  # first run
    a = _model_dir(tmp_path, "a", b"weights-a")
    b = _model_dir(tmp_path, "b", b"weights-b")
    registry.promote("run-a", a, {"solve_rate": {"value": 0.5}}, "k1")
    first = registry.current()
    assert first.run_id == "run-a" and first.previous is None
    registry.promote("run-b", b, {"solve_rate": {"value": 0.6}}, "k1")
    assert registry.current().run_id == "run-b" and registry.current().previous == "run-a"
    with pytest.raises(RegistryError, match="never overwritten"):
        registry.promote("run-a", b, {}, "k1")
    # The first champion's files are untouched by everything since.
    from asyncrl import storage

    assert storage.read_bytes(f"{first.model}/model.safetensors") == b"weights-a"
    back = registry.rollback()
    assert back.run_id == "run-a" and back.model == first.model
    with pytest.raises(RegistryError, match="nothing to roll back"):
        registry.rollback()


def test_the_gate_stage_fails_a_damaged_checkpoint_and_names_the_metrics(tmp_path):
    """A briefly trained micro model is the champion; the same weights perturbed are gated.

    The micro model learns in seconds to answer at once with a number (no tools: demonstrations
    with `warm_start.tool_fraction=0`), so it ends its episodes well-formed; damaged weights ramble.
    """
    from flax import nnx

    from asyncrl.model import build_model
    from asyncrl.model import hf_checkpoint as hf
    from asyncrl.run_layout import RunLayout
    from asyncrl.stages.promote import Decision, PromotionResult, promote
    from asyncrl.stages.quality_gate import GateResult, format_report, quality_gate
    from asyncrl.stages.train import TrainResult
    from asyncrl.stages.warm_start import warm_start
    from asyncrl.testing.configs import micro_config

    overrides = (
        "env.tasks=[calculator]",
        "warm_start.tool_fraction=0",
        "warm_start.steps=150",
        "warm_start.content_steps=50",
        "warm_start.lr=3e-3",
        "warm_start.batch_size=16",
        "env.heldout_size=16",
        "gate.samples_per_task=2",
        f"gate.champion={tmp_path / 'champion'}",
    )
    cfg = micro_config(*overrides)
    good = RunLayout.of(tmp_path / "good")
    warm_start(cfg, good)
    first = quality_gate(cfg, good)
    assert first.passed and first.champion is None  # the first run has no champion to beat
    # Per family too (informational): with one family, its rates are the overall ones.
    for name in ("solve_rate", "pass@1_sampled", "pass@k"):
        assert first.candidate[f"{name}/calculator"] == first.candidate[name]
    assert promote(cfg, good).decision == Decision.PROMOTED  # and becomes the champion
    assert promote(cfg, good).decision == Decision.ALREADY_CHAMPION  # a retried stage
    model = build_model(cfg.model, seed=0)
    hf.load_into(model, str(good.warm_start_model))
    rng = np.random.default_rng(0)
    params = nnx.state(model, nnx.Param)
    damaged = jax_tree_perturb(params, rng, scale=3.0)
    nnx.update(model, damaged)
    bad = RunLayout.of(tmp_path / "bad")
    hf.save(model, str(bad.warm_start_model))
    outcome = quality_gate(cfg, bad)
    assert not outcome.passed
    assert promote(cfg, bad).decision == Decision.GATE_FAILED
    assert bad.read(PromotionResult).promoted is False
    failed = {c.name for c in outcome.failed}
    assert failed and all(name.endswith("regression") for name in failed), format_report(outcome)
    saved = bad.read(GateResult)
    assert saved == outcome and saved.champion == "good"
    # The gain check reads the start the train stage recorded (its TrainResult): a model whose
    # recorded start is its own solve rate gained nothing, and only that check fails.
    start = first.candidate["solve_rate"].value
    good.write(
        TrainResult(
            model_dir=str(good.warm_start_model),
            steps=0,
            seconds=0.0,
            initial_solve_rate=start,
            final_solve_rate=start,
            groups_trained=0,
            groups_dropped_stale=0,
            groups_failed=0,
            groups_withdrawn=0,
            groups_no_signal=0,
            policy_lag_mean=0.0,
            policy_lag_max=0,
            learner_idle_fraction=0.0,
            curve="",
        )
    )
    again = quality_gate(micro_config(*overrides, "gate.min_gain=0.05"), good)
    assert [c.name for c in again.failed] == ["solve_rate gain over start >= min_gain"]


def jax_tree_perturb(params, rng, scale):
    import jax

    return jax.tree.map(
        lambda x: x + scale * np.std(np.asarray(x)) * rng.standard_normal(x.shape), params
    )


def test_decide_requires_the_configured_gain_over_the_starting_model():
    cfg = GateConfig(min_solve_rate=0.3, min_gain=0.2)
    assert by_name(decide(rates(0.6), None, cfg, start_solve_rate=0.35))[
        "solve_rate gain over start >= min_gain"
    ].passed
    report = decide(rates(0.5), None, cfg, start_solve_rate=0.35)
    assert [c.name for c in report.failed] == ["solve_rate gain over start >= min_gain"]
    unknown = by_name(decide(rates(0.6), None, cfg))["solve_rate gain over start >= min_gain"]
    assert not unknown.passed and unknown.value is None  # nothing recorded to compare with
    assert "solve_rate gain over start >= min_gain" not in by_name(decide(rates(0.6), None, CFG))
