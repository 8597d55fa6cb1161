"""Where an AWS stack lives: the provider's region, required before anything is planned, and the explicit
provider every resource of the stack names."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from gpu_k8s.components.configbase import ConfigError, ConfigIssue

# The region names of every AWS partition, and the regions known today, from botocore's endpoint data
# (botocore/data/endpoints.json, `regionRegex` and `regions` of each partition; tests compare them). A region
# newer than this list still matches its partition's pattern.
REGION_PATTERNS = tuple(
    re.compile(pattern, re.ASCII)
    for pattern in (
        r"^(us|eu|ap|sa|ca|me|af|il|mx)\-\w+\-\d+$",
        r"^cn\-\w+\-\d+$",
        r"^us\-gov\-\w+\-\d+$",
        r"^us\-iso\-\w+\-\d+$",
        r"^us\-isob\-\w+\-\d+$",
        r"^eu\-isoe\-\w+\-\d+$",
        r"^us\-isof\-\w+\-\d+$",
        r"^eusc\-(de)\-\w+\-\d+$",
    )
)
KNOWN_REGIONS = frozenset(
    (
        "af-south-1",
        "ap-east-1",
        "ap-east-2",
        "ap-northeast-1",
        "ap-northeast-2",
        "ap-northeast-3",
        "ap-south-1",
        "ap-south-2",
        "ap-southeast-1",
        "ap-southeast-2",
        "ap-southeast-3",
        "ap-southeast-4",
        "ap-southeast-5",
        "ap-southeast-6",
        "ap-southeast-7",
        "ca-central-1",
        "ca-west-1",
        "eu-central-1",
        "eu-central-2",
        "eu-north-1",
        "eu-south-1",
        "eu-south-2",
        "eu-west-1",
        "eu-west-2",
        "eu-west-3",
        "il-central-1",
        "me-central-1",
        "me-south-1",
        "mx-central-1",
        "sa-east-1",
        "us-east-1",
        "us-east-2",
        "us-west-1",
        "us-west-2",
        "cn-north-1",
        "cn-northwest-1",
        "us-gov-east-1",
        "us-gov-west-1",
        "us-iso-east-1",
        "us-iso-west-1",
        "us-isob-east-1",
        "us-isob-west-1",
        "eu-isoe-west-1",
        "us-isof-east-1",
        "us-isof-south-1",
        "eusc-de-east-1",
    )
)
_GCP_REGION = re.compile(r"[a-z]+-[a-z]+[0-9]+", re.ASCII)


def region_issue(region: str | None) -> ConfigIssue | None:
    """What is wrong with `aws:region`, if anything."""
    if not region:
        return ConfigIssue(
            "aws:region",
            None,
            "is not set",
            "pulumi config set aws:region us-east-1 (or set it in the stack file)",
        )
    if any(pattern.fullmatch(region) for pattern in REGION_PATTERNS):
        return None
    if _GCP_REGION.fullmatch(region):
        problem = "is a GCP region name; AWS regions read like us-east-1"
    else:
        problem = "is not an AWS region name"
    guess = difflib.get_close_matches(region, sorted(KNOWN_REGIONS), n=1, cutoff=0.9)
    return ConfigIssue(
        "aws:region",
        region,
        problem,
        (f"did you mean {guess[0]}? " if guess else "") + "pick one from `aws ec2 describe-regions`",
    )


def region_from_config() -> str:
    """`aws:region`, or a ConfigError saying how to set it."""
    region = pulumi.Config("aws").get("region")
    issue = region_issue(region)
    if issue is not None:
        raise ConfigError([issue])
    assert region is not None
    return region


def cluster_tags(cluster_name: str) -> dict[str, str]:
    """The tag every AWS resource of the cluster carries (cost allocation, cleanup)."""
    return {"gpu-k8s.io/cluster": cluster_name}


def aws_provider(cluster_name: str, region: str, after: Sequence[pulumi.Resource] = ()) -> aws.Provider:
    """The stack's AWS provider; every resource it makes carries the cluster's tag."""
    return aws.Provider(
        f"{cluster_name}-aws",
        region=region,
        default_tags=aws.ProviderDefaultTagsArgs(tags=cluster_tags(cluster_name)),
        opts=pulumi.ResourceOptions(depends_on=list(after)),
    )
