"""The stack outputs every platform exports."""

from __future__ import annotations

from typing import Any

from components.cluster import GpuCluster


def pool_summary(cluster: GpuCluster) -> list[dict[str, Any]]:
    """Per GPU pool: what a node is and how far the pool scales (plain data, no secrets)."""
    return [
        {
            "name": pool.spec.name,
            "instanceType": pool.spec.instance_type,
            "gpuModel": pool.gpu_model_id,
            "gpusPerNode": pool.gpus_per_node,
            "minNodes": pool.spec.min_nodes,
            "maxNodes": pool.spec.max_nodes,
            "spot": pool.spec.spot,
        }
        for pool in cluster.pools
    ]


def stack_outputs(cluster: GpuCluster) -> dict[str, Any]:
    return {
        "clusterName": cluster.name,
        "kubeconfig": cluster.kubeconfig,
        "gpuPools": pool_summary(cluster),
        "gpuDriver": {"owner": cluster.traits.driver_owner, "branch": cluster.traits.driver_branch},
    }
