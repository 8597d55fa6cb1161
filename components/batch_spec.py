"""The `batch` section of the stack config: its model and its rules (Kueue reads the durations)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

from pydantic import Field

from gpu_k8s.components.configbase import DNS_LABEL, ConfigIssue, StrictModel, config_path, duration_seconds

# Namespaces every cluster has, or that the add-ons the stacks install own: no team's jobs queue there.
RESERVED_NAMESPACES = (
    "default",
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "kueue-system",
    "jobset-system",
    "gpu-operator",
    "system-upgrade",
    "gce-pd-csi-driver",
    # `monitoring` and `inference` create these (components/monitoring.py, components/inference.py).
    "monitoring",
    "keda",
)
# Prefixes of namespaces Kubernetes and GKE keep for themselves (kube-*; GKE's gke-* and managed
# Prometheus's gmp-*).
RESERVED_NAMESPACE_PREFIXES = ("kube-", "gke-", "gmp-")
# Kueue reads durations into Go's time.Duration, an int64 of nanoseconds: about 292 years at most.
GO_DURATION_MAX_SECONDS = (2**63 - 1) // 10**9
# A GPU node started from zero needs minutes to boot, set up its driver and pull a CUDA image; a shorter
# wait would evict jobs that are only waiting for their nodes.
MIN_PODS_READY_MINUTES = 10
# A pod that restarts in place is ready again within seconds to a minute; a shorter recovery timeout would
# evict a job for it.
MIN_RECOVERY_SECONDS = 60


class BatchSpec(StrictModel):
    """`batch`: Kueue in front of the GPU pools: a queue per pool whose quota is the pool at maxNodes, a
    LocalQueue per pool in each listed namespace, all-or-nothing admission."""

    # The teams' namespaces (created by the stack) whose jobs queue for the GPU pools.
    namespaces: Annotated[tuple[str, ...], Field(min_length=1)]
    # How long an admitted job may take until all its pods run (scaling a pool up from zero included);
    # after it, the job is evicted and queued again (Kueue waitForPodsReady).
    pods_ready_timeout: str = "30m"
    # How many times an evicted job is queued again before Kueue deactivates it (`.spec.active: false`):
    # a job that cannot start never keeps starting GPU nodes.
    requeue_limit: Annotated[int, Field(ge=0, le=100)] = 6
    # How long a running job may miss a pod (a node lost, a spot node reclaimed) before Kueue evicts and
    # queues it again. Unset: 5m where a provisioning check admits jobs (its replacement pod is left alone
    # by the cluster-autoscaler, so only a new admission gets it a node: review-training.md T1), else
    # podsReadyTimeout (the pod scales a pool up itself, as slowly as a first start).
    recovery_timeout: str | None = None
    # GPU pods outside the queued namespaces (and the add-ons' own, and namespaces labelled
    # gpu-k8s.io/unqueued-gpus=allowed) are refused, so the quotas hold (review-training.md T10).
    queued_gpus_only: bool = True


def batch_issues(batch: BatchSpec) -> Iterable[ConfigIssue]:
    seen: set[str] = set()
    for index, namespace in enumerate(batch.namespaces):
        where = config_path("batch", "namespaces", index)
        if len(namespace) > 63 or not DNS_LABEL.match(namespace):
            yield ConfigIssue(
                where, namespace, "not a namespace name", "use a lowercase DNS label, e.g. research"
            )
        elif namespace in RESERVED_NAMESPACES or namespace.startswith(RESERVED_NAMESPACE_PREFIXES):
            yield ConfigIssue(
                where,
                namespace,
                "exists in every cluster, belongs to an add-on the stack installs, or is kept by "
                "Kubernetes or GKE (kube-*, gke-*, gmp-*)",
                "list your teams' own namespaces (the stack creates them)",
            )
        elif namespace in seen:
            yield ConfigIssue(where, namespace, "listed twice", "list each namespace once")
        seen.add(namespace)
    yield from _duration_issues(
        "podsReadyTimeout",
        batch.pods_ready_timeout,
        MIN_PODS_READY_MINUTES * 60,
        f"is shorter than a GPU node takes to start from zero (allow at least {MIN_PODS_READY_MINUTES}m)",
        'use "30m" unless your pools keep warm nodes (minNodes)',
    )
    if batch.recovery_timeout is None:
        return
    yield from _duration_issues(
        "recoveryTimeout",
        batch.recovery_timeout,
        MIN_RECOVERY_SECONDS,
        "is shorter than a pod takes to restart in place (and 0s turns the check off: a job that lost a pod "
        "would wait for it forever)",
        'use "5m"',
    )


def _duration_issues(
    key: str, value: str, minimum_seconds: int, too_short: str, fix_short: str
) -> Iterable[ConfigIssue]:
    """A `batch` duration Kueue reads as a Go time.Duration, at least `minimum_seconds`."""
    seconds = duration_seconds(value)
    if seconds is None:
        yield ConfigIssue(config_path("batch", key), value, "not a duration", 'write it like "30m" or "1h"')
    elif seconds > GO_DURATION_MAX_SECONDS:
        yield ConfigIssue(
            config_path("batch", key),
            value,
            "is longer than a Go duration holds (about 292 years), which is how Kueue reads it",
            'write something like "30m" or "2h"',
        )
    elif seconds < minimum_seconds:
        yield ConfigIssue(config_path("batch", key), value, too_short, fix_short)
