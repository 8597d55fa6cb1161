"""`inference`: replicas that follow load, down to zero where a trigger sees requests without a pod.

KEDA rather than the HPA with a metrics adapter: one operator scales a Deployment from Prometheus queries
(request concurrency, queue depth, GPU utilization), from queues and on a schedule, and takes it to zero
replicas and back, which the HPA cannot (it stops at one). Its metrics server serves the external metrics
API, so a cluster can run only one such adapter.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpu_k8s.components.cluster import GpuCluster, PlatformTraits, pod_security_labels
from gpu_k8s.components.helm import helm_release
from gpu_k8s.components.spec import ClusterSpec

KEDA_NAMESPACE = "keda"
KEDA_CHART = "keda"
KEDA_CHART_VERSION = "2.20.2"
# The chart's README at v2.20.2: `helm repo add kedacore https://kedacore.github.io/charts`.
KEDA_REPOSITORY = "https://kedacore.github.io/charts"
# Where the API server calls KEDA: its metrics server's container port (the chart's service.portHttpsTarget)
# and its admission webhooks' (webhooks.port, empty: 9443), values.yaml at v2.20.2.
KEDA_API_PORTS = (6443, 9443)


def keda_values(traits: PlatformTraits) -> dict[str, Any]:
    """Helm values for KEDA: its operator, metrics server and webhooks on the system nodes (the chart's
    top-level tolerations apply to all three)."""
    return {"tolerations": traits.system_tolerations} if traits.system_tolerations else {}


class ReplicaAutoscaling(pulumi.ComponentResource):
    """KEDA on a GpuCluster, in its own namespace at the cluster's Pod Security level (KEDA's pods run as
    non-root with every capability dropped, so `restricted` admits them too)."""

    def __init__(self, name: str, cluster: GpuCluster, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-k8s:index:ReplicaAutoscaling", name, None, opts)
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata={"name": KEDA_NAMESPACE, "labels": pod_security_labels(cluster.traits.pod_security)},
            opts=pulumi.ResourceOptions(
                parent=self, provider=cluster.k8s_provider, depends_on=list(cluster.system_ready)
            ),
        )
        helm_release(
            f"{name}-keda",
            chart=KEDA_CHART,
            version=KEDA_CHART_VERSION,
            repository=KEDA_REPOSITORY,
            namespace=namespace.metadata.name,
            values=keda_values(cluster.traits),
            parent=self,
            provider=cluster.k8s_provider,
            depends_on=[namespace],
        )
        self.register_outputs({})


def install_inference(spec: ClusterSpec, cluster: GpuCluster) -> None:
    """The stack's `inference`, if it has one."""
    if spec.inference is not None:
        ReplicaAutoscaling(f"{spec.name}-inference", cluster)
