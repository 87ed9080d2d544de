"""The loopback GKE API for node-pool tests (the product's own, cloud/local_gke.py)."""

from __future__ import annotations

from asyncrl.cloud.local_gke import LocalGkeApi as GkeStub
from asyncrl.cloud.local_gke import local_gke_api as gke_stub

__all__ = ["GkeStub", "gke_stub"]
