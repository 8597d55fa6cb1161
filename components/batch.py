"""Queues and gang admission for batch and training jobs: Kueue in front of the GPU pools.

Each GPU pool gets a ResourceFlavor (its nodes' pool label; the pool's taints as tolerations Kueue adds to
the pods it admits there) and a ClusterQueue whose quota is the pool at maxNodes: every GPU resource the
pool's nodes advertise (whole GPUs, shared slots or MIG slices) times maxNodes. Pools' queues share no
cohort: a queue can borrow only quota of flavors it lists, and each lists its own pool's, so a cohort of
pools would lend nothing (review-training.md T11). With `batch.teams` each pool instead has a queue per
team holding the team's share, in a cohort per pool where the teams lend and borrow that pool's flavor
(T14). Each queued namespace gets a LocalQueue per pool, named after the pool. A job is admitted whole or
not at all (waitForPodsReady): if its pods are not all running within `batch.podsReadyTimeout`, scaling
from zero included, it is evicted and queued again.

Where this toolkit runs the cluster-autoscaler (EKS, k3s), a job holding its quota is admitted once the
autoscaler has asked the cloud for nodes for all its pods: Kueue's ProvisioningRequest admission check asks
the autoscaler for the job's pods as one request of the class
`best-effort-atomic-scale-up.autoscaling.x-k8s.io`. On AWS and Compute Engine that is not atomic (their
node groups do not implement AtomicIncreaseSize, so the class raises the groups' sizes and reports the
request provisioned: review-training.md T2): when the cloud delivers only some nodes, `waitForPodsReady`
evicts and requeues the job after its timeout. On GKE, whose
own autoscaler ties ProvisioningRequests to node pools with queued provisioning (not created here), an
admitted job's pods are pending until the autoscaler starts the pool's nodes, which it does because they
are pending. Quotas count GPU slots only: CPU, memory, disk and huge pages are left to the scheduler
(`resources.excludeResourcePrefixes`), since a pool's allocatable CPU and memory are not known before a node
runs and a quota above them would admit what cannot be placed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpu_k8s.components.batch_spec import DEFAULT_QUEUE, TEAM_PRIORITIES, BatchSpec, TeamSpec, team_queue_name
from gpu_k8s.components.cluster import POOL_LABEL, GpuCluster, GpuPool, pod_security_labels
from gpu_k8s.components.gpu_operator import OPERATOR_NAMESPACE
from gpu_k8s.components.helm import helm_release
from gpu_k8s.components.manifests import CustomObject
from gpu_k8s.components.queued_gpus import queued_gpu_pods
from gpu_k8s.components.yamltext import yaml_text

KUEUE_CHART_VERSION = "0.19.2"
# The chart README at v0.19.2: helm install kueue oci://registry.k8s.io/kueue/charts/kueue --version="0.19.2".
KUEUE_REPOSITORY = "oci://registry.k8s.io/kueue/charts"
# The release image; the chart's git values name a staging image that its release packaging replaces
# (shared/upstream-charts/index.json, releaseValues).
KUEUE_IMAGE = {"repository": "registry.k8s.io/kueue/kueue", "tag": "v0.19.2"}
KUEUE_NAMESPACE = "kueue-system"
# Where the API server calls the Kueue and JobSet webhooks: their managers' webhook container port
# (templates/manager/manager.yaml at kueue 0.19.2, templates/controller/deployment.yaml at jobset 0.12.0).
WEBHOOK_PORTS = (9443,)
KUEUE_API = "kueue.x-k8s.io/v1beta2"
# JobSet runs a training job as a group of Jobs (leader and workers) with a headless Service for rendezvous;
# Kueue queues a JobSet as one workload. Chosen over the Kubeflow trainer: framework-neutral, queued by Kueue
# natively, and a single small controller (the trainer's v2 builds on it).
JOBSET_CHART_VERSION = "0.12.0"
JOBSET_REPOSITORY = "oci://registry.k8s.io/jobset/charts"
# As its release packaging sets them (shared/upstream-charts/index.json, releaseValues); git's values name a
# staging image.
JOBSET_IMAGE = {"repository": "registry.k8s.io/jobset/jobset", "tag": "v0.12.0", "pullPolicy": "IfNotPresent"}
JOBSET_NAMESPACE = "jobset-system"
# Requests Kueue leaves to the scheduler (prefix match).
UNQUOTED_RESOURCE_PREFIXES = ("cpu", "memory", "ephemeral-storage", "hugepages-")
# The job kinds Kueue queues: the chart's own list at 0.19.2 (values.yaml managerConfig), so a framework
# installed later (Kubeflow Trainer v2, the MPI operator, KubeRay, LeaderWorkerSet) is queued like JobSet
# (review-training.md T15); Kueue leaves an integration idle while its CRD is absent. Only jobs (and pods,
# Deployments, StatefulSets) that name a queue, in the queued namespaces, are touched.
QUEUED_FRAMEWORKS = (
    "batch/job",
    "kubeflow.org/mpijob",
    "ray.io/rayjob",
    "ray.io/rayservice",
    "ray.io/raycluster",
    "jobset.x-k8s.io/jobset",
    "workload.codeflare.dev/appwrapper",
    "trainer.kubeflow.org/trainjob",
    "pod",
    "deployment",
    "statefulset",
    "leaderworkerset.x-k8s.io/leaderworkerset",
)
# Kueue's ProvisioningRequest admission check (Kueue docs, concepts/admission_check/provisioning_request at
# v0.19.2): the controller name, and the class the cluster-autoscaler sizes up for all of a job's pods at
# once.
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
ATOMIC_SCALE_UP = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
PROVISIONING_CHECK = "gpu-nodes-provisioned"


def queue_quota(pool: GpuPool) -> dict[str, int]:
    """The pool's GPU resources at maxNodes (whole GPUs, shared slots or MIG slices), and its interconnect's
    (Kueue would refuse a job asking for a resource its queue does not cover)."""
    per_node = {**pool.offer.resources, **pool.interconnect_resources}
    return {resource: count * pool.spec.max_nodes for resource, count in per_node.items()}


def resource_flavor(pool: GpuPool) -> dict[str, Any]:
    """The pool's nodes as Kueue sees them: Kueue adds the node label to the admitted pods' node selector
    and the tolerations to their tolerations, so a job names its queue and nothing else."""
    return {
        "apiVersion": KUEUE_API,
        "kind": "ResourceFlavor",
        "metadata": {"name": pool.spec.name},
        "spec": {
            "nodeLabels": {POOL_LABEL: pool.spec.name},
            "tolerations": [
                {"key": taint.key, "operator": "Equal", "value": taint.value, "effect": taint.effect}
                for taint in pool.taints
            ],
        },
    }


def provisioning_request_config(pools: Sequence[GpuPool]) -> dict[str, Any]:
    """What Kueue puts in the ProvisioningRequest it makes for a job: the scale-up-at-once class, for the pod
    sets that ask for what the pools' quotas count (GPU slots, interconnect devices). A pod set without them
    (a launcher, a leader on the system nodes) stays out of the request, which it could keep from ever
    being satisfied (review-training.md T7; ProvisioningRequestConfig.spec.managedResources: "If not
    empty, the ProvisioningRequest will contain only the podsets that are requesting at least one of
    them", Kueue 0.19.2 CRD)."""
    managed = sorted({name for pool in pools for name in queue_quota(pool)})
    return {
        "apiVersion": KUEUE_API,
        "kind": "ProvisioningRequestConfig",
        "metadata": {"name": PROVISIONING_CHECK},
        "spec": {"provisioningClassName": ATOMIC_SCALE_UP, "managedResources": managed},
    }


def provisioning_admission_check() -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API,
        "kind": "AdmissionCheck",
        "metadata": {"name": PROVISIONING_CHECK},
        "spec": {
            "controllerName": PROVISIONING_CONTROLLER,
            "parameters": {
                "apiGroup": "kueue.x-k8s.io",
                "kind": "ProvisioningRequestConfig",
                "name": PROVISIONING_CHECK,
            },
        },
    }


