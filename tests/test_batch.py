"""`batch`: Kueue queues derived from the GPU pools (quotas, flavors, LocalQueues), on every platform
whose stack turns it on, and nothing of it where `batch` is absent."""

from __future__ import annotations

import copy
import json
import re
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest

from gpu_k8s.tools.engine import Recording, run_program
from tests.conftest import assert_refused_before_any_resource, set_path, some, upstream, upstream_yaml
from tests.test_charts import crd_schemas, validate_custom_resource

KUEUE = "kubernetes:kueue.x-k8s.io/v1beta2:"


def kueue_objects(recording: Recording, kind: str) -> dict[str, dict[str, Any]]:
    """The plan's Kueue objects of one kind, by (namespace/)name."""
    found = {}
    for r in recording.by_type(KUEUE + kind):
        metadata = r.inputs["metadata"]
        key = f"{metadata['namespace']}/{metadata['name']}" if "namespace" in metadata else metadata["name"]
        found[key] = {**r.inputs, "urn": r.urn, "dependencies": r.dependencies}
    return found


def quotas(queue: dict[str, Any]) -> dict[str, int]:
    (group,) = queue["spec"]["resourceGroups"]
    (flavor,) = group["flavors"]
    assert group["coveredResources"] == [r["name"] for r in flavor["resources"]]
    return {r["name"]: int(r["nominalQuota"]) for r in flavor["resources"]}


def test_each_pool_queues_its_gpu_slots_at_max_nodes(aws_eks):
    queues = kueue_objects(aws_eks, "ClusterQueue")
    # Worked out by hand from the stack file and the catalog: g6e.xlarge 1 GPU x 4 nodes; g5.xlarge 1 GPU
    # time-sliced 4 ways x 4 nodes; g6.12xlarge 4 GPUs x MPS 4 x 2 nodes; p5.48xlarge 8 H100 x 7 1g.10gb
    # slices (single strategy: advertised as nvidia.com/gpu) x 2 nodes.
    assert {name: quotas(queue) for name, queue in queues.items()} == {
        "l40s": {"nvidia.com/gpu": 4},
        "a10g-shared": {"nvidia.com/gpu": 16},
        "l4-mps": {"nvidia.com/gpu": 32},
        "h100": {"nvidia.com/gpu": 112},
        # 8 whole H100s and 32 EFA interfaces per p5.48xlarge, 2 nodes.
        "h100-train": {"nvidia.com/gpu": 16, "vpc.amazonaws.com/efa": 64},
    }


def test_mixed_mig_queues_each_slice_size(aws_eks_config):
    config = copy.deepcopy(aws_eks_config)
    cluster = config["gpu-k8s:cluster"]
    cluster["gpuPools"] = [
        {
            "name": "h100",
            "instanceType": "p5.48xlarge",
            "maxNodes": 3,
            "sharing": {"mode": "mig", "strategy": "mixed", "profile": "3g.40gb"},
        }
    ]
    (queue,) = kueue_objects(run_program("mixed", config), "ClusterQueue").values()
    # 3g.40gb: two slices per H100 80GB, 8 GPUs, 3 nodes.
    assert quotas(queue) == {"nvidia.com/mig-3g.40gb": 48}


def test_flavors_lead_admitted_pods_to_their_pool(aws_eks):
    flavors = kueue_objects(aws_eks, "ResourceFlavor")
    assert flavors["l40s"]["spec"]["nodeLabels"] == {"gpu-k8s.io/pool": "l40s"}
    shared = flavors["a10g-shared"]["spec"]["tolerations"]
    assert {(t["key"], t["value"], t["effect"]) for t in shared} == {
        ("nvidia.com/gpu", "true", "NoSchedule"),
        ("gpu-k8s.io/sharing", "timeSlicing", "NoSchedule"),
    }
    for name, queue in kueue_objects(aws_eks, "ClusterQueue").items():
        assert queue["spec"]["resourceGroups"][0]["flavors"][0]["name"] == name
        assert flavors[name]["urn"] in queue["dependencies"]


def test_queues_claim_no_cohort_they_could_not_borrow_from(aws_eks_config):
    """review-training.md T11: a ClusterQueue borrows only quota of flavors it lists, and each lists its own
    pool's flavor alone, so a cohort per GPU model lent nothing while the docs said it did."""
    config = copy.deepcopy(aws_eks_config)
    config["gpu-k8s:cluster"]["gpuPools"] = [
        {"name": "l40s-spot", "instanceType": "g6e.xlarge", "maxNodes": 2, "spot": True},
        {"name": "l40s", "instanceType": "g6e.2xlarge", "maxNodes": 1},
    ]
    queues = kueue_objects(run_program("cohorts", config), "ClusterQueue")
    assert set(queues) == {"l40s-spot", "l40s"}
    for name, queue in queues.items():
        assert "cohortName" not in queue["spec"]
        assert [f["name"] for group in queue["spec"]["resourceGroups"] for f in group["flavors"]] == [name]


