"""No workload pod on a k3s server: the ValidatingAdmissionPolicy the k3s platforms create, its CEL
expressions evaluated by a CEL implementation (cel-python) against pods it must refuse and pods it must let
through, and every pod the cluster itself runs on servers shown to be in a namespace the policy exempts (or
the first `up` would refuse its own add-ons).
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import kubernetes_validate
import pytest

from gpu_k8s.components.k3s.admission import POLICY_NAME, server_pod_policy
from gpu_k8s.components.k3s.cloudinit import SERVER_TAINT
from gpu_k8s.tools.engine import Recording, run_program
from tests.conftest import planned_admission_policy, some
from tests.test_charts import tolerates

WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job")


def refusals(
    policy: dict[str, Any],
    pod_spec: dict[str, Any],
    operation: str = "CREATE",
    old_spec: dict[str, Any] | None = None,
) -> list[str]:
    """The messages of the validations that refuse this pod (as the API server evaluates them: each
    expression must be true to admit; `oldObject` is null on CREATE)."""
    env = celpy.Environment()
    old = None if old_spec is None else {"apiVersion": "v1", "kind": "Pod", "spec": old_spec}
    activation = {
        "object": celpy.json_to_cel({"apiVersion": "v1", "kind": "Pod", "spec": pod_spec}),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel({"operation": operation}),
    }
    refused = []
    for validation in policy["spec"]["validations"]:
        result = env.program(env.compile(validation["expression"])).evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), (validation["expression"], result)
        if not result:
            refused.append(validation["message"])
    return refused


CONTAINER = {"name": "app", "image": "registry.example/app:1"}
ALLOWED = [
    ("no tolerations", {"containers": [CONTAINER]}),
    (
        "a GPU pool's taints",
        {
            "containers": [CONTAINER],
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "gpu-k8s.io/sharing", "operator": "Equal", "value": "mps", "effect": "NoSchedule"},
            ],
        },
    ),
    # Tolerating every NoSchedule taint does not tolerate the servers' NoExecute one.
    (
        "every NoSchedule taint",
        {"containers": [CONTAINER], "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}]},
    ),
    (
        "the default not-ready toleration",
        {
            "containers": [CONTAINER],
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
        },
    ),
]
REFUSED = [
    ("the server taint by key", [{"key": "CriticalAddonsOnly", "operator": "Exists"}]),
    (
        "the server taint with its value",
        [{"key": "CriticalAddonsOnly", "operator": "Equal", "value": "true"}],
    ),
    (
        "the server taint's effect",
        [{"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoExecute"}],
    ),
    ("every taint", [{"operator": "Exists"}]),
    ("every NoExecute taint", [{"key": "", "operator": "Exists", "effect": "NoExecute"}]),
    # The API server drops empty optional fields; both spellings are refused.
    ("every taint, empty effect", [{"operator": "Exists", "effect": ""}]),
]


@pytest.mark.parametrize("plan", ["aws_k3s", "gcp_k3s"])
def test_pods_that_tolerate_the_servers_or_name_a_node_are_refused(request, plan):
    policy = planned_admission_policy(request.getfixturevalue(plan), POLICY_NAME)
    for what, spec in ALLOWED:
        assert refusals(policy, spec) == [], what
    for what, tolerations in REFUSED:
        (message,) = refusals(policy, {"containers": [CONTAINER], "tolerations": tolerations})
        assert "may not tolerate the k3s servers' taint CriticalAddonsOnly:NoExecute" in message, what
    named = {"containers": [CONTAINER], "nodeName": "ip-10-0-1-10"}
    (message,) = refusals(policy, named)
    assert "may not name their node" in message
    # A scheduled pod has a node name; updating it (labels, say) stays possible.
    assert refusals(policy, named, operation="UPDATE") == []
    # Adding the server toleration to a pending pod is an update too.
    tolerating = {"containers": [CONTAINER], "tolerations": REFUSED[0][1]}
    assert refusals(policy, tolerating, "UPDATE", old_spec={"containers": [CONTAINER]})
    # A pod admitted before the policy keeps taking updates that leave its tolerations alone (labels,
    # finalizers the Job controller removes, owner references).
    assert refusals(policy, tolerating, "UPDATE", old_spec=tolerating) == []


def test_the_policy_follows_the_server_taint():
    """The expression is built from the taint, so a change of the servers' taint cannot leave it behind."""
    taint = copy.deepcopy(SERVER_TAINT).model_copy(
        update={"key": "example.com/server", "effect": "NoSchedule"}
    )
    policy, _ = server_pod_policy(["kube-system"], taint)
    tolerating = {
        "containers": [CONTAINER],
        "tolerations": [{"key": "example.com/server", "operator": "Exists"}],
    }
    assert refusals(policy, tolerating)
    assert refusals(
        policy, {"containers": [CONTAINER], "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}]}
    )


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        ("aws_k3s", ["gpu-operator", "kube-system", "monitoring", "system-upgrade"]),
        (
            "gcp_k3s",
            ["gce-pd-csi-driver", "gpu-operator", "keda", "kube-system", "monitoring", "system-upgrade"],
        ),
    ],
)
def test_only_the_namespaces_of_the_add_ons_the_cluster_runs_are_exempt(request, plan, expected):
    policy = planned_admission_policy(request.getfixturevalue(plan), POLICY_NAME)
    selector = policy["spec"]["matchConstraints"]["namespaceSelector"]
    assert selector == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": expected}]
    }
    assert policy["spec"]["failurePolicy"] == "Fail"


