"""What an EC2 node of a k3s cluster boots with: its image, its metadata access and its user data, and how it
learns about itself and reads its secrets (no AWS CLI, no SSH)."""

from __future__ import annotations

import base64
import gzip
from functools import cache
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws

from gpu_k8s.components.k3s.cloudinit import NodeBootstrap
from gpu_k8s.providers.aws.iam import POLICY_VERSION

FILES = Path(__file__).parent / "files"
FETCH_SCRIPT = FILES / "fetch_secret.py"
# What the fetch script, the snapshot store script and the ECR credential provider import.
SUPPORT_FILES = ("aws_api.py",)
# A kubelet image credential provider for Amazon ECR (Kubernetes, "Configure a kubelet image credential
# provider"): the kubelet runs it with a CredentialProviderRequest on stdin and pulls with the
# CredentialProviderResponse it prints, a token of the image registry's region (ECR GetAuthorizationToken;
# one token serves every registry the role may pull from, AWS's EKS add-on registries included). k3s agents
# have no ECR credential provider binary, and this one needs nothing but Python and the node's role. It runs
# through a link in the kubelet's provider directory; Python puts the link target's directory, where
# aws_api.py is, on sys.path.
ECR_CREDENTIAL_PROVIDER_SCRIPT = FILES / "ecr_credential_provider.py"

# IMDSv2 only: a session token first, then the instance's facts. The provider ID format is the one the
# cluster-autoscaler parses (aws:///<zone>/<instance-id>, cloudprovider/aws). Nodes are named after their
# instance, the resource-based naming the AWS cloud controller manager accepts (cloud-provider-aws
# docs/prerequisites.md); an instance ID is never reused, so a replacement never meets an old node's name.
NODE_FACTS_SH = """\
imds_token=$(curl -sf --retry 5 -X PUT http://169.254.169.254/latest/api/token \\
  -H "X-aws-ec2-metadata-token-ttl-seconds: 300")
imds() {
  curl -sf --retry 5 -H "X-aws-ec2-metadata-token: $imds_token" "http://169.254.169.254/latest/meta-data/$1"
}
ZONE=$(imds placement/availability-zone)
REGION=$(imds placement/region)
INSTANCE_TYPE=$(imds instance-type)
NODE_NAME=$(imds instance-id)
PROVIDER_ID="aws:///$ZONE/$NODE_NAME"
export ZONE REGION INSTANCE_TYPE NODE_NAME PROVIDER_ID
"""


# EC2 takes at most 16 KiB of user data, before base64 (EC2 API reference, RunInstances UserData).
EC2_USER_DATA_LIMIT = 16384


def ec2_user_data(cloud_config: str) -> str:
    """A cloud-config as EC2 user data: gzipped (cloud-init uncompresses gzip user data and uses it as
    though it were not compressed: cloud-init docs, "User data formats"), which keeps a server's well under
    EC2's limit, then base64 as the API takes it. mtime 0: the same config gives the same bytes, so no
    spurious diff."""
    packed = gzip.compress(cloud_config.encode(), mtime=0)
    if len(packed) >= EC2_USER_DATA_LIMIT:
        raise ValueError(f"user data is {len(packed)} bytes gzipped; EC2 takes at most {EC2_USER_DATA_LIMIT}")
    return base64.b64encode(packed).decode()


# Canonical's public SSM parameters for the current Ubuntu 24.04 LTS server AMI (parameter scheme from
# Canonical's "Finding Ubuntu images with the AWS SSM Parameter Store"; the ebs-gp3 volume type of 24.04
# images is recalled, UNCONFIRMED). Read at `up` (ubuntu_ami), so new nodes get the image of the last `up`.
UBUNTU_AMI_PARAMETER = "/aws/service/canonical/ubuntu/server/24.04/stable/current/{arch}/hvm/ebs-gp3/ami-id"
UBUNTU_ARCH = {"x86_64": "amd64", "arm64": "arm64"}
UBUNTU_ROOT_DEVICE = "/dev/sda1"
# Hop limit 1 on every node: an IMDSv2 token answer does not survive the hop into a pod's network namespace,
# so only the node and host-network pods reach IMDS (on servers the cloud controller, the EBS and EFS CSI
# controllers and the cluster-autoscaler; on agents the termination handler; the EBS node plugin reads its
# node from Kubernetes). The pod-metadata rule of every node's user data refuses the rest too.
IMDS_HOP_LIMIT = 1


def ubuntu_ami(arch: str, parent: pulumi.Resource) -> pulumi.Output[str]:
    """The newest Ubuntu AMI ID, read from Canonical's SSM parameter at `up`: a new image reaches a pool's
    nodes only through an `up`, whose diff shows the launch template's new ID (with `resolve:ssm:` every
    launch would take whatever is newest, so a new kernel could break every new GPU node with no `up`)."""
    return aws.ssm.get_parameter_output(
        name=UBUNTU_AMI_PARAMETER.format(arch=UBUNTU_ARCH[arch]),
        opts=pulumi.InvokeOutputOptions(parent=parent),
    ).value


@cache
def aws_node_bootstrap() -> NodeBootstrap:
    return NodeBootstrap(
        node_facts_sh=NODE_FACTS_SH,
        fetch_secret_py=FETCH_SCRIPT.read_text(),
        snapshot_store_py=(FILES / "snapshot_store.py").read_text(),
        support_files={name: (FILES / name).read_text() for name in SUPPORT_FILES},
    )


def read_secrets_policy(secret_arns: list[str]) -> dict[str, Any]:
    """Read exactly these secrets' values (encrypted with the default aws/secretsmanager key: no grant)."""
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            {
                "Sid": "ReadBootstrapSecrets",
                "Effect": "Allow",
                "Action": "secretsmanager:GetSecretValue",
                "Resource": secret_arns,
            }
        ],
    }
