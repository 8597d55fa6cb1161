"""GPU pods go through the queues (review-training.md T10): the ValidatingAdmissionPolicy `batch` adds, its
CEL evaluated by cel-python against pods it must refuse and let through, and its namespace selector
against the namespaces it must leave alone."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import kubernetes_validate
import pytest

from gpu_k8s.components.queued_gpus import OPT_OUT_LABEL, POLICY_NAME
from gpu_k8s.tools.engine import run_program
from tests.conftest import ADMISSION_BINDING, ADMISSION_POLICY, planned_admission_policy


def refused(policy: dict[str, Any], pod_spec: dict[str, Any]) -> bool:
    env = celpy.Environment()
    activation = {"object": celpy.json_to_cel({"apiVersion": "v1", "kind": "Pod", "spec": pod_spec})}
    (validation,) = policy["spec"]["validations"]
    result = env.program(env.compile(validation["expression"])).evaluate(activation)
    assert isinstance(result, celpy.celtypes.BoolType), result
    return not result


def selected(policy: dict[str, Any], name: str, labels: dict[str, str] | None = None) -> bool:
    """Whether the policy applies in a namespace (label selector semantics: NotIn matches an absent key)."""
    labels = {"kubernetes.io/metadata.name": name, **(labels or {})}
    expressions = policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
    assert {e["operator"] for e in expressions} == {"NotIn"}
    return all(labels.get(e["key"]) not in e["values"] for e in expressions)


def container(**resources: dict[str, str]) -> dict[str, Any]:
    return {"name": "app", "image": "registry.example/app:1", "resources": resources}


REFUSED = [
    ("a whole GPU", {"containers": [container(limits={"nvidia.com/gpu": "1"})]}),
    ("a time-sliced slot as a request", {"containers": [container(requests={"nvidia.com/gpu.shared": "1"})]}),
    ("a MIG slice", {"containers": [container(limits={"nvidia.com/mig-1g.10gb": "1", "cpu": "2"})]}),
    (
        "a GPU in an init container",
        {"initContainers": [container(limits={"nvidia.com/gpu": "1"})], "containers": [container()]},
    ),
    (
        "a GPU in the second container",
        {"containers": [container(limits={"cpu": "1"}), container(limits={"nvidia.com/gpu": "2"})]},
    ),
]
ALLOWED = [
    ("no resources", {"containers": [{"name": "app", "image": "registry.example/app:1"}]}),
    ("CPU and memory", {"containers": [container(requests={"cpu": "4", "memory": "8Gi"})]}),
    ("EFA interfaces only", {"containers": [container(limits={"vpc.amazonaws.com/efa": "1"})]}),
]


@pytest.fixture(scope="module")
def policy(aws_eks) -> dict[str, Any]:
    return planned_admission_policy(aws_eks, POLICY_NAME)


@pytest.mark.parametrize(("what", "pod"), REFUSED, ids=[w for w, _ in REFUSED])
def test_a_pod_asking_for_a_gpu_outside_the_queues_is_refused(policy, what, pod):
    assert refused(policy, pod), what
    (validation,) = policy["spec"]["validations"]
    assert "the queued namespaces: research" in validation["message"]
    assert f"{OPT_OUT_LABEL}=allowed" in validation["message"]


@pytest.mark.parametrize(("what", "pod"), ALLOWED, ids=[w for w, _ in ALLOWED])
def test_a_pod_without_gpus_is_let_through(policy, what, pod):
    assert not refused(policy, pod), what


def test_the_queued_and_the_add_ons_namespaces_and_opted_out_ones_are_left_alone(policy):
    for namespace in ("research", "kube-system", "gpu-operator", "kueue-system", "jobset-system"):
        assert not selected(policy, namespace), namespace
    assert not selected(policy, "serving", {OPT_OUT_LABEL: "allowed"})
    assert selected(policy, "serving")
    assert selected(policy, "default")
    assert selected(policy, "serving", {OPT_OUT_LABEL: "yes"})
    # Only creations: running pods and their updates are left alone, so adding the policy stops nothing.
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["CREATE"] and rule["resources"] == ["pods"]


def test_the_policy_is_a_valid_object_that_fails_closed(aws_eks):
    for kind in (ADMISSION_POLICY, ADMISSION_BINDING):
        (found,) = [r for r in aws_eks.by_type(kind) if r.inputs["metadata"]["name"] == POLICY_NAME]
        manifest = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind.rsplit(":", 1)[-1],
            **found.inputs,
        }
        kubernetes_validate.validate(manifest, "1.33.0", strict=True)
    assert planned_admission_policy(aws_eks, POLICY_NAME)["spec"]["failurePolicy"] == "Fail"


def test_the_user_can_turn_it_off(aws_eks_config):
    config = copy.deepcopy(aws_eks_config)
    config["gpu-k8s:cluster"]["batch"]["queuedGpusOnly"] = False
    recording = run_program("open", config)
    for kind in (ADMISSION_POLICY, ADMISSION_BINDING):
        assert not [r for r in recording.by_type(kind) if r.inputs["metadata"]["name"] == POLICY_NAME]