def test_batch_adds_its_controllers_namespaces(aws_k3s_config):
    config = copy.deepcopy(aws_k3s_config)
    config["gpu-k8s:cluster"]["batch"] = {"namespaces": ["team-a"]}
    policy = planned_admission_policy(run_program("batch", config), POLICY_NAME)
    values = policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]["values"]
    assert "kueue-system" in values and "jobset-system" in values and "team-a" not in values


def pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj.get("kind") in WORKLOADS:
        return [obj["spec"]["template"]["spec"]]
    if obj.get("kind") == "CronJob":
        return [obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    return []


@pytest.mark.parametrize("plan", ["aws_k3s", "gcp_k3s"])
def test_every_pod_the_cluster_runs_on_servers_is_in_an_exempt_namespace(request, rendered, plan):
    """Rendered releases and applied manifests: a pod template that tolerates the server taint lives in an
    exempt namespace, or the policy would refuse the cluster's own add-ons on the first `up`."""
    recording = request.getfixturevalue(plan)
    policy = planned_admission_policy(recording, POLICY_NAME)
    exempt = set(policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]["values"])
    templates = []
    for (name, _), release in rendered.items():
        if name == plan:
            for obj in release.objects:
                namespace = (obj.get("metadata") or {}).get("namespace") or release.ref.namespace
                templates += [(release.ref.chart, namespace, spec) for spec in pod_specs(obj)]
    for resource in recording.registrations:
        if resource.type.startswith("kubernetes:apps/v1:") or resource.type.startswith(
            "kubernetes:batch/v1:"
        ):
            kind = resource.type.rsplit(":", 1)[-1]
            spec = {"kind": kind, **resource.inputs}
            namespace = resource.inputs["metadata"].get("namespace", "default")
            templates += [(resource.name, namespace, s) for s in pod_specs(spec)]
        if resource.type == "kubernetes:upgrade.cattle.io/v1:Plan":
            templates.append(
                (resource.name, resource.inputs["metadata"]["namespace"], resource.inputs["spec"])
            )
    on_servers = [(what, namespace) for what, namespace, spec in some(templates, 5) if refusals(policy, spec)]
    assert some(on_servers, 3)
    assert [(what, ns) for what, ns in on_servers if ns not in exempt] == []


def test_on_gcp_k3s_the_add_ons_that_use_the_servers_identity_run_on_the_host_network(gcp_k3s, rendered):
    """gcp-k3s servers refuse instance metadata to pods (tests/test_pod_metadata.py): the cloud controller,
    the PD CSI controller and the cluster-autoscaler reach the servers' service account from the host."""
    workloads = {
        r.inputs["metadata"]["name"]: r.inputs["spec"]["template"]["spec"]
        for r in gcp_k3s.registrations
        if r.type in ("kubernetes:apps/v1:DaemonSet", "kubernetes:apps/v1:Deployment")
    }
    assert workloads["cloud-controller-manager"].get("hostNetwork") is True
    assert workloads["csi-gce-pd-controller"].get("hostNetwork") is True
    (autoscaler,) = [
        o for o in rendered["gcp_k3s", "cluster-autoscaler"].objects if o["kind"] == "Deployment"
    ]
    assert autoscaler["spec"]["template"]["spec"].get("hostNetwork") is True
    # Host ports: one server cannot hold the old and the new pod of a rolling update.
    assert autoscaler["spec"]["strategy"] == {"type": "Recreate"}
    controller = next(
        r.inputs for r in gcp_k3s.registrations if r.name.endswith("deployment-csi-gce-pd-controller")
    )
    assert controller["spec"]["strategy"] == {"type": "Recreate"}


