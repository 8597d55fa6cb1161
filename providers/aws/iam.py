"""IAM policy documents (pure, linted by parliament in the tests) and a role helper."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_aws as aws

POLICY_VERSION = "2012-10-17"
MANAGED = "arn:aws:iam::aws:policy/"

EKS_CLUSTER_POLICIES = (f"{MANAGED}AmazonEKSClusterPolicy",)
# AmazonSSMManagedInstanceCore gives shell access through Session Manager, so nodes need no SSH key or port.
EKS_NODE_POLICIES = (
    f"{MANAGED}AmazonEKSWorkerNodePolicy",
    f"{MANAGED}AmazonEKS_CNI_Policy",
    f"{MANAGED}AmazonEC2ContainerRegistryPullOnly",
    f"{MANAGED}AmazonSSMManagedInstanceCore",
)
EBS_CSI_POLICIES = (f"{MANAGED}service-role/AmazonEBSCSIDriverPolicy",)


def service_trust_policy(service: str) -> dict[str, Any]:
    """A role trust policy for an AWS service principal such as eks.amazonaws.com."""
    return {
        "Version": POLICY_VERSION,
        "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}],
    }


def pod_identity_trust_policy() -> dict[str, Any]:
    """Trust policy for EKS Pod Identity: the agent assumes the role and tags the session."""
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "pods.eks.amazonaws.com"},
                "Action": ["sts:AssumeRole", "sts:TagSession"],
            }
        ],
    }


def cluster_autoscaler_policy(cluster_name: str) -> dict[str, Any]:
    """The autoscaler's documented permissions, with every write limited to this cluster's groups.

    EKS names a managed node group's Auto Scaling group `eks-<node group>-<uuid>` (ours start with the
    cluster name) and tags it `k8s.io/cluster-autoscaler/<cluster>=owned`; writes need both, so this role
    cannot resize or terminate anything else in the account.
    """
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            {
                "Sid": "DiscoverGroupsAndTemplates",
                "Effect": "Allow",
                "Action": [
                    "autoscaling:DescribeAutoScalingGroups",
                    "autoscaling:DescribeAutoScalingInstances",
                    "autoscaling:DescribeLaunchConfigurations",
                    "autoscaling:DescribeScalingActivities",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplateVersions",
                    "ec2:GetInstanceTypesFromInstanceRequirements",
                ],
                "Resource": "*",
            },
            {
                "Sid": "ReadThisClustersNodeGroups",
                "Effect": "Allow",
                "Action": "eks:DescribeNodegroup",
                "Resource": f"arn:aws:eks:*:*:nodegroup/{cluster_name}/*/*",
            },
            {
                "Sid": "ScaleOnlyThisClustersGroups",
                "Effect": "Allow",
                "Action": [
                    "autoscaling:SetDesiredCapacity",
                    "autoscaling:TerminateInstanceInAutoScalingGroup",
                ],
                "Resource": (
                    f"arn:aws:autoscaling:*:*:autoScalingGroup:*:autoScalingGroupName/eks-{cluster_name}-*"
                ),
                "Condition": {
                    "StringEquals": {f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster_name}": "owned"}
                },
            },
        ],
    }


def role_with_policies(
    name: str,
    trust_policy: dict[str, Any],
    managed_policy_arns: Sequence[str],
    parent: pulumi.Resource,
    inline_policy: dict[str, Any] | None = None,
) -> aws.iam.Role:
    """A role, its managed-policy attachments and optional inline policy, all children of `parent`."""
    child = pulumi.ResourceOptions(parent=parent)
    role = aws.iam.Role(f"{name}-role", assume_role_policy=json.dumps(trust_policy), opts=child)
    for arn in managed_policy_arns:
        aws.iam.RolePolicyAttachment(
            f"{name}-{arn.rsplit('/', 1)[-1]}",
            role=role.name,
            policy_arn=arn,
            opts=pulumi.ResourceOptions(parent=role),
        )
    if inline_policy is not None:
        aws.iam.RolePolicy(
            f"{name}-policy",
            role=role.id,
            policy=json.dumps(inline_policy),
            opts=pulumi.ResourceOptions(parent=role),
        )
    return role
