"""The quality gate: intervals, pass@k, decide() on hand-built cases, the champion registry, and
the stage failing a damaged checkpoint."""

import hashlib
from pathlib import Path

import numpy as np
import pytest

from asyncrl.config.ops import GateConfig
from asyncrl.gates.champion import ChampionRegistry, RegistryError
from asyncrl.gates.quality import Estimate, decide, pass_at_k, wilson

CFG = GateConfig(min_solve_rate=0.3, max_regression=0.05, confidence=0.95)


def test_wilson_interval_matches_hand_computation():
    e = wilson(8, 10, 0.95)  # p = 0.8, z = 1.95996
    z = 1.959964
    centre = (0.8 + z * z / 20) / (1 + z * z / 10)
    half = z * np.sqrt(0.8 * 0.2 / 10 + z * z / 400) / (1 + z * z / 10)
    assert e.value == 0.8
    assert e.low == pytest.approx(centre - half, abs=1e-6)
    assert e.high == pytest.approx(centre + half, abs=1e-6)
    assert wilson(0, 0, 0.95) == Estimate(0.0, 0.0, 1.0, 0)


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - (3 / 4) * (2 / 3))  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)


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