def patched_pod_spec(recording: Recording, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A rendered Deployment's pod spec with the plan's DeploymentPatches for it applied (one level deep:
    the patches here set scalar fields of the pod spec)."""
    spec = dict(obj["spec"]["template"]["spec"])
    for patch in recording.by_type("kubernetes:apps/v1:DeploymentPatch"):
        meta = patch.inputs["metadata"]
        if (meta["name"], meta.get("namespace")) == (obj["metadata"]["name"], namespace):
            spec.update(patch.inputs["spec"]["template"]["spec"])
    return spec


def test_on_aws_k3s_the_add_ons_that_use_the_servers_role_run_on_the_host_network(aws_k3s, rendered):
    """aws-k3s servers refuse instance metadata to pods too (hop limit 1 and the pod-metadata rule): the
    cloud controller, both CSI controllers and the cluster-autoscaler reach the servers' role from the
    host. The EBS controller gets there through a patch of the chart's Deployment."""
    specs = {}
    for chart, kind, name in (
        ("aws-cloud-controller-manager", "DaemonSet", "aws-cloud-controller-manager"),
        ("aws-ebs-csi-driver", "Deployment", "ebs-csi-controller"),
        ("aws-efs-csi-driver", "Deployment", "efs-csi-controller"),
        ("cluster-autoscaler", "Deployment", None),
    ):
        release = rendered["aws_k3s", chart]
        (obj,) = [o for o in release.of_kind(kind) if name in (None, o["metadata"]["name"])]
        specs[chart] = patched_pod_spec(aws_k3s, obj, release.ref.namespace)
    assert {chart: spec.get("hostNetwork") for chart, spec in specs.items()} == dict.fromkeys(specs, True)
    # The patch names the chart's Deployment in the release's namespace, or it would fail at `up`; what
    # the API server then holds is a valid Deployment.
    (patch,) = aws_k3s.by_type("kubernetes:apps/v1:DeploymentPatch")
    assert patch.dependencies == [aws_k3s.by_name("ml-ebs-csi").urn]
    release = rendered["aws_k3s", "aws-ebs-csi-driver"]
    (controller,) = [
        o for o in release.of_kind("Deployment") if o["metadata"]["name"] == "ebs-csi-controller"
    ]
    patched = copy.deepcopy(controller)
    patched["spec"]["template"]["spec"] = patched_pod_spec(aws_k3s, controller, release.ref.namespace)
    kubernetes_validate.validate(patched, "1.36.0", strict=True)


def host_ports(spec: dict[str, Any]) -> set[int]:
    """The ports a host-network pod takes on its node (the API defaults hostPort to containerPort)."""
    return {
        port["containerPort"]
        for container in spec["containers"]
        for port in container.get("ports") or []
        if port.get("protocol", "TCP") == "TCP"
    }


# What k3s itself listens on, on a server's host network (k3s docs, "Networking: inbound rules" and the
# components' default ports): API 6443 (and its internal 6444), kubelet 10250 and healthz 10248, kube-proxy
# metrics 10249 and health 10256, controller-manager 10257, scheduler 10259, etcd 2379-2381.
K3S_SERVER_PORTS = {6443, 6444, 10248, 10249, 10250, 10256, 10257, 10259, 2379, 2380, 2381}


@pytest.mark.parametrize("plan", ["aws_k3s", "gcp_k3s"])
def test_host_network_add_ons_on_the_servers_share_no_port_and_fit_one_per_server(plan, request, rendered):
    """Host-network pods on a server take host ports: two add-ons on one port, or on one of k3s's, would
    crash-loop; more replicas than servers would stay pending; a surge would have nowhere to start."""
    recording: Recording = request.getfixturevalue(plan)
    servers = len(
        recording.by_type("aws:ec2/instance:Instance") or recording.by_type("gcp:compute/instance:Instance")
    )
    workloads = []
    for (name, chart), release in rendered.items():
        if name != plan:
            continue
        for obj in release.objects:
            if obj["kind"] in ("Deployment", "DaemonSet"):
                spec = patched_pod_spec(recording, obj, release.ref.namespace)
                workloads.append((f"{chart}/{obj['metadata']['name']}", obj, spec))
    for resource in recording.registrations:
        if resource.type in ("kubernetes:apps/v1:Deployment", "kubernetes:apps/v1:DaemonSet"):
            obj = {"kind": resource.type.rsplit(":", 1)[-1], **resource.inputs}
            workloads.append((resource.name, obj, obj["spec"]["template"]["spec"]))
    on_servers = [
        (what, obj, spec)
        for what, obj, spec in workloads
        if spec.get("hostNetwork") and tolerates(spec, "CriticalAddonsOnly", "NoExecute")
    ]
    assert some(on_servers, 3)
    taken: dict[int, str] = {}
    for what, obj, spec in on_servers:
        for port in host_ports(spec):
            assert port not in K3S_SERVER_PORTS, (what, port)
            assert taken.setdefault(port, what) == what, (what, taken[port], port)
        if obj["kind"] == "Deployment":
            assert obj["spec"].get("replicas", 1) <= servers, what
            strategy = obj["spec"].get("strategy") or {}
            surge = (strategy.get("rollingUpdate") or {}).get("maxSurge", "25%")
            assert strategy.get("type") == "Recreate" or surge == 0, what
