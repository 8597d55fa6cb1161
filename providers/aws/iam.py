"""IAM policy documents (pure, linted by parliament in the tests) and a role helper."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

POLICY_VERSION = "2012-10-17"
MANAGED = "arn:aws:iam::aws:policy/"

EKS_CLUSTER_POLICIES = (f"{MANAGED}AmazonEKSClusterPolicy",)
# Nodes get shell access through Session Manager (no SSH key or port) from SESSION_MANAGER_POLICY, not
# AmazonSSMManagedInstanceCore, which also lets a node read every SSM parameter and document of the account
# and take Run Command and State Manager work.
EKS_NODE_POLICIES = (
    f"{MANAGED}AmazonEKSWorkerNodePolicy",
    f"{MANAGED}AmazonEKS_CNI_Policy",
    f"{MANAGED}AmazonEC2ContainerRegistryPullOnly",
)
# What the SSM Agent needs for Session Manager and nothing else: AWS's documented minimal instance policy
# ("Create a custom IAM instance profile for Session Manager"; the same five actions as the AWS managed
# policy AWSCloud9SSMInstanceProfile). Session logging to S3 or KMS-encrypted sessions would add their own.
SESSION_MANAGER_POLICY: dict[str, Any] = {
    "Version": POLICY_VERSION,
    "Statement": [
        {
            "Sid": "SessionManagerOnly",
            "Effect": "Allow",
            "Action": [
                "ssm:UpdateInstanceInformation",
                "ssmmessages:CreateControlChannel",
                "ssmmessages:CreateDataChannel",
                "ssmmessages:OpenControlChannel",
                "ssmmessages:OpenDataChannel",
            ],
            "Resource": "*",
        }
    ],
}
# V2 limits the driver to volumes and snapshots tagged ebs.csi.aws.com/cluster=true, which the driver puts
# on every volume it creates (aws-ebs-csi-driver pkg/driver/controller.go volumeTags, AwsEbsDriverTagKey);
# V1 reaches every volume of the account (security.md S12). V2 lives at the root path, V1 under
# service-role/ (moto's copy of the managed-policy list, checked by tests/test_references.py).
EBS_CSI_POLICIES = (f"{MANAGED}AmazonEBSCSIDriverPolicyV2",)
# The EKS user guide's policy for the EFS CSI driver (storage/efs-csi.adoc): access points it makes are
# tagged, and it deletes only tagged ones.
EFS_CSI_POLICIES = (f"{MANAGED}service-role/AmazonEFSCSIDriverPolicy",)


def service_trust_policy(service: str) -> dict[str, Any]:
    """A role trust policy for an AWS service principal such as eks.amazonaws.com."""
    return {
        "Version": POLICY_VERSION,
        "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}],
    }


def pod_identity_trust_policy(
    cluster_name: str, namespace: str, service_accounts: Sequence[str]
) -> dict[str, Any]:
    """Trust policy for EKS Pod Identity: the agent assumes the role and tags the session, for these service
    accounts of this cluster only. Pod Identity adds the session tags eks-cluster-name, kubernetes-namespace
    and kubernetes-service-account to its AssumeRole request (EKS user guide, pod-id-abac), and the EKS guide
    (pod-id-role) conditions the trust on them: an association made for the role in another cluster or for
    another service account gets no credentials."""
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "pods.eks.amazonaws.com"},
                "Action": ["sts:AssumeRole", "sts:TagSession"],
                "Condition": {
                    "StringEquals": {
                        "aws:RequestTag/eks-cluster-name": cluster_name,
                        "aws:RequestTag/kubernetes-namespace": namespace,
                        "aws:RequestTag/kubernetes-service-account": list(service_accounts),
                    }
                },
            }
        ],
    }


def secrets_encryption_policy(key_arn: str) -> dict[str, Any]:
    """What the EKS cluster role needs on its secrets key, on that key only (the actions terraform-aws-eks
    grants its cluster role for envelope encryption)."""
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            {
                "Sid": "EncryptClusterSecrets",
                "Effect": "Allow",
                "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ListGrants", "kms:DescribeKey"],
                "Resource": key_arn,
            }
        ],
    }


def log_group_key_policy(account_id: str, region: str, log_group_name: str) -> dict[str, Any]:
    """The key policy of the key that encrypts one CloudWatch log group: the account administers it through
    IAM (KMS's default key policy statement), and CloudWatch Logs may use it for that log group only (the
    CloudWatch Logs user guide, encrypt-log-data-kms: the service principal with the encryption context
    condition on the log group's ARN)."""
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            {
                "Sid": "AccountAdministersKeyThroughIam",
                "Effect": "Allow",
                "Principal": {"AWS": f"arn:aws:iam::{account_id}:root"},
                "Action": "kms:*",
                "Resource": "*",
            },
            {
                "Sid": "LogsEncryptOneLogGroup",
                "Effect": "Allow",
                "Principal": {"Service": f"logs.{region}.amazonaws.com"},
                "Action": [
                    "kms:Encrypt*",
                    "kms:Decrypt*",
                    "kms:ReEncrypt*",
                    "kms:GenerateDataKey*",
                    "kms:Describe*",
                ],
                "Resource": "*",
                "Condition": {
                    "ArnEquals": {
                        "kms:EncryptionContext:aws:logs:arn": (
                            f"arn:aws:logs:{region}:{account_id}:log-group:{log_group_name}"
                        )
                    }
                },
            },
        ],
    }