def team_quotas(pool: GpuPool, teams: Sequence[TeamSpec]) -> dict[str, dict[str, int]]:
    """Each team's part of the pool's quota (team: resource: count): its share, rounded down, and the units
    rounding leaves over to the teams with the largest remainders (the first listed on a tie), so the parts
    add up to the pool."""
    parts: dict[str, dict[str, int]] = {team.name: {} for team in teams}
    for resource, total in queue_quota(pool).items():
        # In whole hundredths, so equal remainders compare equal (as floats, 1.46 - 1 < 0.46).
        remainders: dict[str, int] = {}
        for team in teams:
            parts[team.name][resource], remainders[team.name] = divmod(total * team.share, 100)
        left = total - sum(part[resource] for part in parts.values())
        # sorted() keeps the listed order among equal remainders.
        for name in sorted(remainders, key=lambda name: remainders[name], reverse=True)[:left]:
            parts[name][resource] += 1
    return parts


def cluster_queue(
    pool: GpuPool,
    namespaces: Sequence[str],
    admission_checks: Sequence[str] = (),
    team: TeamSpec | None = None,
    quota: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The pool's queue, or with `team` that team's queue of the pool: its part as nominal quota, in the
    pool's cohort, where it borrows what the other teams leave unused (no borrowing limit) and lends what
    it leaves; a job of the team that fits its nominal quota takes lent quota back by preempting the
    borrowers (reclaimWithinCohort Any, under fair sharing: those whose queue uses the most beyond its own
    quota, weighted by share), and within the team a higher-priority job preempts a lower one
    (withinClusterQueue LowerPriority). ClusterQueue v1beta2 fields, Kueue 0.19.2 CRD."""
    quota = quota if quota is not None else queue_quota(pool)
    checks = (
        {"admissionChecksStrategy": {"admissionChecks": [{"name": check} for check in admission_checks]}}
        if admission_checks
        else {}
    )
    sharing = (
        {
            "cohortName": pool.spec.name,
            "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"},
            "fairSharing": {"weight": team.share},
        }
        if team
        else {}
    )
    return {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": {"name": team_queue_name(pool.spec.name, team.name) if team else pool.spec.name},
        "spec": {
            **checks,
            **sharing,
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(namespaces)}
                ]
            },
            "resourceGroups": [
                {
                    "coveredResources": list(quota),
                    "flavors": [
                        {
                            "name": pool.spec.name,
                            "resources": [
                                {"name": name, "nominalQuota": count} for name, count in quota.items()
                            ],
                        }
                    ],
                }
            ],
        },
    }


def local_queue(name: str, namespace: str, cluster_queue_name: str) -> dict[str, Any]:
    """A namespace's queue for a pool: named after the pool whether it leads to the pool's queue or to its
    team's queue of the pool, so a job names the pool either way; or `default`, for the jobs that name
    none."""
    return {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def workload_priority_classes() -> list[dict[str, Any]]:
    return [
        {"apiVersion": KUEUE_API, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value}
        for name, value in TEAM_PRIORITIES.items()
    ]


# With teams, fair sharing: Kueue's documented strategies, in its documented order (site/content/en/docs/
# concepts/preemption.md at v0.19.2); a Configuration with `fairSharing` turns it on (cmd/kueue/main.go,
# fairsharing.Enabled: set, not nil).
FAIR_SHARING = {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]}


# Where a provisioning check admits jobs, how long a running job may miss a pod unless `batch` says.
RECOVERY_TIMEOUT = "5m"


def kueue_configuration(batch: BatchSpec, provisioning_check: bool) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2): the chart's defaults, with all-or-nothing
    admission, GPU-only quotas and the queued namespaces and job kinds. `provisioning_check`: whether the
    autoscaler sizes a job's nodes before it is admitted (not on GKE)."""
    # A running job that lost a pod (node loss, spot reclaim) is evicted and queued again after
    # `recoveryTimeout`. Behind a provisioning check its replacement pod gets no node from the autoscaler
    # (T1), so only a new admission brings one: 5m. Without one (GKE) the replacement pod scales a pool up
    # itself, which takes as long as a first start: podsReadyTimeout.
    recovery = batch.recovery_timeout or (
        RECOVERY_TIMEOUT if provisioning_check else batch.pods_ready_timeout
    )
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "controller": {
            "groupKindConcurrency": {
                "Job.batch": 5,
                "Pod": 5,
                "Workload.kueue.x-k8s.io": 10,
                "LocalQueue.kueue.x-k8s.io": 5,
                "ClusterQueue.kueue.x-k8s.io": 5,
                "ResourceFlavor.kueue.x-k8s.io": 1,
            }
        },
        "clientConnection": {"qps": 300, "burst": 500},
        # With a provisioning check, no blockAdmission: a job waiting minutes for its nodes does not hold back
        # the others; its quota is reserved, so no other job takes its place meanwhile. Without one (GKE), two
        # multi-node jobs admitted together could each get part of their nodes and wait on each other until
        # their timeouts, so admission waits until each admitted job runs (review-training.md T8; Kueue's
        # site/content/en/docs/tasks/manage/setup_wait_for_pods_ready.md). An evicted job keeps its place by
        # creation time and waits longer each time (60 s doubling, at most 30 min), and after `requeueLimit`
        # evictions it is deactivated instead of starting nodes again forever (review-training.md T3; Kueue
        # 0.19.2 apis/config/v1beta2 RequeuingStrategy).
        "waitForPodsReady": {
            "timeout": batch.pods_ready_timeout,
            "recoveryTimeout": recovery,
            "blockAdmission": not provisioning_check,
            "requeuingStrategy": {
                "timestamp": "Creation",
                "backoffLimitCount": batch.requeue_limit,
                "backoffBaseSeconds": 60,
                "backoffMaxSeconds": 1800,
            },
        },
        "managedJobsNamespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "In",
                    "values": list(batch.queued_namespaces),
                }
            ]
        },
        "integrations": {"frameworks": list(QUEUED_FRAMEWORKS)},
        "resources": {"excludeResourcePrefixes": list(UNQUOTED_RESOURCE_PREFIXES)},
        **({"fairSharing": FAIR_SHARING} if batch.teams else {}),
    }


