"""The EFA device plugin for GPU pools with `interconnect: efa`: it advertises each node's EFA interfaces as
`vpc.amazonaws.com/efa`, which a training pod requests to get them (EKS user guide, "Run machine learning
training on Amazon EKS with Elastic Fabric Adapter": helm install aws-efa-k8s-device-plugin
--namespace kube-system eks/aws-efa-k8s-device-plugin)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import pulumi

from gpu_k8s.components.availability import AWS_NETWORK_CARDS_FILE
from gpu_k8s.components.cluster import GpuCluster, GpuPool
from gpu_k8s.components.helm import helm_release
from gpu_k8s.providers.aws.autoscaling import EFA_HUGE_PAGE_COUNT
from gpu_k8s.providers.aws.iam import POLICY_VERSION
from gpu_k8s.providers.aws.settings import EFA_RESOURCE

EFA_PLUGIN_CHART = "aws-efa-k8s-device-plugin"
EFA_PLUGIN_CHART_VERSION = "v0.5.30"
EKS_CHARTS_REPOSITORY = "https://aws.github.io/eks-charts"
EFA_PLUGIN_NAMESPACE = "kube-system"
# For containers a host needs only the EFA kernel driver, "the equivalent of `./efa_installer.sh --minimal`";
# libfabric is in the container (amazonlinux/amazon-linux-2023#488). Ubuntu's kernel has the driver
# (amzn-drivers kernel/linux/efa README, "Driver distribution"), loaded by the EFA device's PCI alias. What
# else the installer sets up on an EKS AMI, a k3s agent sets itself: the huge pages the EKS user guide says
# EFA nodes pre-allocate, and no cap on locked memory, which libfabric's memory registration needs and
# containers inherit from k3s (the installer lifts it for every user; recalled, not confirmed here).
EFA_AGENT_SYSCTLS = {"vm.nr_hugepages": str(EFA_HUGE_PAGE_COUNT)}
EFA_AGENT_SERVICE_SETTINGS = {"LimitMEMLOCK": "infinity"}
# The chart's image (values.yaml at v0.5.30): AWS publishes the plugin only in the EKS registry of account
# 602401143452, a private ECR registry every AWS account may pull from with ECR credentials ("there are no
# plans at this time to make the device plugin code open source", aws-samples/aws-efa-eks#26). EKS nodes
# have the kubelet's ECR credential provider; k3s agents of EFA pools get one (the fetch script, run as
# `ecr-credential-provider`) and a role that may pull this one repository.
EFA_PLUGIN_REGISTRY = "602401143452.dkr.ecr.us-west-2.amazonaws.com"
EFA_PLUGIN_REPOSITORY = "eks/aws-efa-k8s-device-plugin"
EFA_PLUGIN_REPOSITORY_ARN = "arn:aws:ecr:us-west-2:602401143452:repository/eks/aws-efa-k8s-device-plugin"


def efa_plugin_pull_policy() -> dict[str, Any]:
    """What a node needs to pull the plugin: a registry token (GetAuthorizationToken takes no resource, ECR
    user guide "Private registry authentication") and the layers of that one repository."""
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            {
                "Sid": "RegistryToken",
                "Effect": "Allow",
                "Action": "ecr:GetAuthorizationToken",
                "Resource": "*",
            },
            {
                "Sid": "PullTheEfaDevicePlugin",
                "Effect": "Allow",
                "Action": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                "Resource": EFA_PLUGIN_REPOSITORY_ARN,
            },
        ],
    }


def efa_interfaces(pool: GpuPool) -> int:
    """How many EFA interfaces a node of the pool gets (0: the pool has no EFA)."""
    return pool.interconnect_resources.get(EFA_RESOURCE, 0)


@cache
def network_cards(instance_type: str) -> dict[int, tuple[str, ...]]:
    """Each network card of an EFA instance type and the interface types it takes (moto's copy of
    DescribeInstanceTypes: components/data/aws-network-cards.json)."""
    cards = json.loads(AWS_NETWORK_CARDS_FILE.read_text())["types"][instance_type]["cards"]
    return {int(index): tuple(types) for index, types in cards.items()}


@dataclass(frozen=True)
class EfaInterface:
    network_card: int
    device: int
    interface_type: str


def efa_layout(cards: Mapping[int, Sequence[str]], efa_only: bool) -> list[EfaInterface]:
    """An EFA on every network card that takes one, from the card's interface types (DescribeInstanceTypes).

    The primary interface (card 0, device 0) is an EFA with ENA where card 0 takes EFA, else plain ENA (card
    0 of a p6-b300.48xlarge). With `efa_only`, each other card gets an EFA-only interface as device 0, as
    AWS lays out instances with several cards (EC2 user guide, "Maximize network bandwidth on Amazon EC2
    instances with multiple network cards"); EFA-only interfaces hold no IP address. AWS's guide puts an ENA
    primary and an EFA-only device 1 on card 0 instead; that takes card 0's second interface, which the VPC
    CNI attaches for pod addresses (a p5 has two there: 49 pod addresses instead of 98, under a kubelet
    limit of 100), so the EFA stays on the primary, as terraform-aws-eks lays it out. Without `efa_only`,
    eksctl's layout (pkg/cfn/builder/network_interfaces.go): an EFA with ENA as device 1 of each other card,
    for clusters whose VPC CNI may predate EFA-only interfaces."""
    interfaces = [EfaInterface(0, 0, "efa" if "efa" in cards[0] else "interface")]
    for card, types in sorted(cards.items()):
        if card == 0:
            continue
        if efa_only and "efa-only" in types:
            interfaces.append(EfaInterface(card, 0, "efa-only"))
        elif "efa" in types:
            interfaces.append(EfaInterface(card, 1, "efa"))
    return interfaces


def efa_pools(pools: Sequence[GpuPool]) -> list[GpuPool]:
    return [pool for pool in pools if efa_interfaces(pool)]


def efa_plugin_values(pools: Sequence[GpuPool]) -> dict[str, Any]:
    """The chart's own node affinity already keeps the plugin to instance types with EFA; it has to tolerate
    the taints of the pools that have them."""
    keys = sorted({taint.key for pool in efa_pools(pools) for taint in pool.taints})
    return {"tolerations": [{"key": key, "operator": "Exists"} for key in keys]}


class EfaDevicePlugin(pulumi.ComponentResource):
    """The device plugin on the nodes of the cluster's EFA pools."""

    def __init__(self, name: str, cluster: GpuCluster, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-k8s:aws:EfaDevicePlugin", name, None, opts)
        helm_release(
            f"{name}-release",
            chart=EFA_PLUGIN_CHART,
            version=EFA_PLUGIN_CHART_VERSION,
            repository=EKS_CHARTS_REPOSITORY,
            namespace=EFA_PLUGIN_NAMESPACE,
            values=efa_plugin_values(cluster.pools),
            parent=self,
            provider=cluster.k8s_provider,
            depends_on=list(cluster.system_ready),
        )
        self.register_outputs({})


def install_efa_device_plugin(
    name: str, cluster: GpuCluster, opts: pulumi.ResourceOptions | None = None
) -> None:
    """The plugin, where some pool has EFA."""
    if efa_pools(cluster.pools):
        EfaDevicePlugin(f"{name}-efa-device-plugin", cluster, opts)
