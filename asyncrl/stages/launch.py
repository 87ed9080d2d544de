"""Where a pipeline task finds the cluster it drives, from its environment.

On GKE the KFP pods reach Google's GKE API and, through their service account, the cluster's
Kubernetes API (the `kubernetes` client's in-cluster config). A local cluster (the local JobSet
executor behind `asyncrl run` with backend gke, and the tests) hands its tasks two variables:
KUBECONFIG, the kube config naming its API server, and GKE_ENDPOINT_ENV, the loopback GKE API that
node pools are requested from. Nothing else in the package reads them.
"""

from __future__ import annotations

import os

GKE_ENDPOINT_ENV = "ASYNCRL_GKE_ENDPOINT"


def gke_endpoint() -> str | None:
    """The GKE API to provision node pools through; None for Google's."""
    return os.environ.get(GKE_ENDPOINT_ENV) or None


def kube_config_file() -> str | None:
    """The kube config file KUBECONFIG names; None for the default (~/.kube/config or, in a pod,
    the service account)."""
    return os.environ.get("KUBECONFIG") or None
