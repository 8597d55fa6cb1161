"""How an EC2 node of a k3s cluster learns about itself and reads its secrets (no AWS CLI, no SSH)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from gpu_k8s.components.k3s.cloudinit import NodeBootstrap
from gpu_k8s.providers.aws.iam import POLICY_VERSION

FETCH_SCRIPT = Path(__file__).parent / "files" / "fetch_secret.py"

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


@cache
def aws_node_bootstrap() -> NodeBootstrap:
    return NodeBootstrap(node_facts_sh=NODE_FACTS_SH, fetch_secret_py=FETCH_SCRIPT.read_text())


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
