"""The `monitoring` section of the stack config: its model and its rules (kept apart from the component so
the config model can hold it without importing Pulumi resources)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated

from pydantic import Field

from gpu_k8s.components.configbase import ConfigIssue, StrictModel, config_path

# A Prometheus duration as the Prometheus Operator's CRDs take it (their `retention` and rule `for`
# pattern): units in the order y w d h m s, each at most once; milliseconds are not offered here.
PROMETHEUS_DURATION = re.compile(
    r"(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?"
)
UNIT_SECONDS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1)
MIN_STORAGE_GIB = 5


class GpuAlertsSpec(StrictModel):
    """`monitoring.alerts`: when each GPU alert fires."""

    # Every GPU of a node under 1% busy this long while a running pod holds some of them: a node someone
    # pays for that does no work (the pod keeps the autoscaler from removing it).
    gpu_idle_for: str = "1h"
    # A pod asking for GPU slots that the scheduler cannot place after this long: no capacity, a quota, or
    # a shape no node fits.
    gpu_pod_pending_for: str = "30m"
    # A GPU's memory this full (percent of its frame buffer) for gpuMemoryFullFor: the next allocation
    # fails with out-of-memory.
    gpu_memory_full_percent: Annotated[int, Field(ge=50, le=100)] = 95
    gpu_memory_full_for: str = "15m"
    # With `batch`: a queue whose workloads have waited this long while it admitted none.
    queue_stalled_for: str = "1h"


class MonitoringSpec(StrictModel):
    """`monitoring`: Prometheus with the GPU metrics and alerts."""

    # How long samples are kept (a Prometheus duration).
    retention: str = "15d"
    # The Prometheus volume (GiB) on the cluster's default StorageClass; the oldest samples go first when
    # the TSDB reaches 80% of it, even before `retention`.
    storage_gib: Annotated[int, Field(ge=MIN_STORAGE_GIB, le=16384)] = 20
    alerts: GpuAlertsSpec = GpuAlertsSpec()
    # Grafana (the chart's) with a dashboard of the GPU pools: use, slots, queues and cost per hour.
    dashboards: bool = True


def prometheus_duration_seconds(text: str) -> int | None:
    """Seconds of a whole-unit Prometheus duration ("1h", "1h30m", "15d"), or None."""
    match = PROMETHEUS_DURATION.fullmatch(text)
    if not text or match is None:
        return None
    return sum(int(n or 0) * unit for n, unit in zip(match.groups(), UNIT_SECONDS, strict=True))


def monitoring_issues(monitoring: MonitoringSpec) -> Iterable[ConfigIssue]:
    durations = {
        ("retention",): (monitoring.retention, 2 * 3600),
        ("alerts", "gpuIdleFor"): (monitoring.alerts.gpu_idle_for, 5 * 60),
        ("alerts", "gpuPodPendingFor"): (monitoring.alerts.gpu_pod_pending_for, 60),
        ("alerts", "gpuMemoryFullFor"): (monitoring.alerts.gpu_memory_full_for, 60),
        ("alerts", "queueStalledFor"): (monitoring.alerts.queue_stalled_for, 5 * 60),
    }
    for keys, (value, minimum) in durations.items():
        seconds = prometheus_duration_seconds(value)
        if seconds is None:
            yield ConfigIssue(
                config_path("monitoring", *keys),
                value,
                "not a Prometheus duration",
                'write it like "30m" or "2h"',
            )
        elif seconds < minimum:
            why = (
                "Prometheus' smallest block of samples (2h)"
                if keys == ("retention",)
                else "which alerts on normal churn"
            )
            yield ConfigIssue(
                config_path("monitoring", *keys),
                value,
                f"shorter than {minimum // 60} minutes, {why}",
                f'write at least "{minimum // 60}m"',
            )
