"""GKE TPU node pools with the `google-cloud-container` client: create or reuse, wait, delete.

`node_pool_request(cfg)` is pure: the machine type and node count (hosts) of the slice from the one
table of GKE TPU slices (config/topology.py), compact placement with the TPU topology, spot
capacity or a named reservation, TPU taints are GKE's own. `provision_node_pool` reuses a pool of
that name when it exists (recording that it did not create it, so teardown leaves it alone),
otherwise creates it and waits until it is RUNNING. Errors name the cause: quota, permission, an
unknown topology. `dry_run` returns the request without sending it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.config.topology import slice_of
from asyncrl.stages.provision import Resource


class ProvisionError(RuntimeError):
    pass


def node_pool_request(cfg: RunConfig) -> dict[str, Any]:
    c = cfg.cluster
    try:
        tpu = slice_of(c.tpu_type, c.tpu_topology)
    except ValueError as e:
        raise ProvisionError(f"cluster.tpu_topology: {e}") from None
    config: dict[str, Any] = {
        "machine_type": tpu.machine_type,
        "spot": c.spot,
        "service_account": f"{c.service_account}@{c.project}.iam.gserviceaccount.com",
        "oauth_scopes": ["https://www.googleapis.com/auth/cloud-platform"],
        "labels": {"app": "asyncrl"},
        "workload_metadata_config": {"mode": "GKE_METADATA"},
    }
    if c.reservation:
        config["reservation_affinity"] = {
            "consume_reservation_type": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": [c.reservation],
        }
    return {
        "parent": f"projects/{c.project}/locations/{c.location}/clusters/{c.cluster_name}",
        "node_pool": {
            "name": c.node_pool,
            "initial_node_count": tpu.hosts,
            "config": config,
            "placement_policy": {"type_": "COMPACT", "tpu_topology": c.tpu_topology},
            "management": {"auto_repair": True, "auto_upgrade": False},
        },
    }


def _client(endpoint: str | None = None):
    from google.cloud import container_v1

    options = {"api_endpoint": endpoint} if endpoint else None
    credentials = None
    if endpoint and endpoint.startswith("http://"):  # a loopback stub: no credentials
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()
    return container_v1.ClusterManagerClient(
        transport="rest", client_options=options, credentials=credentials
    )


def _explain(e: Exception, what: str) -> ProvisionError:
    from google.api_core import exceptions as gexc

    if isinstance(e, gexc.ResourceExhausted) or "quota" in str(e).lower():
        return ProvisionError(
            f"{what}: TPU quota exceeded ({e.message if hasattr(e, 'message') else e}); "
            "request quota or use a reservation / spot capacity"
        )
    if isinstance(e, gexc.PermissionDenied | gexc.Forbidden):
        return ProvisionError(
            f"{what}: permission denied ({getattr(e, 'message', e)}); the caller "
            "needs roles/container.admin on the project"
        )
    return ProvisionError(f"{what}: {type(e).__name__}: {getattr(e, 'message', e)}")


def provision_node_pool(
    cfg: RunConfig, endpoint: str | None = None, timeout_s: float = 1800, poll_s: float = 10
) -> dict[str, Any]:
    """Create (or reuse) the node pool and wait until it runs; returns what teardown needs."""
    from google.api_core import exceptions as gexc
    from google.cloud import container_v1

    request = node_pool_request(cfg)
    name = f"{request['parent']}/nodePools/{request['node_pool']['name']}"
    client = _client(endpoint)
    record = {"kind": "node_pool", "name": name, "created": False}
    try:
        pool = client.get_node_pool(name=name)
        return record | {"status": pool.status.name}
    except gexc.NotFound:
        pass
    except Exception as e:
        raise _explain(e, f"reading node pool {name}") from None
    try:
        client.create_node_pool(request=container_v1.CreateNodePoolRequest(**request))
    except Exception as e:
        raise _explain(e, f"creating node pool {name}") from None
    record["created"] = True
    deadline = time.monotonic() + timeout_s
    while True:
        pool = client.get_node_pool(name=name)
        if pool.status == container_v1.NodePool.Status.RUNNING:
            return record | {"status": "RUNNING"}
        if pool.status == container_v1.NodePool.Status.ERROR:
            raise ProvisionError(f"node pool {name} failed: {pool.status_message}")
        if time.monotonic() > deadline:
            raise ProvisionError(f"node pool {name} not RUNNING after {timeout_s} s")
        time.sleep(poll_s)


def delete_node_pool(cfg: RunConfig, resource: dict[str, Any], endpoint: str | None = None):
    from google.api_core import exceptions as gexc

    try:
        _client(endpoint).delete_node_pool(name=resource["name"])
    except gexc.NotFound:
        pass  # already gone: teardown is idempotent
    except Exception as e:
        raise _explain(e, f"deleting node pool {resource['name']}") from None


@dataclass(frozen=True, slots=True)
class NodePoolProvisioner:
    """The provision stage's `Provisioner` on GKE: the run's TPU node pool."""

    endpoint: str | None = None
    timeout_s: float = 1800
    poll_s: float = 10

    def acquire(self, cfg: RunConfig) -> Resource:
        record = provision_node_pool(cfg, self.endpoint, self.timeout_s, self.poll_s)
        return Resource(
            kind=record["kind"],
            name=record["name"],
            created=bool(record["created"]),
            status=str(record.get("status", "")),
        )

    def release(self, cfg: RunConfig, resource: Resource) -> None:
        if resource.kind != "node_pool":
            raise ProvisionError(f"cannot release a {resource.kind!r}: not a node pool")
        delete_node_pool(cfg, {"kind": resource.kind, "name": resource.name}, self.endpoint)
