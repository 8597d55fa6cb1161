"""The stack outputs every platform exports."""

from __future__ import annotations

from typing import Any

from gpu_k8s.components.cluster import GpuCluster


def pool_summary(cluster: GpuCluster) -> list[dict[str, Any]]:
    """Per GPU pool: what a node is, how it shares its GPUs and how far the pool scales (no secrets)."""
    return [
        {
            "name": pool.spec.name,
            "instanceType": pool.spec.instance_type,
            "gpuModel": pool.gpu_model_id,
            "gpusPerNode": pool.gpus_per_node,
            "sharing": pool.sharing.mode,
            "slotsPerNode": pool.offer.slots_per_node,
            "slots": [
                {"resource": kind.resource, "perNode": kind.per_node, "memoryGiB": kind.memory_gib}
                for kind in pool.offer.slots
            ],
            "isolation": pool.offer.isolation,
            "minNodes": pool.spec.min_nodes,
            "maxNodes": pool.spec.max_nodes,
            "spot": pool.spec.spot,
            **({"interconnect": pool.spec.interconnect} if pool.spec.interconnect is not None else {}),
        }
        for pool in cluster.pools
    ]


def stack_outputs(cluster: GpuCluster) -> dict[str, Any]:
    driver = cluster.traits.driver
    shared = {} if cluster.shared_storage is None else {"sharedStorage": cluster.shared_storage.summary()}
    return {
        "clusterName": cluster.name,
        "kubeconfig": cluster.kubeconfig,
        "gpuPools": pool_summary(cluster),
        "gpuDriver": {"owner": driver.owner, "version": driver.version_text},
        **shared,
    }
