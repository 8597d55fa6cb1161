"""Upstream manifests (parsed YAML) as typed Pulumi Kubernetes resources."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

# The label the API server sets on every namespace to its name, which nobody can change: what policies select
# namespaces by (Kubernetes "Well-Known Labels").
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
# The kinds the pinned upstream deployments use (apiVersion, kind) -> resource class.
OBJECT_CLASSES: Mapping[tuple[str, str], Callable[..., pulumi.CustomResource]] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.rbac.v1.ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.rbac.v1.ClusterRoleBinding,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
    ("scheduling.k8s.io/v1", "PriorityClass"): k8s.scheduling.v1.PriorityClass,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("apps/v1", "DaemonSet"): k8s.apps.v1.DaemonSet,
    ("storage.k8s.io/v1", "CSIDriver"): k8s.storage.v1.CSIDriver,
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): k8s.apiextensions.v1.CustomResourceDefinition,
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
    ): k8s.admissionregistration.v1.ValidatingAdmissionPolicy,
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
    ): k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding,
}


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def kubernetes_object(
    name: str, manifest: Mapping[str, Any], opts: pulumi.ResourceOptions
) -> pulumi.CustomResource:
    """The typed resource for a manifest; its top-level fields become arguments, nested ones pass as they
    are (the provider reads them in the API's own spelling)."""
    make = OBJECT_CLASSES[(manifest["apiVersion"], manifest["kind"])]
    fields = {_snake(key): value for key, value in manifest.items() if key not in ("apiVersion", "kind")}
    return make(name, **fields, opts=opts)


class CustomObject(pulumi.CustomResource):
    """An object of a custom kind whose fields are not all under `spec` (a Kueue WorkloadPriorityClass has
    a top-level `value`): pulumi_kubernetes' Python CustomResource takes only `spec`
    (pulumi/pulumi-kubernetes#2363), while its provider, which the Node.js SDK's `otherFields` rely on,
    sends the object as given under the same type token (kubernetes:<apiVersion>:<kind>)."""

    def __init__(self, name: str, manifest: Mapping[str, Any], opts: pulumi.ResourceOptions):
        token = f"kubernetes:{manifest['apiVersion']}:{manifest['kind']}"
        super().__init__(token, name, dict(manifest), opts)


def resource_name_part(object_name: str) -> str:
    """An object's name (RBAC names such as `system:cloud-controller-manager` included) as a resource-name
    part."""
    return re.sub(r"[^a-z0-9-]+", "-", object_name).strip("-")


def pod_policy(
    name: str,
    operations: Sequence[str],
    namespace_expressions: Sequence[Mapping[str, Any]],
    validations: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """A ValidatingAdmissionPolicy on pods, failing closed (an API server that cannot evaluate it refuses),
    in the namespaces the label expressions select."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": list(operations),
                        "resources": ["pods"],
                    }
                ],
                "namespaceSelector": {"matchExpressions": [dict(e) for e in namespace_expressions]},
            },
            "validations": [dict(v) for v in validations],
        },
    }


def deny_binding(policy_name: str) -> dict[str, Any]:
    """A ValidatingAdmissionPolicyBinding that denies what the named policy refuses, wherever the policy's own
    match constraints reach (no params, no narrower selector)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy_name},
        "spec": {"policyName": policy_name, "validationActions": ["Deny"]},
    }


def admission_policy(
    name: str,
    policy: Mapping[str, Any],
    provider: pulumi.ProviderResource,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource],
) -> tuple[pulumi.CustomResource, pulumi.CustomResource]:
    """A ValidatingAdmissionPolicy and then its denying binding, through `provider`."""
    made = kubernetes_object(
        f"{name}-policy",
        policy,
        pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=list(depends_on)),
    )
    bound = kubernetes_object(
        f"{name}-binding",
        deny_binding(policy["metadata"]["name"]),
        pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=[made]),
    )
    return made, bound
