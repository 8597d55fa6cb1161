"""`monitoring`: a Prometheus that reads every GPU, and alerts on the costs and faults GPUs hide.

kube-prometheus-stack (the Prometheus Operator, one Prometheus, kube-state-metrics, node-exporter) on the
system nodes; the GPU Operator's DCGM exporter is scraped through its ServiceMonitor; a PrometheusRule of
this toolkit's alerts; with `dashboards`, the chart's Grafana and a dashboard of the GPU pools
(components/monitoring_dashboards.py). Alertmanager is left off: alerts show on Prometheus' own alerts
page until the user routes them (their own Alertmanager, or the chart's, in their program).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpu_k8s.components.cluster import GpuCluster, GpuPool, PlatformTraits
from gpu_k8s.components.helm import helm_release
from gpu_k8s.components.monitoring_dashboards import (
    DASHBOARD_TITLE,
    NODE_LABELS_ALLOWLIST,
    dashboard_config_map,
    price_rules,
)
from gpu_k8s.components.monitoring_spec import GpuAlertsSpec, MonitoringSpec
from gpu_k8s.components.prices import Price
from gpu_k8s.components.spec import ClusterSpec

MONITORING_NAMESPACE = "monitoring"
CHART = "kube-prometheus-stack"
CHART_VERSION = "88.5.3"
# The chart's README at the tag: `helm repo add prometheus-community https://prometheus-community.github.io/...`.
CHART_REPOSITORY = "https://prometheus-community.github.io/helm-charts"
RULES_NAME = "gpu-k8s-gpu-alerts"
# node-exporter listens on each node's own address (host network) on its chart's port: Prometheus reaches it
# from another node, which the k3s platforms' firewalls must then let through.
NODE_EXPORTER_PORT = 9100
# What the TSDB may use of its volume before it deletes the oldest blocks: the rest is the write-ahead log
# and compaction's headroom (Prometheus storage docs: size-based retention counts blocks, WAL and chunks,
# so a volume filled to the brim stops the server).
TSDB_SHARE_OF_VOLUME = 0.8


# The frame buffer's used share per GPU (used + free is what the driver gives workloads).
GPU_MEMORY_SHARE = "max by (node, gpu) (DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE))"
# kube-state-metrics writes a resource name into `resource` with each character outside [a-zA-Z0-9_] as `_`
# (SanitizeLabelName, internal/store/utils.go at v2.20.0, pinned): whole GPUs (nvidia_com_gpu), shared slots
# (nvidia.com/gpu.shared) and MIG slices (nvidia.com/mig-1g.10gb) all match.
GPU_REQUESTS = 'kube_pod_container_resource_requests{resource=~"nvidia_com_.*"}'
# GPU slots requested by each pod the scheduler cannot place (PodScheduled=False, Unschedulable: waiting for
# a node). Pods Kueue holds back carry a scheduling gate instead and are not counted.
UNSCHEDULABLE_GPU_PODS = (
    f"sum by (namespace, pod) ({GPU_REQUESTS}) * on (namespace, pod) group_left () "
    "max by (namespace, pod) (kube_pod_status_unschedulable == 1) > 0"
)
# Nodes whose GPUs are all idle (the graphics engine active under 1% of the time: DCGM's profiling field,
# which reads MIG instances too, where DCGM_FI_DEV_GPU_UTIL reads 0) while a running pod holds some of
# them. Without such a pod the node is either scaled away by the autoscaler or kept on purpose (minNodes).
IDLE_HELD_GPU_NODES = (
    "max by (node) (DCGM_FI_PROF_GR_ENGINE_ACTIVE) < 0.01 and on (node) "
    f"sum by (node) ({GPU_REQUESTS} * on (namespace, pod) group_left () "
    'max by (namespace, pod) (kube_pod_status_phase{phase="Running"} == 1)) > 0'
)
# Xids after which NVIDIA's Xid catalog says to reset the GPU or drain the node (double-bit ECC 48, row
# remapping 63/64, NVLink 74, fallen off the bus 79, high single-bit ECC rate 92, contained and uncontained
# ECC 94/95; recalled from the catalog, not pinned here). Others (13, 31, 43, 45: a program's own fault) are
# the workload's. The exporter's value is the last Xid, kept until it restarts.
DRAIN_XIDS = (48, 63, 64, 74, 79, 92, 94, 95)
DRAIN_XID_GPUS = (
    "max by (node, gpu) (" + " or ".join(f"DCGM_FI_DEV_XID_ERRORS == {code}" for code in DRAIN_XIDS) + ")"
)


def stalled_queues(window: str) -> str:
    """ClusterQueues with workloads pending that admitted none in the last `window` (Kueue 0.19.2's
    kueue_pending_workloads and kueue_admitted_workloads_total, pkg/metrics/metrics.go)."""
    return (
        "sum by (cluster_queue) (kueue_pending_workloads) > 0 unless on (cluster_queue) "
        f"sum by (cluster_queue) (increase(kueue_admitted_workloads_total[{window}])) > 0"
    )


# Scale-ups the cluster-autoscaler gave up on in the last 15 minutes, by reason (its
# cluster_autoscaler_failed_scale_ups_total counter, metrics/metrics.go at cluster-autoscaler-1.36.1, pinned).
FAILED_SCALE_UPS = "sum by (reason) (increase(cluster_autoscaler_failed_scale_ups_total[15m])) > 0"


def capacity_alert_rules(alerts: GpuAlertsSpec, queued: bool, autoscaled: bool) -> list[dict[str, Any]]:
    """Alerts on the queues (with `batch`) and on the autoscaler this toolkit runs (not GKE's)."""
    rules: list[dict[str, Any]] = []
    if queued:
        rules.append(
            {
                "alert": "KueueQueueStalled",
                "expr": stalled_queues(alerts.queue_stalled_for),
                "for": alerts.queue_stalled_for,
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "ClusterQueue {{ $labels.cluster_queue }} has {{ $value }} workload(s) "
                    "waiting and admitted none for " + alerts.queue_stalled_for,
                    "description": "kubectl describe clusterqueue {{ $labels.cluster_queue }}: its quota "
                    "held by running jobs, a workload larger than the quota, or a provisioning request "
                    "the cloud cannot fill (kubectl get provisioningrequests -A).",
                },
            }
        )
    if autoscaled:
        rules.append(
            {
                "alert": "GpuScaleUpFailed",
                "expr": FAILED_SCALE_UPS,
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "The cluster-autoscaler failed {{ $value }} scale-up(s) in 15 minutes: "
                    "{{ $labels.reason }}",
                    "description": "Usually no capacity or quota for the instance type in the pool's zones; "
                    "kubectl -n kube-system get configmap cluster-autoscaler-status -o yaml says which "
                    "group and why.",
                },
            }
        )
    return [{"name": "gpu-k8s.capacity", "rules": rules}] if rules else []


