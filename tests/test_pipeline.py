"""The Kubeflow pipeline: compiled snapshots, the local run through kfp.local (pass, and a
failing gate that still tears down), submit/schedule/wait against a loopback KFP API, and each
component alone."""

import json
from pathlib import Path

import pytest
import yaml
from conftest import PIPELINE_OVERRIDES, recovery_verdict

from asyncrl.config import load_config, load_config_text, to_yaml
from asyncrl.config.ops import ALL_STAGES
from asyncrl.pipeline import remote
from asyncrl.pipeline.components import FUNCTIONS
from asyncrl.run_layout import RunLayout
from asyncrl.stages.model_check import ModelCheckResult
from asyncrl.stages.provision import TeardownResult
from asyncrl.stages.quality_gate import GateResult
from asyncrl.stages.recovery_test import PLAN, RecoveryVerdict
from asyncrl.testing.configs import MICRO_OVERRIDES
from asyncrl.testing.kfp_stub import kfp_stub

ROOT = Path(__file__).parent.parent
# The local preset, and the single-host and multi-host GKE presets.
CONFIGS = (
    "configs/local.yaml",
    "configs/qwen2.5-0.5b-v6e.yaml",
    "configs/qwen2.5-0.5b-v6e-multihost.yaml",
)
TINY = (*MICRO_OVERRIDES, *PIPELINE_OVERRIDES)


@pytest.mark.parametrize("config", CONFIGS)
def test_pipeline_compiles_to_its_checked_in_snapshot(tmp_path, config):
    """Regenerate: `asyncrl pipeline compile <each of CONFIGS>`."""
    cfg = load_config(ROOT / config)
    fresh = remote.compile_pipeline(cfg, tmp_path)
    snapshot = ROOT / "pipelines" / "compiled" / remote.compiled_name(cfg)
    assert fresh.read_text() == snapshot.read_text(), f"{snapshot} is stale: recompile it"


