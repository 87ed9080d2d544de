"""Bad configuration input: each case is refused with exit status 2 and one line naming the key
(or the file) and what is allowed; the same `ConfigError` comes from `load_config`."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from asyncrl.cli import main
from asyncrl.config import ConfigError, RunConfig, load_config, load_config_text
from asyncrl.config.source import MAX_CONFIG_BYTES, MAX_DEPTH

LOCAL = "configs/local.yaml"


def refused(capsys, path: Path | str, overrides: tuple[str, ...] = ()) -> ConfigError:
    """The error `load_config` raises, after checking `asyncrl config show` exits 2 with it."""
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    assert main(["config", "show", str(path), *overrides]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [f"asyncrl: {info.value}"]
    return info.value


def refused_text(capsys, tmp_path: Path, text: str | bytes) -> ConfigError:
    path = tmp_path / "c.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return refused(capsys, path)


# -- the file itself ------------------------------------------------------------------------------

# (content, fragment of the message); the error names the file, not a key.
BAD_FILES = [
    (b"", "holds no settings"),
    (b"# only a comment\n\n   # and another\n", "holds no settings"),
    (b"   \n\n", "holds no settings"),
    (b"~\n", "mapping of sections, got a null"),
    (b"- a\n- b\n", "mapping of sections, got a list"),
    (b"hello\n", "mapping of sections, got a str"),
    (b"\x00\x01\x02\x03binary", "is binary (a NUL byte at offset 0)"),
    (b"learner:\n  lr: 1e-5\n\x89PNG\x00", "is binary"),
    (b"learner:\n  lr: \xff\xfe\n", "not UTF-8 text (byte 0xff at offset 15)"),
    (b"learner: [1, 2\n", "not valid YAML at line 2"),
    (b"learner:\n\tlr: 1\n", "not valid YAML"),
    (b"learner:\n  lr: 1\n---\nlearner:\n  lr: 2\n", "not valid YAML"),
    (b"learner: !!python/object:os.system {}\n", "not valid YAML"),
    (b"pipeline:\n  run_id: \x07bell\n", "not valid YAML"),
]


@pytest.mark.parametrize(("content", "fragment"), BAD_FILES, ids=lambda x: repr(x)[:30])
def test_a_malformed_file_is_refused_naming_the_file(capsys, tmp_path, content, fragment):
    e = refused_text(capsys, tmp_path, content)
    assert e.key == "" and e.source == str(tmp_path / "c.yaml")
    assert fragment in str(e)


def test_a_folder_given_as_the_config_is_refused(capsys, tmp_path):
    e = refused(capsys, tmp_path)
    assert e.key == "" and "is a folder" in str(e) and str(tmp_path) in str(e)


def test_a_missing_file_and_a_path_under_a_file_are_refused(capsys, tmp_path):
    assert "not found" in str(refused(capsys, tmp_path / "nope.yaml"))
    (tmp_path / "f").write_text("seed: 1\n")
    assert "a parent is a file" in str(refused(capsys, tmp_path / "f" / "c.yaml"))


def test_a_fifo_is_refused_without_blocking(capsys, tmp_path):
    import os

    os.mkfifo(tmp_path / "pipe.yaml")  # opening it for reading would wait for a writer forever
    assert "not a regular file" in str(refused(capsys, tmp_path / "pipe.yaml"))


def test_a_file_over_the_size_cap_is_refused(capsys, tmp_path):
    e = refused_text(capsys, tmp_path, "seed: 1\n" + "#" * MAX_CONFIG_BYTES)
    assert f"at most {MAX_CONFIG_BYTES} allowed" in str(e)


def test_a_byte_order_mark_is_accepted():
    assert load_config_text("\ufeffseed: 3\n").seed == 3


def test_empty_config_text_names_its_source():
    with pytest.raises(ConfigError, match="config file '<pipeline parameter>': holds no settings"):
        load_config_text("", source="<pipeline parameter>")


# -- YAML features that are refused -------------------------------------------------------------

# (YAML, dotted key the error names, fragment of the message)
BAD_YAML = [
    ("learner:\n  lr: 1e-5\nlearner:\n  steps: 3\n", "learner", "given twice (lines 1 and 3)"),
    ("learner:\n  lr: 1e-5\n  lr: 2e-5\n", "learner.lr", "given twice (lines 2 and 3)"),
    ("seed: 1\nseed: 2\n", "seed", "given twice"),
    ("learner: &l {lr: 1.0e-5}\nwarm_start: *l\n", "learner", "anchors and aliases"),
    ("env:\n  tasks: [&t lookup, *t]\n", "env.tasks[0]", "anchors and aliases"),
    ("learner:\n  <<: {lr: 1.0e-5}\n", "learner.<<", "merge keys are not allowed"),
    ("learner:\n  ? [a, b]\n  : 1\n", "learner", "keys are plain names"),
    ("pipeline:\n  run_id: " + "x" * 5000 + "\n", "pipeline.run_id", "at most 4096"),
    ("learner:\n  steps: " + "9" * 5000 + "\n", "learner.steps", "at most 4096"),
]


@pytest.mark.parametrize(("text", "key", "fragment"), BAD_YAML, ids=lambda x: str(x)[:30])
def test_refused_yaml_names_the_key(capsys, tmp_path, text, key, fragment):
    e = refused_text(capsys, tmp_path, text)
    assert e.key == key
    assert fragment in str(e)


def test_an_alias_bomb_is_refused_at_its_first_anchor(capsys, tmp_path):
    bomb = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    e = refused_text(capsys, tmp_path, bomb)  # 9**9 strings if it were expanded
    assert e.key == "a" and "anchors and aliases are not allowed" in str(e)


@pytest.mark.parametrize("deep", ["flow", "block"])
def test_nesting_deeper_than_the_cap_is_refused(capsys, tmp_path, deep):
    n = 5000 if deep == "flow" else 40
    text = "[" * n + "]" * n if deep == "flow" else "".join(f"{'  ' * i}k{i}:\n" for i in range(n))
    e = refused_text(capsys, tmp_path, text)
    assert f"nested deeper than {MAX_DEPTH} levels" in str(e)
    assert e.key == ("[0]" * MAX_DEPTH if deep == "flow" else ".".join(f"k{i}" for i in range(8)))


def test_dates_stay_text_and_binary_is_not_text(capsys, tmp_path):
    assert load_config(LOCAL, ["pipeline.run_id=2024-12-01"]).pipeline.run_id == "2024-12-01"
    e = refused_text(capsys, tmp_path, "pipeline:\n  run_id: !!binary aGVsbG8=\n")
    assert e.key == "pipeline.run_id" and "expected a str" in str(e)


# -- values -------------------------------------------------------------------------------------

# (overrides on configs/local.yaml, dotted key the error names, fragment of what is allowed)
BAD_VALUES = [
    (["learner.lr=.inf"], "learner.lr", "a finite number"),
    (["learner.lr=-.inf"], "learner.lr", "a finite number"),
    (["learner.lr=.nan"], "learner.lr", "got nan"),
    (["learner.lr=1e999"], "learner.lr", "a finite number"),
    (["learner.lr=1e39"], "learner.lr", "float32 range"),
    (["learner.lr=" + "9" * 400], "learner.lr", "a finite number"),
    (["rollout.temperature=.inf"], "rollout.temperature", "a finite number"),
    (["gate.temperature=nan"], "gate.temperature", "a finite number"),
    (["model.rope_theta=1e400"], "model.rope_theta", "a finite number"),
    (["pipeline.timeout_s=.inf"], "pipeline.timeout_s", "seconds, at most 30 days"),
    (["env.episode_timeout_s=1e12"], "env.episode_timeout_s", "in [0, 2592000]"),
    (["env.tool_timeout_s=.nan"], "env.tool_timeout_s", "seconds"),
    (["rollout.request_timeout_s=1e30"], "rollout.request_timeout_s", "seconds"),
    (["tracing.counter_interval_s=1e300"], "tracing.counter_interval_s", "seconds"),
    (["env.latency_p50_s=-1"], "env.latency_p50_s", "in [0, 2592000]"),
    (["rollout.top_k=2147483648"], "rollout.top_k", "int32 range"),
    (["rollout.top_k=1000"], "rollout.top_k", "at most model.vocab_size=320"),
    (["seed=9223372036854775808"], "seed", "int32 range"),
    (["env.seed=-1099511627776"], "env.seed", "int32 range"),
    (["learner.steps=1099511627776"], "learner.steps", "int32 range"),
    (["model.d_model=2147483648"], "model.d_model", "int32 range"),
    (["rollout.prefill_buckets=[16, 1099511627776]"], "rollout.prefill_buckets[1]", "int32"),
    (["learner.steps=true"], "learner.steps", "expected an int"),
    (["model.preset=[tiny]"], "model.preset", "expected a str"),
    (["model.preset={}"], "model.preset", "expected a str"),
    (["model.preset=qwen9"], "model.preset", "allowed: micro, mini, tiny"),
    (["pipeline.stages=[]"], "pipeline.stages", "a non-empty subsequence"),
    (["pipeline.run_id=a\x00b"], "pipeline.run_id", "no newlines or control characters"),
    (['pipeline.experiment="a\\nb"'], "pipeline.experiment", "control characters"),
    (["learner.lr=*x"], "learner.lr", "anchors and aliases"),
    (["env.tasks=" + "[" * 100], "env.tasks" + "[0]" * MAX_DEPTH, "nested deeper"),
    (["learner..lr=1"], "learner..lr", "dotted names"),
    (["cluster.rollout_port=0"], "cluster.rollout_port", "allowed: 1 to 65535"),
    (["cluster.rollout_port=65536"], "cluster.rollout_port", "allowed: 1 to 65535"),
    (["cluster.rollout_port=8470.5"], "cluster.rollout_port", "expected an int"),
    (["cluster.rollout_bind_host=localhost"], "cluster.rollout_bind_host", "an IP address"),
    (["cluster.rollout_bind_host=1.2.3.4.5"], "cluster.rollout_bind_host", "0.0.0.0"),
    (["cluster.rollout_token_secret="], "cluster.rollout_token_secret", "DNS-1123"),
    (["cluster.rollout_token_secret=Token"], "cluster.rollout_token_secret", "a-z, 0-9"),
    (["cluster.rollout_token_secret=-x"], "cluster.rollout_token_secret", "starting and"),
    (["cluster.rollout_token_secret=" + "a" * 254], "cluster.rollout_token_secret", "253"),
    (["cluster.rollout_max_connections=-1"], "cluster.rollout_max_connections", "[0, 65536]"),
    (["cluster.rollout_max_connections=1e6"], "cluster.rollout_max_connections", "an int"),
    (["cluster.rollout_read_timeout_s=0"], "cluster.rollout_read_timeout_s", "seconds > 0"),
    (["cluster.rollout_read_timeout_s=.nan"], "cluster.rollout_read_timeout_s", "seconds"),
    (["cluster.rollout_keep_versions=0"], "cluster.rollout_keep_versions", "[1, 1000]"),
    (["=1"], "=1", "section.key=value"),
]


@pytest.mark.parametrize(("overrides", "key", "allowed"), BAD_VALUES, ids=lambda x: str(x)[:40])
def test_a_bad_value_names_its_key_and_what_is_allowed(capsys, overrides, key, allowed):
    e = refused(capsys, LOCAL, tuple(overrides))
    assert e.key == key
    assert allowed in str(e)


# (location, fragment of the problem) for every key that holds a location
BAD_LOCATIONS = [
    ("gs://", "no bucket name"),
    ("gs:///runs", "no bucket name"),
    ("gs://ab/x", "3-63 characters"),
    ("gs://" + "a" * 64, "3-63 characters"),
    ("gs://My_Bucket/x", "may hold only a-z"),
    ("gs://-bucket/x", "may hold only a-z"),
    ("gs://bucket-/x", "may hold only a-z"),
    ("gs://my..bucket/x", "empty or over-63-character"),
    ("gs://192.168.10.1/x", "IP address"),
    ("gs://goog-bucket/x", "'goog'"),
    ("gs://my-google-bucket/x", "'google'"),
    ("gs://bucket/../etc", "'..' segment"),
    ("gs://bucket/a//b", "empty"),
    ("gs:/bucket/x", "malformed gs:// prefix"),
    ("s3://bucket/x", "unsupported scheme"),
]
LOCATION_KEYS = ["checkpoint.dir", "gate.champion", "model.checkpoint"]


@pytest.mark.parametrize(("uri", "problem"), BAD_LOCATIONS, ids=lambda x: str(x)[:24])
def test_a_malformed_gs_uri_is_refused(capsys, uri, problem):
    for key in LOCATION_KEYS:
        e = refused(capsys, LOCAL, (f"{key}={uri}",))
        assert e.key == key
        assert problem in str(e) and "allowed: a local path or gs://bucket/path" in str(e)


def test_well_formed_locations_are_accepted():
    for uri in ("gs://my-bucket", "gs://my-bucket/", "gs://my.bucket.example.com/a/b/", "ckpt/x"):
        assert load_config(LOCAL, [f"checkpoint.dir={uri}"]).checkpoint.dir == uri


def test_tokenizer_path_and_runs_dir_are_locations(capsys):
    e = refused(capsys, LOCAL, ("tokenizer.kind=hf", "tokenizer.path=gs://Bad/x"))
    assert e.key == "tokenizer.path" and "may hold only a-z" in str(e)
    e = refused(capsys, LOCAL, ("pipeline.runs_dir=gs://x",))
    assert e.key == "pipeline.runs_dir" and "3-63 characters" in str(e)


def test_a_gs_runs_dir_needs_the_gke_backend(capsys):
    e = refused(capsys, LOCAL, ("pipeline.runs_dir=gs://my-bucket/runs",))
    assert e.key == "pipeline.runs_dir" and "when cluster.backend is 'local'" in str(e)


def test_a_long_value_is_abbreviated_in_the_one_line(capsys):
    e = refused(capsys, LOCAL, ("pipeline.name=" + "X" * 3000,))
    assert e.key == "pipeline.name" and len(str(e)) < 300 and "(3002 chars)" in str(e)


# -- every number of every section, generically ------------------------------------------------


def _numeric_fields(cls: type = RunConfig, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            yield from _numeric_fields(tp, f"{key}.")
        elif tp in (int, float):
            yield key, tp


NUMERIC = list(_numeric_fields())


def test_every_section_has_numbers_to_check():
    sections = {key.split(".")[0] for key, _ in NUMERIC if "." in key}
    assert {"learner", "warm_start", "rollout", "env", "model", "pipeline"} <= sections


@pytest.mark.parametrize(("key", "tp"), NUMERIC, ids=[k for k, _ in NUMERIC])
def test_every_number_refuses_non_finite_or_overflowing_values(key, tp):
    bad = ".inf" if tp is float else str(2**63)
    with pytest.raises(ConfigError) as info:
        load_config(LOCAL, [f"{key}={bad}"])
    assert info.value.key == key
    assert ("finite number" if tp is float else "an integer in [") in str(info.value)
