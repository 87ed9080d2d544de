"""The one table of GKE TPU slices (config/topology.py) and everything that reads it: config
validation, the node pool request, the JobSet's trainer job, node selectors and chip limits."""

import math
from pathlib import Path

import pytest

from asyncrl.cloud.jobset import EXCLUSIVE, render_jobset
from asyncrl.cloud.provision import node_pool_request, node_pool_requests, rollout_node_pool_request
from asyncrl.config import ConfigError, load_config
from asyncrl.config.topology import ACCELERATOR, SLICES, slice_of, topologies

ROOT = Path(__file__).parent.parent
SINGLE = ROOT / "configs" / "qwen2.5-0.5b-v6e.yaml"
MULTI = ROOT / "configs" / "qwen2.5-0.5b-v6e-multihost.yaml"


def test_every_row_is_consistent_and_names_its_slice_alone():
    assert len({(s.tpu_type, s.topology) for s in SLICES}) == len(SLICES)
    for s in SLICES:
        assert math.prod(int(n) for n in s.topology.split("x")) == s.chips  # per host x hosts
        assert s.machine_type.endswith(f"-{s.chips_per_host}t")  # GKE names a VM by its chips
        assert s.tpu_type in ACCELERATOR and s.hosts >= 1


@pytest.mark.parametrize(
    ("tpu_type", "topology", "machine", "per_host", "hosts"),
    [
        ("v6e", "2x4", "ct6e-standard-8t", 8, 1),  # the single-host flagship
        ("v6e", "4x4", "ct6e-standard-4t", 4, 4),  # the multi-host preset
        ("v6e", "2x2", "ct6e-standard-4t", 4, 1),
        ("v5e", "4x4", "ct5lp-hightpu-4t", 4, 4),
        ("v5p", "2x2x2", "ct5p-hightpu-4t", 4, 2),
    ],
)
def test_the_table_gives_machine_chips_and_hosts(tpu_type, topology, machine, per_host, hosts):
    s = slice_of(tpu_type, topology)
    assert (s.machine_type, s.chips_per_host, s.hosts) == (machine, per_host, hosts)


def test_an_unknown_pair_is_refused_naming_what_is_offered():
    with pytest.raises(ValueError, match=r"v6e has no '3x3'.*2x4, 4x4"):
        slice_of("v6e", "3x3")
    with pytest.raises(ConfigError, match=r"cluster.tpu_topology.*'3x3'.*v6e slice.*2x4"):
        load_config(SINGLE, ["cluster.tpu_topology=3x3"])
    with pytest.raises(ConfigError, match=r"cluster.tpu_topology.*v5p slice.*2x2x1"):
        load_config(SINGLE, ["cluster.tpu_type=v5p"])  # 2x4 is not a v5p shape
    assert "2x2x2" in topologies("v5p") and "2x4" not in topologies("v5p")


def test_a_multi_host_slice_refuses_disaggregated_placement():
    with pytest.raises(ConfigError, match=r"cluster.placement.*4-host slice"):
        load_config(MULTI, ["cluster.placement=disaggregated"])


@pytest.mark.parametrize(("preset", "hosts", "per_host"), [(SINGLE, 1, 8), (MULTI, 4, 4)])
def test_the_presets_provision_and_launch_the_tables_slice(preset, hosts, per_host):
    cfg = load_config(preset)
    s = slice_of(cfg.cluster.tpu_type, cfg.cluster.tpu_topology)
    assert cfg.cluster.hosts == s.hosts == hosts and s.chips_per_host == per_host
    pool = node_pool_request(cfg)["node_pool"]
    assert pool["config"]["machine_type"] == s.machine_type
    assert pool["initial_node_count"] == hosts
    jobset = render_jobset(cfg, "run-1", "gs://b/runs/run-1")
    trainer = next(j for j in jobset["spec"]["replicatedJobs"] if j["name"] == "trainer")
    spec = trainer["template"]["spec"]
    assert spec["parallelism"] == spec["completions"] == hosts
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": cfg.cluster.tpu_topology,
        "cloud.google.com/gke-nodepool": cfg.cluster.node_pool,
    }
    exclusive = trainer["template"]["metadata"]["annotations"]
    assert exclusive == {EXCLUSIVE: "cloud.google.com/gke-nodepool"}  # the slice's pool is its own
    container = pod["containers"][0]
    assert container["resources"]["limits"]["google.com/tpu"] == str(per_host)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["JAX_NUM_PROCESSES"] == str(hosts)


