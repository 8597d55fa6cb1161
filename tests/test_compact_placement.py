"""`gpuPools[].interconnect: compact` on GKE: the pool's nodes placed close together in one zone, with gVNIC;
the pool table says so; and the refusals where GKE does not place a machine compactly, or where it is not
built (gcp-k3s)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_k8s.tools.engine import Recording, run_program
from tests.conftest import Mutation, assert_refused_before_any_resource, set_path

NODE_POOL = "gcp:container/nodePool:NodePool"
COMPACT_POOL = "ml-gpu-h100-train"


def _variant(config: dict[str, Any], *mutations: Mutation) -> Recording:
    changed = copy.deepcopy(config)
    for mutate in mutations:
        mutate(changed["gpu-k8s:cluster"])
    return run_program("variant", changed)


def _with_pool(**pool: Any) -> Mutation:
    def mutate(cluster: dict[str, Any]) -> None:
        cluster["gpuPools"] = [{"name": "train", "maxNodes": 2, **pool}]

    return mutate


def test_only_the_compact_pool_is_placed_compactly_in_one_zone_with_gvnic(gcp_gke):
    pools = {r.name: r.inputs for r in gcp_gke.by_type(NODE_POOL)}
    compact = pools.pop(COMPACT_POOL)
    assert compact["placementPolicy"] == {"type": "COMPACT"}
    assert compact["nodeConfig"]["gvnic"] == {"enabled": True}
    # The example names no zones for it: the network's first, not the three the other pools spread over.
    assert compact["nodeLocations"] == ["us-central1-a"]
    assert compact["nodeConfig"]["imageType"] == "COS_CONTAINERD"  # GKE's gVNIC wants COS nodes
    assert pools, "the example has pools without an interconnect"
    for name, inputs in pools.items():
        assert "placementPolicy" not in inputs, name
        assert "gvnic" not in inputs["nodeConfig"], name


def test_a_compact_pool_keeps_the_one_zone_it_names(gcp_gke_config):
    rec = _variant(
        gcp_gke_config,
        _with_pool(instanceType="a2-highgpu-8g", interconnect="compact", zones=["us-central1-c"]),
    )
    (pool,) = [r for r in rec.by_type(NODE_POOL) if r.name == "ml-gpu-train"]
    assert pool.inputs["nodeLocations"] == ["us-central1-c"]
    assert pool.inputs["placementPolicy"] == {"type": "COMPACT"}


def test_the_pool_table_names_the_interconnect_of_the_pools_that_have_one(gcp_gke, aws_eks):
    for rec, pool, interconnect in ((gcp_gke, "h100-train", "compact"), (aws_eks, "h100-train", "efa")):
        rows = {row["name"]: row for row in rec.outputs["gpuPools"]}
        assert rows.pop(pool)["interconnect"] == interconnect
        assert all("interconnect" not in row for row in rows.values())


BAD_COMPACT = [
    (
        "n1-with-t4",
        _with_pool(
            instanceType="n1-standard-8",
            accelerator={"type": "nvidia-tesla-t4", "count": 1},
            interconnect="compact",
        ),
        "gpu-k8s:cluster.gpuPools[0].interconnect",
        ("n1-standard-8 (nvidia-t4) is not placed compactly", "A100, L4 and H100", "a3-high"),
    ),
    (
        "h200",
        _with_pool(instanceType="a3-ultragpu-8g", interconnect="compact"),
        "gpu-k8s:cluster.gpuPools[0].interconnect",
        ("a3-ultragpu-8g (nvidia-h200-141gb) is not placed compactly",),
    ),
    (
        "two-zones",
        _with_pool(
            instanceType="g2-standard-24", interconnect="compact", zones=["us-central1-a", "us-central1-b"]
        ),
        "gpu-k8s:cluster.gpuPools[0].zones",
        ("a compact pool lives in one zone", "zones: [us-central1-a]"),
    ),
    (
        "gpudirect",
        _with_pool(instanceType="a3-highgpu-8g", interconnect="gpudirect-tcpx"),
        "gpu-k8s:cluster.gpuPools[0].interconnect",
        ("not an interconnect of gcp", "multi-networking", "use compact"),
    ),
]


@pytest.mark.parametrize(
    ("mutation", "path", "words"), [c[1:] for c in BAD_COMPACT], ids=[c[0] for c in BAD_COMPACT]
)
def test_compact_placement_where_gke_does_not_offer_it_is_refused(gcp_gke_config, mutation, path, words):
    assert_refused_before_any_resource(gcp_gke_config, mutation, path, words)


def test_compact_placement_on_k3s_agents_is_refused_with_the_reason(gcp_k3s_config):
    assert_refused_before_any_resource(
        gcp_k3s_config,
        set_path("gpuPools.0.interconnect", "compact"),
        "gpu-k8s:cluster.gpuPools[0].interconnect",
        ("not built", "created together", "kind: gke"),
    )