def test_each_namespace_gets_a_queue_per_pool_after_kueue_and_its_namespace(aws_eks_config):
    config = copy.deepcopy(aws_eks_config)
    config["gpu-k8s:cluster"]["batch"] = {"namespaces": ["research", "training"]}
    recording = run_program("teams", config)
    local = kueue_objects(recording, "LocalQueue")
    pools = {"l40s", "a10g-shared", "l4-mps", "h100", "h100-train"}
    assert set(local) == {f"{team}/{pool}" for team in ("research", "training") for pool in pools}
    (kueue,) = [r for r in recording.by_type("kubernetes:helm.sh/v3:Release") if r.inputs["name"] == "kueue"]
    namespaces = {
        r.inputs["metadata"]["name"]: r.urn for r in recording.by_type("kubernetes:core/v1:Namespace")
    }
    for key, queue in some(local.items(), at_least=10):
        team, pool = key.split("/")
        assert queue["spec"] == {"clusterQueue": pool}
        assert {kueue.urn, namespaces[team]} <= set(queue["dependencies"])
    selector = kueue_objects(recording, "ClusterQueue")["l40s"]["spec"]["namespaceSelector"]
    assert selector["matchExpressions"][0]["values"] == ["research", "training"]


def test_a_job_is_admitted_once_the_autoscaler_has_provisioned_all_its_pods(aws_eks):
    """Kueue's ProvisioningRequest admission check on every queue, with the all-or-nothing class; Kueue
    starts after the CRD (it sets the check up only if the CRD exists then), and so does the autoscaler."""
    (config,) = kueue_objects(aws_eks, "ProvisioningRequestConfig").values()
    assert config["spec"]["provisioningClassName"] == "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    # review-training.md T7: only pod sets that ask for what the quotas count go into the request, so a
    # CPU-only launcher or leader cannot keep it from being satisfied.
    covered = {
        name
        for queue in kueue_objects(aws_eks, "ClusterQueue").values()
        for group in queue["spec"]["resourceGroups"]
        for name in group["coveredResources"]
    }
    assert config["spec"]["managedResources"] == sorted(covered)
    assert {"nvidia.com/gpu", "vpc.amazonaws.com/efa"} <= covered
    assert not covered & {"cpu", "memory", "ephemeral-storage"}
    (check,) = kueue_objects(aws_eks, "AdmissionCheck").values()
    assert check["spec"]["controllerName"] == "kueue.x-k8s.io/provisioning-request"
    assert check["spec"]["parameters"] == {
        "apiGroup": "kueue.x-k8s.io",
        "kind": "ProvisioningRequestConfig",
        "name": config["metadata"]["name"],
    }
    assert config["urn"] in check["dependencies"]
    queues = kueue_objects(aws_eks, "ClusterQueue")
    assert len(queues) == 5
    for queue in queues.values():
        assert queue["spec"]["admissionChecksStrategy"] == {
            "admissionChecks": [{"name": check["metadata"]["name"]}]
        }
        assert check["urn"] in queue["dependencies"]
    (crd,) = aws_eks.by_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
    assert crd.inputs["metadata"]["name"] == "provisioningrequests.autoscaling.x-k8s.io"
    # Kueue 0.19.2 maps the v1 kind (cmd/kueue/main.go imports .../autoscaling.x-k8s.io/v1).
    assert {v["name"] for v in crd.inputs["spec"]["versions"] if v["served"]} >= {"v1"}
    releases = {r.inputs["name"]: r for r in aws_eks.by_type("kubernetes:helm.sh/v3:Release")}
    for chart in ("kueue", "cluster-autoscaler"):
        assert crd.urn in releases[chart].dependencies, chart