def test_gke_pipeline_carries_tpu_settings_and_retries():
    spec = list(yaml.safe_load_all((ROOT / "pipelines/compiled/asyncrl-gke.yaml").read_text()))
    pipeline, platform = spec[0], spec[1]
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    warm = executors["exec-warm-start"]  # train is a launcher on gke: its JobSet holds the TPUs
    selectors = warm["nodeSelector"]["labels"]
    assert selectors["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice"
    assert warm["tolerations"][0]["key"] == "google.com/tpu"
    container = pipeline["deploymentSpec"]["executors"]["exec-warm-start"]["container"]
    assert container["resources"]["accelerator"]["resourceCount"] == "8"  # v6e 2x4: one host
    tasks = pipeline["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    assert "retryPolicy" in tasks["provision"] and "retryPolicy" not in tasks["quality-gate"]
    assert pipeline["root"]["dag"]["tasks"]["teardown"]["triggerPolicy"]["strategy"] == (
        "ALL_UPSTREAM_TASKS_COMPLETED"
    )
    assert "tolerations" not in executors.get("exec-provision", {})  # CPU stages stay off TPUs


def test_the_local_pipeline_runs_every_stage_and_passes(passing_run):
    folder, result = passing_run.folder, passing_run.result
    assert passing_run.returncode == 0, passing_run.output[-3000:]
    assert result.succeeded and result.final_state == "SUCCEEDED"
    # Every stage, in order; promotion follows the gate.
    assert result.stages_done == (*ALL_STAGES[:-1], "promote", ALL_STAGES[-1])
    assert result.gate_passed is True and result.teardown_ran
    champion = json.loads((folder / "ch" / "CURRENT.json").read_text())
    assert champion["run_id"] == result.run_dir.name  # first run: promoted by the last stage
    kfp_outputs = list((result.run_dir / "kfp").rglob("executor_output.json"))
    assert len(kfp_outputs) >= 7  # one per component
    verdict = RunLayout.of(result.run_dir).read(RecoveryVerdict)
    assert [p.phase for p in verdict.phases] == [phase.value for phase, _ in PLAN]
    assert verdict.passed and all(
        p.killed and p.bit_identical and p.cursor_ok for p in verdict.phases
    )


def test_an_impossible_gate_fails_the_run_and_its_verdict_page_reaches_kfp(failing_gate_run):
    """The gate task itself succeeds, so KFP keeps its outputs (the verdict page and metrics a
    user opens to see why); the promote task after it fails the run; teardown still runs."""
    folder, result = failing_gate_run.folder, failing_gate_run.result
    assert not result.succeeded and result.final_state == "FAILED"
    assert result.gate_passed is False
    assert "report" not in result.stages_done and result.teardown_ran
    layout = RunLayout.of(result.run_dir)
    gate = layout.read(GateResult)
    assert [c.name for c in gate.failed] == ["solve_rate >= min_solve_rate"]
    assert not (folder / "ch" / "CURRENT.json").exists()  # nothing promoted
    (outputs,) = layout.kfp_root.glob("*/quality-gate/executor_output.json")
    artifacts = json.loads(outputs.read_text())["artifacts"]
    (metrics,) = artifacts["metrics"]["artifacts"]
    assert metrics["metadata"]["gate_passed"] == 0.0 and metrics["metadata"]["checks_failed"] == 1
    page = (outputs.parent / "html").read_text()
    assert "Quality gate FAILED" in page and "solve_rate &gt;= min_solve_rate" in page
    assert not list(layout.kfp_root.glob("*/promote/executor_output.json"))  # promote failed


def test_a_failed_recovery_test_stops_the_run_at_promote_before_anything_is_promoted(tmp_path):
    """The recovery task succeeds whatever its verdict (KFP keeps its page); promote refuses."""
    from asyncrl.pipeline import components as c

    cfg = load_config(ROOT / "configs/local.yaml", [f"gate.champion={tmp_path / 'ch'}"])
    assert "recovery_test" in cfg.pipeline.stages
    layout = RunLayout.of(tmp_path / "run").create()
    layout.write(recovery_verdict(("train_step", False)))
    with pytest.raises(RuntimeError, match="recovery test failed"):
        c.promote(to_yaml(cfg), str(layout.root))
    assert not (tmp_path / "ch" / "CURRENT.json").exists()


def test_submit_and_schedule_send_the_run_config_to_the_kfp_api():
    cfg = load_config(ROOT / "configs/local.yaml")
    with kfp_stub() as stub:
        run = remote.submit(cfg, stub.host, "nightly")
        posts = [r for r in stub.requests if r["method"] == "POST"]
        created = next(r["body"] for r in posts if r["path"] == "/apis/v2beta1/runs")
        assert created["display_name"] == "nightly"
        assert created["runtime_config"]["parameters"]["config_yaml"] == to_yaml(cfg)
        assert created["service_account"] == cfg.cluster.service_account
        assert created["pipeline_spec"]["pipelineInfo"]["name"] == cfg.pipeline.name
        assert run.run_id in run.url
        job = remote.schedule(cfg, stub.host, "0 0 3 * * *")
        recurring = stub.requests[-1]["body"]
        assert stub.requests[-1]["path"] == "/apis/v2beta1/recurringruns" and job
        assert recurring["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * *"
        assert recurring["runtime_config"]["parameters"]["config_yaml"] == to_yaml(cfg)
        assert remote.wait(stub.host, run.run_id, 30) == "SUCCEEDED"
        stub.run_states[run.run_id] = "FAILED"
        assert remote.wait(stub.host, run.run_id, 30) == "FAILED"


def test_cli_wait_exit_code_is_the_runs_verdict(capsys):
    from asyncrl.cli import main

    with kfp_stub() as stub:
        stub.run_states.update({"good": "SUCCEEDED", "bad": "FAILED"})
        assert main(["pipeline", "wait", "good", "--host", stub.host]) == 0
        assert main(["pipeline", "wait", "bad", "--host", stub.host]) == 1


def test_endpoint_errors_are_clear():
    cfg = load_config(ROOT / "configs/local.yaml")
    with pytest.raises(
        remote.KfpError, match=r"cannot reach Kubeflow Pipelines at http://127\.0\.0\.1:9"
    ):
        remote.submit(cfg, "http://127.0.0.1:9")
    with kfp_stub() as stub:
        stub.refuse = (403, "permission denied for namespace asyncrl")
        with pytest.raises(remote.KfpError, match="permission denied"):
            remote.submit(cfg, stub.host)
        stub.refuse = None
        with pytest.raises(remote.KfpError, match="six"):
            remote.schedule(cfg, stub.host, "0 3 * * *")


@pytest.mark.slow  # every stage again, in-process: the session's passing run covers the wiring
def test_each_component_function_runs_on_its_own(tmp_path):
    """The components' Python functions, called directly in order with real artifact objects."""
    from kfp import dsl

    from asyncrl.pipeline.components import components

    c = components("asyncrl-runtime:test")
    cfg = load_config(
        ROOT / "configs/local.yaml",
        [
            *TINY,
            f"pipeline.runs_dir={tmp_path / 'runs'}",
            f"gate.champion={tmp_path / 'ch'}",
            "pipeline.run_id=alone",
            # Not the recovery test (the session's passing run covers it): promote then does not
            # look for its verdict.
            "pipeline.stages=[provision,warm_start,train,quality_gate,report]",
        ],
    )
    text = to_yaml(cfg)

    def art(cls, name):
        return cls(uri=str(tmp_path / "out" / name))

    run_dir, resolved = c.provision.python_func(config_yaml=text, job_id="job-1", rl_steps=2)
    assert load_config_text(resolved) == cfg  # rl_steps=2 is the config's already
    layout = RunLayout.of(run_dir)
    assert layout.run_id == "alone" and layout.done(ModelCheckResult)
    m = art(dsl.Metrics, "ws-metrics")
    model_dir = c.warm_start.python_func(
        resolved, run_dir, art(dsl.Model, "ws"), m, art(dsl.HTML, "ws-html")
    )
    assert "heldout_solve_rate_low" in m.metadata
    assert (tmp_path / "out/ws/model.safetensors").exists()
    m = art(dsl.Metrics, "tr-metrics")
    c.train.python_func(
        resolved,
        run_dir,
        model_dir,
        art(dsl.Model, "tr"),
        m,
        art(dsl.Artifact, "trace"),
        art(dsl.HTML, "tr-html"),
    )
    assert m.metadata["steps"] == 2.0 and (tmp_path / "out/trace").stat().st_size > 0
    assert "data:image/png;base64," in (tmp_path / "out/tr-html").read_text()
    m = art(dsl.Metrics, "gate-metrics")
    c.quality_gate.python_func(
        resolved, run_dir, art(dsl.Artifact, "gate"), m, art(dsl.HTML, "gate-html")
    )
    assert m.metadata["gate_passed"] == 1.0
    assert "Quality gate PASSED" in (tmp_path / "out/gate-html").read_text()
    assert c.promote.python_func(text, run_dir) == "promoted"
    c.report.python_func(text, run_dir, art(dsl.HTML, "html"), art(dsl.Markdown, "md"))
    assert "asyncrl run report" in (tmp_path / "out/md").read_text()

    class Status:
        state = "SUCCEEDED"

    c.teardown.python_func(config_yaml=text, job_id="job-1", status=Status())
    assert layout.read(TeardownResult).pipeline_state == "SUCCEEDED"


def test_component_specs_are_compiled_snapshots_and_load_as_components(tmp_path):
    """Regenerate: `asyncrl pipeline compile <each of CONFIGS>`."""
    from kfp import components as kfp_components

    cfg = load_config(ROOT / "configs/local.yaml")
    fresh = remote.compile_components(cfg, tmp_path)
    names = [p.parent.name for p in fresh]
    assert names == [f.__name__ for f in FUNCTIONS] and "promote" in names
    for path in fresh:
        snapshot = ROOT / "components" / path.parent.name / "component.yaml"
        assert path.read_text() == snapshot.read_text(), f"{snapshot} is stale: recompile it"
        loaded = kfp_components.load_component_from_file(str(snapshot))
        assert loaded.name == path.parent.name.replace("_", "-")
        assert "config_yaml" in loaded.component_spec.inputs
