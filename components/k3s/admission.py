"""No workload pod on a k3s server: a ValidatingAdmissionPolicy, built into the API server (GA since
Kubernetes 1.30, so every k3s minor this toolkit runs), refuses outside the system namespaces any pod that
could run on a server.

Why: a server holds the cluster's CA keys and, through its cloud identity, the bootstrap secret; a pod there
can reach that identity (on AWS the EBS CSI controller must, and its chart has no host-network option). The
servers' taint is only a scheduling hint: Pod Security `baseline` lets any pod tolerate it, and a pod that
names its node skips the scheduler. So the policy refuses, in every namespace but the add-ons', a pod that
tolerates the server taint (by its key, or every key with `operator: Exists`) with an effect that keeps it
on a server, and a pod created with `spec.nodeName` set (which skips the scheduler; the kubelet too refuses a
pod that does not tolerate its node's NoExecute taints, pkg/kubelet/lifecycle/predicate.go as a review
read it, so this rule is the explicit second guard). An update that leaves a pod's tolerations unchanged
passes, so pods admitted before the policy (or in a namespace since un-exempted) keep being updated.
Namespaces are matched by their `kubernetes.io/metadata.name` label, which the API server sets and nobody
can change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pulumi

from gpu_k8s.components.batch import JOBSET_NAMESPACE, KUEUE_NAMESPACE
from gpu_k8s.components.cluster import PlatformTraits
from gpu_k8s.components.gpu_operator import OPERATOR_NAMESPACE
from gpu_k8s.components.inference import KEDA_NAMESPACE
from gpu_k8s.components.k3s.settings import K3sClusterSpec
from gpu_k8s.components.k3s.upgrades import upgrade_namespace
from gpu_k8s.components.manifests import NAMESPACE_NAME_LABEL, admission_policy, deny_binding, pod_policy
from gpu_k8s.components.monitoring import MONITORING_NAMESPACE
from gpu_k8s.components.spec import TaintSpec

POLICY_NAME = "gpu-k8s-no-workloads-on-servers"
UNCHANGED_TOLERATIONS = (
    "(request.operation == 'UPDATE' && has(oldObject.spec.tolerations) && has(object.spec.tolerations) "
    "&& object.spec.tolerations == oldObject.spec.tolerations)"
)


def k3s_system_namespaces(spec: K3sClusterSpec, *platform_namespaces: str) -> list[str]:
    """The namespaces whose pods may run on servers: the add-ons' that this cluster installs, and the
    platform's own (its CSI driver's, say). Only these: a namespace exempt but unused is one a user who may
    create namespaces could claim."""
    batch = (KUEUE_NAMESPACE, JOBSET_NAMESPACE) if spec.batch is not None else ()
    # Prometheus and its operator run on the system nodes, which on k3s are the servers.
    monitoring = (MONITORING_NAMESPACE,) if spec.monitoring is not None else ()
    inference = (KEDA_NAMESPACE,) if spec.inference is not None else ()
    return sorted(
        {
            "kube-system",
            OPERATOR_NAMESPACE,
            upgrade_namespace(),
            *batch,
            *monitoring,
            *inference,
            *platform_namespaces,
        }
    )


def tolerates_server_expression(taint: TaintSpec) -> str:
    """CEL: the pod has a toleration that matches `taint` (its key, or any key through an empty key with
    `Exists`) for the taint's effect (no effect in a toleration matches every effect)."""
    effect = f"(!has(t.effect) || t.effect == '' || t.effect == '{taint.effect}')"
    any_key = "((!has(t.key) || t.key == '') && has(t.operator) && t.operator == 'Exists')"
    key = f"((has(t.key) && t.key == '{taint.key}') || {any_key})"
    return f"has(object.spec.tolerations) && object.spec.tolerations.exists(t, {key} && {effect})"


def server_pod_policy(system_namespaces: Sequence[str], taint: TaintSpec) -> list[dict[str, Any]]:
    """The policy and its binding (Deny) as manifests."""
    exempt = sorted({"kube-system", *system_namespaces})
    policy = pod_policy(
        POLICY_NAME,
        # Tolerations may be added to a pod that is not yet scheduled (an update).
        ["CREATE", "UPDATE"],
        [{"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": exempt}],
        [
            {
                # An update that leaves a pod's tolerations as they were (labels, finalizers, owner
                # references) is not the pod newly asking for a server.
                "expression": f"{UNCHANGED_TOLERATIONS} || !({tolerates_server_expression(taint)})",
                "reason": "Forbidden",
                "message": f"pods outside {', '.join(exempt)} may not tolerate the k3s servers' taint "
                f"{taint.key}:{taint.effect} (nor every taint): servers hold the cluster's CA keys and "
                "cloud identity. Tolerate the GPU pools' taints by key instead (gpu-k8s plan: 'How a pod "
                "lands on a pool')",
            },
            {
                "expression": "request.operation != 'CREATE' || !has(object.spec.nodeName) "
                "|| object.spec.nodeName == ''",
                "reason": "Forbidden",
                "message": f"pods outside {', '.join(exempt)} may not name their node (spec.nodeName "
                "skips the scheduler); use a nodeSelector",
            },
        ],
    )
    return [policy, deny_binding(POLICY_NAME)]


class ServerPodPolicy(pulumi.ComponentResource):
    """The policy and its binding, through the cluster's Kubernetes provider, for the platform's taint on
    its servers."""

    def __init__(
        self,
        name: str,
        system_namespaces: Sequence[str],
        traits: PlatformTraits,
        provider: pulumi.ProviderResource,
        depends_on: Sequence[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("gpu-k8s:k3s:ServerPodPolicy", name, None, opts)
        assert traits.system_taint is not None, "k3s servers are tainted"
        policy, _ = server_pod_policy(system_namespaces, traits.system_taint)
        self.policy, self.binding = admission_policy(name, policy, provider, self, depends_on)
        self.register_outputs({})