@pytest.mark.parametrize(
    ("preset", "overrides", "machine", "topology", "chips"),
    [
        (MULTI, (), "ct6e-standard-4t", "2x2", 4),  # a 4-chip trainer host's size
        (
            SINGLE,
            ("cluster.placement=remote", "cluster.rollout_replicas=3"),
            "ct6e-standard-8t",
            "2x4",
            8,
        ),
        (MULTI, ("cluster.rollout_tpu_topology=1x1",), "ct6e-standard-1t", "1x1", 1),
        (
            SINGLE,
            (
                "cluster.tpu_type=v5p",
                "cluster.tpu_topology=2x2x2",
                "cluster.placement=remote",
                "cluster.rollout_replicas=2",
            ),
            "ct5p-hightpu-4t",
            "2x2x1",
            4,
        ),
    ],
)
def test_remote_replicas_get_their_own_pool_of_single_host_nodes(
    preset, overrides, machine, topology, chips
):
    """The trainer's pool holds its slice and nothing else; each replica is one single-host node
    of a second pool, and the JobSet's rollout pods select exactly that pool and topology."""
    cfg = load_config(preset, overrides)
    c = cfg.cluster
    trainer_pool, rollout_pool = node_pool_requests(cfg)
    assert trainer_pool == node_pool_request(cfg)
    pool = rollout_pool["node_pool"]
    assert pool["name"] == f"{c.node_pool}-rollout" == c.rollout_node_pool
    assert pool["initial_node_count"] == c.rollout_replicas
    assert pool["config"]["machine_type"] == machine
    assert "placement_policy" not in pool  # N single-host slices, not one slice of N hosts
    assert pool["config"]["spot"] == c.spot and rollout_pool["parent"] == trainer_pool["parent"]
    jobset = render_jobset(cfg, "run-1", "gs://b/runs/run-1")
    rollout, trainer = jobset["spec"]["replicatedJobs"]
    pod = rollout["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": slice_of(c.tpu_type, topology).accelerator,
        "cloud.google.com/gke-tpu-topology": topology,
        "cloud.google.com/gke-nodepool": c.rollout_node_pool,
    }
    assert pod["containers"][0]["resources"]["limits"] == {"google.com/tpu": str(chips)}
    assert "metadata" not in rollout["template"]  # replicas share their pool: not exclusive
    assert EXCLUSIVE in trainer["template"]["metadata"]["annotations"]
    assert EXCLUSIVE not in jobset["metadata"].get("annotations", {})


@pytest.mark.parametrize("placement", ["colocated", "disaggregated"])
def test_without_remote_replicas_there_is_one_pool(placement):
    """Disaggregated placement splits the trainer's one host between rollout and learner in one
    process (a multi-host slice refuses it): no rollout pods, so no second pool."""
    cfg = load_config(SINGLE, [f"cluster.placement={placement}"])
    assert rollout_node_pool_request(cfg) is None
    assert node_pool_requests(cfg) == [node_pool_request(cfg)]
    assert [rj["name"] for rj in render_jobset(cfg, "r", "gs://b/r")["spec"]["replicatedJobs"]] == [
        "trainer"
    ]


@pytest.mark.parametrize(
    ("overrides", "key", "allowed"),
    [
        (["cluster.rollout_tpu_topology=4x4"], "cluster.rollout_tpu_topology", "1x1, 2x2, 2x4"),
        (["cluster.rollout_tpu_topology=9x9"], "cluster.rollout_tpu_topology", "single-host v6e"),
        (["cluster.node_pool=" + "p" * 33], "cluster.node_pool", "at most 40 characters"),
        (["cluster.node_pool=Pool_A"], "cluster.node_pool", "lowercase letters"),
    ],
)
def test_a_rollout_pool_that_gke_would_refuse_is_refused_with_the_config(overrides, key, allowed):
    with pytest.raises(ConfigError) as refused:
        load_config(MULTI, overrides)
    assert refused.value.key == key and allowed in str(refused.value)


def _single_pod_selectors(cfg, tmp_path):
    """{executor: (node selector labels, TPU chip limit)} of the compiled pipeline's TPU tasks."""
    import yaml
    from kfp import compiler

    from asyncrl.pipeline.definition import build_pipeline

    out = tmp_path / "p.yaml"
    compiler.Compiler().compile(build_pipeline(cfg), str(out))
    docs = list(yaml.safe_load_all(out.read_text()))
    executors = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    containers = docs[0]["deploymentSpec"]["executors"]
    return {
        name: (
            spec["nodeSelector"]["labels"],
            containers[name]["container"]["resources"].get("accelerator", {}).get("resourceCount"),
        )
        for name, spec in executors.items()
        if "nodeSelector" in spec
    }


def test_single_pod_stages_of_a_multi_host_run_use_one_node_of_the_replicas_pool(tmp_path):
    """One host of a multi-host slice cannot start libtpu alone: warm start, recovery test and gate
    run on a single-host node of the replicas' pool; on a single-host slice, on the slice's node."""
    multi = load_config(MULTI)
    one = multi.cluster.rollout_slice
    found = _single_pod_selectors(multi, tmp_path)
    assert {n.removeprefix("exec-") for n in found} == {
        "warm-start",
        "recovery-test",
        "quality-gate",
    }
    for labels, chips in found.values():
        assert labels == {
            "cloud.google.com/gke-tpu-accelerator": one.accelerator,
            "cloud.google.com/gke-tpu-topology": one.topology,
            "cloud.google.com/gke-nodepool": multi.cluster.rollout_node_pool,
        }
        assert int(chips) == one.chips_per_host
    single = load_config(SINGLE)
    for labels, chips in _single_pod_selectors(single, tmp_path).values():
        assert labels["cloud.google.com/gke-tpu-topology"] == single.cluster.tpu_topology
        assert "cloud.google.com/gke-nodepool" not in labels
        assert int(chips) == slice_of(single.cluster.tpu_type, single.cluster.tpu_topology).chips


def test_a_multi_host_run_without_replicas_has_no_node_for_its_single_pod_stages():
    from asyncrl.pipeline.definition import build_pipeline

    cfg = load_config(MULTI, ["cluster.placement=colocated", "cluster.rollout_replicas=0"])
    with pytest.raises(ConfigError, match=r"cluster\.placement.*'colocated'.*allowed: 'remote'"):
        build_pipeline(cfg)