def gpu_alert_rules(alerts: GpuAlertsSpec) -> list[dict[str, Any]]:
    """The PrometheusRule groups. Series: the DCGM exporter's (its fields from the GPU Operator's collector
    list, dcp-metrics-included.csv) with the `node` label the ServiceMonitor adds; kube-state-metrics'
    pod requests, phases and schedulability."""
    memory_share = alerts.gpu_memory_full_percent / 100
    return [
        {
            "name": "gpu-k8s.gpus",
            "rules": [
                {
                    "alert": "GpuNodeIdle",
                    "expr": IDLE_HELD_GPU_NODES,
                    "for": alerts.gpu_idle_for,
                    "labels": {"severity": "warning"},
                    "annotations": {
                        "summary": "Every GPU of node {{ $labels.node }} has been idle for "
                        + alerts.gpu_idle_for,
                        "description": "A running pod holds GPUs of this node without using them, so the "
                        "autoscaler keeps the node and it bills. Find the pods: kubectl get pods -A "
                        "--field-selector spec.nodeName={{ $labels.node }}",
                    },
                },
                {
                    "alert": "GpuXidError",
                    "expr": DRAIN_XID_GPUS,
                    "labels": {"severity": "critical"},
                    "annotations": {
                        "summary": "GPU {{ $labels.gpu }} on {{ $labels.node }} reported Xid {{ $value }}",
                        "description": "The driver reported a fault after which the GPU needs a reset: drain "
                        "the node (the alert stays until the DCGM exporter restarts, as its value is the "
                        "last Xid).",
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
                    "expr": UNSCHEDULABLE_GPU_PODS,
                    "for": alerts.gpu_pod_pending_for,
                    "labels": {"severity": "warning"},
                    "annotations": {
                        "summary": "{{ $labels.namespace }}/{{ $labels.pod }} has waited "
                        + alerts.gpu_pod_pending_for
                        + " for a node with {{ $value }} GPU slot(s)",
                        "description": "kubectl describe pod says why: no node of that shape, a pool at "
                        "maxNodes, no cloud capacity (the autoscaler's events), or a quota.",
                    },
                },
            ],
        }
    ]


def prometheus_rule_manifest(
    alerts: GpuAlertsSpec,
    queued: bool = False,
    autoscaled: bool = False,
    node_prices: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The alerts, and with `node_prices` (pool: USD per node-hour) the dashboard's price series."""
    groups = [
        *gpu_alert_rules(alerts),
        *capacity_alert_rules(alerts, queued, autoscaled),
        *price_rules(node_prices or {}),
    ]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": RULES_NAME, "namespace": MONITORING_NAMESPACE},
        "spec": {"groups": groups},
    }


# The chart's Grafana, narrowed: its sidecars read ConfigMaps of `monitoring` only (the chart's defaults
# give them a cluster-wide role that lists and watches every ConfigMap and Secret: searchNamespace ALL,
# resource both, rbac.namespaced false), no data source for the Alertmanager that is not installed, and no
# calls home (Grafana's [analytics]: update checks and usage reports).
GRAFANA_VALUES: dict[str, Any] = {
    "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
    "rbac": {"namespaced": True},
    "sidecar": {
        "dashboards": {"searchNamespace": MONITORING_NAMESPACE, "resource": "configmap"},
        "datasources": {"resource": "configmap", "alertmanager": {"enabled": False}},
    },
    "grafana.ini": {
        "analytics": {
            "check_for_updates": False,
            "check_for_plugin_updates": False,
            "reporting_enabled": False,
        }
    },
}


def stack_values(monitoring: MonitoringSpec, traits: PlatformTraits) -> dict[str, Any]:
    """Helm values for kube-prometheus-stack on a platform with these traits."""
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
        # The claim goes with the Prometheus when a stack sets `monitoring: false`, and the CSI driver
        # deletes its disk. On `destroy` the driver may go first: stacks/README says to set it false before.
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
    }
    values: dict[str, Any] = {
        # Grafana keeps no state of its own (no volume): its dashboards are ConfigMaps; its admin password
        # is the random one the chart keeps in the Secret it makes.
        "grafana": GRAFANA_VALUES if monitoring.dashboards else {"enabled": False},
        "alertmanager": {"enabled": False},
        # Managed control planes and k3s's single binary expose no etcd, scheduler, controller-manager or
        # kube-proxy endpoint to scrape: their targets would only ever report them down (the chart drops
        # their default rules with them).
        "kubeEtcd": {"enabled": False},
        "kubeScheduler": {"enabled": False},
        "kubeControllerManager": {"enabled": False},
        "kubeProxy": {"enabled": False},
        "prometheus": {"prometheusSpec": prometheus},
        # node-exporter keeps its host network and PID namespace, but not the host's root file system: its
        # free-space metrics of the node's mounts are the price of not handing an exporter the whole host.
        "prometheus-node-exporter": {"hostRootFsMount": {"enabled": False}},
        # Only Linux nodes run here: the chart's AIX and Darwin node dashboards would always be empty.
        "nodeExporter": {"operatingSystems": {"aix": {"enabled": False}, "darwin": {"enabled": False}}},
        # kube-state-metrics would list and watch every Secret of the cluster for a few metrics about them;
        # the dashboard reads each node's pool from kube_node_labels.
        "kube-state-metrics": {
            "collectorsExclude": ["secrets"],
            **({"metricLabelsAllowlist": [NODE_LABELS_ALLOWLIST]} if monitoring.dashboards else {}),
        },
    }
    if traits.cluster_dns != "coredns":
        # The chart scrapes CoreDNS's metrics port on the `k8s-app: kube-dns` pods, which GKE's kube-dns
        # does not serve: its target would only ever be down.
        values["coreDns"] = {"enabled": False}
    if traits.system_tolerations:
        tolerations = traits.system_tolerations
        prometheus["tolerations"] = tolerations
        values["prometheusOperator"] = {
            "tolerations": tolerations,
            "admissionWebhooks": {"patch": {"tolerations": tolerations}},
        }
        values["kube-state-metrics"]["tolerations"] = tolerations
        if monitoring.dashboards:
            values["grafana"] = {**values["grafana"], "tolerations": tolerations}
    return values


