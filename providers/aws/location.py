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
# (botocore/data/endpoints.json, `partition`, `partitionName`, `regionRegex` and `regions` of each partition;
# tests compare them). A region newer than this list still matches its partition's pattern.
PARTITIONS = (
    ("aws", "AWS Standard", r"^(us|eu|ap|sa|ca|me|af|il|mx)\-\w+\-\d+$"),
    ("aws-cn", "AWS China", r"^cn\-\w+\-\d+$"),
    ("aws-us-gov", "AWS GovCloud (US)", r"^us\-gov\-\w+\-\d+$"),
    ("aws-iso", "AWS ISO (US)", r"^us\-iso\-\w+\-\d+$"),
    ("aws-iso-b", "AWS ISOB (US)", r"^us\-isob\-\w+\-\d+$"),
    ("aws-iso-e", "AWS ISOE (Europe)", r"^eu\-isoe\-\w+\-\d+$"),
    ("aws-iso-f", "AWS ISOF", r"^us\-isof\-\w+\-\d+$"),
    ("aws-eusc", "AWS EUSC", r"^eusc\-(de)\-\w+\-\d+$"),
)
REGION_PATTERNS = tuple(re.compile(pattern, re.ASCII) for _, _, pattern in PARTITIONS)
# The one partition stacks are built for. Every ARN the program writes (managed policies, EKS access
# policies, the autoscaler's node-group scope), the S3 endpoint service name and the registries it pulls from
# are the `aws` partition's; the others spell ARNs `arn:aws-cn:`/`arn:aws-us-gov:`..., have other endpoint
# suffixes (`amazonaws.com.cn`, `c2s.ic.gov`) and other EKS registries, and whether the EKS features the
# stacks use (Pod Identity, the NVIDIA AMI's public SSM parameters, EFA, Capacity Blocks) exist there is not
# checked here. A region of another partition is refused rather than failing half-built.
SUPPORTED_PARTITION = "aws"
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
    partition = next(
        (
            (name, title)
            for (name, title, _), pattern in zip(PARTITIONS, REGION_PATTERNS, strict=True)
            if pattern.fullmatch(region)
        ),
        None,
    )
    if partition is not None:
        name, title = partition
        if name == SUPPORTED_PARTITION:
            return None
        return ConfigIssue(
            "aws:region",
            region,
            f"is in the {title} partition ({name}); gpu-k8s builds for the standard aws partition only (its "
            "ARNs, endpoints and image registries are those of aws)",
            "use a region of the aws partition, e.g. us-east-1, or a GCP stack",
        )
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
