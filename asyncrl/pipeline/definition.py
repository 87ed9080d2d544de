"""The Kubeflow pipeline: provision → [warm start → train → recovery → gate → promote → report]
→ teardown.

The run config travels as one YAML string parameter (`config_yaml`), whose default is the config
the pipeline was compiled from (on one line: see `params.config_default`), so a run started in the
UI needs no input. Beside it the UI's form offers `overrides` (dotted `key=value` strings) and
typed parameters for what people change most (`pipeline/params.py` names the keys they set and
their "keep" defaults); the docstring's Args are the descriptions the form shows. Provision
resolves them once, with the CLI's loader, and every stage receives that one resolved config; an
invalid value fails provision, naming the key.

The stages sit inside a `dsl.ExitHandler` whose exit task tears down what provision created,
whatever happened to the stages. Provision and teardown are retried (they are idempotent); the
stages that train or gate are not (a retried gate would hide a flaky failure).
Caching is off for every stage: each has side effects (a run folder, a champion, a node pool).

TPU placement comes from the config at compile time, through `kfp-kubernetes`: the GKE TPU node
selectors, a toleration for the `google.com/tpu` taint and `google.com/tpu` chip limits on the
stages that use the accelerator in their own pod (warm start, recovery test, gate: one node of
a single-host slice, or of the replicas' single-host pool when the trainer's slice spans several
hosts; train is a launcher whose JobSet's pods hold the slice); pods run as non-root with a
timeout. The Kubernetes service account is named at submit time (`asyncrl pipeline submit`), and
Workload Identity maps it to GCS permissions: no key or secret is ever a parameter. The same
pipeline runs locally through `kfp.local` (see `pipeline/local.py`), where those settings have no
effect.
"""

# No `from __future__ import annotations`: KFP reads the pipeline signature's real types.

from kfp import dsl, kubernetes

from asyncrl.cloud.jobset import ACCELERATOR, slice_shape
from asyncrl.config import ConfigError, RunConfig
from asyncrl.pipeline.components import components
from asyncrl.pipeline.params import config_default


def _one_host(cfg: RunConfig) -> tuple[str, int, str | None]:
    """(topology, chips, node pool or None) of the one TPU node a single-pod stage runs on.

    A single-host slice's node is that node. One host of a multi-host slice cannot run alone
    (libtpu starts only with all the slice's hosts), so warm start, recovery test and gate then
    run on a node of the replicas' single-host pool, which provision creates for placement
    remote and which is free before and after the training JobSet."""
    c = cfg.cluster
    hosts, chips = slice_shape(c.tpu_type, c.tpu_topology)
    if hosts == 1:
        return c.tpu_topology, chips, None
    one = c.rollout_slice
    if c.placement != "remote" or one is None:
        raise ConfigError(
            "cluster.placement",
            f"got {c.placement!r} with the multi-host slice {c.tpu_type} {c.tpu_topology}; "
            "allowed: 'remote' (warm start, recovery test and gate run in one pod on one "
            "single-host node, and only the replicas' pool has those)",
        )
    return one.topology, one.chips_per_host, c.rollout_node_pool


def _on_tpu(task, cfg: RunConfig) -> None:
    c = cfg.cluster
    topology, chips, pool = _one_host(cfg)
    kubernetes.add_node_selector(
        task,
        label_key="cloud.google.com/gke-tpu-accelerator",
        label_value=ACCELERATOR[c.tpu_type],
    )
    kubernetes.add_node_selector(
        task, label_key="cloud.google.com/gke-tpu-topology", label_value=topology
    )
    if pool is not None:
        kubernetes.add_node_selector(
            task, label_key="cloud.google.com/gke-nodepool", label_value=pool
        )
    kubernetes.add_toleration(task, key="google.com/tpu", operator="Exists", effect="NoSchedule")
    task.set_accelerator_type("google.com/tpu").set_accelerator_limit(chips)


