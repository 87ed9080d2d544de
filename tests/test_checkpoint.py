"""Checkpoints: bit-exact round trips, atomic saves, resumption that equals no restart, GCS."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from asyncrl.checkpoint.manager import Checkpointer, CheckpointError, digest, flatten
from asyncrl.checkpoint.train_record import TrainRecord, incompatibilities
from asyncrl.envs.tasks import calculator_task
from asyncrl.learner.learner import Learner
from asyncrl.learner.state import LoopState
from asyncrl.model import build_model
from asyncrl.rollout.cursor import DataCursor
from asyncrl.run_layout import RunLayout
from asyncrl.testing.configs import micro_config
from asyncrl.types import GroupOutcome


def _learner(cfg=None):
    cfg = cfg or micro_config()
    return Learner(build_model(cfg.model, seed=0), cfg.learner, max_len=cfg.env.max_context)


def _stepped_state(learner):
    """A state whose optimizer moments are non-zero (one SFT step on a fixed batch)."""
    from asyncrl.testing.trajectories import fixed_trajectory

    learner.sft_step(learner.sft_batch([fixed_trajectory(37)]))
    return learner.state


def _equal_bits(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.asarray(x).dtype == np.asarray(y).dtype
        and np.asarray(x).tobytes() == np.asarray(y).tobytes()
        for x, y in zip(la, lb, strict=True)
    )


def test_save_restore_is_bit_identical(tmp_path):
    learner = _learner()
    state = _stepped_state(learner)
    ckpt = Checkpointer(str(tmp_path / "ck"), max_to_keep=2)
    ckpt.save(state, {"note": "x"})
    ckpt.wait()
    fresh = _learner()
    restored, pipeline = ckpt.restore(fresh.state)
    ckpt.close()
    assert _equal_bits(restored, state)
    assert pipeline["step"] == 1 and pipeline["note"] == "x"
    assert pipeline["digest"] == digest(flatten(state))


def test_max_to_keep_keeps_the_newest(tmp_path):
    learner = _learner()
    ckpt = Checkpointer(str(tmp_path / "ck"), max_to_keep=2, async_save=False)
    for _ in range(3):
        _stepped_state(learner)
        ckpt.save(learner.state, {})
    assert ckpt.steps() == [2, 3]
    ckpt.close()


KILLED_SAVE = textwrap.dedent(
    """
    import os, signal, sys
    from asyncrl.checkpoint.manager import Checkpointer
    from asyncrl.learner.learner import Learner
    from asyncrl.model import build_model
    from asyncrl.testing.configs import micro_config
    sys.path.insert(0, os.path.dirname(sys.argv[2]))
    from test_checkpoint import _stepped_state
    cfg = micro_config()
    learner = Learner(build_model(cfg.model, seed=0), cfg.learner, max_len=256)
    ckpt = Checkpointer(sys.argv[1], max_to_keep=3)
    ckpt.save(_stepped_state(learner), {"n": 1})
    ckpt.wait()
    ckpt.save(_stepped_state(learner), {"n": 2})  # in the background...
    os.kill(os.getpid(), signal.SIGKILL)  # ...when the machine goes away
    """
)


def test_a_killed_save_leaves_the_previous_checkpoint_restorable(tmp_path):
    where = tmp_path / "ck"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_SAVE, str(where), __file__],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    ckpt = Checkpointer(str(where))
    assert ckpt.steps() == [1]
    restored, pipeline = ckpt.restore(_learner().state)
    assert pipeline["n"] == 1 and int(restored.step) == 1
    ckpt.close()
    assert not [p for p in where.iterdir() if "tmp" in p.name]  # leftovers cleaned up


def test_a_corrupted_checkpoint_is_a_clear_error(tmp_path):
    learner = _learner()
    ckpt = Checkpointer(str(tmp_path / "ck"), async_save=False)
    ckpt.save(_stepped_state(learner), {})
    data = sorted((tmp_path / "ck" / "1" / "train_state").rglob("d/*"))
    assert data
    for blob in data:  # flip bytes in the middle of every data file
        raw = bytearray(blob.read_bytes())
        for i in range(len(raw) // 3, len(raw) // 3 + 64):
            raw[i] ^= 0xFF
        blob.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="step 1"):
        ckpt.restore(_learner().state)
    ckpt.close()


def test_an_empty_location_is_a_clear_error(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "none"))
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        ckpt.restore(_learner().state)
    ckpt.close()


def test_incompatible_config_names_what_differs(tmp_path):
    from asyncrl.wiring.training import resume

    cfg = micro_config()
    learner = _learner(cfg)
    ckpt = Checkpointer(str(tmp_path / "ck"), async_save=False)
    ckpt.save(learner.state, TrainRecord.of(LoopState(), (), cfg).to_json())
    other = micro_config("rollout.group_size=2", "learner.steps=50")
    diffs = incompatibilities(cfg.to_dict(), other.to_dict())
    assert diffs == ["rollout.group_size: checkpoint 4, config 2"]  # steps may change
    with pytest.raises(CheckpointError, match=r"rollout\.group_size: checkpoint 4, config 2"):
        resume(ckpt, _learner(other), other)
    bigger = micro_config("model.d_ff=256")
    with pytest.raises(CheckpointError, match=r"model\.d_ff: checkpoint 128, config 256"):
        resume(ckpt, _learner(bigger), bigger)
    ckpt.close()


def test_cursor_reissues_unfinished_groups_first_and_skips_none():
    stream = [calculator_task("train", i) for i in range(100)]
    cursor = DataCursor()
    numbered = cursor.numbered(stream.__getitem__)
    for _ in range(6):
        item = next(numbered)
        assert not item.replay
        cursor = cursor.issue(item.number)
    for n in (0, 2, 3):
        cursor = cursor.finish(n, GroupOutcome.TRAINED)
    cursor = cursor.finish(1, GroupOutcome.STALE)
    saved = json.loads(json.dumps(cursor.to_json()))
    restored = DataCursor.from_json(saved)
    again = restored.numbered(stream.__getitem__)
    first = [next(again) for _ in range(4)]
    assert [(i.number, i.replay) for i in first] == [(4, True), (5, True), (6, False), (7, False)]
    assert first[0].task == stream[4] and first[0].group_id == f"{stream[4].id}@4"
    assert restored.trained == (0, 2, 3) and restored.dropped == (1,)
    # The replays, once issued and trained, are saved once: the record restores again.
    for item in first:
        restored = restored.issue(item.number).finish(item.number, GroupOutcome.TRAINED)
    again = DataCursor.from_json(json.loads(json.dumps(restored.to_json())))
    assert again.trained == (0, 2, 3, 4, 5, 6, 7) and again.replays == ()


def test_loop_state_survives_the_checkpoint_record_unchanged():
    cfg = micro_config()
    state = LoopState().issued(0).issued(1).issued(2)
    state = state.finish(0, GroupOutcome.TRAINED).finish(1, GroupOutcome.FAILED)
    state = state.stepped([0, 1, 1], 0.5).published(1).waited(0.25)
    record = TrainRecord.of(state, ({"step": 0.0, "solve_rate": 0.5},), cfg)
    back = TrainRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert back.state == state.restored() and back.state.cursor.replays == (2,)
    assert back.evals == record.evals and back.config_hash == cfg.hash()


def _record_json(**changes):
    data = TrainRecord.of(LoopState().issued(0), (), micro_config()).to_json()
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = data
        for key in path:
            node = node[key]
        node[last] = value
    return data


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"format": 1}, "format 1"),
        ({"format": "2"}, "format '2'"),
        ({"state": None}, "loop state: expected an object"),
        ({"state__version": -1}, "loop state.version"),
        ({"state__version": True}, "loop state.version"),
        ({"state__cursor": "x"}, "cursor: expected an object"),
        ({"state__cursor__next_index": "3"}, "cursor.next_index"),
        ({"state__cursor__trained": [5]}, "not below next_index"),
        ({"state__cursor__trained": [0], "state__cursor__dropped": [0]}, "appears twice"),
        ({"state__counters__steps": 1.5}, "counters.steps"),
        ({"state__counters__train_seconds": float("nan")}, "counters.train_seconds"),
        ({"state__lags": [[1]]}, "loop state.lags"),
        ({"evals": [{"solve_rate": "high"}]}, "evals"),
        ({"evals": {}}, "evals"),
        ({"config": []}, "config: expected an object"),
        ({"config_hash": 7}, "config_hash"),
    ],
)
def test_a_malformed_checkpoint_record_is_refused_naming_the_field(changes, named):
    with pytest.raises(CheckpointError) as e:
        TrainRecord.from_json(_record_json(**changes), "checkpoint step 3")
    assert named in str(e.value) and str(e.value).startswith("checkpoint step 3: ")


def test_resume_refuses_a_malformed_record_and_leaves_the_learner_untouched(tmp_path):
    from asyncrl.wiring.training import resume

    cfg = micro_config()
    ckpt = Checkpointer(str(tmp_path / "ck"), async_save=False)
    ckpt.save(_stepped_state(_learner(cfg)), _record_json(state__cursor={"next_index": "x"}))
    learner = _learner(cfg)
    before = learner.state
    with pytest.raises(CheckpointError, match=r"cursor\.next_index"):
        resume(ckpt, learner, cfg)
    assert learner.state is before and learner.step == 0
    ckpt.close()


def _resume_cfg(tmp_path, steps):
    return micro_config(
        "learner.mode=sync",
        "learner.max_staleness=0",
        f"learner.steps={steps}",
        "learner.eval_every=0",
        "env.heldout_size=1",
        "env.train_size=8",
        "checkpoint.every_steps=1",
        "checkpoint.async_save=false",
    )


def _params(run_dir):
    from asyncrl.model import hf_checkpoint as hf

    cfg = micro_config()
    model = build_model(cfg.model, seed=1)
    hf.load_into(model, str(run_dir / "train" / "model"))
    from flax import nnx

    return nnx.state(model, nnx.Param)


def test_restore_then_step_equals_no_restart(tmp_path):
    """Sync mode, same seed: 2 steps straight == 1 step, stop, resume, 1 more step."""
    from asyncrl.stages.train import train

    straight, split = tmp_path / "straight", tmp_path / "split"
    train(_resume_cfg(tmp_path, 2), RunLayout.of(straight))
    train(_resume_cfg(tmp_path, 1), RunLayout.of(split))
    result = train(_resume_cfg(tmp_path, 2), RunLayout.of(split))  # resumes at step 1
    assert json.loads((split / "train" / "resume.json").read_text())["step"] == 1
    # The first attempt's trace is kept beside the resumed run's.
    assert (split / "train" / "trace.1.perfetto-trace").exists()
    assert result.steps == 2
    assert _equal_bits(_params(straight), _params(split))
    ckpt = Checkpointer(str(split / "checkpoints"))
    pipeline = ckpt.read_pipeline(2)
    ckpt.close()
    trained = TrainRecord.from_json(pipeline).state.cursor.trained
    assert sorted(trained) == list(range(4)) and len(set(trained)) == len(trained)


def test_gcs_round_trip_and_uncommitted_steps_are_ignored(gcs_bucket):
    from asyncrl import storage

    uri = f"{gcs_bucket}/ckpt-roundtrip"
    learner = _learner()
    ckpt = Checkpointer(uri, max_to_keep=2)
    state = _stepped_state(learner)
    ckpt.save(state, {"where": "gcs"})
    ckpt.close()
    # An upload cut short: files of step 7 but no COMMIT object.
    storage.write_bytes(f"{uri}/7/train_state/_METADATA", b"{}")
    reader = Checkpointer(uri)
    assert reader.steps() == [1]
    restored, pipeline = reader.restore(_learner().state)
    reader.close()
    assert pipeline["where"] == "gcs" and _equal_bits(restored, state)


@pytest.mark.slow  # the default suite sees the four phases pass in the session's pipeline run
def test_recovery_test_passes_all_four_phases(tmp_path):
    """SIGKILL during rollout, train step, publish and checkpoint write; resume each time."""
    from asyncrl.stages.recovery_test import PLAN, recovery_test, table

    cfg = micro_config("env.train_size=16", "learner.max_staleness=1")
    verdict = recovery_test(cfg, RunLayout.of(tmp_path), progress=lambda _: None)
    assert [p.phase for p in verdict.phases] == [phase.value for phase, _ in PLAN]
    assert verdict.passed, table(verdict)
    assert all(p.killed and p.bit_identical and p.cursor_ok for p in verdict.phases)
    saved = json.loads((tmp_path / "recovery_test" / "verdict.json").read_text())
    assert saved["passed"] and len(saved["phases"]) == 4


# -- bad inputs and "nothing is lost" -------------------------------------------------------------


def test_importing_the_module_leaves_logging_alone_and_a_checkpointer_quiets_orbax(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        from absl import logging
        logging.set_verbosity(logging.INFO)
        from asyncrl.checkpoint.manager import Checkpointer
        imported = logging.get_verbosity()
        Checkpointer(sys.argv[1]).close()
        print(imported, logging.get_verbosity())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "ck")], capture_output=True, text=True
    )
    from absl import logging as absl_logging

    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(absl_logging.INFO), str(absl_logging.WARNING)]


@pytest.mark.parametrize("where", ["f", "f/below"], ids=["file", "under-a-file"])
def test_a_file_as_the_checkpoint_location_is_refused_naming_checkpoint_dir(tmp_path, where):
    (tmp_path / "f").write_text("x")
    with pytest.raises(CheckpointError) as e:
        Checkpointer(str(tmp_path / where))
    assert str(e.value).startswith(f"checkpoint.dir: '{tmp_path / where}' is a file, or lies")
    assert (tmp_path / "f").read_text() == "x"


def test_an_unsafe_object_name_in_a_gcs_checkpoint_is_a_checkpoint_error(gcs_bucket, tmp_path):
    """`ckpt/5//<abs path>` once wrote to that path on the trainer's disk."""
    import uuid

    from asyncrl import storage

    uri = f"{gcs_bucket}/ckpt-{uuid.uuid4().hex[:8]}"
    bucket, path = storage.split_gcs(uri)
    outside = tmp_path / "outside"
    for name in ("5/COMMIT", "5/pipeline/metadata", f"5/{outside}/x"):
        storage._client().bucket(bucket).blob(f"{path}/{name}").upload_from_string(b"x")
    ckpt = Checkpointer(uri, staging=tmp_path / "staging")
    assert ckpt.steps() == [5]
    with pytest.raises(CheckpointError) as e:
        ckpt.read_pipeline(5)
    ckpt.close()
    message = str(e.value)
    assert message.startswith(f"checkpoint step 5 at {uri} holds an object with an unsafe name")
    assert f"gs://{bucket}/{path}/5/{outside}/x" in message  # the object, named
    assert not outside.exists()