def jobset_values(tolerations: Sequence[dict[str, str]]) -> dict[str, Any]:
    return {"image": dict(JOBSET_IMAGE), "controller": {"tolerations": list(tolerations)}}


def kueue_values(
    batch: BatchSpec, tolerations: Sequence[dict[str, str]], provisioning_check: bool, scraped: bool = False
) -> dict[str, Any]:
    """`scraped`: the chart's ServiceMonitor for Kueue's metrics (queues, admissions), which a Prometheus
    Operator (`monitoring`) reads with its service account token (the metrics endpoint checks it)."""
    return {
        **({"enablePrometheus": True} if scraped else {}),
        "controllerManager": {
            "manager": {"image": dict(KUEUE_IMAGE)},
            "tolerations": list(tolerations),
        },
        "managerConfig": {
            "controllerManagerConfigYaml": yaml_text(kueue_configuration(batch, provisioning_check))
        },
    }


class BatchQueues(pulumi.ComponentResource):
    """Kueue, JobSet, a flavor and a queue per GPU pool (with `teams`, a queue per pool and team), the
    queued namespaces and their LocalQueues. Given
    the ProvisioningRequest CRD of a cluster-autoscaler that serves it, the queues admit a job once that
    autoscaler has provisioned all its pods; Kueue sets its check up only if the CRD exists when it starts
    (cmd/kueue/main.go at v0.19.2, ServerSupportsProvisioningRequest), so its release waits for the CRD."""

    def __init__(
        self,
        name: str,
        cluster: GpuCluster,
        batch: BatchSpec,
        provisioning_request_crd: pulumi.Resource | None = None,
        metrics: pulumi.Resource | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("gpu-k8s:index:BatchQueues", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=cluster.k8s_provider)
        # Team jobs and the two controllers need no host access: the cluster's Pod Security level, which
        # on EKS and GKE nothing else sets (security.md S5: unlabelled namespaces admit privileged pods).
        labels = pod_security_labels(cluster.traits.pod_security)
        kueue_namespace = k8s.core.v1.Namespace(
            f"{name}-kueue-namespace",
            metadata={"name": KUEUE_NAMESPACE, "labels": labels},
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=list(cluster.system_ready))
            ),
        )
        release = helm_release(
            f"{name}-kueue",
            chart="kueue",
            version=KUEUE_CHART_VERSION,
            repository=KUEUE_REPOSITORY,
            namespace=kueue_namespace.metadata.name,
            values=kueue_values(
                batch,
                cluster.traits.system_tolerations,
                provisioning_check=provisioning_request_crd is not None,
                scraped=metrics is not None,
            ),
            parent=self,
            provider=cluster.k8s_provider,
            depends_on=[
                kueue_namespace,
                *([provisioning_request_crd] if provisioning_request_crd else []),
                *([metrics] if metrics is not None else []),
            ],
        )
        jobset_namespace = k8s.core.v1.Namespace(
            f"{name}-jobset-namespace",
            metadata={"name": JOBSET_NAMESPACE, "labels": labels},
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=list(cluster.system_ready))
            ),
        )
        helm_release(
            f"{name}-jobset",
            chart="jobset",
            version=JOBSET_CHART_VERSION,
            repository=JOBSET_REPOSITORY,
            namespace=jobset_namespace.metadata.name,
            values=jobset_values(cluster.traits.system_tolerations),
            parent=self,
            provider=cluster.k8s_provider,
            depends_on=[jobset_namespace],
        )
        # Kueue's webhooks check these objects, so they wait for its release (Helm waits for its pods).
        after_kueue = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[release]))
        team_namespaces = {
            namespace: k8s.core.v1.Namespace(
                f"{name}-{namespace}-namespace", metadata={"name": namespace, "labels": labels}, opts=child
            )
            for namespace in batch.queued_namespaces
        }
        checks: list[pulumi.Resource] = []
        if provisioning_request_crd is not None:
            config = _custom_resource(
                f"{name}-provisioning-config", provisioning_request_config(cluster.pools), after_kueue
            )
            checks.append(
                _custom_resource(
                    f"{name}-provisioning-check",
                    provisioning_admission_check(),
                    pulumi.ResourceOptions.merge(after_kueue, pulumi.ResourceOptions(depends_on=[config])),
                )
            )
        if batch.queued_gpus_only:
            queued_gpu_pods(
                name,
                batch.queued_namespaces,
                [OPERATOR_NAMESPACE, KUEUE_NAMESPACE, JOBSET_NAMESPACE],
                cluster.k8s_provider,
                self,
                list(cluster.system_ready),
            )
        check_names = [PROVISIONING_CHECK] if checks else []
        for priority in workload_priority_classes() if batch.teams else []:
            CustomObject(f"{name}-{priority['metadata']['name']}-priority", priority, after_kueue)
        for pool in cluster.pools:
            flavor = _custom_resource(f"{name}-{pool.spec.name}-flavor", resource_flavor(pool), after_kueue)
            after_flavor = pulumi.ResourceOptions.merge(
                after_kueue, pulumi.ResourceOptions(depends_on=[flavor, *checks])
            )
            # (queue resource, its ClusterQueue's name, the namespaces it serves)
            queues: list[tuple[pulumi.Resource, str, Sequence[str]]] = []
            if batch.teams:
                parts = team_quotas(pool, batch.teams)
                for team in batch.teams:
                    manifest = cluster_queue(pool, team.namespaces, check_names, team, parts[team.name])
                    queue_name = manifest["metadata"]["name"]
                    queue = _custom_resource(f"{name}-{queue_name}-queue", manifest, after_flavor)
                    queues.append((queue, queue_name, team.namespaces))
            else:
                manifest = cluster_queue(pool, batch.queued_namespaces, check_names)
                queue = _custom_resource(f"{name}-{pool.spec.name}-queue", manifest, after_flavor)
                queues.append((queue, pool.spec.name, batch.queued_namespaces))
            local_names = [pool.spec.name]
            if pool.spec.name == batch.default_pool:
                local_names.append(DEFAULT_QUEUE)
            for backing_queue, queue_name, namespaces in queues:
                for namespace in namespaces:
                    for local_name in local_names:
                        # A LocalQueue's clusterQueue is immutable (Kueue CRD: self == oldSelf): moving a
                        # namespace between the shared and a team's queue, or `default` to another pool,
                        # replaces it, the old one deleted first (the new one has its name).
                        _custom_resource(
                            f"{name}-{namespace}-{local_name}-queue",
                            local_queue(local_name, namespace, queue_name),
                            pulumi.ResourceOptions.merge(
                                after_kueue,
                                pulumi.ResourceOptions(
                                    depends_on=[backing_queue, team_namespaces[namespace]],
                                    replace_on_changes=["spec.clusterQueue"],
                                    delete_before_replace=True,
                                ),
                            ),
                        )
        self.register_outputs({})


def _custom_resource(
    name: str, manifest: dict[str, Any], opts: pulumi.ResourceOptions
) -> pulumi.CustomResource:
    return k8s.apiextensions.CustomResource(
        name,
        api_version=manifest["apiVersion"],
        kind=manifest["kind"],
        metadata=manifest["metadata"],
        spec=manifest["spec"],
        opts=opts,
    )
