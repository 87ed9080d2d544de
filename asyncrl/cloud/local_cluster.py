"""The local cluster: what `cluster.backend: gke` talks to when the pipeline runs on this machine.

A Kubernetes API (kube_emulator.py) with the local JobSet executor behind it (local_jobset.py,
playing JobSet controller and kubelet, its pods' logs served at pods/log), the rollout token
Secret created in it with a fresh token (on GKE the operator creates it, see the README runbook),
and a loopback GKE API for node pools (local_gke.py) unless one is given. `env()` is what a pipeline
task needs to reach it (stages/launch.py); `run_local` sets it for the kfp.local tasks.

The pods share this machine's filesystem, so the run folders must be local paths, listed in
`shared`: pods see them at the same path, as GKE pods see gs:// run folders at /gcs/.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from asyncrl.cloud.kube_emulator import CORE, JOBSETS, KubeEmulator, kube_emulator
from asyncrl.cloud.local_gke import local_gke_api
from asyncrl.cloud.local_jobset import LocalJobSetExecutor
from asyncrl.config import RunConfig
from asyncrl.run_layout import local_path
from asyncrl.stages.launch import GKE_ENDPOINT_ENV


@dataclass(frozen=True, slots=True)
class LocalCluster:
    api: KubeEmulator
    executor: LocalJobSetExecutor
    kubeconfig: Path
    gke_endpoint: str
    namespace: str

    def env(self) -> dict[str, str]:
        """The environment of a pipeline task that drives this cluster."""
        return {"KUBECONFIG": str(self.kubeconfig), GKE_ENDPOINT_ENV: self.gke_endpoint}

    def api_client(self):
        return self.api.api_client()


@contextlib.contextmanager
def local_cluster(
    workdir: Path,
    namespace: str,
    token_secret: str,
    *,
    shared: tuple[Path, ...] = (),
    gke_endpoint: str | None = None,
) -> Iterator[LocalCluster]:
    """A running local cluster whose state (kubeconfig, pod folders and logs) is under `workdir`."""
    with contextlib.ExitStack() as stack:
        api = stack.enter_context(kube_emulator((JOBSETS, *CORE)))
        _create_token_secret(api.api_client(), namespace, token_secret)
        if gke_endpoint is None:
            gke = stack.enter_context(local_gke_api())
            gke.polls_to_run = 0  # a local node pool has nothing to wait for
            gke_endpoint = gke.endpoint
        executor = LocalJobSetExecutor(
            api.api_client(), namespace, workdir / "pods", shared=shared
        ).start()
        stack.callback(executor.stop)
        api.serve_logs(executor.log)
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig", namespace)
        yield LocalCluster(api, executor, kubeconfig, gke_endpoint, namespace)


def cluster_for(cfg: RunConfig, workdir: Path, **kw) -> contextlib.AbstractContextManager:
    """The local cluster for `cfg`'s namespace and token Secret, sharing its runs folder."""
    c = cfg.cluster
    runs = local_path(cfg.pipeline.runs_dir).absolute()
    return local_cluster(workdir, c.namespace, c.rollout_token_secret, shared=(runs,), **kw)


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """This process's environment with `values` set (for the tasks it starts), then restored."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _create_token_secret(api_client, namespace: str, name: str) -> None:
    from kubernetes import client

    token = secrets.token_urlsafe(32)
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "data": {"token": base64.b64encode(token.encode()).decode()},
    }
    client.CoreV1Api(api_client).create_namespaced_secret(namespace, body)