def test_checkpoints_live_under_the_run_unless_a_config_shares_them(tmp_path):
    from asyncrl.stages.train import checkpoint_uri

    cfg = micro_config()
    assert checkpoint_uri(cfg, RunLayout.of(tmp_path / "a")) == str(tmp_path / "a" / "checkpoints")
    assert checkpoint_uri(cfg, RunLayout.of("gs://bkt/runs/a")) == "gs://bkt/runs/a/checkpoints"
    shared = micro_config(f"checkpoint.dir={tmp_path / 'shared'}")
    assert checkpoint_uri(shared, RunLayout.of(tmp_path / "a")) == str(tmp_path / "shared")


def test_pruning_a_gcs_location_touches_only_its_own_steps(gcs_bucket):
    import uuid

    from asyncrl import storage

    root = f"{gcs_bucket}/runs-{uuid.uuid4().hex[:8]}"
    uri = f"{root}/r1/checkpoints"
    neighbours = [
        f"{root}/r2/checkpoints/1/COMMIT",  # another run's step
        f"{root}/r1/checkpoints-old/1/COMMIT",  # a sibling whose name starts like ours
        f"{uri}/notes/1",  # not a step folder
    ]
    for other in neighbours:
        storage.write_bytes(other, b"keep")
    from asyncrl.learner.step import TrainState

    ckpt = Checkpointer(uri, max_to_keep=1, async_save=False)
    for step in (1, 2):  # a two-array state: what is pruned matters here, not what is saved
        ckpt.save(TrainState(params={"w": np.ones(4)}, opt_state=(), step=np.int32(step)), {})
    ckpt.close()
    assert storage.list_names(uri) == ["2", "notes"]
    assert [storage.read_bytes(other) for other in neighbours] == [b"keep"] * 3