def cluster_autoscaler_tag(cluster_name: str) -> str:
    """The tag EKS puts on each managed node group's Auto Scaling group (aws-k3s puts it on its own groups):
    what the autoscaler discovers a cluster's groups by, and what its writes are limited to."""
    return f"k8s.io/cluster-autoscaler/{cluster_name}"


def cluster_autoscaler_policy(cluster_name: str, scope_tag: str | None = None) -> dict[str, Any]:
    """The autoscaler's documented permissions, with every write limited to this cluster's groups.

    EKS tags each managed node group's Auto Scaling group `k8s.io/cluster-autoscaler/<cluster>=owned`;
    writes are conditioned on that tag (and on `scope_tag` too, where the autoscaler must leave some of the
    cluster's groups alone), so this role cannot resize or terminate anything else in the account. (The
    group names are generated by EKS and have changed format over time, so they are not a reliable scope.)
    """
    scopes = [cluster_autoscaler_tag(cluster_name), *([scope_tag] if scope_tag else [])]
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
                "Resource": "*",
                "Condition": {"StringEquals": {f"aws:ResourceTag/{scope}": "owned" for scope in scopes}},
            },
        ],
    }


@dataclass(frozen=True)
class GrantedRole:
    """A role and what grants its permissions (policy attachments, inline policies).

    Whatever uses the role depends on `grants` too: created after its permissions exist, and destroyed
    before they go (an EKS cluster or node group whose policies are detached first cannot clean up its
    network interfaces and security groups, and the VPC cannot be deleted)."""

    role: aws.iam.Role
    grants: tuple[pulumi.Resource, ...]

    @property
    def arn(self) -> pulumi.Output[str]:
        return self.role.arn

    @property
    def name(self) -> pulumi.Output[str]:
        return self.role.name


def role_with_policies(
    name: str,
    trust_policy: dict[str, Any],
    managed_policy_arns: Sequence[str],
    parent: pulumi.Resource,
    inline_policy: dict[str, Any] | None = None,
    session_manager: bool = False,
) -> GrantedRole:
    """A role, its managed-policy attachments, an optional inline policy and, for a node role
    (`session_manager`), the Session Manager policy, all children of `parent`."""
    child = pulumi.ResourceOptions(parent=parent)
    role = aws.iam.Role(f"{name}-role", assume_role_policy=json.dumps(trust_policy), opts=child)
    grants: list[pulumi.Resource] = [
        aws.iam.RolePolicyAttachment(
            f"{name}-{arn.rsplit('/', 1)[-1]}",
            role=role.name,
            policy_arn=arn,
            opts=pulumi.ResourceOptions(parent=role),
        )
        for arn in managed_policy_arns
    ]
    inline = {"policy": inline_policy, "session-manager": SESSION_MANAGER_POLICY if session_manager else None}
    grants += [
        aws.iam.RolePolicy(
            f"{name}-{suffix}",
            role=role.id,
            policy=json.dumps(document),
            opts=pulumi.ResourceOptions(parent=role),
        )
        for suffix, document in inline.items()
        if document is not None
    ]
    return GrantedRole(role, tuple(grants))
