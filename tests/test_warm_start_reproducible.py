"""The warm start is reproducible: the same config and seed give the same model, byte for byte,
and the same held-out solve rate; another seed gives another model (so the equality is not
vacuous)."""

from __future__ import annotations

from asyncrl.run_layout import RunLayout
from asyncrl.stages.warm_start import warm_start
from asyncrl.testing.configs import micro_config

WARM = (
    "warm_start.steps=6",
    "warm_start.content_steps=2",
    "warm_start.warmup_steps=1",
    "warm_start.batch_size=4",
    "env.train_size=8",
    "env.heldout_size=2",
)


def _warm(tmp_path, name: str, seed: int):
    layout = RunLayout.of(tmp_path / name).create()
    result = warm_start(micro_config(*WARM, f"seed={seed}"), layout, log_every=1000)
    weights = (layout.warm_start_model / "model.safetensors").read_bytes()
    return result, weights


def test_the_same_config_and_seed_give_the_same_warm_start_model_and_solve_rate(tmp_path):
    a, a_weights = _warm(tmp_path, "a", seed=0)
    b, b_weights = _warm(tmp_path, "b", seed=0)
    assert a_weights == b_weights
    assert a.final_loss == b.final_loss
    assert a.heldout_solve_rate == b.heldout_solve_rate
    assert a.heldout_by_family == b.heldout_by_family
    _, other = _warm(tmp_path, "c", seed=1)
    assert other != a_weights