def test_a_resumed_gcs_run_keeps_max_to_keep_steps(gcs_bucket):
    """A new process stages only what it restores; its first save must not prune the steps that
    max_to_keep still covers."""
    import uuid

    from asyncrl import storage
    from asyncrl.learner.step import TrainState

    uri = f"{gcs_bucket}/ckpt-{uuid.uuid4().hex[:8]}"

    def state(step):
        return TrainState(params={"w": np.full(4, step)}, opt_state=(), step=np.int32(step))

    first = Checkpointer(uri, max_to_keep=3, async_save=False)
    for step in (1, 2, 3, 4):
        first.save(state(step), {})
    first.close()
    resumed = Checkpointer(uri, max_to_keep=3, async_save=False)
    resumed.read_pipeline(4)  # what a resume stages
    resumed.save(state(5), {})
    resumed.close()
    assert storage.list_names(uri) == ["3", "4", "5"]


def test_a_reused_run_id_resumes_only_with_the_same_config(tmp_path):
    from asyncrl.config import ConfigError
    from asyncrl.stages.provision import claim

    cfg = micro_config(f"pipeline.runs_dir={tmp_path}", "pipeline.run_id=r1")
    layout = RunLayout.at(str(tmp_path), "r1")
    claim(layout, cfg)
    recorded = layout.config.read_text()
    assert claim(layout, cfg) == layout  # the same config: a resume
    other = micro_config(f"pipeline.runs_dir={tmp_path}", "pipeline.run_id=r1", "seed=7")
    with pytest.raises(ConfigError) as e:
        claim(layout, other)
    assert e.value.key == "pipeline.run_id" and "(seed: 0 → 7)" in str(e.value)
    assert layout.config.read_text() == recorded  # the first run's record is kept
