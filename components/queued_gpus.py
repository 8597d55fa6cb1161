"""GPU pods go through the queues: with `batch`, a ValidatingAdmissionPolicy refuses a pod that asks for a
GPU (any `nvidia.com/` resource: whole GPUs, shared slots, MIG slices) in a namespace Kueue does not queue,
so the pools' quotas hold (review-training.md T10: otherwise such pods bypass them and the autoscaler
starts GPU nodes for them).

Exempt: the namespaces `batch` queues, the toolkit's own add-ons' (the GPU Operator's validator asks for a
GPU), kube-system, and any namespace a user labels `gpu-k8s.io/unqueued-gpus: allowed` (a model server,
say). Only pod creation is checked: running pods and their updates are left alone, so the `up` that adds
the policy stops nothing, but every new pod of an unlabelled namespace is refused (rollouts delete before
they create: stacks/README.md says what that costs). Not seen: a job without a queue label inside a queued
namespace (Kueue runs it unqueued), and GPUs reached without a resource request (a DRA claim, a privileged
pod).
Namespaces are matched by `kubernetes.io/metadata.name`, which only the API server sets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pulumi

from gpu_k8s.components.manifests import NAMESPACE_NAME_LABEL, admission_policy, deny_binding, pod_policy

POLICY_NAME = "gpu-k8s-gpu-pods-through-queues"
OPT_OUT_LABEL = "gpu-k8s.io/unqueued-gpus"
OPT_OUT_VALUE = "allowed"
GPU_RESOURCE_PREFIX = "nvidia.com/"


def asks_for_gpu_expression() -> str:
    """CEL: some container or init container requests or limits an `nvidia.com/` resource."""

    def in_list(field: str) -> str:
        gpu = f"r.startsWith('{GPU_RESOURCE_PREFIX}')"
        wants = " || ".join(
            f"(has(c.resources.{kind}) && c.resources.{kind}.exists(r, {gpu}))"
            for kind in ("limits", "requests")
        )
        return f"(has(object.spec.{field}) && object.spec.{field}.exists(c, has(c.resources) && ({wants})))"

    return f"{in_list('containers')} || {in_list('initContainers')}"


def queued_gpu_policy(queued: Sequence[str], exempt: Sequence[str]) -> list[dict[str, Any]]:
    """The policy and its binding (Deny) as manifests: `queued` are the namespaces Kueue queues, `exempt`
    the add-ons' own."""
    skipped = sorted({"kube-system", *queued, *exempt})
    policy = pod_policy(
        POLICY_NAME,
        ["CREATE"],
        [
            {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": skipped},
            {"key": OPT_OUT_LABEL, "operator": "NotIn", "values": [OPT_OUT_VALUE]},
        ],
        [
            {
                "expression": f"!({asks_for_gpu_expression()})",
                "reason": "Forbidden",
                "message": "GPU pods run where Kueue queues them "
                f"(the queued namespaces: {', '.join(queued)}), so the pools' quotas hold. Fix: submit the "
                f"job to a pool's queue there, label this namespace {OPT_OUT_LABEL}={OPT_OUT_VALUE} "
                "(a model server, say), or set batch.queuedGpusOnly: false",
            }
        ],
    )
    return [policy, deny_binding(POLICY_NAME)]


def queued_gpu_pods(
    name: str,
    queued: Sequence[str],
    exempt: Sequence[str],
    provider: pulumi.ProviderResource,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource],
) -> tuple[pulumi.CustomResource, pulumi.CustomResource]:
    """The policy, then its binding, through the cluster's Kubernetes provider."""
    policy, _ = queued_gpu_policy(queued, exempt)
    return admission_policy(f"{name}-gpu-pods", policy, provider, parent, depends_on)
