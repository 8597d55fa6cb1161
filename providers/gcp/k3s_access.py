"""What the servers' service account may do for the add-ons that run on the servers as it: the cloud
controller manager, the PD CSI controller and the cluster-autoscaler."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp

from gpu_k8s.providers.gcp.autoscaling import AUTOSCALER_READ_PERMISSIONS, AUTOSCALER_RESIZE_PERMISSIONS
from gpu_k8s.providers.gcp.cloud_controller import PERMISSIONS as CCM_PERMISSIONS
from gpu_k8s.providers.gcp.cloud_controller import SERVICE_CONTROLLER_PERMISSIONS
from gpu_k8s.providers.gcp.iam import NodeServiceAccount, project_custom_role_grant
from gpu_k8s.providers.gcp.k3s_network import Identities
from gpu_k8s.providers.gcp.pd_csi import custom_role_permissions

# The PD CSI controller creates, resizes, snapshots and deletes disks: upstream names this role as required
# next to its custom attach/detach role and a scoped serviceAccountUser (docs/kubernetes/user-guides/
# driver-install.md at v1.26.4, commit 6e7ea1c). It documents no narrower set, so none is guessed here.
PD_CSI_ROLES = ("roles/compute.storageAdmin",)
SERVICE_ACCOUNT_USER = "roles/iam.serviceAccountUser"


def cloud_controller_access(
    parent: pulumi.Resource,
    name: str,
    project: str,
    servers: NodeServiceAccount,
    iam_api: Sequence[pulumi.Resource],
) -> list[gcp.projects.IAMMember]:
    """The CCM runs on the servers, on their network, as their service account: its node controllers read
    instances, zones and the network; its service controller makes load balancers and their firewall rules.
    Two roles, so that the plan shows the reads apart from the project-wide writes."""
    return [
        project_custom_role_grant(
            f"{name}-{part}-role",
            f"{name}-{part}-{verb}",
            project,
            f"{title} of {name}",
            permissions,
            servers.member,
            parent,
            iam_api,
        )
        for part, title, permissions, verb in (
            ("cloud-controller", "cloud controller manager", CCM_PERMISSIONS, "reads"),
            ("load-balancer", "load balancers", SERVICE_CONTROLLER_PERMISSIONS, "writes"),
        )
    ]


def pd_csi_access(
    parent: pulumi.Resource,
    name: str,
    project: str,
    identities: Identities,
    iam_api: Sequence[pulumi.Resource],
) -> list[pulumi.Resource]:
    """The driver's controller runs on the servers as their service account: upstream's custom role for
    attaching disks, and acting as the node accounts whose VMs it attaches disks to (granted on those two
    accounts, not project-wide)."""
    child = pulumi.ResourceOptions(parent=parent)
    grants: list[pulumi.Resource] = [
        *identities.servers.bindings,
        project_custom_role_grant(
            f"{name}-pd-csi-role",
            f"{name}-pd-csi-attaches",
            project,
            f"PD CSI driver of {name}",
            custom_role_permissions(),
            identities.servers.member,
            parent,
            iam_api,
        ),
    ]
    for target, identity in (("servers", identities.servers), ("agents", identities.agents)):
        grants.append(
            gcp.serviceaccount.IAMMember(
                f"{name}-pd-csi-acts-as-{target}",
                service_account_id=identity.account.name,
                role=SERVICE_ACCOUNT_USER,
                member=identities.servers.member,
                opts=child,
            )
        )
    return grants


def autoscaler_access(
    parent: pulumi.Resource,
    name: str,
    project: str,
    servers: NodeServiceAccount,
    iam_api: Sequence[pulumi.Resource],
) -> list[pulumi.Resource]:
    """The autoscaler runs on the servers as their service account: read what it plans with, and resize
    instance groups, project-wide. It cannot be narrowed to this cluster's groups: instance group
    managers take no IAM policy of their own (Compute API v1: no setIamPolicy among their methods), and
    they are not among the resource types IAM Conditions evaluate `resource.name` for (Google Cloud,
    "Resource attributes for IAM Conditions": the Compute types go from Instance to InstanceTemplate),
    so a condition on their names would not grant the resize. A project per cluster bounds it."""
    return [
        project_custom_role_grant(
            f"{name}-autoscaler-{purpose}",
            f"{name}-autoscaler-{verb}",
            project,
            f"cluster-autoscaler of {name}: {what}",
            permissions,
            servers.member,
            parent,
            iam_api,
        )
        for purpose, what, permissions, verb in (
            ("reader", "read", AUTOSCALER_READ_PERMISSIONS, "reads"),
            ("resizer", "resize", AUTOSCALER_RESIZE_PERMISSIONS, "resizes"),
        )
    ]
