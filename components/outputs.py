"""The stack outputs every platform exports."""

from __future__ import annotations

from typing import Any

from gpu_k8s.components.cluster import POOL_LABEL, GpuCluster, GpuPool


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
            "usage": pool_usage(pool),
        }
        for pool in cluster.pools
    ]


def pool_usage(pool: GpuPool) -> dict[str, Any]:
    """What a pod says to run on the pool: the node selector, a toleration for each taint its nodes carry
    (the GPU taint with the platform's value, the sharing taint, the pool's own), and the resources that are
    its slots (and its interconnect devices), one of which it requests."""
    return {
        "nodeSelector": {POOL_LABEL: pool.node_labels[POOL_LABEL]},
        "tolerations": [
            {"key": taint.key, "operator": "Equal", "value": taint.value, "effect": taint.effect}
            if taint.value
            else {"key": taint.key, "operator": "Exists", "effect": taint.effect}
            for taint in pool.taints
        ],
        "resources": [kind.resource for kind in pool.offer.slots] + sorted(pool.interconnect_resources),
    }


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
