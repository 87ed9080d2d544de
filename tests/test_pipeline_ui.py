"""The pipeline as the Kubeflow UI shows it: the compiled parameters (the default config, the
overrides, the typed parameters and their descriptions), their resolution and refusal, submit and
schedule into an experiment with the UI's links, each stage's metrics and HTML page, and the
reusable component specs in another pipeline. Nothing here runs a stage."""

import base64
import re
from pathlib import Path

import pytest
import yaml
from conftest import recovery_verdict

from asyncrl.config import ConfigError, load_config, load_config_text, to_yaml
from asyncrl.gates.quality import decide
from asyncrl.metrics.intervals import Estimate, wilson
from asyncrl.metrics.plots import learning_curve
from asyncrl.metrics.tracker import JsonlTracker
from asyncrl.pipeline import params, remote, visuals
from asyncrl.pipeline.components import FUNCTIONS
from asyncrl.stages.quality_gate import GateResult
from asyncrl.stages.train import TrainResult
from asyncrl.stages.warm_start import WarmStartResult
from asyncrl.testing.kfp_stub import kfp_stub

ROOT = Path(__file__).parent.parent
LOCAL = ROOT / "configs/local.yaml"
STAGES_WITH_PAGES = ("warm-start", "train", "recovery-test", "quality-gate")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    cfg = load_config(LOCAL)
    path = remote.compile_pipeline(cfg, tmp_path_factory.mktemp("compiled"))
    return cfg, yaml.safe_load(path.read_text())


def test_the_compiled_pipeline_defaults_to_its_config_and_offers_typed_parameters(compiled):
    cfg, spec = compiled
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    default = inputs["config_yaml"]["defaultValue"]
    assert load_config_text(default) == cfg and "\n" not in default  # one line: kfp#10438
    assert inputs["overrides"]["parameterType"] == "LIST"
    assert inputs["overrides"]["defaultValue"] == []
    names = params.typed_names()
    assert set(inputs) == {"config_yaml", "overrides", *names}
    kinds = {str: "STRING", int: "NUMBER_INTEGER", float: "NUMBER_DOUBLE", tuple: "LIST"}
    unset = params.RunParams()
    for name in names:
        assert inputs[name]["isOptional"] is True
        value = getattr(unset, name)
        assert inputs[name]["parameterType"] == kinds[type(value)], name
        assert inputs[name]["defaultValue"] == (list(value) if isinstance(value, tuple) else value)
    for name, parameter in inputs.items():  # what the UI's form shows beside each field
        assert len(parameter.get("description", "")) > 20, name
    for name in names:  # each says what its default means
        assert "keeps the config's" in inputs[name]["description"], name


@pytest.mark.parametrize("compiled_file", sorted((ROOT / "pipelines/compiled").glob("*.yaml")))
def test_each_checked_in_pipeline_is_yaml_defaulting_to_its_config(compiled_file):
    """The header comment kfp writes holds every default: a line break in one breaks the file."""
    pipeline = next(yaml.safe_load_all(compiled_file.read_text()))
    default = pipeline["root"]["inputDefinitions"]["parameters"]["config_yaml"]["defaultValue"]
    cfg = load_config_text(default)
    assert remote.compiled_name(cfg) == compiled_file.name
    assert pipeline["pipelineInfo"]["name"] == cfg.pipeline.name


def test_every_stage_runs_the_config_provision_resolved(compiled):
    _, spec = compiled
    dag = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    for name, task in dag.items():
        source = task["inputs"]["parameters"]["config_yaml"]
        if name == "provision":
            assert source == {"componentInputParameter": "pipelinechannel--config_yaml"}
            continue
        assert source["taskOutputParameter"] == {
            "outputParameterKey": "resolved_config",
            "producerTask": "provision",
        }, name
    for name in ("provision", "teardown"):  # teardown resolves the same parameters itself
        tasks = spec["root"]["dag"]["tasks"]
        task = dag["provision"] if name == "provision" else tasks["teardown"]
        wired = set(task["inputs"]["parameters"])
        assert {"overrides", *params.typed_names()} <= wired, name


def test_stages_have_metrics_and_a_page_in_the_ui(compiled):
    _, spec = compiled
    for stage in STAGES_WITH_PAGES:
        outputs = spec["components"][f"comp-{stage}"]["outputDefinitions"]["artifacts"]
        assert outputs["metrics"]["artifactType"]["schemaTitle"] == "system.Metrics", stage
        assert outputs["html"]["artifactType"]["schemaTitle"] == "system.HTML", stage


