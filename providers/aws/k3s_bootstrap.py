"""How an EC2 node of a k3s cluster learns about itself and reads its secrets (no AWS CLI, no SSH)."""

from __future__ import annotations

import base64
import gzip
from functools import cache
from pathlib import Path
from typing import Any

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
