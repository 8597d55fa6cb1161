"""The `batch` section of the stack config: its model and its rules (Kueue reads the durations)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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


# A team's queue is named `<pool>-<team>`: a pool name (at most 40 characters) and this stay a DNS label.
MAX_TEAM_NAME = 20
# Kueue WorkloadPriorityClasses made with `teams`: a job labelled kueue.x-k8s.io/priority-class=<name> gets
# the value; one without the label takes its pods' PriorityClass, else the cluster's globalDefault one, else
# 0 (Kueue 0.19.2 jobframework reconciler and util/priority).
TEAM_PRIORITIES = {"gpu-k8s-high": 1000, "gpu-k8s-low": -1000}


class TeamSpec(StrictModel):
    """`batch.teams[]`: a team, its namespaces and its share of every GPU pool."""

    name: str
    namespaces: Annotated[tuple[str, ...], Field(min_length=1)]
    # Percent of each pool's quota the team is guaranteed; the shares of all teams add up to 100.
    share: Annotated[int, Field(ge=1, le=100)]


class BatchSpec(StrictModel):
    """`batch`: Kueue in front of the GPU pools: a queue per pool whose quota is the pool at maxNodes (or,
    with `teams`, a queue per pool and team in a cohort per pool), a LocalQueue per pool in each queued
    namespace, all-or-nothing admission."""

    # The namespaces (created by the stack) whose jobs share the GPU pools' queues; or `teams`.
    namespaces: Annotated[tuple[str, ...], Field(min_length=1)] | None = None
    # Teams that each hold a share of every pool, borrow what the others leave unused and get it back when
    # they need it (review-training.md T14); instead of `namespaces`.
    teams: Annotated[tuple[TeamSpec, ...], Field(min_length=1)] | None = None
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
    # The pool whose queue takes the workloads that name none: each queued namespace gets a LocalQueue
    # `default` leading where the pool's own LocalQueue leads, and Kueue's webhooks give a job, JobSet,
    # Deployment, StatefulSet or bare pod created there without `kueue.x-k8s.io/queue-name` that queue
    # where the namespace is one Kueue manages (Kueue "Setup default LocalQueue", stable since v0.17;
    # jobframework/defaults.go at v0.19.2), so nothing in a queued namespace runs outside the quotas
    # (review-training.md T10). Unset, such a workload runs unqueued.
    default_pool: str | None = None

    @property
    def queued_namespaces(self) -> tuple[str, ...]:
        """Every namespace whose jobs queue: the listed ones, or the teams' in order."""
        if self.teams:
            return tuple(namespace for team in self.teams for namespace in team.namespaces)
        return self.namespaces or ()


# The LocalQueue Kueue gives a job that names no queue, in its namespace.
DEFAULT_QUEUE = "default"


def team_queue_name(pool: str, team: str) -> str:
    return f"{pool}-{team}"


def batch_issues(batch: BatchSpec, pool_names: Sequence[str] = ()) -> Iterable[ConfigIssue]:
    if (batch.namespaces is None) == (batch.teams is None):
        yield ConfigIssue(
            config_path("batch"),
            "namespaces and teams" if batch.teams else "neither namespaces nor teams",
            "needs exactly one of `namespaces` (one queue per pool, shared) and `teams` (a share of each "
            "pool per team)",
            "keep one: e.g. namespaces: [research]",
        )
        return
    if batch.teams:
        yield from _team_issues(batch.teams)
        yield from _queue_name_issues(batch.teams, pool_names)
    else:
        yield from _namespace_issues(batch.namespaces or (), ("batch", "namespaces"))
    yield from _default_pool_issues(batch.default_pool, pool_names)
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


def _default_pool_issues(default_pool: str | None, pool_names: Sequence[str]) -> Iterable[ConfigIssue]:
    if default_pool is None:
        return
    if default_pool not in pool_names:
        yield ConfigIssue(
            config_path("batch", "defaultPool"),
            default_pool,
            "names no GPU pool",
            f"one of: {', '.join(pool_names)}",
        )


def _team_issues(teams: tuple[TeamSpec, ...]) -> Iterable[ConfigIssue]:
    names: set[str] = set()
    owner: dict[str, str] = {}
    for index, team in enumerate(teams):
        where = ("batch", "teams", index)
        if len(team.name) > MAX_TEAM_NAME or not DNS_LABEL.match(team.name):
            yield ConfigIssue(
                config_path(*where, "name"),
                team.name,
                f"not a team name (a lowercase DNS label of at most {MAX_TEAM_NAME} characters: it names "
                "the team's queue of each pool, <pool>-<team>)",
                "e.g. research",
            )
        elif team.name in names:
            yield ConfigIssue(config_path(*where, "name"), team.name, "names two teams", "name each once")
        names.add(team.name)
        yield from _namespace_issues(team.namespaces, (*where, "namespaces"))
        for position, namespace in enumerate(team.namespaces):
            if owner.get(namespace, team.name) != team.name:
                yield ConfigIssue(
                    config_path(*where, "namespaces", position),
                    namespace,
                    f"already belongs to team {owner[namespace]}: a namespace's jobs go to one team's queues",
                    "give each namespace to one team",
                )
            owner.setdefault(namespace, team.name)
    total = sum(team.share for team in teams)
    if total != 100:
        yield ConfigIssue(
            config_path("batch", "teams"),
            f"shares adding up to {total}",
            "the teams' shares divide each pool: they must add up to 100 (percent)",
            "adjust the `share` of each team so they total 100",
        )


def _queue_name_issues(teams: tuple[TeamSpec, ...], pool_names: Sequence[str]) -> Iterable[ConfigIssue]:
    """Two (pool, team) pairs whose queue names run together ("a-b" + "c" and "a" + "b-c"), or a pair named
    like a pool ("a" + "b" and pool "a-b"): that pool's shared queue and cohort have the name."""
    named: dict[str, tuple[str, str]] = {}
    for index, team in enumerate(teams):
        for pool in pool_names:
            queue = team_queue_name(pool, team.name)
            other = named.setdefault(queue, (pool, team.name))
            if queue in pool_names:
                taken_by = f"the name of pool {queue} (its cohort's, and its queue's without teams)"
            elif other != (pool, team.name):
                taken_by = f"which pool {other[0]} and team {other[1]} already have"
            else:
                continue
            yield ConfigIssue(
                config_path("batch", "teams", index, "name"),
                team.name,
                f"gives pool {pool} the queue name {queue}, {taken_by}",
                "rename the team (or a pool) so each pool-team name is its own, and no pool's",
            )


def _namespace_issues(namespaces: tuple[str, ...], where: tuple[str | int, ...]) -> Iterable[ConfigIssue]:
    seen: set[str] = set()
    for index, namespace in enumerate(namespaces):
        path = config_path(*where, index)
        if len(namespace) > 63 or not DNS_LABEL.match(namespace):
            yield ConfigIssue(
                path, namespace, "not a namespace name", "use a lowercase DNS label, e.g. research"
            )
        elif namespace in RESERVED_NAMESPACES or namespace.startswith(RESERVED_NAMESPACE_PREFIXES):
            yield ConfigIssue(
                path,
                namespace,
                "exists in every cluster, belongs to an add-on the stack installs, or is kept by "
                "Kubernetes or GKE (kube-*, gke-*, gmp-*)",
                "list your teams' own namespaces (the stack creates them)",
            )
        elif namespace in seen:
            yield ConfigIssue(path, namespace, "listed twice", "list each namespace once")
        seen.add(namespace)


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
