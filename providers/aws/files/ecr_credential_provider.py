#!/usr/bin/env python3
"""Kubelet image credential provider for Amazon ECR, signing with the instance profile (see
providers/aws/k3s_bootstrap.py). Errors name their type only."""

import base64
import json
import re
import sys

from aws_api import call, instance_credentials

# <account>.dkr.ecr[-fips].<region>.amazonaws.com (ECR user guide, "Private registry concepts").
ECR_REGISTRY = re.compile(r"^\d{12}\.dkr\.ecr(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com$")


def ecr_credentials(request, credentials, endpoint=None):
    registry = request["image"].split("/", 1)[0]
    match = ECR_REGISTRY.match(registry)
    if match is None:
        raise ValueError("not an ECR registry")
    region = match.group(1)
    target = "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken"
    answer = call(f"api.ecr.{region}.amazonaws.com", "ecr", region, target, credentials, {}, endpoint)
    user, _, password = (
        base64.b64decode(answer["authorizationData"][0]["authorizationToken"]).decode().partition(":")
    )
    # ECR tokens last 12 hours; the kubelet reuses one for 6.
    return {
        "kind": "CredentialProviderResponse",
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "cacheKeyType": "Registry",
        "cacheDuration": "6h",
        "auth": {registry: {"username": user, "password": password}},
    }


def main():
    try:
        sys.stdout.write(json.dumps(ecr_credentials(json.load(sys.stdin), instance_credentials()[1])))
    except (OSError, ValueError, KeyError) as error:
        print(f"gpu-k8s: no ECR credentials ({type(error).__name__})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