def test_unset_parameters_keep_the_config_and_set_ones_equal_the_cli_overrides():
    cfg = load_config(LOCAL)
    text = to_yaml(cfg)
    assert params.resolve(text, params.RunParams.of(None)) == cfg
    typed = dict(
        model_checkpoint="gs://weights-bucket/qwen: v2 #7",  # YAML-looking text stays text
        tasks=["lookup"],
        rl_steps=7,
        learning_rate=3e-6,
        loss="dapo",
        min_solve_rate=0.5,
    )
    resolved = params.resolve(text, params.RunParams.of(["learner.kl_coef=0.05"], **typed))
    cli = load_config(
        LOCAL,
        [
            "learner.kl_coef=0.05",
            "model.checkpoint='gs://weights-bucket/qwen: v2 #7'",
            "env.tasks=[lookup]",
            "learner.steps=7",
            "learner.lr=3e-6",
            "learner.loss=dapo",
            "gate.min_solve_rate=0.5",
        ],
    )
    assert resolved == cli and resolved != cfg
    assert resolved.model.checkpoint == "gs://weights-bucket/qwen: v2 #7"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"loss": "ppo"}, r"'learner\.loss'.*allowed: grpo, dr_grpo, dapo, gspo.*'loss'"),
        ({"tasks": ["calc"]}, r"'env\.tasks\[0\]'.*allowed: calculator, lookup.*'tasks'"),
        ({"min_solve_rate": 1.5}, r"'gate\.min_solve_rate'.*in \[0, 1\].*'min_solve_rate'"),
        ({"rl_steps": 0}, r"'learner\.steps'.*positive.*'rl_steps'"),
        ({"overrides": ["learner.lrr=1e-5"]}, r"'learner\.lrr'.*did you mean 'learner\.lr'"),
        ({"overrides": ["learner.lr"]}, r"section\.key=value"),
        ({"overrides": [3]}, r"'overrides\[0\]'.*key=value string"),
        ({"overrides": ["learner.loss=dapo"], "loss": "gspo"}, r"set twice.*'loss'"),
        ({"overrides": ["learner.mode=lockstep"]}, r"'learner\.mode'.*allowed: sync, async"),
    ],
)
def test_invalid_parameters_are_refused_naming_the_key_and_what_is_allowed(given, message):
    text = to_yaml(load_config(LOCAL))
    with pytest.raises(ConfigError, match=message):
        params.resolve(text, params.RunParams.of(**given))


def test_provision_refuses_invalid_parameters_before_creating_anything(tmp_path, capsys):
    from asyncrl.pipeline.components import components

    c = components("asyncrl-runtime:test")
    text = to_yaml(load_config(LOCAL, [f"pipeline.runs_dir={tmp_path / 'runs'}"]))
    with pytest.raises(ConfigError, match=r"'learner\.loss'.*allowed: grpo"):
        c.provision.python_func(config_yaml=text, job_id="job-1", loss="ppo")

    class Failed:
        state = "FAILED"

    c.teardown.python_func(config_yaml=text, job_id="job-1", status=Failed(), loss="ppo")
    assert "nothing was provisioned" in capsys.readouterr().out
    assert not (tmp_path / "runs").exists()


def test_submit_and_schedule_file_runs_under_an_experiment_created_once():
    cfg = load_config(LOCAL)
    with kfp_stub() as stub:
        run = remote.submit(cfg, stub.host, "lr-sweep-1", experiment="lr-sweep")
        again = remote.submit(cfg, stub.host, "lr-sweep-2", experiment="lr-sweep")
        job = remote.schedule(cfg, stub.host, "0 0 3 * * *", "nightly", experiment="nightly")
        posts = [r for r in stub.requests if r["method"] == "POST"]
        made = [r["body"]["display_name"] for r in posts if r["path"].endswith("/experiments")]
        assert made == ["lr-sweep", "nightly"]  # the second submit found the first's experiment
        runs = [r["body"] for r in posts if r["path"] == "/apis/v2beta1/runs"]
        assert [r["experiment_id"] for r in runs] == [run.experiment_id, again.experiment_id]
        assert run.experiment_id == again.experiment_id == stub.experiments["lr-sweep"]
        assert run.url == f"{stub.host}/#/runs/details/{run.run_id}"
        assert run.experiment_url == f"{stub.host}/#/experiments/details/{run.experiment_id}"
        recurring = posts[-1]["body"]
        assert recurring["experiment_id"] == job.experiment_id == stub.experiments["nightly"]
        assert job.url == f"{stub.host}/#/recurringrun/details/{job.run_id}"


