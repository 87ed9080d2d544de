"""The pipeline's components: one thin lightweight-Python component per stage.

Each function parses the run config (one YAML string), sets up the process's devices, calls the
stage function in `asyncrl.stages` and copies the stage's results into typed KFP artifacts (Model,
Metrics, HTML, Markdown, Artifact) so the Kubeflow UI shows them. Nothing else happens here: the
stages own the work. On the gke backend `train` is a launcher (cloud/launcher.py): the run's
JobSet trains on the TPU slice while this pod watches it, and its result is read from the run
folder; provision and teardown reach GKE's API (or the endpoint stages/launch.py names). Every
component runs in the one runtime image (`images/runtime.Dockerfile`), which has asyncrl and kfp
installed, so `install_kfp_package=False` and no pip installs at run time. Stages the config
leaves out of `pipeline.stages` return at once, marked skipped.
"""

# No `from __future__ import annotations`: KFP reads the real annotation objects.
from dataclasses import dataclass
from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Artifact, Markdown, Metrics, Model, Output


def provision(
    config_yaml: str,
    job_id: str,
    overrides: list = [],  # noqa: B006 - KFP needs a literal default; never mutated
    model_checkpoint: str = "",
    tasks: list = [],  # noqa: B006
    rl_steps: int = -1,
    learning_rate: float = -1.0,
    loss: str = "",
    min_solve_rate: float = -1.0,
) -> NamedTuple("Outputs", [("run_dir", str), ("resolved_config", str)]):
    """Resolve the run's config once, make the run folder and acquire the devices.

    Args:
        config_yaml: The run config as YAML.
        job_id: Names the run folder unless the config's pipeline.run_id does.
        overrides: Dotted key=value overrides applied to config_yaml.
        model_checkpoint: Sets model.checkpoint; "" keeps the config's.
        tasks: Sets env.tasks; [] keeps the config's.
        rl_steps: Sets learner.steps; -1 keeps the config's.
        learning_rate: Sets learner.lr; -1 keeps the config's.
        loss: Sets learner.loss; "" keeps the config's.
        min_solve_rate: Sets gate.min_solve_rate; -1 keeps the config's.
    """
    from collections import namedtuple

    from asyncrl.config import to_yaml
    from asyncrl.pipeline.params import RunParams, resolve
    from asyncrl.run_layout import RunLayout
    from asyncrl.wiring.devices import ensure_host_devices

    typed = dict(model_checkpoint=model_checkpoint, tasks=tasks, rl_steps=rl_steps)
    typed |= dict(learning_rate=learning_rate, loss=loss, min_solve_rate=min_solve_rate)
    cfg = resolve(config_yaml, RunParams.of(overrides, **typed))  # refuses a bad value first
    ensure_host_devices(cfg)
    from asyncrl.stages.provision import provision as run

    provisioner = None
    if cfg.cluster.backend == "gke":
        from asyncrl.cloud.provision import NodePoolProvisioner
        from asyncrl.stages.launch import gke_endpoint

        provisioner = NodePoolProvisioner(endpoint=gke_endpoint())
    layout = RunLayout.at(cfg.pipeline.runs_dir, cfg.pipeline.run_id or job_id)
    result = run(cfg, layout, provisioner)
    print(f"provisioned {result.devices}; run folder {result.run_dir}")
    return namedtuple("Outputs", ["run_dir", "resolved_config"])(result.run_dir, to_yaml(cfg))


def warm_start(
    config_yaml: str,
    run_dir: str,
    model: Output[Model],
    metrics: Output[Metrics],
    html: Output[HTML],
) -> str:
    import shutil
    from pathlib import Path

    from asyncrl.config import load_config_text
    from asyncrl.pipeline import visuals
    from asyncrl.run_layout import RunLayout
    from asyncrl.wiring.devices import ensure_host_devices

    cfg = load_config_text(config_yaml)
    if "warm_start" not in cfg.pipeline.stages or cfg.warm_start.steps == 0:
        model.metadata["skipped"] = True
        Path(html.path).write_text(visuals.skipped_html("warm start"))
        return ""
    ensure_host_devices(cfg)
    from asyncrl.stages.warm_start import warm_start as run

    result = run(cfg, RunLayout.of(run_dir))
    shutil.copytree(result.model_dir, model.path, dirs_exist_ok=True)
    for name, value in visuals.warm_start_metrics(result, cfg).items():
        metrics.log_metric(name, value)
    Path(html.path).write_text(visuals.warm_start_html(result, cfg))
    return result.model_dir