def test_turning_batch_on_for_a_running_cluster_changes_only_the_autoscalers_flags(aws_k3s, aws_k3s_config):
    """Day 2: what the cluster already has keeps its URN and inputs, except the autoscaler release, whose
    flags gain the one ProvisioningRequests need, the servers' admission policy, which exempts the batch
    controllers' namespaces, and monitoring's alerts and dashboard, which gain the queues'; everything else
    batch brings is new."""
    config = copy.deepcopy(aws_k3s_config)
    config["gpu-k8s:cluster"]["batch"] = {"namespaces": ["research"]}
    with_batch = {r.urn: r for r in run_program("aws-k3s", config).registrations}
    before = {r.urn: r for r in aws_k3s.registrations}
    assert set(before) <= set(with_batch)
    changed = {before[urn].name: urn for urn, r in before.items() if with_batch[urn].inputs != r.inputs}
    assert set(changed) == {
        "ml-autoscaler-release",
        "ml-server-pods-policy",
        "ml-monitoring-gpu-alerts",
        "ml-monitoring-gpu-dashboard",
    }
    alerts = json.dumps(with_batch[changed["ml-monitoring-gpu-alerts"]].inputs)
    assert "KueueQueueStalled" in alerts and "KueueQueueStalled" not in json.dumps(
        before[changed["ml-monitoring-gpu-alerts"]].inputs
    )
    policy = changed["ml-server-pods-policy"]
    exempt = with_batch[policy].inputs["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]
    assert set(exempt["values"]) - set(
        before[policy].inputs["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0][
            "values"
        ]
    ) == {"kueue-system", "jobset-system"}
    urn = changed["ml-autoscaler-release"]
    flags_before = before[urn].inputs["values"]["extraArgs"]
    flags_after = with_batch[urn].inputs["values"]["extraArgs"]
    assert flags_after == {**flags_before, "enable-provisioning-requests": True}


def test_the_provisioning_request_crd_is_a_valid_crd_for_every_supported_minor():
    from gpu_k8s.components.autoscaler import provisioning_request_crd
    from gpu_k8s.components.spec import SUPPORTED_KUBERNETES_MINORS

    for minor in SUPPORTED_KUBERNETES_MINORS:
        kubernetes_validate.validate(provisioning_request_crd(), f"{minor}.0", strict=True)


def test_gke_queues_wait_for_no_provisioning(gcp_gke_config):
    """GKE's own autoscaler ties ProvisioningRequests to node pools with queued provisioning, which the
    stack does not create: a check there would hold every job forever."""
    config = copy.deepcopy(gcp_gke_config)
    config["gpu-k8s:cluster"]["batch"] = {"namespaces": ["research"]}
    recording = run_program("gke-batch", config)
    queues = kueue_objects(recording, "ClusterQueue")
    assert queues and all("admissionChecksStrategy" not in q["spec"] for q in queues.values())
    assert not kueue_objects(recording, "AdmissionCheck")
    assert not recording.by_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
    # Without the check, two multi-node jobs admitted together could each get part of their nodes and wait
    # on each other until their timeouts (review-training.md T8): admission waits until each one runs.
    assert kueue_config(recording)["waitForPodsReady"]["blockAdmission"] is True
    # There a replacement pod scales its pool up itself, as slowly as a first start: a running job that
    # lost a pod gets the whole podsReadyTimeout, not the 5m of clusters with the check.
    assert kueue_config(recording)["waitForPodsReady"]["recoveryTimeout"] == "30m"


def test_where_a_provisioning_check_sizes_jobs_admission_does_not_wait_on_running_ones(aws_eks):
    assert kueue_config(aws_eks)["waitForPodsReady"]["blockAdmission"] is False


@pytest.mark.parametrize("stack", ["gcp_gke", "aws_k3s", "gcp_k3s"])
def test_no_batch_key_no_kueue(stack, request):
    recording = request.getfixturevalue(stack)
    assert not [r for r in recording.registrations if "kueue" in r.type or r.inputs.get("name") == "kueue"]


def test_batch_runs_on_k3s_with_the_servers_tolerated(aws_k3s_config):
    config = copy.deepcopy(aws_k3s_config)
    config["gpu-k8s:cluster"]["batch"] = {"namespaces": ["research"]}
    recording = run_program("k3s-batch", config)
    (kueue,) = [r for r in recording.by_type("kubernetes:helm.sh/v3:Release") if r.inputs["name"] == "kueue"]
    tolerations = kueue.inputs["values"]["controllerManager"]["tolerations"]
    assert tolerations and all(t["operator"] == "Exists" for t in tolerations)
    assert kueue_objects(recording, "ClusterQueue")
    # The toolkit runs the autoscaler on k3s too, so the queues wait for its provisioning.
    assert kueue_objects(recording, "AdmissionCheck")
    assert recording.by_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")


BAD_BATCH = [
    ("no-namespaces", set_path("batch.namespaces", []), "gpu-k8s:cluster.batch.namespaces", ("at least 1",)),
    (
        "system-namespace",
        set_path("batch.namespaces", ["kube-system"]),
        "gpu-k8s:cluster.batch.namespaces[0]",
        ("exists in every cluster",),
    ),
    (
        # `monitoring` makes this namespace: a team namespace of the same name would be made twice.
        "add-on-namespace",
        set_path("batch.namespaces", ["research", "monitoring"]),
        "gpu-k8s:cluster.batch.namespaces[1]",
        ("belongs to an add-on",),
    ),
    (
        "bad-namespace",
        set_path("batch.namespaces", ["Research"]),
        "gpu-k8s:cluster.batch.namespaces[0]",
        ("not a namespace name",),
    ),
    (
        "namespace-twice",
        set_path("batch.namespaces", ["research", "research"]),
        "gpu-k8s:cluster.batch.namespaces[1]",
        ("listed twice",),
    ),
    (
        "short-timeout",
        set_path("batch.podsReadyTimeout", "5m"),
        "gpu-k8s:cluster.batch.podsReadyTimeout",
        ("at least 10m",),
    ),
    (
        "timeout-not-duration",
        set_path("batch.podsReadyTimeout", "soon"),
        "gpu-k8s:cluster.batch.podsReadyTimeout",
        ("not a duration",),
    ),
    (
        "recovery-off",
        set_path("batch.recoveryTimeout", "0s"),
        "gpu-k8s:cluster.batch.recoveryTimeout",
        ("0s turns the check off", 'use "5m"'),
    ),
    (
        "recovery-not-duration",
        set_path("batch.recoveryTimeout", "5 minutes"),
        "gpu-k8s:cluster.batch.recoveryTimeout",
        ("not a duration",),
    ),
    (
        "negative-requeue",
        set_path("batch.requeueLimit", -1),
        "gpu-k8s:cluster.batch.requeueLimit",
        ("at least 0",),
    ),
    ("unknown-batch-key", set_path("batch.queues", 3), "gpu-k8s:cluster.batch.queues", ("unknown key",)),
    (
        "default-pool-unknown",
        set_path("batch.defaultPool", "b200"),
        "gpu-k8s:cluster.batch.defaultPool",
        ("names no GPU pool", "one of: l40s, a10g-shared, l4-mps, h100, h100-train"),
    ),
]


@pytest.mark.parametrize(
    ("mutation", "path", "words"), [c[1:] for c in BAD_BATCH], ids=[c[0] for c in BAD_BATCH]
)
def test_bad_batch_config_is_refused_before_any_resource(aws_eks_config, mutation, path, words):
    assert_refused_before_any_resource(aws_eks_config, mutation, path, words)


def _namespace_labels(rec: Recording) -> dict[str, dict[str, str]]:
    return {
        r.inputs["metadata"]["name"]: r.inputs["metadata"].get("labels") or {}
        for r in rec.by_type("kubernetes:core/v1:Namespace")
    }


@pytest.mark.parametrize(
    ("stack", "changes", "level"),
    [
        ("aws-eks", {}, "baseline"),
        ("gcp-gke", {"batch": {"namespaces": ["research"]}}, "baseline"),
        (
            "aws-k3s",
            {"batch": {"namespaces": ["research"]}, "k3s": {"podSecurity": "restricted"}},
            "restricted",
        ),
    ],
)
def test_every_namespace_the_toolkit_makes_carries_pod_security(stack, changes, level, request):
    """security.md S5: EKS and GKE admit privileged pods in a namespace without Pod Security labels. Team
    namespaces and the batch controllers' get the cluster's level enforced (k3s: its podSecurity, which a
    label must not loosen) and restricted warned of. Privileged only where host access is the point: the
    GPU Operator's operands, on k3s the upgrade controller's jobs (they replace the k3s binary), and with
    `monitoring` node-exporter's (the host's network and processes)."""
    privileged = {"gpu-operator", "system-upgrade", "monitoring"}
    config = copy.deepcopy(request.getfixturevalue(f"{stack.replace('-', '_')}_config"))
    cluster = config["gpu-k8s:cluster"]
    for key, value in changes.items():
        cluster[key] = {**cluster.get(key, {}), **value}
    labels = _namespace_labels(run_program(stack, config))
    assert {"research", "kueue-system", "jobset-system", "gpu-operator"} <= set(labels)
    for namespace, namespace_labels in labels.items():
        if namespace in privileged:
            assert namespace_labels["pod-security.kubernetes.io/enforce"] == "privileged", namespace
            continue
        assert namespace_labels["pod-security.kubernetes.io/enforce"] == level, namespace
        assert namespace_labels["pod-security.kubernetes.io/warn"] == "restricted", namespace
        assert namespace_labels["pod-security.kubernetes.io/audit"] == "restricted", namespace


def test_an_evicted_job_is_requeued_a_bounded_number_of_times(aws_eks, aws_eks_config):
    """review-training.md T3: without a requeuing strategy a job that cannot start is evicted and queued
    again forever, starting GPU nodes each time. It keeps its place by creation time, waits longer each time
    and is deactivated after `batch.requeueLimit` evictions (Kueue 0.19.2 RequeuingStrategy)."""
    import yaml

    def strategy(rec: Recording) -> dict[str, Any]:
        (release,) = [r for r in rec.by_type("kubernetes:helm.sh/v3:Release") if r.inputs["name"] == "kueue"]
        config = yaml.safe_load(release.inputs["values"]["managerConfig"]["controllerManagerConfigYaml"])
        return config["waitForPodsReady"]["requeuingStrategy"]

    assert strategy(aws_eks) == {
        "timestamp": "Creation",
        "backoffLimitCount": 6,
        "backoffBaseSeconds": 60,
        "backoffMaxSeconds": 1800,
    }
    config = copy.deepcopy(aws_eks_config)
    config["gpu-k8s:cluster"]["batch"]["requeueLimit"] = 2
    assert strategy(run_program("requeue", config))["backoffLimitCount"] == 2


def kueue_config(rec: Recording) -> dict[str, Any]:
    import yaml

    (release,) = [r for r in rec.by_type("kubernetes:helm.sh/v3:Release") if r.inputs["name"] == "kueue"]
    return yaml.safe_load(release.inputs["values"]["managerConfig"]["controllerManagerConfigYaml"])


def test_a_job_that_loses_a_pod_is_queued_again_after_the_recovery_timeout(aws_eks, aws_eks_config):
    """review-training.md T1: a replacement pod of a job admitted through a provisioning request gets no
    node from the autoscaler, so the job must be queued again (a new request) soon, not after the whole
    podsReadyTimeout that Kueue uses by default (apis/config/v1beta2 defaults.go at v0.19.2)."""
    wait = kueue_config(aws_eks)["waitForPodsReady"]
    assert (wait["timeout"], wait["recoveryTimeout"]) == ("30m", "5m")
    config = copy.deepcopy(aws_eks_config)
    config["gpu-k8s:cluster"]["batch"]["recoveryTimeout"] = "10m"
    assert kueue_config(run_program("recovery", config))["waitForPodsReady"]["recoveryTimeout"] == "10m"


def go_struct_fields(source: str) -> dict[str, dict[str, str]]:
    """Each Go struct of the file: its JSON field names and their Go types (inline members merged; those of
    other packages' types keep their JSON names only for TypeMeta, the one this file embeds)."""
    structs: dict[str, dict[str, str]] = {}
    inline: dict[str, list[str]] = {}
    for name, body in re.findall(r"^type (\w+) struct \{\n(.*?)^\}", source, re.S | re.M):
        fields = structs.setdefault(name, {})
        for go_type, json_name, options in re.findall(
            r"^\t(?:\w+\s+)?([\w.*\[\]]+)\s+`json:\"([^\",]*)((?:,[^\"]*)?)\"", body, re.M
        ):
            if json_name:
                fields[json_name] = go_type
            elif "inline" in options:
                inline.setdefault(name, []).append(go_type)
    for name, members in inline.items():
        for member in members:
            if member == "metav1.TypeMeta":
                structs[name].update({"apiVersion": "string", "kind": "string"})
            else:
                structs[name].update(structs[member])
    return structs


def unknown_config_fields(
    value: Any, go_type: str, structs: dict[str, dict[str, str]], path: str
) -> list[str]:
    bare = go_type.lstrip("*")
    if bare.startswith("[]") and isinstance(value, list):
        return [
            f
            for i, v in enumerate(value)
            for f in unknown_config_fields(v, bare[2:], structs, f"{path}[{i}]")
        ]
    if bare in structs and not isinstance(value, dict):
        return [f"{path} (not an object)"]
    if bare not in structs:
        # A scalar, a map, or another package's type (leaderElection, managedJobsNamespaceSelector): not
        # checked here; Kueue decodes its configuration strictly and would stop on them at start.
        return []
    fields = structs[bare]
    return [f"{path}.{key}" for key in value if key not in fields] + [
        found
        for key, item in value.items()
        if key in fields
        for found in unknown_config_fields(item, fields[key], structs, f"{path}.{key}")
    ]


def test_every_field_of_the_kueue_configuration_is_one_kueue_reads(aws_eks):
    """Kueue refuses to start on a Configuration field it does not know, and no offline check would see a
    misspelt one: each key is matched against Kueue's own types at the pinned release
    (upstream/kueue/0.19.2/configuration_types.go, apis/config/v1beta2 at 8eab687)."""
    structs = go_struct_fields(upstream("kueue/0.19.2/configuration_types.go").read_text())
    assert {"timeout", "recoveryTimeout", "requeuingStrategy"} <= set(structs["WaitForPodsReady"])
    config = kueue_config(aws_eks)
    assert unknown_config_fields(config, "Configuration", structs, "config") == []
    config["waitForPodsReady"]["recoveryTimout"] = "5m"
    config["integrations"]["framework"] = []
    config["resources"] = ["cpu"]
    assert unknown_config_fields(config, "Configuration", structs, "config") == [
        "config.waitForPodsReady.recoveryTimout",
        "config.integrations.framework",
        "config.resources (not an object)",
    ]


def test_kueue_queues_every_framework_its_chart_does(aws_eks):
    """review-training.md T15: a narrower list leaves a framework installed later (Trainer v2, MPIJob,
    KubeRay) running unqueued; the list is the pinned chart's own (values.yaml at 0.19.2)."""
    import yaml

    values = yaml.safe_load(upstream("charts/kueue-0.19.2/values.yaml").read_text())
    chart_config = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    frameworks = kueue_config(aws_eks)["integrations"]["frameworks"]
    assert frameworks == chart_config["integrations"]["frameworks"]
    assert {"jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob", "kubeflow.org/mpijob"} <= set(
        frameworks
    )


# --- teams (review-training.md T14) -------------------------------------------------------------------------

TEAMS = [
    {"name": "research", "namespaces": ["research", "research-dev"], "share": 70},
    {"name": "prod", "namespaces": ["prod"], "share": 30},
]


@pytest.fixture(scope="module")
def teams_plan(aws_eks_config) -> Recording:
    config = copy.deepcopy(aws_eks_config)
    config["gpu-k8s:cluster"]["batch"] = {"teams": copy.deepcopy(TEAMS)}
    return run_program("teams", config)


def test_each_team_holds_its_share_of_each_pool_in_the_pools_cohort(teams_plan, aws_eks):
    pool_quota = {name: quotas(queue) for name, queue in kueue_objects(aws_eks, "ClusterQueue").items()}
    queues = kueue_objects(teams_plan, "ClusterQueue")
    assert set(queues) == {f"{pool}-{team['name']}" for pool in pool_quota for team in TEAMS}
    for pool, whole in some(pool_quota.items(), at_least=5):
        research, prod = queues[f"{pool}-research"], queues[f"{pool}-prod"]
        for resource, total in whole.items():
            # The parts add up to the pool, and each is its share give or take the one unit rounding moves.
            assert quotas(research)[resource] + quotas(prod)[resource] == total
            assert abs(quotas(research)[resource] - total * 0.7) < 1
        for queue, team in ((research, TEAMS[0]), (prod, TEAMS[1])):
            spec = queue["spec"]
            assert spec["cohortName"] == pool
            assert spec["preemption"] == {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"}
            assert spec["fairSharing"] == {"weight": team["share"]}
            assert spec["namespaceSelector"]["matchExpressions"][0]["values"] == team["namespaces"]
            assert spec["admissionChecksStrategy"] == {"admissionChecks": [{"name": "gpu-nodes-provisioned"}]}
    # Worked by hand: 16 H100s and 64 EFA devices of h100-train at 70/30: 11.2/4.8 GPUs and 44.8/19.2
    # devices, the unit left by rounding down going to the larger remainder (0.8).
    assert quotas(queues["h100-train-research"]) == {"nvidia.com/gpu": 11, "vpc.amazonaws.com/efa": 45}
    assert quotas(queues["h100-train-prod"]) == {"nvidia.com/gpu": 5, "vpc.amazonaws.com/efa": 19}


def test_a_teams_namespaces_queue_to_its_queues_under_the_pools_names(teams_plan):
    local = kueue_objects(teams_plan, "LocalQueue")
    pools = {"l40s", "a10g-shared", "l4-mps", "h100", "h100-train"}
    expected = {
        f"{namespace}/{pool}": f"{pool}-{team['name']}"
        for team in TEAMS
        for namespace in team["namespaces"]
        for pool in pools
    }
    assert {key: queue["spec"]["clusterQueue"] for key, queue in local.items()} == expected
    (lq,) = [r for r in teams_plan.by_type(KUEUE + "LocalQueue") if r.name == "ml-batch-prod-h100-queue"]
    (cq,) = [r for r in teams_plan.by_type(KUEUE + "ClusterQueue") if r.name == "ml-batch-h100-prod-queue"]
    assert cq.urn in lq.dependencies
    # Its ClusterQueue cannot change in place (Kueue's CRD: self == oldSelf): a move replaces it, old first.
    assert lq.options["replaceOnChanges"] == ["spec.clusterQueue"] and lq.options["deleteBeforeReplace"]
    config = kueue_config(teams_plan)
    assert config["fairSharing"] == {
        "preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]
    }
    assert config["managedJobsNamespaceSelector"]["matchExpressions"][0]["values"] == [
        "research",
        "research-dev",
        "prod",
    ]


def test_teams_get_two_workload_priorities_and_plans_without_teams_none(teams_plan, aws_eks):
    priorities = {
        r.inputs["metadata"]["name"]: r.inputs for r in teams_plan.by_type(KUEUE + "WorkloadPriorityClass")
    }
    assert {name: p["value"] for name, p in priorities.items()} == {
        "gpu-k8s-high": 1000,
        "gpu-k8s-low": -1000,
    }
    assert not aws_eks.by_type(KUEUE + "WorkloadPriorityClass")
    (kueue,) = [r for r in teams_plan.by_type("kubernetes:helm.sh/v3:Release") if r.inputs["name"] == "kueue"]
    for priority in teams_plan.by_type(KUEUE + "WorkloadPriorityClass"):
        # Kueue's webhook checks them, so they wait for its release; made through the cluster's provider.
        assert kueue.urn in priority.dependencies
        assert priority.provider and priority.provider.startswith(kueue.provider.rsplit("::", 1)[0])
    assert "fairSharing" not in kueue_config(aws_eks)


def test_the_team_objects_pass_the_pinned_crds(teams_plan):
    crds = [
        upstream_yaml(f"kueue/0.19.2/crds/kueue.x-k8s.io_{kind}.yaml")
        for kind in ("clusterqueues", "localqueues", "workloadpriorityclasses")
    ]
    schemas = crd_schemas(crds)
    objects = [
        r.inputs
        for kind in ("ClusterQueue", "LocalQueue", "WorkloadPriorityClass")
        for r in teams_plan.by_type(KUEUE + kind)
    ]
    for obj in some(objects, at_least=20):
        validate_custom_resource(obj, schemas)


def test_rounding_gives_the_left_over_units_to_the_largest_remainders():
    from gpu_k8s.components.batch import team_quotas
    from gpu_k8s.components.batch_spec import TeamSpec

    def pool(gpus: int) -> Any:
        """The parts of a GpuPool team_quotas reads."""
        offer = SimpleNamespace(resources={"nvidia.com/gpu": gpus})
        return SimpleNamespace(spec=SimpleNamespace(max_nodes=1), offer=offer, interconnect_resources={})

    def teams(*shares: tuple[str, int]) -> list[TeamSpec]:
        return [TeamSpec(name=name, namespaces=(name,), share=share) for name, share in shares]

    # 3.3, 3.3 and 3.4 GPUs: 3 each, and the tenth to the largest remainder, c.
    assert team_quotas(pool(10), teams(("a", 33), ("b", 33), ("c", 34))) == {
        "a": {"nvidia.com/gpu": 3},
        "b": {"nvidia.com/gpu": 3},
        "c": {"nvidia.com/gpu": 4},
    }
    # 0.5 each: the first listed wins the tie; the other still borrows the GPU while it is idle.
    assert team_quotas(pool(1), teams(("a", 50), ("b", 50))) == {
        "a": {"nvidia.com/gpu": 1},
        "b": {"nvidia.com/gpu": 0},
    }
    # 0.08, 1.46 and 0.46: b and c tie on 0.46 (which floats would not see: 1.46 - 1 < 0.46), and b,
    # listed first, takes the GPU rounding left.
    assert team_quotas(pool(2), teams(("a", 4), ("b", 73), ("c", 23))) == {
        "a": {"nvidia.com/gpu": 0},
        "b": {"nvidia.com/gpu": 2},
        "c": {"nvidia.com/gpu": 0},
    }


BAD_TEAMS = [
    (
        "namespaces-and-teams",
        {"namespaces": ["research"], "teams": TEAMS},
        "gpu-k8s:cluster.batch",
        ("exactly one of `namespaces`",),
    ),
    ("neither", {"podsReadyTimeout": "30m"}, "gpu-k8s:cluster.batch", ("exactly one of",)),
    (
        "shares-not-100",
        {"teams": [{**TEAMS[0], "share": 60}, TEAMS[1]]},
        "gpu-k8s:cluster.batch.teams",
        ("add up to 100", "adding up to 90"),
    ),
    (
        "namespace-in-two-teams",
        {"teams": [TEAMS[0], {**TEAMS[1], "namespaces": ["prod", "research"]}]},
        "gpu-k8s:cluster.batch.teams[1].namespaces[1]",
        ("already belongs to team research",),
    ),
    (
        "team-twice",
        {"teams": [TEAMS[0], {**TEAMS[1], "name": "research"}]},
        "gpu-k8s:cluster.batch.teams[1].name",
        ("names two teams",),
    ),
    (
        "long-team-name",
        {"teams": [{**TEAMS[0], "name": "research-and-development"}, TEAMS[1]]},
        "gpu-k8s:cluster.batch.teams[0].name",
        ("at most 20 characters",),
    ),
    (
        "reserved-team-namespace",
        {"teams": [{**TEAMS[0], "namespaces": ["kube-system"]}, TEAMS[1]]},
        "gpu-k8s:cluster.batch.teams[0].namespaces[0]",
        ("exists in every cluster",),
    ),
    (
        "zero-share",
        {"teams": [{**TEAMS[0], "share": 0}, TEAMS[1]]},
        "gpu-k8s:cluster.batch.teams[0].share",
        ("at least 1",),
    ),
    (
        # Pools h100 and h100-train: team "train-x" of pool h100 and team "x" of pool h100-train would both
        # be the queue h100-train-x.
        "queue-names-collide",
        {
            "teams": [
                {"name": "x", "namespaces": ["a"], "share": 50},
                {"name": "train-x", "namespaces": ["b"], "share": 50},
            ]
        },
        "gpu-k8s:cluster.batch.teams[1].name",
        ("h100-train-x", "pool h100-train and team x"),
    ),
    (
        "unknown-team-key",
        {"teams": [{**TEAMS[0], "weight": 2}, TEAMS[1]]},
        "gpu-k8s:cluster.batch.teams[0].weight",
        ("unknown key", "allowed keys: name, namespaces, share"),
    ),
    (
        # Pool h100 and team train make h100-train: the other pool's name (its cohort's).
        "queue-named-like-a-pool",
        {"teams": [{"name": "train", "namespaces": ["a"], "share": 50}, {**TEAMS[1], "share": 50}]},
        "gpu-k8s:cluster.batch.teams[0].name",
        ("the name of pool h100-train",),
    ),
]


@pytest.mark.parametrize(
    ("batch", "path", "words"), [c[1:] for c in BAD_TEAMS], ids=[c[0] for c in BAD_TEAMS]
)
def test_bad_teams_are_refused_before_any_resource(aws_eks_config, batch, path, words):
    assert_refused_before_any_resource(aws_eks_config, set_path("batch", copy.deepcopy(batch)), path, words)


@pytest.fixture(scope="module")
def default_pool_plans(aws_eks_config) -> dict[str, Recording]:
    """`defaultPool` on the shared queues (l40s, then h100: a day-2 move) and with teams (h100)."""
    plans = {}
    for key, batch in (
        ("shared", {"namespaces": ["research"], "defaultPool": "l40s"}),
        ("moved", {"namespaces": ["research"], "defaultPool": "h100"}),
        ("teams", {"teams": copy.deepcopy(TEAMS), "defaultPool": "h100"}),
    ):
        config = copy.deepcopy(aws_eks_config)
        config["gpu-k8s:cluster"]["batch"] = batch
        plans[key] = run_program("default-queue", config)
    return plans


def test_jobs_that_name_no_queue_go_to_the_default_pools_queue(default_pool_plans, aws_eks):
    """Kueue gives a job without kueue.x-k8s.io/queue-name the LocalQueue `default` of its namespace
    (Kueue 0.19.2 site: tasks/manage/enforce_job_management/setup_default_local_queue.md)."""
    shared = kueue_objects(default_pool_plans["shared"], "LocalQueue")
    assert shared["research/default"]["spec"] == {"clusterQueue": "l40s"} == shared["research/l40s"]["spec"]
    (cq,) = [
        q
        for q in kueue_objects(default_pool_plans["shared"], "ClusterQueue").values()
        if q["metadata"]["name"] == "l40s"
    ]
    assert cq["urn"] in shared["research/default"]["dependencies"]
    teams = kueue_objects(default_pool_plans["teams"], "LocalQueue")
    defaults = {key: q["spec"]["clusterQueue"] for key, q in teams.items() if key.endswith("/default")}
    assert defaults == {
        "research/default": "h100-research",
        "research-dev/default": "h100-research",
        "prod/default": "h100-prod",
    }
    assert not [key for key in kueue_objects(aws_eks, "LocalQueue") if key.endswith("/default")]
    # Kueue defaults the queue only in the namespaces it manages (jobframework/defaults.go), and does not
    # hold back the jobs that name no queue where there is no default one.
    assert "manageJobsWithoutQueueName" not in kueue_config(default_pool_plans["teams"])
    managed = kueue_config(default_pool_plans["teams"])["managedJobsNamespaceSelector"]["matchExpressions"]
    assert managed == [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "In",
            "values": ["research", "research-dev", "prod"],
        }
    ]
    crd = crd_schemas([upstream_yaml("kueue/0.19.2/crds/kueue.x-k8s.io_localqueues.yaml")])
    for queue in (shared["research/default"], teams["prod/default"]):
        validate_custom_resource({k: queue[k] for k in ("apiVersion", "kind", "metadata", "spec")}, crd)


def test_moving_the_default_pool_replaces_only_the_default_queues(default_pool_plans):
    before = {r.urn: r for r in default_pool_plans["shared"].registrations}
    after = {r.urn: r for r in default_pool_plans["moved"].registrations}
    assert set(before) == set(after)
    changed = [after[urn] for urn in before if before[urn].inputs != after[urn].inputs]
    assert [r.name for r in changed] == ["ml-batch-research-default-queue"]
    (queue,) = changed
    assert queue.inputs["spec"] == {"clusterQueue": "h100"}
    # A LocalQueue's clusterQueue is immutable: the move is a replacement, the old queue deleted first.
    assert queue.options["replaceOnChanges"] == ["spec.clusterQueue"] and queue.options["deleteBeforeReplace"]