def test_cli_submit_and_schedule_print_the_ui_links(capsys):
    from asyncrl.cli import main

    with kfp_stub() as stub:
        args = ["--host", stub.host, "--experiment", "ablations", "--run-name", "kl-0.05"]
        assert main(["pipeline", "submit", str(LOCAL), "learner.kl_coef=0.05", *args]) == 0
        lines = capsys.readouterr().out.splitlines()
        created = next(r["body"] for r in stub.requests if r["path"] == "/apis/v2beta1/runs")
        assert created["display_name"] == "kl-0.05"
        assert "kl_coef: 0.05" in created["runtime_config"]["parameters"]["config_yaml"]
        eid = stub.experiments["ablations"]
        assert len(lines) == 2  # kfp.Client's own link lines are not shown
        assert lines[0] == f"experiment ablations: {stub.host}/#/experiments/details/{eid}"
        rid = re.fullmatch(r"submitted run (\S+): (\S+)", lines[1])
        assert rid and rid[1] in stub.run_states
        assert rid[2] == f"{stub.host}/#/runs/details/{rid[1]}"
        cron = ["--cron", "0 0 3 * * *"]
        assert main(["pipeline", "schedule", str(LOCAL), *cron, *args]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == f"experiment ablations: {stub.host}/#/experiments/details/{eid}"
        job = re.fullmatch(
            r"scheduled recurring run (\S+) on cron '0 0 3 \* \* \*': (\S+)", lines[1]
        )
        assert len(lines) == 2 and job and job[2] == f"{stub.host}/#/recurringrun/details/{job[1]}"


# -- metrics and pages ----------------------------------------------------------------------------


def _heldout_n(cfg) -> int:
    return cfg.env.heldout_size * len(cfg.env.tasks)


def test_warm_start_metrics_carry_wilson_intervals_over_the_heldout_episodes():
    cfg = load_config(LOCAL)
    n = _heldout_n(cfg)
    result = WarmStartResult(
        model_dir="m",
        steps=460,
        seconds=12.5,
        final_loss=0.31,
        heldout_solve_rate=40 / n,
        heldout_by_family=tuple((f, 20 / cfg.env.heldout_size) for f in ("calculator", "lookup")),
        demonstrations=2000,
        skipped_too_long=48,
    )
    m = visuals.warm_start_metrics(result, cfg)
    whole = wilson(40, n, cfg.gate.confidence)
    assert (m["heldout_solve_rate_low"], m["heldout_solve_rate_high"]) == (whole.low, whole.high)
    lookup = wilson(20, cfg.env.heldout_size, cfg.gate.confidence)
    assert m["heldout_solve_rate/lookup"] == m["heldout_solve_rate"] == 40 / n
    assert m["heldout_solve_rate/lookup_high"] == lookup.high > whole.high  # half the episodes
    assert m["steps"] == 460 and m["final_loss"] == 0.31
    page = visuals.warm_start_html(result, cfg)
    assert whole.text() in page and lookup.text() in page


def test_train_page_embeds_the_learning_curve_and_metrics_skip_what_is_not_a_number(tmp_path):
    cfg = load_config(LOCAL)
    tracker = JsonlTracker(tmp_path / "metrics.jsonl")
    for step, rate in ((0, 0.25), (10, 0.5)):
        tracker.log(step, {"solve_rate": rate, "episodes": 128.0}, kind="eval")
    tracker.close()
    curve = learning_curve(tmp_path / "metrics.jsonl", tmp_path / "learning_curve.png")
    result = TrainResult(
        model_dir="m",
        steps=10,
        seconds=0.0,  # no wall time: no steps/min rather than inf
        initial_solve_rate=0.25,
        final_solve_rate=0.5,
        groups_trained=40,
        groups_dropped_stale=2,
        groups_failed=0,
        groups_withdrawn=0,
        groups_no_signal=3,
        policy_lag_mean=0.8,
        policy_lag_max=1,
        learner_idle_fraction=float("nan"),
        curve=str(curve),
    )
    m = visuals.train_metrics(result, cfg)
    assert "steps_per_min" not in m and "learner_idle_fraction" not in m
    assert m["initial_solve_rate_low"] < 0.25 < m["initial_solve_rate_high"]
    assert m["final_solve_rate"] == 0.5 and m["policy_lag_mean"] == 0.8 and m["steps"] == 10
    page = visuals.train_html(result, cfg)
    (embedded,) = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert base64.b64decode(embedded) == curve.read_bytes()
    curve.unlink()
    assert "No learning curve" in visuals.train_html(result, cfg)


def _gate(cfg, solve: Estimate, champion: dict | None) -> GateResult:
    candidate = {
        "solve_rate": solve,
        "mean_reward": Estimate(0.4, 0.3, 0.5, 128),
        "failed/truncated": wilson(12, 128, 0.95),
    }
    report = decide(candidate, champion, cfg.gate, "run-0", start_solve_rate=0.2)
    return GateResult(
        passed=report.passed,
        run_id="run-1",
        model="m",
        champion=report.champion,
        eval_key="k",
        checks=report.checks,
        candidate=candidate,
        champion_metrics=champion,
        greedy_statuses={},
    )


def test_gate_page_is_its_verdict_table_and_its_metrics_carry_intervals():
    cfg = load_config(LOCAL)  # bar 0.25, gain 0.10 over the start
    low = _gate(cfg, wilson(20, 128, 0.95), None)
    assert not low.passed
    page = visuals.gate_html(low)
    rows = re.findall(r"<tr><td>([^<]*)</td>(?:<td>[^<]*</td>){2}<td>(pass|FAIL)</td>", page)
    assert rows == [
        (c.name.replace(">", "&gt;"), "pass" if c.passed else "FAIL") for c in low.checks
    ]
    assert "Quality gate FAILED" in page and wilson(20, 128, 0.95).text() in page
    assert "<td>failed/truncated</td><td>9.4% [" in page and "<td>0.4 [0.3, 0.5]</td>" in page
    m = visuals.gate_metrics(low)
    assert m["gate_passed"] == 0.0 and m["checks_failed"] == len(low.failed) >= 1
    assert m["solve_rate_low"] < m["solve_rate"] < m["solve_rate_high"]
    champion = {"solve_rate": wilson(40, 128, 0.95), "mean_reward": Estimate(0.3, 0.2, 0.4, 128)}
    high = _gate(cfg, wilson(64, 128, 0.95), champion)
    assert high.passed and "Quality gate PASSED" in visuals.gate_html(high)
    assert visuals.gate_metrics(high)["champion/solve_rate"] == 40 / 128


def test_recovery_page_has_a_row_per_phase():
    verdict = recovery_verdict(("before_step", True), ("after_publish", False))
    m = visuals.recovery_metrics(verdict)
    assert (m["phases"], m["phases_passed"], m["passed"]) == (2, 1, 0.0)
    page = visuals.recovery_html(verdict)
    assert "1/2 phases" in page and "FAIL weights differ" in page and "DIFFERENT" in page


# -- reusable components ------------------------------------------------------------------------


def test_a_checked_in_component_spec_runs_in_another_teams_pipeline(tmp_path):
    """Another pipeline loads the gate's spec and wires it after a step of its own."""
    from kfp import compiler, dsl
    from kfp.components import load_component_from_file

    gate = load_component_from_file(str(ROOT / "components/quality_gate/component.yaml"))

    @dsl.component(base_image="python:3.11")
    def pick_run(prefix: str) -> str:
        return prefix + "/run-7"

    @dsl.pipeline(name="other-team-gate")
    def other(config_yaml: str, runs: str = "gs://other-team/runs"):
        run = pick_run(prefix=runs)
        gate(config_yaml=config_yaml, run_dir=run.output)

    path = tmp_path / "other.yaml"
    compiler.Compiler().compile(other, str(path))
    spec = yaml.safe_load(path.read_text())
    task = spec["root"]["dag"]["tasks"]["quality-gate"]
    assert task["inputs"]["parameters"]["run_dir"]["taskOutputParameter"]["producerTask"] == (
        "pick-run"
    )
    outputs = spec["components"]["comp-quality-gate"]["outputDefinitions"]["artifacts"]
    assert {"report", "metrics", "html"} <= set(outputs)
    assert spec["deploymentSpec"]["executors"]["exec-quality-gate"]["container"]["image"] == (
        load_config(LOCAL).cluster.image
    )


def test_the_components_readme_lists_every_input_and_output():
    readme = (ROOT / "components/README.md").read_text()
    for f in FUNCTIONS:
        spec = yaml.safe_load((ROOT / "components" / f.__name__ / "component.yaml").read_text())
        comp = spec["components"][f"comp-{f.__name__.replace('_', '-')}"]
        names = set(comp.get("inputDefinitions", {}).get("parameters", {}))
        names |= set(comp.get("inputDefinitions", {}).get("artifacts", {}))
        names |= set(comp.get("outputDefinitions", {}).get("parameters", {}))
        names |= set(comp.get("outputDefinitions", {}).get("artifacts", {}))
        section = readme.split(f"### `{f.__name__}`", 1)
        assert len(section) == 2, f"components/README.md has no section for {f.__name__}"
        text = section[1].split("### ", 1)[0]
        missing = [n for n in sorted(names) if f"`{n}`" not in text]
        assert not missing, f"components/README.md, {f.__name__}: {missing} not listed"
