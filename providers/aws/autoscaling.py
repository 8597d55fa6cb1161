"""The AWS half of the cluster-autoscaler: scale-from-zero ASG tags, chart values and its identity."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from gpu_k8s.components.autoscaler import (
    AUTOSCALER_NAMESPACE,
    AUTOSCALER_SERVICE_ACCOUNT,
    NodeTemplate,
    node_template,
)
from gpu_k8s.components.cluster import GpuPool
from gpu_k8s.components.configbase import ConfigIssue, config_path
from gpu_k8s.providers.aws.iam import cluster_autoscaler_policy, pod_identity_trust_policy, role_with_policies
from gpu_k8s.providers.aws.settings import EFA_RESOURCE

TEMPLATE_PREFIX = "k8s.io/cluster-autoscaler/node-template"
# The label the autoscaler's AWS provider reads as "this node has GPUs" (cloudprovider/aws, REFERENCE.md 5.3).
ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"


def scale_from_zero_tags(template: NodeTemplate) -> dict[str, str]:
    """ASG tags from which the autoscaler builds a node of an empty group (cloudprovider/aws/README.md).

    EKS does not copy node group labels and taints to the ASG, so a group at zero would otherwise look
    like a plain CPU node and never be chosen for a GPU pod.
    """
    tags = {f"{TEMPLATE_PREFIX}/label/{key}": value for key, value in sorted(template.labels.items())}
    for taint in template.taints:
        tags[f"{TEMPLATE_PREFIX}/taint/{taint.key}"] = f"{taint.value}:{taint.effect}"
    for resource, quantity in sorted(template.resources.items()):
        tags[f"{TEMPLATE_PREFIX}/resources/{resource}"] = quantity
    if template.scale_down_unneeded_time:
        tags[f"{TEMPLATE_PREFIX}/autoscaling-options/scaledownunneededtime"] = (
            template.scale_down_unneeded_time
        )
    return tags


# Tags an Auto Scaling group takes (Amazon EC2 Auto Scaling user guide, "Tag Auto Scaling groups and
# instances": 50 per group).
MAX_ASG_TAGS = 50


def asg_tag_issues(
    pools: Sequence[GpuPool], tags_of: Callable[[GpuPool], Mapping[str, str]], tags_not_ours: int
) -> Iterator[ConfigIssue]:
    """A pool whose labels and taints, as scale-from-zero tags next to the `tags_not_ours` the platform puts
    on its groups, would not fit an Auto Scaling group (its creation or tagging fails mid-`up`)."""
    for index, pool in enumerate(pools):
        count = len(tags_of(pool)) + tags_not_ours
        if count > MAX_ASG_TAGS:
            yield ConfigIssue(
                config_path("gpuPools", index, "labels"),
                None,
                f"its {len(pool.spec.labels)} labels with the pool's taints make {count} tags on each of its "
                "Auto Scaling groups (one per label and taint tells the autoscaler what a node at zero looks "
                f"like); a group takes at most {MAX_ASG_TAGS}",
                f"drop at least {count - MAX_ASG_TAGS} labels or taints",
            )


# "Amazon EC2 instances with the EFA driver installed pre-allocate 5128 2MiB Huge Pages" (EKS user guide,
# node-efa.adoc, awsdocs/amazon-eks-user-guide 4d52b4d): 5128 x 2 MiB. k3s EFA agents reserve exactly that
# many themselves (providers/aws/efa.py EFA_AGENT_SYSCTLS).
EFA_HUGE_PAGES_RESOURCE = "hugepages-2Mi"
EFA_HUGE_PAGE_COUNT = 5128
EFA_HUGE_PAGES = f"{EFA_HUGE_PAGE_COUNT * 2}Mi"
# On EKS the AMI installs EFA with `--minimal`, whose efa-config may size huge pages to need (review-aws
# AN-D4: amazon-eks-ami install-efa.sh, awslabs/libfabric-ci-scripts#122): what an EKS EFA node really
# has is UNCONFIRMED. Its template promises only the 5120Mi the EKS NCCL test asks for, so a pod the
# autoscaler scales a node up for fits on it.
EKS_EFA_HUGE_PAGES = "5120Mi"
# The kubelet's allocatable ephemeral storage is the root filesystem's size (a few per cent under the volume)
# less the hard eviction threshold (nodefs.available 10% by default: Kubernetes "Node-pressure eviction";
# k3s sets 5%) and reserved space (EKS reserves 1Gi). A group at zero advertises this share of its volume,
# below all of these, so no pod is scaled up for that cannot fit the node it gets (review-aws AN-D3).
ALLOCATABLE_DISK_SHARE = 0.85


def aws_node_template(pool: GpuPool, cluster_unneeded_time: str, efa_huge_pages: str) -> NodeTemplate:
    """The pool's template plus the ephemeral storage a node brings (from its root volume), which the AWS
    provider cannot know for a group at zero (cloudprovider/aws/README.md: node-template resources); a pod
    asking for ephemeral-storage would otherwise never scale the pool up. `efa_huge_pages`: what an EFA node
    of the platform has."""
    template = node_template(pool, cluster_unneeded_time)
    disk = int(pool.spec.disk_size_gib * ALLOCATABLE_DISK_SHARE)
    resources = {**template.resources, "ephemeral-storage": f"{disk}Gi"}
    if EFA_RESOURCE in pool.interconnect_resources:
        # NCCL over EFA asks for huge pages; a group at zero must show them or such a pod never scales it up.
        resources[EFA_HUGE_PAGES_RESOURCE] = efa_huge_pages
    return dataclasses.replace(template, resources=resources)


@dataclass(frozen=True)
class ZoneLimits:
    """One zone's group of a pool: the private subnet (by index) and its share of the pool's limits."""

    zone_index: int
    min_nodes: int
    max_nodes: int


def zone_limits(min_nodes: int, max_nodes: int, zone_indexes: Sequence[int]) -> list[ZoneLimits]:
    """A pool's limits split over its per-zone groups so that they add up to the pool's: as many zones as
    the pool may have nodes, the remainder to the first ones (the autoscaler balances similar groups)."""
    used = zone_indexes[:max_nodes]

    def share(total: int, position: int) -> int:
        return total // len(used) + (1 if position < total % len(used) else 0)

    return [
        ZoneLimits(zone_index, share(min_nodes, position), share(max_nodes, position))
        for position, zone_index in enumerate(used)
    ]


# Labels a p4d/p5-class node carries that differ from node to node: one per network node above it, from
# EC2 DescribeInstanceTopology (cloud-provider-aws v1.35.2 pkg/providers/v1/instances_v2.go and
# well_known_labels.go; EKS sets the same on its nodes). Three layers, four on some UltraServer types.
NETWORK_NODE_LABELS = tuple(f"topology.k8s.aws/network-node-layer-{layer}" for layer in range(1, 5))


def autoscaler_cloud_values(cluster_name: str, region: str) -> dict[str, Any]:
    """Chart values for the AWS provider with ASG auto-discovery of this cluster's groups. A pool's per-zone
    groups are alike but for their zone: the autoscaler spreads scale-ups over them. Once a group has a node
    the autoscaler takes it as the group's template, so the per-node topology labels are ignored when it
    compares groups; else a pool's zonal groups stop being alike, and an all-or-nothing scale-up that needs
    two of them fails (review-aws.md AN-D2; the autoscaler's AWS ignore list lacks them). The chart renders
    `<flag>_<n>` keys as repeated `--<flag>` arguments (templates/deployment.yaml, mustRegexFind "^[^_]+")."""
    ignored = {f"balancing-ignore-label_{i}": label for i, label in enumerate(NETWORK_NODE_LABELS, start=1)}
    return {
        "cloudProvider": "aws",
        "awsRegion": region,
        "autoDiscovery": {"clusterName": cluster_name},
        "extraArgs": {"balance-similar-node-groups": True, **ignored},
    }


class AutoscalerIdentity(pulumi.ComponentResource):
    """An IAM role for the autoscaler's service account, delivered through EKS Pod Identity."""

    association: aws.eks.PodIdentityAssociation

    def __init__(
        self,
        name: str,
        cluster_name: pulumi.Input[str],
        cluster_label: str,
        opts: pulumi.ResourceOptions | None = None,
        scope_tag: str | None = None,
    ):
        """`scope_tag`: the Auto Scaling group tag its writes are limited to (default: the cluster's)."""
        super().__init__("gpu-k8s:aws:AutoscalerIdentity", name, None, opts)
        role = role_with_policies(
            name,
            pod_identity_trust_policy(cluster_label, AUTOSCALER_NAMESPACE, [AUTOSCALER_SERVICE_ACCOUNT]),
            (),
            parent=self,
            inline_policy=cluster_autoscaler_policy(cluster_label, scope_tag),
        )
        self.association = aws.eks.PodIdentityAssociation(
            f"{name}-association",
            cluster_name=cluster_name,
            namespace=AUTOSCALER_NAMESPACE,
            service_account=AUTOSCALER_SERVICE_ACCOUNT,
            role_arn=role.arn,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(role.grants)),
        )
        self.register_outputs({"roleArn": role.arn})
