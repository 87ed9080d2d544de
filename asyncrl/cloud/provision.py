"""GKE TPU node pools with the `google-cloud-container` client: create or reuse, wait, delete.

`node_pool_request(cfg)` is pure: the machine type and node count (hosts) of the slice from the one
table of GKE TPU slices (config/topology.py), compact placement with the TPU topology, spot
capacity or a named reservation, TPU taints are GKE's own. With remote rollout replicas the run
has a second pool, `rollout_node_pool_request`: one single-host node per replica (the trainer's
pool cannot hold them: its slice's hosts are all the trainer's, and its JobSet job holds that
pool exclusively). `provision_node_pool` reuses a pool of that name when it exists (recording
that it did not create it, so teardown leaves it alone), otherwise creates it and waits until it
is RUNNING (a pool it created that fails to get there is deleted again); `provision_node_pools`
does every pool of the run and undoes its own creations when one fails. Errors name the cause:
quota, permission, an unknown topology.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.config.topology import slice_of
from asyncrl.stages.provision import Resource


class ProvisionError(RuntimeError):
    pass


def node_pool_request(cfg: RunConfig) -> dict[str, Any]:
    """The trainer's node pool: the whole TPU slice, one node per host, placed compactly."""
    c = cfg.cluster
    try:
        tpu = slice_of(c.tpu_type, c.tpu_topology)
    except ValueError as e:
        raise ProvisionError(f"cluster.tpu_topology: {e}") from None
    placement = {"type_": "COMPACT", "tpu_topology": c.tpu_topology}
    return _request(cfg, c.node_pool, tpu.machine_type, tpu.hosts, placement)


def rollout_node_pool_request(cfg: RunConfig) -> dict[str, Any] | None:
    """The remote rollout replicas' node pool: one single-host TPU node per replica, each its own
    slice (no placement policy: a topology there would ask for one slice of all the nodes).
    None when the run has no remote replicas: `disaggregated` splits the trainer's one host
    between rollout and learner in one process, and `colocated` shares it."""
    c = cfg.cluster
    if c.placement != "remote" or c.rollout_replicas == 0:
        return None
    tpu = c.rollout_slice
    if tpu is None:
        raise ProvisionError("cluster.tpu_type/tpu_topology: remote replicas need a TPU slice")
    return _request(cfg, c.rollout_node_pool, tpu.machine_type, c.rollout_replicas, None)


def node_pool_requests(cfg: RunConfig) -> list[dict[str, Any]]:
    """Every node pool the run needs: the trainer's, then the rollout replicas' when remote."""
    rollout = rollout_node_pool_request(cfg)
    return [node_pool_request(cfg), *([rollout] if rollout else [])]


def _request(cfg: RunConfig, name: str, machine: str, nodes: int, placement) -> dict[str, Any]:
    c = cfg.cluster
    config: dict[str, Any] = {
        "machine_type": machine,
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
    pool: dict[str, Any] = {
        "name": name,
        "initial_node_count": nodes,
        "config": config,
        "management": {"auto_repair": True, "auto_upgrade": False},
    }
    if placement:
        pool["placement_policy"] = placement
    return {
        "parent": f"projects/{c.project}/locations/{c.location}/clusters/{c.cluster_name}",
        "node_pool": pool,
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
    cfg: RunConfig,
    endpoint: str | None = None,
    timeout_s: float = 1800,
    poll_s: float = 10,
    request: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Create (or reuse) a node pool (default: the trainer's) and wait until it runs; returns
    what teardown needs."""
    from google.api_core import exceptions as gexc
    from google.cloud import container_v1

    request = request or node_pool_request(cfg)
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
    try:
        _wait_running(client, name, timeout_s, poll_s)
    except BaseException:  # failed, timed out or cancelled: no record will name it, delete it now
        with contextlib.suppress(Exception):
            client.delete_node_pool(name=name)
        raise
    return record | {"status": "RUNNING"}


def _wait_running(client, name: str, timeout_s: float, poll_s: float) -> None:
    from google.cloud import container_v1

    deadline = time.monotonic() + timeout_s
    while True:
        pool = client.get_node_pool(name=name)
        if pool.status == container_v1.NodePool.Status.RUNNING:
            return
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


def provision_node_pools(
    cfg: RunConfig, endpoint: str | None = None, timeout_s: float = 1800, poll_s: float = 10
) -> list[dict[str, Any]]:
    """Every node pool of the run (`node_pool_requests`), in order. If one fails, those this
    call created are deleted again before the error is raised: nothing is left behind that no
    provision record names (teardown releases only what a record names)."""
    records: list[dict[str, Any]] = []
    try:
        for request in node_pool_requests(cfg):
            records.append(provision_node_pool(cfg, endpoint, timeout_s, poll_s, request))
    except BaseException:
        for record in reversed(records):
            if record["created"]:
                with contextlib.suppress(ProvisionError):  # the first error is the one to see
                    delete_node_pool(cfg, record, endpoint)
        raise
    return records


@dataclass(frozen=True, slots=True)
class NodePoolProvisioner:
    """The provision stage's `Provisioner` on GKE: the run's TPU node pools."""

    endpoint: str | None = None
    timeout_s: float = 1800
    poll_s: float = 10

    def acquire(self, cfg: RunConfig) -> tuple[Resource, ...]:
        records = provision_node_pools(cfg, self.endpoint, self.timeout_s, self.poll_s)
        return tuple(
            Resource(
                kind=r["kind"],
                name=r["name"],
                created=bool(r["created"]),
                status=str(r.get("status", "")),
            )
            for r in records
        )

    def release(self, cfg: RunConfig, resource: Resource) -> None:
        if resource.kind != "node_pool":
            raise ProvisionError(f"cannot release a {resource.kind!r}: not a node pool")
        delete_node_pool(cfg, {"kind": resource.kind, "name": resource.name}, self.endpoint)