def _on_gke(task, cfg: RunConfig) -> None:
    kubernetes.set_image_pull_policy(task, "IfNotPresent")
    # The run folder gs://… is mounted at /gcs/… by the Cloud Storage FUSE driver.
    kubernetes.add_pod_annotation(task, "gke-gcsfuse/volumes", "true")
    kubernetes.set_security_context(task, run_as_user=1000, run_as_non_root=True)
    kubernetes.set_timeout(task, int(cfg.pipeline.timeout_s))


def _stages(comps, cfg: RunConfig, config_yaml, run_dir) -> tuple:
    """Warm start → train → recovery test → gate → promote → report, all on one config."""
    ws = comps.warm_start(config_yaml=config_yaml, run_dir=run_dir)
    tr = comps.train(config_yaml=config_yaml, run_dir=run_dir, init_model=ws.outputs["Output"])
    rec = comps.recovery_test(
        config_yaml=config_yaml, run_dir=run_dir, init_model=ws.outputs["Output"]
    ).after(tr)
    gate = comps.quality_gate(config_yaml=config_yaml, run_dir=run_dir).after(rec)
    prom = comps.promote(config_yaml=config_yaml, run_dir=run_dir).after(gate)
    rep = comps.report(config_yaml=config_yaml, run_dir=run_dir).after(prom)
    for task in (ws, tr, rec, gate, prom, rep):
        task.set_caching_options(False)
    if cfg.cluster.backend == "gke" and cfg.cluster.tpu_type != "none":
        for task in (ws, rec, gate):  # train launches the JobSet that trains: its pod needs no TPU
            _on_tpu(task, cfg)
    return ws, tr, rec, gate, prom, rep


def build_pipeline(cfg: RunConfig):
    """The pipeline function for `cfg`'s cluster settings (image, TPU, service account); `cfg`
    itself is the default of `config_yaml`, so a run started from the UI needs no input."""
    comps = components(cfg.cluster.image)

    @dsl.pipeline(name=cfg.pipeline.name)
    def asyncrl_pipeline(
        config_yaml: str = config_default(cfg),
        overrides: list = [],  # noqa: B006 - KFP needs a literal default; never mutated
        model_checkpoint: str = "",
        tasks: list = [],  # noqa: B006
        rl_steps: int = -1,
        learning_rate: float = -1.0,
        loss: str = "",
        min_solve_rate: float = -1.0,
    ):
        """asyncrl: SFT warm start, async agentic GRPO, recovery test, quality gate.

        Args:
            config_yaml: The whole run config as YAML; the default is the compiled-in config.
            overrides: Dotted key=value strings, as on the CLI, e.g. ["learner.kl_coef=0.05"].
            model_checkpoint: HF safetensors folder (gs:// or path). "" keeps the config's.
            tasks: Task families, e.g. ["calculator", "lookup"]. [] keeps the config's.
            rl_steps: RL optimizer steps (learner.steps). -1 keeps the config's.
            learning_rate: RL learning rate (learner.lr). -1 keeps the config's.
            loss: RL objective: grpo, dr_grpo, dapo or gspo. "" keeps the config's.
            min_solve_rate: Gate bar: held-out solve rate in [0, 1]. -1 keeps the config's.
        """
        typed = dict(model_checkpoint=model_checkpoint, tasks=tasks, rl_steps=rl_steps)
        typed |= dict(learning_rate=learning_rate, loss=loss, min_solve_rate=min_solve_rate)
        job = dsl.PIPELINE_JOB_ID_PLACEHOLDER  # names the run folder unless pipeline.run_id does
        down = comps.teardown(config_yaml=config_yaml, job_id=job, overrides=overrides, **typed)
        down.set_caching_options(False).set_retry(3)
        with dsl.ExitHandler(down, name="stages"):
            prov = comps.provision(
                config_yaml=config_yaml, job_id=job, overrides=overrides, **typed
            )
            prov.set_caching_options(False).set_retry(3)
            run_dir = prov.outputs["run_dir"]
            resolved = prov.outputs["resolved_config"]  # every stage runs this one config
            stages = _stages(comps, cfg, config_yaml=resolved, run_dir=run_dir)
        if cfg.cluster.backend == "gke":
            for task in (prov, *stages, down):
                _on_gke(task, cfg)

    return asyncrl_pipeline