class Monitoring(pulumi.ComponentResource):
    """kube-prometheus-stack and the GPU alerts on a GpuCluster (with the queue alerts where `queued`, and the
    autoscaler's where `autoscaled`). `release` is what a ServiceMonitor or PrometheusRule of another
    component waits for (the chart installs their CRDs)."""

    release: k8s.helm.v3.Release

    def __init__(
        self,
        name: str,
        cluster: GpuCluster,
        monitoring: MonitoringSpec,
        queued: bool = False,
        autoscaled: bool = False,
        node_prices: Mapping[str, float] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("gpu-k8s:index:Monitoring", name, None, opts)
        prices = (node_prices or {}) if monitoring.dashboards else {}
        child = pulumi.ResourceOptions(parent=self, provider=cluster.k8s_provider)
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata={
                "name": MONITORING_NAMESPACE,
                # node-exporter reads the host's network and processes (hostNetwork, hostPID, hostPath):
                # only `privileged` admits it. Only the chart's pods run here.
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
            values=stack_values(monitoring, cluster.traits),
            parent=self,
            provider=cluster.k8s_provider,
            depends_on=[namespace],
        )
        after_release = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[self.release]))
        rule = prometheus_rule_manifest(monitoring.alerts, queued, autoscaled, prices)
        k8s.apiextensions.CustomResource(
            f"{name}-gpu-alerts",
            api_version=rule["apiVersion"],
            kind=rule["kind"],
            metadata=rule["metadata"],
            spec=rule["spec"],
            opts=after_release,
        )
        if monitoring.dashboards:
            board = dashboard_config_map(MONITORING_NAMESPACE, queued, autoscaled, priced=bool(prices))
            k8s.core.v1.ConfigMap(
                f"{name}-gpu-dashboard", metadata=board["metadata"], data=board["data"], opts=after_release
            )
        self.register_outputs({})


