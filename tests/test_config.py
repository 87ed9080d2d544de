"""Configuration: presets load, round-trip, and every malformed input names its key."""

from pathlib import Path

import pytest

from asyncrl.config import ConfigError, RunConfig, load_config, to_yaml
from asyncrl.config.presets import MODEL_PRESETS

CONFIGS = sorted(Path(__file__).parent.parent.joinpath("configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_preset_loads_and_round_trips(path, tmp_path):
    cfg = load_config(path)
    again = tmp_path / "again.yaml"
    again.write_text(to_yaml(cfg))
    assert load_config(again) == cfg
    assert load_config(again).hash() == cfg.hash()


def test_defaults_are_valid_and_round_trip(tmp_path):
    cfg = RunConfig()
    (tmp_path / "c.yaml").write_text(to_yaml(cfg))
    assert load_config(tmp_path / "c.yaml") == cfg


def test_overrides_apply_with_types():
    cfg = load_config(
        "configs/local.yaml",
        ["learner.lr=3e-6", "rollout.top_k=5", "learner.mask_truncated=true", "env.tasks=[lookup]"],
    )
    assert cfg.learner.lr == pytest.approx(3e-6)
    assert cfg.rollout.top_k == 5
    assert cfg.learner.mask_truncated is True
    assert cfg.env.tasks == ("lookup",)


def test_model_preset_expands_and_keys_beside_it_override():
    cfg = load_config(None, ["model.preset=qwen2.5-0.5b", "model.n_layers=2"])
    assert cfg.model.d_model == MODEL_PRESETS["qwen2.5-0.5b"]["d_model"]
    assert cfg.model.n_layers == 2


def test_hash_ignores_pipeline_section_but_not_learning_keys():
    base = load_config("configs/local.yaml")
    assert load_config("configs/local.yaml", ["pipeline.run_id=abc"]).hash() == base.hash()
    assert load_config("configs/local.yaml", ["learner.lr=1e-3"]).hash() != base.hash()


# (overrides, dotted key the error must name, fragment of what is allowed)
MALFORMED = [
    (["learner.lrr=1e-5"], "learner.lrr", "did you mean 'learner.lr'"),
    (["lerner.lr=1e-5"], "lerner", "did you mean 'learner'"),
    (["learner.lr=fast"], "learner.lr", "expected a float"),
    (["learner.lr=-1"], "learner.lr", "a number > 0"),
    (["learner.loss=grpoo"], "learner.loss", "did you mean 'grpo'"),
    (["learner.loss=ppo"], "learner.loss", "grpo, dr_grpo, dapo, gspo"),
    (["learner.steps=2.5"], "learner.steps", "expected an int"),
    (["learner.steps=0"], "learner.steps", "a positive integer"),
    (["learner.mask_truncated=maybe"], "learner.mask_truncated", "expected a bool"),
    (["learner.batch_size=30"], "learner.batch_size", "a multiple of rollout.group_size=8"),
    (["rollout.group_size=1", "learner.batch_size=8"], "rollout.group_size", "at least 2"),
    (["rollout.max_tokens=500"], "rollout.max_tokens", "at most learner.max_response_length"),
    (["rollout.return_logprobs=false"], "rollout.return_logprobs", "log-probabilities"),
    (["rollout.top_p=1.5"], "rollout.top_p", "(0, 1]"),
    (["rollout.temperature=-0.1"], "rollout.temperature", ">= 0"),
    (["rollout.prefill_buckets=[128,64]"], "rollout.prefill_buckets", "strictly increasing"),
    (["rollout.prefill_buckets=64"], "rollout.prefill_buckets", "expected a list"),
    (["rollout.in_flight_policy=drop"], "rollout.in_flight_policy", "continue, recompute"),
    (["model.n_kv_heads=3"], "model.n_kv_heads", "a divisor of n_heads=4"),
    (["model.preset=qwen3-9b"], "model.preset", "allowed: micro, mini, tiny"),
    (["model.vocab_size=100"], "model.vocab_size", "byte tokenizer"),
    (["model.dtype=float16"], "model.dtype", "float32, bfloat16"),
    (["model.max_seq_len=256"], "env.max_context", "at most model.max_seq_len=256"),
    (["env.tasks=[calculator,calculator]"], "env.tasks", "no repeated family"),
    (["env.tasks=[chess]"], "env.tasks[0]", "calculator, lookup"),
    (["env.malformed_tool_call=ignore"], "env.malformed_tool_call", "observation, terminate"),
    (["learner.mode=sync"], "learner.max_staleness", "0 when learner.mode is 'sync'"),
    (["tokenizer.kind=hf"], "tokenizer.path", "when kind is 'hf'"),
    (["cluster.placement=remote"], "cluster.rollout_replicas", "at least 1"),
    (["cluster.backend=gke"], "cluster.project", "non-empty value when backend is 'gke'"),
    (["cluster.tpu_topology=big"], "cluster.tpu_topology", "'2x4'"),
    (["checkpoint.max_to_keep=0"], "checkpoint.max_to_keep", ">= 1"),
    (["gate.confidence=1.2"], "gate.confidence", "[0.5, 1)"),
    (["pipeline.stages=[train,provision]"], "pipeline.stages", "a subsequence of"),
    (["pipeline.name=My Pipeline"], "pipeline.name", "lowercase"),
    (["learner=3"], "learner", "expected a mapping"),
    (["learner.lr.x=3"], "learner.lr", "is a value, not a section"),
    (["seed"], "seed", "section.key=value"),
]


@pytest.mark.parametrize(("overrides", "key", "allowed"), MALFORMED, ids=lambda x: str(x))
def test_malformed_config_names_key_and_allowed(overrides, key, allowed):
    with pytest.raises(ConfigError) as info:
        load_config("configs/local.yaml", overrides)
    assert info.value.key == key
    assert allowed in str(info.value)


def test_malformed_yaml_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("learner: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(bad)


def test_config_module_imports_no_jax():
    import subprocess
    import sys

    code = "import sys, asyncrl.config, asyncrl.types; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_field_metadata_declares_bounds_and_presets_for_any_section():
    """The loader knows no section by name: bounds and preset tables are declared per field."""
    from dataclasses import dataclass, field

    from asyncrl.config import from_dict
    from asyncrl.config.errors import bounds
    from asyncrl.config.presets import selects_preset

    @dataclass(frozen=True, slots=True, kw_only=True)
    class Toy:
        kind: str = field(default="custom", metadata=selects_preset({"big": {"width": 64}}))
        width: int = field(default=8, metadata=bounds(1, 100, "toy widths"))
        wide: int = field(default=0, metadata=bounds(0, 2**40, "int64 on purpose"))

    assert from_dict(Toy, {"kind": "big"}).width == 64
    assert from_dict(Toy, {"kind": "big", "width": 3}).width == 3
    assert from_dict(Toy, {"wide": 2**39}).wide == 2**39  # a declared range may exceed int32
    with pytest.raises(ConfigError) as info:
        from_dict(Toy, {"width": 101}, "toy")
    assert info.value.key == "toy.width"
    assert "an integer in [1, 100] (toy widths)" in str(info.value)
    with pytest.raises(ConfigError, match="unknown preset 'bigg' \\(did you mean 'big'\\?\\)"):
        from_dict(Toy, {"kind": "bigg"})


def test_to_yaml_never_writes_anchors_the_loader_would_refuse():
    from asyncrl.config import load_config_text

    cfg = load_config(None, ["rollout.prefill_buckets=[16,64,128]", "env.tasks=[lookup]"])
    text = to_yaml(cfg)
    assert "&" not in text and "*" not in text
    assert load_config_text(text) == cfg
