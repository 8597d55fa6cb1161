"""EKS add-ons (CNI, kube-proxy, CoreDNS, Pod Identity agent, EBS CSI, node monitoring agent) and the default
StorageClass."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from gpu_k8s.components import storage
from gpu_k8s.providers.aws.iam import EBS_CSI_POLICIES, pod_identity_trust_policy, role_with_policies

# Add-ons the nodes need to become Ready; node groups wait for them.
PRE_NODE_ADDONS = ("vpc-cni", "kube-proxy", "eks-pod-identity-agent")
EBS_CSI_ADDON = "aws-ebs-csi-driver"
NODE_MONITORING_ADDON = "eks-node-monitoring-agent"
EBS_CSI_SERVICE_ACCOUNT = "ebs-csi-controller-sa"
# Where EKS add-ons run, and so where their Pod Identity associations name their service accounts.
ADDON_NAMESPACE = "kube-system"
DEFAULT_STORAGE_CLASS = "gp3"


def default_storage_class_manifest() -> dict:
    """The default StorageClass: encrypted gp3 EBS volumes."""
    return storage.default_storage_class_manifest(
        DEFAULT_STORAGE_CLASS, "ebs.csi.aws.com", {"type": "gp3", "encrypted": "true"}
    )


def default_storage_class(
    name: str,
    ebs_csi: pulumi.Resource,
    k8s_provider: k8s.Provider,
    parent: pulumi.Resource,
    system_ready: Sequence[pulumi.Resource],
) -> k8s.storage.v1.StorageClass:
    """The cluster's default StorageClass, once the EBS CSI driver (EKS add-on or k3s chart) and the system
    nodes it runs on are there."""
    return storage.storage_class(
        f"{name}-storage-class",
        default_storage_class_manifest(),
        k8s_provider,
        parent,
        [ebs_csi, *system_ready],
    )


def addon(
    name: str,
    addon_name: str,
    cluster_name: pulumi.Input[str],
    kubernetes_version: str,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
    **kwargs,
) -> aws.eks.Addon:
    """An EKS-managed add-on at the newest version EKS offers for the cluster's Kubernetes version, so a
    `kubernetesVersion` bump moves the add-ons with it (terraform-aws-eks resolves them the same way)."""
    version = aws.eks.get_addon_version_output(
        addon_name=addon_name,
        kubernetes_version=kubernetes_version,
        most_recent=True,
        opts=pulumi.InvokeOutputOptions(parent=parent),
    ).version
    return aws.eks.Addon(
        f"{name}-{addon_name}",
        cluster_name=cluster_name,
        addon_name=addon_name,
        addon_version=version,
        resolve_conflicts_on_create="OVERWRITE",
        resolve_conflicts_on_update="OVERWRITE",
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on)),
        **kwargs,
    )


def pod_identity_addon(
    name: str,
    addon_name: str,
    role_name: str,
    policies: Sequence[str],
    service_accounts: Sequence[str],
    cluster_name: pulumi.Input[str],
    kubernetes_version: str,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource],
    cluster_label: str,
) -> aws.eks.Addon:
    """An add-on whose service accounts (in kube-system, where EKS add-ons run) get AWS credentials through
    Pod Identity (a role of their own, trusted for them in the cluster named `cluster_label`), not the node
    role."""
    trust = pod_identity_trust_policy(cluster_label, ADDON_NAMESPACE, service_accounts)
    role = role_with_policies(role_name, trust, policies, parent=parent)
    return addon(
        name,
        addon_name,
        cluster_name,
        kubernetes_version,
        parent,
        [*depends_on, *role.grants],
        pod_identity_associations=[
            aws.eks.AddonPodIdentityAssociationArgs(role_arn=role.arn, service_account=account)
            for account in service_accounts
        ],
    )


def ebs_csi_driver(
    name: str,
    cluster_name: pulumi.Input[str],
    kubernetes_version: str,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource],
    cluster_label: str,
) -> aws.eks.Addon:
    """The EBS CSI add-on; its controller attaches volumes."""
    return pod_identity_addon(
        name,
        EBS_CSI_ADDON,
        f"{name}-ebs-csi",
        EBS_CSI_POLICIES,
        (EBS_CSI_SERVICE_ACCOUNT,),
        cluster_name,
        kubernetes_version,
        parent,
        depends_on,
        cluster_label,
    )