def monitoring_access(monitoring: MonitoringSpec) -> dict[str, str]:
    """Where to look (the stack output `monitoring`): the commands that open Prometheus and Grafana from a
    workstation with the kubeconfig, and the dashboard's name."""
    prometheus, grafana = f"{CHART}-prometheus", f"{CHART}-grafana"
    access = {
        "alerts": f"kubectl -n {MONITORING_NAMESPACE} port-forward svc/{prometheus} 9090, then "
        "http://localhost:9090/alerts",
    }
    if monitoring.dashboards:
        access |= {
            "grafana": f"kubectl -n {MONITORING_NAMESPACE} port-forward svc/{grafana} 3000:80, then "
            "http://localhost:3000 as admin",
            "grafanaPassword": f"kubectl -n {MONITORING_NAMESPACE} get secret {grafana} "
            "-o jsonpath='{.data.admin-password}' | base64 -d",
            "dashboard": DASHBOARD_TITLE,
        }
    return access


def install_monitoring(
    spec: ClusterSpec,
    cluster: GpuCluster,
    autoscaled: bool,
    node_price: Callable[[GpuPool], Price | None] | None = None,
) -> pulumi.Resource | None:
    """The stack's `monitoring`, if it has one: the release the ServiceMonitors of the GPU Operator, Kueue
    and (`autoscaled`: the toolkit runs it) the cluster-autoscaler wait for. `node_price`: the platform's
    list price of one node of a pool, for the dashboard's cost panel (pools without one are left out)."""
    if spec.monitoring is None:
        return None
    queued = spec.batch is not None
    prices = {}
    for pool in cluster.pools:
        price = node_price(pool) if node_price else None
        if price is not None:
            prices[pool.spec.name] = price.usd_per_hour
    return Monitoring(
        f"{spec.name}-monitoring", cluster, spec.monitoring, queued, autoscaled, node_prices=prices
    ).release
