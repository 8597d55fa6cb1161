"""One team's namespace on a gpu-k8s cluster, its GPU requests capped at a share of what the pools can offer.

The cluster (network, EKS, GPU pools, GPU Operator, autoscaler) comes from the library; the namespace and
its ResourceQuota are this program's own, made with the cluster's Kubernetes provider once the system
nodes are up.
"""

import math

import pulumi
import pulumi_kubernetes as k8s

from gpu_k8s import GpuCluster, build_cluster, load_spec, stack_cluster_config, stack_outputs

GPU_RESOURCE = "nvidia.com/gpu"


def gpu_slots_at_max(cluster: GpuCluster) -> int:
    """Schedulable `nvidia.com/gpu` slots when every pool runs at maxNodes (shared slots counted as slots)."""
    return sum(
        kind.per_node * pool.spec.max_nodes
        for pool in cluster.pools
        for kind in pool.offer.slots
        if kind.resource == GPU_RESOURCE
    )


cluster = build_cluster(load_spec(stack_cluster_config()))
share = float(pulumi.Config().require("share"))
on_cluster = pulumi.ResourceOptions(provider=cluster.k8s_provider, depends_on=list(cluster.system_ready))

# This team's GPUs are capped by a ResourceQuota, not Kueue's queues: where the stack turns `batch` on, GPU
# pods outside the queued namespaces are refused unless their namespace opts out with this label.
team = k8s.core.v1.Namespace(
    "ml-team",
    metadata={"name": "ml-team", "labels": {"gpu-k8s.io/unqueued-gpus": "allowed"}},
    opts=on_cluster,
)
k8s.core.v1.ResourceQuota(
    "ml-team-gpus",
    metadata={"name": "gpus", "namespace": team.metadata.name},
    # Extended resources are quota'd by their requests only (no limits.* form).
    spec={"hard": {f"requests.{GPU_RESOURCE}": str(math.floor(gpu_slots_at_max(cluster) * share))}},
    opts=on_cluster,
)

for output_name, value in stack_outputs(cluster).items():
    pulumi.export(output_name, value)
pulumi.export("teamNamespace", team.metadata.name)
