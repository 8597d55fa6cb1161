"""`monitoring.dashboards`: a Grafana dashboard of the GPU pools, provisioned as code, and the recording rules
that price their nodes.

The chart's Grafana loads every ConfigMap labelled `grafana_dashboard: "1"` in `monitoring` (its dashboard
sidecar, kube-prometheus-stack 88.5.3 values `grafana.sidecar.dashboards`, narrowed to that namespace in
components/monitoring.py), with the chart's Prometheus as the default data source. Series are tied to
pools through kube-state-metrics' `kube_node_labels`, which carries a node label once it is allowed
(`--metric-labels-allowlist`): `gpu-k8s.io/pool` becomes `label_gpu_k8s_io_pool` (kube-state-metrics
v2.20.0 internal/store/utils.go: "label_" + the key with each character outside [a-zA-Z0-9_] as `_`, in
snake case). The DCGM exporter's series carry `node` (the ServiceMonitor's relabeling), as do
kube-state-metrics' node and pod-request series.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpu_k8s.components.cluster import POOL_LABEL, SYSTEM_POOL_NAME

# kube-state-metrics' name for the pool label on kube_node_labels.
POOL_SERIES_LABEL = "label_gpu_k8s_io_pool"
# What kube-state-metrics is told to copy from nodes into kube_node_labels.
NODE_LABELS_ALLOWLIST = f"nodes=[{POOL_LABEL}]"
DASHBOARD_LABEL = {"grafana_dashboard": "1"}
DASHBOARD_NAME = "gpu-k8s-gpu-pools"
DASHBOARD_TITLE = "GPU pools (gpu-k8s)"
NODE_PRICE_SERIES = "gpu_k8s:pool_node_price_usd_per_hour"

# One series per node and pool: while kube-state-metrics rolls out, two of its pods are scraped and each
# node has two kube_node_labels series, which a join on `node` would refuse (many-to-many) and a count would
# count twice.
NODE_POOLS = f"max by (node, {POOL_SERIES_LABEL}) (kube_node_labels)"
_ON_POOL = f"* on (node) group_left ({POOL_SERIES_LABEL}) {NODE_POOLS}"
_BY_POOL = f"by ({POOL_SERIES_LABEL})"
_GPU_REQUESTS = 'kube_pod_container_resource_requests{resource=~"nvidia_com_.*"}'
_RUNNING = 'max by (namespace, pod) (kube_pod_status_phase{phase="Running"} == 1)'


def price_rules(node_prices: Mapping[str, float]) -> list[dict[str, Any]]:
    """A recording rule per priced pool: what one of its nodes costs an hour at list price (the plan's
    price table), as a series labelled like kube_node_labels, so the dashboard multiplies by running
    nodes."""
    rules = [
        {"record": NODE_PRICE_SERIES, "expr": f"vector({price!r})", "labels": {POOL_SERIES_LABEL: pool}}
        for pool, price in sorted(node_prices.items())
    ]
    return [{"name": "gpu-k8s.prices", "rules": rules}] if rules else []


def pool_panels(queued: bool, autoscaled: bool, priced: bool) -> list[tuple[str, str, str]]:
    """(title, Grafana unit, PromQL) of each panel: per pool unless said otherwise."""
    gpu_pools = f'{POOL_SERIES_LABEL}!="", {POOL_SERIES_LABEL}!="{SYSTEM_POOL_NAME}"'
    panels = [
        (
            "GPU nodes running, by pool",
            "short",
            f"count {_BY_POOL} (max by (node, {POOL_SERIES_LABEL}) (kube_node_labels{{{gpu_pools}}}))",
        ),
        (
            "GPU busy (graphics engine active), by pool",
            "percentunit",
            f"avg {_BY_POOL} (DCGM_FI_PROF_GR_ENGINE_ACTIVE {_ON_POOL})",
        ),
        (
            "GPU memory used, by pool",
            "percentunit",
            f"sum {_BY_POOL} (DCGM_FI_DEV_FB_USED {_ON_POOL}) / "
            f"sum {_BY_POOL} ((DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) {_ON_POOL})",
        ),
        (
            "GPU slots held by running pods, by pool",
            "short",
            f"sum {_BY_POOL} (sum by (node) ({_GPU_REQUESTS} * on (namespace, pod) group_left () {_RUNNING}) "
            f"{_ON_POOL})",
        ),
        (
            "GPU slots the pools' nodes offer, by pool",
            "short",
            f'sum {_BY_POOL} (kube_node_status_allocatable{{resource=~"nvidia_com_.*"}} {_ON_POOL})',
        ),
    ]
    if priced:
        panels.append(
            (
                "Cost of the running GPU nodes, USD per hour at list price, by pool",
                "currencyUSD",
                f"sum {_BY_POOL} ({NODE_POOLS} * on ({POOL_SERIES_LABEL}) group_left () {NODE_PRICE_SERIES})",
            )
        )
    if queued:
        panels += [
            ("Jobs waiting, by queue", "short", "sum by (cluster_queue) (kueue_pending_workloads)"),
            (
                "Wait until admitted (90th percentile over 30 min), by queue",
                "s",
                "histogram_quantile(0.9, sum by (le, cluster_queue) "
                "(rate(kueue_admission_wait_time_seconds_bucket[30m])))",
            ),
            (
                "Admitted until every pod ran: node start-up included (90th percentile over 1 h), by queue",
                "s",
                "histogram_quantile(0.9, sum by (le, cluster_queue) "
                "(rate(kueue_admitted_until_ready_wait_time_seconds_bucket[1h])))",
            ),
        ]
    if autoscaled:
        panels.append(
            (
                "Scale-ups the autoscaler gave up on (per hour), by reason",
                "short",
                "sum by (reason) (increase(cluster_autoscaler_failed_scale_ups_total[1h]))",
            )
        )
    return panels


def dashboard(queued: bool, autoscaled: bool, priced: bool) -> dict[str, Any]:
    """The Grafana dashboard model (schemaVersion 39): one time-series panel per query, two to a row."""
    panels = []
    for index, (title, unit, expr) in enumerate(pool_panels(queued, autoscaled, priced)):
        panels.append(
            {
                "id": index + 1,
                "type": "timeseries",
                "title": title,
                "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [{"refId": "A", "expr": expr, "legendFormat": "__auto"}],
            }
        )
    return {
        "uid": DASHBOARD_NAME,
        "title": DASHBOARD_TITLE,
        "tags": ["gpu-k8s"],
        "timezone": "utc",
        "schemaVersion": 39,
        "refresh": "1m",
        "time": {"from": "now-6h", "to": "now"},
        "panels": panels,
    }


def dashboard_config_map(namespace: str, queued: bool, autoscaled: bool, priced: bool) -> dict[str, Any]:
    return {
        "metadata": {"name": DASHBOARD_NAME, "namespace": namespace, "labels": dict(DASHBOARD_LABEL)},
        "data": {f"{DASHBOARD_NAME}.json": json.dumps(dashboard(queued, autoscaled, priced), indent=1)},
    }
