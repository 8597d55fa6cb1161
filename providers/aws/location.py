"""Where an AWS stack lives: the provider's region, required before anything is planned, and the explicit
provider every resource of the stack names."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from components.configbase import ConfigError, ConfigIssue


def region_from_config() -> str:
    """`aws:region`, or a ConfigError saying how to set it."""
    region = pulumi.Config("aws").get("region")
    if not region:
        raise ConfigError(
            [
                ConfigIssue(
                    "aws:region",
                    None,
                    "is not set",
                    "pulumi config set aws:region us-east-1 (or set it in the stack file)",
                )
            ]
        )
    return region


def cluster_tags(cluster_name: str) -> dict[str, str]:
    """The tag every AWS resource of the cluster carries (cost allocation, cleanup)."""
    return {"gpu-k8s.io/cluster": cluster_name}


def aws_provider(cluster_name: str, region: str) -> aws.Provider:
    """The stack's AWS provider; every resource it makes carries the cluster's tag."""
    return aws.Provider(
        f"{cluster_name}-aws",
        region=region,
        default_tags=aws.ProviderDefaultTagsArgs(tags=cluster_tags(cluster_name)),
    )
