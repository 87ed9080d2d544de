"""The Kubeflow pipeline: provision → [warm start → train → recovery → gate → promote → report]
→ teardown.

The run config travels as one YAML string parameter (`config_yaml`), so a run in the UI shows
exactly what it ran with. The stages sit inside a `dsl.ExitHandler` whose exit task tears down what
provision created, whatever happened to the stages. Provision and teardown are retried (they are
idempotent); the stages that train or gate are not (a retried gate would hide a flaky failure).
Caching is off for every stage: each has side effects (a run folder, a champion, a node pool).

TPU placement comes from the config at compile time, through `kfp-kubernetes`: the GKE TPU node
selectors, a toleration for the `google.com/tpu` taint and `google.com/tpu` chip limits on the
stages that use the accelerator in their own pod (warm start, recovery test, gate; train is a
launcher whose JobSet's pods hold the slice); pods run as non-root with a timeout. The Kubernetes
service account is named at submit time (`asyncrl pipeline submit`), and Workload Identity maps it
to GCS permissions: no key or secret is ever a parameter. The same pipeline runs locally
through `kfp.local` (see `pipeline/local.py`), where those settings have no effect.
"""

# No `from __future__ import annotations`: KFP reads the pipeline signature's real types.

from kfp import dsl, kubernetes

from asyncrl.cloud.jobset import ACCELERATOR, slice_shape
from asyncrl.config import RunConfig
from asyncrl.pipeline.components import components


def _on_tpu(task, cfg: RunConfig) -> None:
    c = cfg.cluster
    kubernetes.add_node_selector(
        task,
        label_key="cloud.google.com/gke-tpu-accelerator",
        label_value=ACCELERATOR[c.tpu_type],
    )
    kubernetes.add_node_selector(
        task, label_key="cloud.google.com/gke-tpu-topology", label_value=c.tpu_topology
    )
    kubernetes.add_toleration(task, key="google.com/tpu", operator="Exists", effect="NoSchedule")
    _, chips = slice_shape(c.tpu_type, c.tpu_topology)  # one host's chips, as the node pool has
    task.set_accelerator_type("google.com/tpu").set_accelerator_limit(chips)


def build_pipeline(cfg: RunConfig):
    """The pipeline function for `cfg`'s cluster settings (image, TPU, service account)."""
    comps = components(cfg.cluster.image)
    accelerated = cfg.cluster.backend == "gke" and cfg.cluster.tpu_type != "none"

    @dsl.pipeline(
        name=cfg.pipeline.name,
        description="asyncrl: SFT warm start, async agentic GRPO, recovery test, quality gate.",
    )
    def asyncrl_pipeline(config_yaml: str):
        job = dsl.PIPELINE_JOB_ID_PLACEHOLDER  # names the run folder unless pipeline.run_id does
        down = comps.teardown(config_yaml=config_yaml, job_id=job)
        down.set_caching_options(False).set_retry(3)
        with dsl.ExitHandler(down, name="stages"):
            prov = comps.provision(config_yaml=config_yaml, job_id=job)
            prov.set_caching_options(False).set_retry(3)
            run_dir = prov.outputs["run_dir"]
            ws = comps.warm_start(config_yaml=config_yaml, run_dir=run_dir)
            tr = comps.train(
                config_yaml=config_yaml, run_dir=run_dir, init_model=ws.outputs["Output"]
            )
            rec = comps.recovery_test(
                config_yaml=config_yaml, run_dir=run_dir, init_model=ws.outputs["Output"]
            ).after(tr)
            gate = comps.quality_gate(config_yaml=config_yaml, run_dir=run_dir).after(rec)
            prom = comps.promote(config_yaml=config_yaml, run_dir=run_dir).after(gate)
            rep = comps.report(config_yaml=config_yaml, run_dir=run_dir).after(prom)
            for task in (ws, tr, rec, gate, prom, rep):
                task.set_caching_options(False)
            if accelerated:  # train launches the JobSet that trains: its own pod needs no TPU
                for task in (ws, rec, gate):
                    _on_tpu(task, cfg)
        if cfg.cluster.backend == "gke":
            for task in (prov, ws, tr, rec, gate, prom, rep, down):
                kubernetes.set_image_pull_policy(task, "IfNotPresent")
                # The run folder gs://… is mounted at /gcs/… by the Cloud Storage FUSE driver.
                kubernetes.add_pod_annotation(task, "gke-gcsfuse/volumes", "true")
                kubernetes.set_security_context(task, run_as_user=1000, run_as_non_root=True)
                kubernetes.set_timeout(task, int(cfg.pipeline.timeout_s))

    return asyncrl_pipeline