def train(
    config_yaml: str,
    run_dir: str,
    init_model: str,
    model: Output[Model],
    metrics: Output[Metrics],
    trace: Output[Artifact],
    html: Output[HTML],
) -> str:
    import shutil
    from pathlib import Path

    from asyncrl.config import load_config_text
    from asyncrl.pipeline import visuals
    from asyncrl.run_layout import RunLayout
    from asyncrl.wiring.devices import ensure_host_devices

    cfg = load_config_text(config_yaml)
    if "train" not in cfg.pipeline.stages:
        model.metadata["skipped"] = True
        Path(html.path).write_text(visuals.skipped_html("train"))
        return init_model
    layout = RunLayout.of(run_dir)
    if cfg.cluster.backend == "gke":  # a launcher: the run's JobSet trains, on the TPU slice
        from asyncrl.cloud.launcher import run_training_jobset

        result = run_training_jobset(cfg, layout, init_model or None)
    else:
        ensure_host_devices(cfg)
        from asyncrl.stages.train import train as run

        result = run(cfg, layout, init_model=init_model or None)
    shutil.copytree(result.model_dir, model.path, dirs_exist_ok=True)
    for name, value in visuals.train_metrics(result, cfg).items():
        metrics.log_metric(name, value)
    Path(html.path).write_text(visuals.train_html(result, cfg))
    if layout.trace.exists():
        shutil.copyfile(layout.trace, trace.path)
    return result.model_dir


def recovery_test(
    config_yaml: str,
    run_dir: str,
    init_model: str,
    verdict: Output[Artifact],
    metrics: Output[Metrics],
    html: Output[HTML],
):
    import shutil
    from pathlib import Path

    from asyncrl.config import load_config_text
    from asyncrl.pipeline import visuals
    from asyncrl.run_layout import RunLayout, Stage

    cfg = load_config_text(config_yaml)
    if "recovery_test" not in cfg.pipeline.stages:
        verdict.metadata["skipped"] = True
        Path(html.path).write_text(visuals.skipped_html("recovery test"))
        return
    from asyncrl.stages.recovery_test import recovery_test as run
    from asyncrl.stages.recovery_test import table

    layout = RunLayout.of(run_dir)
    result = run(cfg, layout, init_model=init_model or None)
    print(table(result))
    shutil.copyfile(layout.result_path(Stage.RECOVERY_TEST), verdict.path)
    for name, value in visuals.recovery_metrics(result).items():
        metrics.log_metric(name, value)
    Path(html.path).write_text(visuals.recovery_html(result))
    # A failed verdict still ends this task successfully, so that KFP keeps its page and metrics
    # (it uploads the outputs of succeeded tasks only); the promote task stops the run on it,
    # before anything is promoted.


def quality_gate(
    config_yaml: str,
    run_dir: str,
    report: Output[Artifact],
    metrics: Output[Metrics],
    html: Output[HTML],
):
    import shutil
    from pathlib import Path

    from asyncrl.config import load_config_text
    from asyncrl.pipeline import visuals
    from asyncrl.run_layout import RunLayout, Stage
    from asyncrl.wiring.devices import ensure_host_devices

    cfg = load_config_text(config_yaml)
    if "quality_gate" not in cfg.pipeline.stages:
        report.metadata["skipped"] = True
        Path(html.path).write_text(visuals.skipped_html("quality gate"))
        return
    ensure_host_devices(cfg)
    from asyncrl.stages.quality_gate import format_report
    from asyncrl.stages.quality_gate import quality_gate as run

    layout = RunLayout.of(run_dir)
    result = run(cfg, layout)
    print(format_report(result))
    shutil.copyfile(layout.result_path(Stage.QUALITY_GATE), report.path)
    for name, value in visuals.gate_metrics(result).items():
        metrics.log_metric(name, value)
    Path(html.path).write_text(visuals.gate_html(result))
    # A failed gate still ends this task successfully: KFP uploads the outputs (the verdict page,
    # the metrics) of succeeded tasks only, and a failed gate is when people read them. The
    # promote task after it fails the run, naming the failed checks.


