"""`monitoring`: a Prometheus that reads every GPU, and alerts on the costs and faults GPUs hide.

kube-prometheus-stack (the Prometheus Operator, one Prometheus, kube-state-metrics, node-exporter) on the
system nodes; the GPU Operator's DCGM exporter is scraped through its ServiceMonitor; a PrometheusRule of
this toolkit's alerts. Grafana and Alertmanager are left off: alerts show on Prometheus' own alerts page
until the user routes them (their own Alertmanager, or the chart's, in their program).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpu_k8s.components.cluster import GpuCluster
from gpu_k8s.components.helm import helm_release
from gpu_k8s.components.monitoring_spec import GpuAlertsSpec, MonitoringSpec
from gpu_k8s.components.spec import ClusterSpec

MONITORING_NAMESPACE = "monitoring"
CHART = "kube-prometheus-stack"
CHART_VERSION = "88.5.3"
# The chart's README at the tag: `helm repo add prometheus-community https://prometheus-community.github.io/...`.
CHART_REPOSITORY = "https://prometheus-community.github.io/helm-charts"
RULES_NAME = "gpu-k8s-gpu-alerts"
# What the TSDB may use of its volume before it deletes the oldest blocks: the rest is the write-ahead log
# and compaction's headroom (Prometheus storage docs: size-based retention counts blocks, WAL and chunks,
# so a volume filled to the brim stops the server).
TSDB_SHARE_OF_VOLUME = 0.8


# The frame buffer's used share per GPU (used + free is what the driver gives workloads).
GPU_MEMORY_SHARE = "max by (node, gpu) (DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE))"
# GPUs requested by each Pending pod (kube-state-metrics spells the resource nvidia.com/gpu as
# nvidia_com_gpu, as Kubecost's GPU troubleshooting queries it; the exporter's source is not pinned here).
PENDING_GPU_PODS = (
    'sum by (namespace, pod) (kube_pod_container_resource_requests{resource="nvidia_com_gpu"})'
    " * on (namespace, pod) group_left () "
    'max by (namespace, pod) (kube_pod_status_phase{phase="Pending"} == 1) > 0'
)


def gpu_alert_rules(alerts: GpuAlertsSpec) -> list[dict[str, Any]]:
    """The PrometheusRule groups. Series: the DCGM exporter's (its fields from the GPU Operator's collector
    list, dcp-metrics-included.csv) with the `node` label the ServiceMonitor adds; kube-state-metrics'
    pod requests and phases (extended resources spelled `nvidia_com_gpu`)."""
    memory_share = alerts.gpu_memory_full_percent / 100
    return [
        {
            "name": "gpu-k8s.gpus",
            "rules": [
                {
                    "alert": "GpuNodeIdle",
                    "expr": "max by (node) (DCGM_FI_DEV_GPU_UTIL) == 0",
                    "for": alerts.gpu_idle_for,
                    "labels": {"severity": "warning"},
                    "annotations": {
                        "summary": "Every GPU of node {{ $labels.node }} has been idle for "
                        + alerts.gpu_idle_for,
                        "description": "The node bills while a pod holds its GPUs without using them, so the "
                        "autoscaler keeps it. Find the pods: kubectl get pods -A "
                        "--field-selector spec.nodeName={{ $labels.node }}",
                    },
                },
                {
                    "alert": "GpuXidError",
                    "expr": "max by (node, gpu) (DCGM_FI_DEV_XID_ERRORS) > 0",
                    "labels": {"severity": "critical"},
                    "annotations": {
                        "summary": "GPU {{ $labels.gpu }} on {{ $labels.node }} reported Xid {{ $value }}",
                        "description": "An Xid is a driver-reported GPU fault; look it up in NVIDIA's Xid "
                        "catalog. Several (48, 63, 64, 74, 79, 92, 94, 95) call for draining the node.",
                    },
                },
                {
                    "alert": "GpuRowRemapFailed",
                    "expr": "max by (node, gpu) (DCGM_FI_DEV_ROW_REMAP_FAILURE) > 0",
                    "labels": {"severity": "critical"},
                    "annotations": {
                        "summary": "GPU {{ $labels.gpu }} on {{ $labels.node }} could not remap a row",
                        "description": "The GPU's memory has an uncorrectable fault it cannot retire: "
                        "replace the node (drain it; the autoscaler or its group brings a new one).",
                    },
                },
                {
                    "alert": "GpuMemoryNearlyFull",
                    "expr": f"{GPU_MEMORY_SHARE} > {memory_share:g}",
                    "for": alerts.gpu_memory_full_for,
                    "labels": {"severity": "warning"},
                    "annotations": {
                        "summary": f"GPU {{{{ $labels.gpu }}}} on {{{{ $labels.node }}}} is over "
                        f"{alerts.gpu_memory_full_percent}% of its memory",
                    },
                },
                {
                    "alert": "GpuPodPending",
                    "expr": PENDING_GPU_PODS,
                    "for": alerts.gpu_pod_pending_for,
                    "labels": {"severity": "warning"},
                    "annotations": {
                        "summary": "{{ $labels.namespace }}/{{ $labels.pod }} has waited "
                        + alerts.gpu_pod_pending_for
                        + " for {{ $value }} GPU(s)",
                        "description": "kubectl describe pod says why: no node of that shape, a pool at "
                        "maxNodes, no cloud capacity (the autoscaler's events), or a quota.",
                    },
                },
            ],
        }
    ]


def prometheus_rule_manifest(alerts: GpuAlertsSpec) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": RULES_NAME, "namespace": MONITORING_NAMESPACE},
        "spec": {"groups": gpu_alert_rules(alerts)},
    }


def stack_values(monitoring: MonitoringSpec, system_tolerations: Sequence[dict[str, str]]) -> dict[str, Any]:
    """Helm values for kube-prometheus-stack on a cluster whose add-ons tolerate `system_tolerations`."""
    tsdb_gib = int(monitoring.storage_gib * TSDB_SHARE_OF_VOLUME)
    prometheus: dict[str, Any] = {
        "retention": monitoring.retention,
        "retentionSize": f"{tsdb_gib}GiB",
        # Every ServiceMonitor, PodMonitor and rule of the cluster, not only the chart's own (the GPU
        # Operator's DCGM exporter, this toolkit's alerts, the user's).
        "serviceMonitorSelectorNilUsesHelmValues": False,
        "podMonitorSelectorNilUsesHelmValues": False,
        "ruleSelectorNilUsesHelmValues": False,
        # Sized for a small system pool: ~1 GiB holds the series of a few dozen nodes at the chart's 30 s.
        "resources": {"requests": {"cpu": "200m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "storageSpec": {
            "volumeClaimTemplate": {
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": f"{monitoring.storage_gib}Gi"}},
                }
            }
        },
        # The volume goes with the Prometheus (on `destroy` or when monitoring is removed), not left billing.
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
    }
    values: dict[str, Any] = {
        "grafana": {"enabled": False},
        "alertmanager": {"enabled": False},
        # Managed control planes and k3s's single binary expose no etcd, scheduler, controller-manager or
        # kube-proxy endpoint to scrape: their targets would only ever report them down (the chart drops
        # their default rules with them).
        "kubeEtcd": {"enabled": False},
        "kubeScheduler": {"enabled": False},
        "kubeControllerManager": {"enabled": False},
        "kubeProxy": {"enabled": False},
        "prometheus": {"prometheusSpec": prometheus},
        # node-exporter keeps its host network and PID namespace, but not the host's root file system: on a
        # k3s server that mount would show the CA keys to whoever controls the exporter's container.
        "prometheus-node-exporter": {"hostRootFsMount": {"enabled": False}},
    }
    if system_tolerations:
        tolerations = list(system_tolerations)
        prometheus["tolerations"] = tolerations
        values["prometheusOperator"] = {
            "tolerations": tolerations,
            "admissionWebhooks": {"patch": {"tolerations": tolerations}},
        }
        values["kube-state-metrics"] = {"tolerations": tolerations}
    return values


class Monitoring(pulumi.ComponentResource):
    """kube-prometheus-stack and the GPU alerts on a GpuCluster. `release` is what a ServiceMonitor or
    PrometheusRule of another component waits for (the chart installs their CRDs)."""

    release: k8s.helm.v3.Release

    def __init__(
        self,
        name: str,
        cluster: GpuCluster,
        monitoring: MonitoringSpec,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("gpu-k8s:index:Monitoring", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=cluster.k8s_provider)
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata={
                "name": MONITORING_NAMESPACE,
                # node-exporter reads the host's network and processes (hostNetwork, hostPID, hostPath):
                # only `privileged` admits it. Nothing else runs here.
                "labels": {"pod-security.kubernetes.io/enforce": "privileged"},
            },
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=list(cluster.system_ready))
            ),
        )
        self.release = helm_release(
            f"{name}-release",
            chart=CHART,
            version=CHART_VERSION,
            repository=CHART_REPOSITORY,
            namespace=namespace.metadata.name,
            values=stack_values(monitoring, cluster.traits.system_tolerations),
            parent=self,
            provider=cluster.k8s_provider,
            depends_on=[namespace],
        )
        rule = prometheus_rule_manifest(monitoring.alerts)
        k8s.apiextensions.CustomResource(
            f"{name}-gpu-alerts",
            api_version=rule["apiVersion"],
            kind=rule["kind"],
            metadata=rule["metadata"],
            spec=rule["spec"],
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[self.release])),
        )
        self.register_outputs({})


def install_monitoring(spec: ClusterSpec, cluster: GpuCluster) -> pulumi.Resource | None:
    """The stack's `monitoring`, if it has one: the release the GPU Operator's ServiceMonitor waits for."""
    if spec.monitoring is None:
        return None
    return Monitoring(f"{spec.name}-monitoring", cluster, spec.monitoring).release
