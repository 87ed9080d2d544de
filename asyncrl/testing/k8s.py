"""The in-process Kubernetes API emulator for tests (the product's own, cloud/kube_emulator.py)."""

from __future__ import annotations

from asyncrl.cloud.kube_emulator import KubeEmulator as K8sEmulator
from asyncrl.cloud.kube_emulator import kube_emulator as k8s_emulator

__all__ = ["K8sEmulator", "k8s_emulator"]