def promote(config_yaml: str, run_dir: str) -> str:
    from asyncrl.config import load_config_text
    from asyncrl.run_layout import RunLayout

    cfg = load_config_text(config_yaml)
    layout = RunLayout.of(run_dir)
    if "recovery_test" in cfg.pipeline.stages:  # its task succeeds whatever its verdict
        from asyncrl.stages.recovery_test import RecoveryVerdict, table

        verdict = layout.read(RecoveryVerdict)
        if not verdict.passed:
            raise RuntimeError("recovery test failed:\n" + table(verdict))
    if "quality_gate" not in cfg.pipeline.stages:
        return "skipped"
    from asyncrl.stages.promote import Decision
    from asyncrl.stages.promote import promote as run
    from asyncrl.stages.quality_gate import GateResult

    result = run(cfg, layout)
    print(f"promotion: {result.decision.value} ({result.registry})")
    if result.decision == Decision.GATE_FAILED:  # the run fails here (see quality_gate above)
        failed = ", ".join(c.name for c in layout.read(GateResult).failed)
        raise RuntimeError(f"quality gate failed: {failed}")
    return result.decision.value


def report(config_yaml: str, run_dir: str, html: Output[HTML], markdown: Output[Markdown]):
    import shutil

    from asyncrl.run_layout import RunLayout
    from asyncrl.stages.report import write_report

    paths = write_report(RunLayout.of(run_dir))
    shutil.copyfile(paths.html, html.path)
    shutil.copyfile(paths.markdown, markdown.path)
    print(f"report {paths.html}")


def teardown(
    config_yaml: str,
    job_id: str,
    status: dsl.PipelineTaskFinalStatus,
    overrides: list = [],  # noqa: B006 - KFP needs a literal default; never mutated
    model_checkpoint: str = "",
    tasks: list = [],  # noqa: B006
    rl_steps: int = -1,
    learning_rate: float = -1.0,
    loss: str = "",
    min_solve_rate: float = -1.0,
):
    from asyncrl.config import ConfigError
    from asyncrl.pipeline.params import RunParams, resolve
    from asyncrl.run_layout import RunLayout
    from asyncrl.stages.provision import teardown as run

    typed = dict(model_checkpoint=model_checkpoint, tasks=tasks, rl_steps=rl_steps)
    typed |= dict(learning_rate=learning_rate, loss=loss, min_solve_rate=min_solve_rate)
    try:  # the exit handler cannot read provision's output: resolve as provision did
        cfg = resolve(config_yaml, RunParams.of(overrides, **typed))
    except ConfigError as e:  # provision refused the same parameters before creating anything
        print(f"teardown after {status.state}: nothing was provisioned ({e})")
        return
    provisioner = None
    if cfg.cluster.backend == "gke":
        from asyncrl.cloud.provision import NodePoolProvisioner
        from asyncrl.stages.launch import gke_endpoint

        provisioner = NodePoolProvisioner(endpoint=gke_endpoint())
    layout = RunLayout.at(cfg.pipeline.runs_dir, cfg.pipeline.run_id or job_id)
    result = run(cfg, layout, pipeline_state=status.state, provisioner=provisioner)
    print(f"teardown after {status.state}: released {len(result.released)} resources")


FUNCTIONS = (
    provision,
    warm_start,
    train,
    recovery_test,
    quality_gate,
    promote,
    report,
    teardown,
)


@dataclass(frozen=True)
class Components:
    provision: object
    warm_start: object
    train: object
    recovery_test: object
    quality_gate: object
    promote: object
    report: object
    teardown: object


def components(image: str) -> Components:
    """The components, all on the runtime image `image`."""
    made = {
        f.__name__: dsl.component(func=f, base_image=image, install_kfp_package=False)
        for f in FUNCTIONS
    }
    return Components(**made)
