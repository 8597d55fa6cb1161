"""Service accounts and role bindings of a cluster's nodes, each granting one thing."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp

# The role GKE documents as the minimum a node service account needs (logging, monitoring): "Configure GKE
# node service accounts", docs.cloud.google.com. No registry role: the operator's images come from nvcr.io
# over Cloud NAT; users pulling from their own Artifact Registry grant roles/artifactregistry.reader.
NODE_ROLES = ("roles/container.defaultNodeServiceAccount",)
KMS_ENCRYPTER = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
# Account ids: 6-30 characters, lowercase letters, digits and hyphens, starting with a letter.
MAX_ACCOUNT_ID = 30


def account_id(cluster_name: str, purpose: str) -> str:
    """A service account id that says which cluster and what for, within GCP's 30 characters."""
    return f"{cluster_name[: MAX_ACCOUNT_ID - len(purpose) - 1]}-{purpose}"


def member(email: pulumi.Input[str]) -> pulumi.Output[str]:
    return pulumi.Output.concat("serviceAccount:", email)


class NodeServiceAccount(pulumi.ComponentResource):
    """A dedicated service account for a cluster's nodes with only the project roles they need (GKE nodes:
    the node role), instead of the Compute Engine default account (project Editor) that CIS GKE 5.2.1
    forbids. `after`: what the account waits for (the IAM API)."""

    email: pulumi.Output[str]
    member: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        cluster_name: str,
        project: str,
        after: Sequence[pulumi.Resource] = (),
        purpose: str = "nodes",
        display_name: str | None = None,
        roles: Sequence[str] = NODE_ROLES,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("gpu-k8s:gcp:NodeServiceAccount", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.account = gcp.serviceaccount.Account(
            f"{name}-account",
            account_id=account_id(cluster_name, purpose),
            display_name=display_name or f"GKE nodes of {cluster_name}",
            project=project,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(after)),
        )
        self.email = self.account.email
        self.member = member(self.email)
        self.bindings = [
            gcp.projects.IAMMember(
                f"{name}-{role.rsplit('/', 1)[-1].rsplit('.', 1)[-1]}",
                project=project,
                role=role,
                member=self.member,
                opts=child,
            )
            for role in roles
        ]
        self.register_outputs({"email": self.email})


def gke_service_agent(project_number: pulumi.Input[str]) -> pulumi.Output[str]:
    """The Google-managed identity GKE's control plane acts as (it encrypts Secrets with the KMS key)."""
    return pulumi.Output.format(
        "serviceAccount:service-{0}@container-engine-robot.iam.gserviceaccount.com", project_number
    )


def custom_role(
    name: str,
    project: str,
    title: str,
    permissions: Sequence[str],
    parent: pulumi.Resource,
    after: Sequence[pulumi.Resource],
) -> gcp.projects.IAMCustomRole:
    """A project role with exactly `permissions`; its id is the resource name in IAM's alphabet. `after`:
    the IAM API's enablement, which creating a role needs (a parent's depends_on would not reach it)."""
    return gcp.projects.IAMCustomRole(
        name,
        role_id=name.replace("-", "_"),
        title=title,
        permissions=list(permissions),
        project=project,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(after)),
    )


def project_custom_role_grant(
    role_name: str,
    grant_name: str,
    project: str,
    title: str,
    permissions: Sequence[str],
    member: pulumi.Input[str],
    parent: pulumi.Resource,
    after: Sequence[pulumi.Resource],
) -> gcp.projects.IAMMember:
    """A custom role with exactly `permissions`, granted to `member` on the project."""
    role = custom_role(role_name, project, title, permissions, parent, after)
    return gcp.projects.IAMMember(
        grant_name, project=project, role=role.name, member=member, opts=pulumi.ResourceOptions(parent=parent)
    )
