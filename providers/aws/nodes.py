"""EKS managed node groups: the on-demand system pool and one autoscaled group per GPU pool."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from gpu_k8s.components.catalog import MachineType
from gpu_k8s.components.cluster import POOL_LABEL, SYSTEM_POOL_NAME, GpuPool
from gpu_k8s.components.spec import (
    TAINT_EFFECT_API_NAMES,
    GpuPoolSpec,
    SystemPoolSpec,
    TaintSpec,
    pool_child_name,
)
from gpu_k8s.providers.aws.autoscaling import (
    EKS_EFA_HUGE_PAGES,
    aws_node_template,
    scale_from_zero_tags,
    zone_limits,
)
from gpu_k8s.providers.aws.efa import EfaInterface, efa_interfaces, efa_layout, network_cards

# Families the EKS-optimized AL2023 NVIDIA AMIs cover (EKS user guide, ml-eks-optimized-ami; REFERENCE 3.1).
# g7 is missing on purpose: it needs driver >= 595 and the AMIs ship the 580 branch.
AL2023_NVIDIA_FAMILIES = {
    "x86_64": {
        "p6-b300",
        "p6-b200",
        "p5",
        "p5e",
        "p5en",
        "p4d",
        "p4de",
        "p3",
        "p3dn",
        "g7e",
        "gr6",
        "g6",
        "g6e",
        "g6f",
        "gr6f",
        "g5",
        "g4dn",
    },
    "arm64": {"p6e-gb200", "p6e-gb300", "g5g"},
}
# Driver branch of the EKS accelerated AMIs ("currently include NVIDIA driver version 580", EKS MIG guide).
AL2023_NVIDIA_DRIVER_BRANCH = "580"
ROOT_DEVICE = "/dev/xvda"
# EC2 naming: Graviton families carry a "g" right after the generation digit (m7g, c8gd, r7gn).
_GRAVITON_FAMILY = re.compile(r"^[a-z]+\d+g[a-z]*\.")


def gpu_ami_type(machine: MachineType) -> str:
    """The EKS AMI type for a GPU instance type: AL2023 with the NVIDIA driver and container toolkit."""
    return {"x86_64": "AL2023_x86_64_NVIDIA", "arm64": "AL2023_ARM_64_NVIDIA"}[machine.arch]


def cpu_arch(instance_type: str) -> str:
    """ "arm64" for Graviton instance types, else "x86_64"."""
    return "arm64" if _GRAVITON_FAMILY.match(instance_type) else "x86_64"


def system_ami_type(instance_type: str) -> str:
    return {"arm64": "AL2023_ARM_64_STANDARD", "x86_64": "AL2023_x86_64_STANDARD"}[cpu_arch(instance_type)]


def eks_taints(taints: Sequence[TaintSpec]) -> list[aws.eks.NodeGroupTaintArgs]:
    return [
        aws.eks.NodeGroupTaintArgs(key=t.key, value=t.value or None, effect=TAINT_EFFECT_API_NAMES[t.effect])
        for t in taints
    ]


def node_group_options(
    parent: pulumi.Resource, depends_on: Sequence[pulumi.Resource]
) -> pulumi.ResourceOptions:
    """The autoscaler owns the node count: Pulumi must never reset it to the value in the program."""
    return pulumi.ResourceOptions(
        parent=parent, depends_on=list(depends_on), ignore_changes=["scalingConfig.desiredSize"]
    )


def launch_tag_specifications(tags: Mapping[str, str]) -> list[aws.ec2.LaunchTemplateTagSpecificationArgs]:
    """Tags for what the Auto Scaling group launches: the provider's default tags reach the template, not the
    instances, volumes and interfaces made from it."""
    return [
        aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=dict(tags))
        for kind in ("instance", "volume", "network-interface")
    ]


# What a launch template for a Capacity Block for ML sets besides the block's instance type (EKS user guide,
# "Create a managed node group with Capacity Blocks for ML"; EC2 Auto Scaling user guide,
# "Use Capacity Blocks for machine learning workloads").
CAPACITY_BLOCK_MARKET = aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type="capacity-block")


def capacity_block_target(reservation_id: str) -> aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs:
    return aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
        capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
            capacity_reservation_id=reservation_id
        )
    )


@dataclass(frozen=True)
class CapacityBlockLaunch:
    """A node group that launches into a Capacity Block: its type is in the template, not the group."""

    reservation_id: str
    instance_type: str


@dataclass(frozen=True)
class EfaLaunch:
    """What a launch template sets for EFA: the interfaces (`efa_layout`), and the placement group."""

    interfaces: Sequence[EfaInterface]
    # The groups of the primary interface (the node's own traffic, and EFA's), and of the others (EFA's).
    primary_security_group_ids: Sequence[pulumi.Input[str]]
    efa_security_group_ids: Sequence[pulumi.Input[str]]
    placement_group: pulumi.Input[str] | None
    # None where the node group sets the subnet (EKS); else the pool's one subnet.
    subnet_id: pulumi.Input[str] | None = None


def efa_network_interfaces(efa: EfaLaunch) -> list[aws.ec2.LaunchTemplateNetworkInterfaceArgs]:
    """The template's interfaces. With interfaces in the template, security groups go on each interface;
    every EFA needs the group that admits EFA traffic, the others only the primary (AWS PCS user guide,
    "Create or update an EC2 launch template" for EFA). On EKS no subnet: EKS sets it from the node group,
    and a launch template for a managed node group may not (EKS user guide, launch-templates)."""
    return [
        aws.ec2.LaunchTemplateNetworkInterfaceArgs(
            device_index=interface.device,
            network_card_index=interface.network_card,
            interface_type=interface.interface_type,
            security_groups=list(
                efa.primary_security_group_ids
                if (interface.network_card, interface.device) == (0, 0)
                else efa.efa_security_group_ids
            ),
            subnet_id=efa.subnet_id,
            delete_on_termination="true",
        )
        for interface in efa.interfaces
    ]


def efa_placement_group(
    name: str, in_capacity_block: bool, parent: pulumi.Resource
) -> pulumi.Output[str] | None:
    """A cluster placement group for an EFA pool (in the one zone such a pool has), unless it launches into
    a Capacity Block, which brings its own placement. Its name, for the launch template."""
    if in_capacity_block:
        return None
    return aws.ec2.PlacementGroup(
        f"{name}-placement", strategy="cluster", opts=pulumi.ResourceOptions(parent=parent)
    ).name


def efa_placement(efa: EfaLaunch | None) -> aws.ec2.LaunchTemplatePlacementArgs | None:
    if efa is None or efa.placement_group is None:
        return None
    return aws.ec2.LaunchTemplatePlacementArgs(group_name=efa.placement_group)


def _launch_template(
    name: str,
    disk_size_gib: int,
    tags: Mapping[str, str],
    parent: pulumi.Resource,
    block: CapacityBlockLaunch | None = None,
    efa: EfaLaunch | None = None,
) -> aws.ec2.LaunchTemplate:
    return aws.ec2.LaunchTemplate(
        f"{name}-lt",
        network_interfaces=efa_network_interfaces(efa) if efa else None,
        placement=efa_placement(efa),
        instance_type=block.instance_type if block else None,
        instance_market_options=CAPACITY_BLOCK_MARKET if block else None,
        capacity_reservation_specification=capacity_block_target(block.reservation_id) if block else None,
        block_device_mappings=[
            aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name=ROOT_DEVICE,
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    volume_size=disk_size_gib,
                    volume_type="gp3",
                    encrypted="true",
                    delete_on_termination="true",
                ),
            )
        ],
        # IMDSv2 only, hop limit 1 (terraform-aws-eks's default since v21): no pod without host networking
        # reaches the node role. Nothing here needs it: the CNI, kube-proxy and the Pod Identity agent use
        # host networking; the EBS CSI controller and the autoscaler get credentials from Pod Identity, the
        # autoscaler its region from awsRegion, and the EBS CSI pods read their node's facts from
        # Kubernetes when IMDS does not answer (aws-ebs-csi-driver docs/install.md, "Metadata").
        metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
            http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=1
        ),
        tag_specifications=launch_tag_specifications(tags),
        update_default_version=True,
        opts=pulumi.ResourceOptions(parent=parent),
    )


@dataclass(frozen=True)
class NodeGroupContext:
    """What every node group of a cluster shares."""

    cluster_name: pulumi.Input[str]
    kubernetes_version: str
    node_role_arn: pulumi.Input[str]
    subnet_ids: Sequence[pulumi.Input[str]]
    # Add-ons nodes need to become Ready (the CNI) must exist before the group.
    depends_on: Sequence[pulumi.Resource]
    # The autoscaler's cluster-wide idle time; pools that differ carry their own in the ASG template.
    cluster_unneeded_time: str
    # Tags for the instances, volumes and interfaces node groups launch.
    launch_tags: Mapping[str, str]
    # The EKS cluster security group, which EFA interfaces carry (None where no pool has EFA).
    cluster_security_group_id: pulumi.Input[str] | None = None
    # Tags on every GPU group's Auto Scaling group besides the scale-from-zero ones (what the autoscaler
    # discovers them by, where the cluster-wide tags EKS sets would also reach groups not ours).
    discovery_tags: Mapping[str, str] = field(default_factory=dict)
    # The AMI release of the node groups (`eks.nodeImageRelease`): None keeps each group's own.
    image_release: str | None = None
    # EFA-only interfaces (`efa_layout`) need VPC CNI 1.18.5 or later, which skips them; an existing
    # cluster's CNI is the user's.
    efa_only: bool = True


@dataclass(frozen=True)
class NodeShape:
    """What differs between the node groups of a cluster."""

    # The first is what the autoscaler plans a node of the group as; the others are launched when it has no
    # capacity (EKS: "If you specify Spot for capacityType, then we recommend specifying multiple values").
    instance_types: tuple[str, ...]
    ami_type: str
    capacity_type: str
    min_nodes: int
    max_nodes: int
    disk_size_gib: int
    labels: dict[str, str]
    taints: tuple[TaintSpec, ...] = ()
    # DEFAULT launches the new node before terminating the old one; MINIMAL terminates first, "useful in
    # scenarios where you are constrained to resources or costs (for example, with hardware accelerators
    # such as GPUs)" (EKS API reference, NodegroupUpdateConfig.updateStrategy).
    update_strategy: str = "DEFAULT"


# Where EKS publishes the recommended AMI release per Kubernetes minor and AMI type (eksctl and
# terraform-aws-eks read the same public SSM parameters); the value looks like "1.36.3-20260827".
RELEASE_VERSION_PARAMETER = (
    "/aws/service/eks/optimized-ami/{minor}/amazon-linux-2023/{arch}/{flavour}/recommended/release_version"
)
AMI_TYPE_PARAMETER_PATH = {
    "AL2023_x86_64_STANDARD": ("x86_64", "standard"),
    "AL2023_ARM_64_STANDARD": ("arm64", "standard"),
    "AL2023_x86_64_NVIDIA": ("x86_64", "nvidia"),
    "AL2023_ARM_64_NVIDIA": ("arm64", "nvidia"),
}


def release_version_parameter(minor: str, ami_type: str) -> str:
    arch, flavour = AMI_TYPE_PARAMETER_PATH[ami_type]
    return RELEASE_VERSION_PARAMETER.format(minor=minor, arch=arch, flavour=flavour)


LATEST_IMAGE_RELEASE = "latest"


def image_release(
    ctx: NodeGroupContext, shape: NodeShape, opts: pulumi.ResourceOptions
) -> pulumi.Input[str] | None:
    """The AMI release a group asks for. None (the default) leaves it to EKS, which takes the recommended
    release when it creates the group and keeps it (release_version is optional and computed in the AWS
    provider, so a later `up` changes nothing: recalled from its schema, UNCONFIRMED here), so no `up`
    drains running GPU jobs unless asked. "latest" is
    the release EKS recommends now, read at every `up`: a new one rolls the group's nodes, one at a time
    (GPU groups terminate first), except a Capacity Block's, which EKS says to upgrade only at size 0."""
    release = ctx.image_release
    if release is None or (release == LATEST_IMAGE_RELEASE and shape.capacity_type == "CAPACITY_BLOCK"):
        return None
    if release != LATEST_IMAGE_RELEASE:
        return release
    return aws.ssm.get_parameter_output(
        name=release_version_parameter(ctx.kubernetes_version, shape.ami_type),
        opts=pulumi.InvokeOutputOptions(parent=opts.parent),
    ).value


def _node_group(
    resource_name: str,
    shape: NodeShape,
    template: aws.ec2.LaunchTemplate,
    subnet_ids: Sequence[pulumi.Input[str]],
    ctx: NodeGroupContext,
    opts: pulumi.ResourceOptions,
) -> aws.eks.NodeGroup:
    """A managed node group from a launch template (encrypted gp3 root, IMDSv2), one node at a time on
    updates."""
    return aws.eks.NodeGroup(
        resource_name,
        cluster_name=ctx.cluster_name,
        version=ctx.kubernetes_version,
        release_version=image_release(ctx, shape, opts),
        node_role_arn=ctx.node_role_arn,
        subnet_ids=list(subnet_ids),
        # A Capacity Block's template names the type, and EKS refuses a type in both places.
        instance_types=None if shape.capacity_type == "CAPACITY_BLOCK" else list(shape.instance_types),
        ami_type=shape.ami_type,
        capacity_type=shape.capacity_type,
        scaling_config=aws.eks.NodeGroupScalingConfigArgs(
            min_size=shape.min_nodes, max_size=shape.max_nodes, desired_size=shape.min_nodes
        ),
        launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
            id=template.id, version=template.latest_version.apply(str)
        ),
        labels=shape.labels,
        taints=eks_taints(shape.taints) or None,
        update_config=aws.eks.NodeGroupUpdateConfigArgs(
            max_unavailable=1, update_strategy=shape.update_strategy
        ),
        # EKS replaces a node that stays unhealthy (NotReady, or faults the node monitoring agent reports).
        node_repair_config=aws.eks.NodeGroupNodeRepairConfigArgs(enabled=True),
        opts=opts,
    )


def system_node_group(
    name: str, spec: SystemPoolSpec, ctx: NodeGroupContext, parent: pulumi.Resource
) -> aws.eks.NodeGroup:
    """On-demand CPU nodes with a fixed size for CoreDNS, the operator and the autoscaler."""
    shape = NodeShape(
        instance_types=(spec.instance_type,),
        ami_type=system_ami_type(spec.instance_type),
        capacity_type="ON_DEMAND",
        min_nodes=spec.nodes,
        max_nodes=spec.nodes,
        disk_size_gib=spec.disk_size_gib,
        labels={POOL_LABEL: SYSTEM_POOL_NAME},
    )
    opts = pulumi.ResourceOptions(parent=parent, depends_on=list(ctx.depends_on))
    template = _launch_template(name, shape.disk_size_gib, {**ctx.launch_tags, "Name": name}, parent)
    return _node_group(name, shape, template, ctx.subnet_ids, ctx, opts)


class GpuNodePool(pulumi.ComponentResource):
    """A GPU pool: one managed node group per zone, each starting empty and scaling to zero when idle.

    One zone per group: the autoscaler models a group's nodes in the group's first zone, so a pod bound to
    an EBS volume in another zone would never scale a multi-zone group up (autoscaler AWS README).
    """

    node_groups: list[aws.eks.NodeGroup]

    def __init__(
        self,
        name: str,
        pool: GpuPool,
        ctx: NodeGroupContext,
        zone_indexes: Sequence[int],
        opts: pulumi.ResourceOptions | None = None,
    ):
        """`zone_indexes`: the private subnets (by index) whose zone offers the pool's instance type."""
        super().__init__("gpu-k8s:aws:GpuNodePool", name, None, opts)
        spec = pool.spec
        block = (
            CapacityBlockLaunch(spec.capacity_reservation_id, spec.instance_type)
            if spec.capacity_reservation_id is not None
            else None
        )
        efa = self._efa_launch(name, pool, ctx, block)
        template = _launch_template(
            name, spec.disk_size_gib, {**ctx.launch_tags, "Name": name}, self, block, efa
        )
        tags = {
            **scale_from_zero_tags(aws_node_template(pool, ctx.cluster_unneeded_time, EKS_EFA_HUGE_PAGES)),
            **ctx.discovery_tags,
        }
        self.node_groups = []
        for limits in zone_limits(spec.min_nodes, spec.max_nodes, zone_indexes):
            zone = limits.zone_index
            shape = NodeShape(
                instance_types=(spec.instance_type, *spec.extra_instance_types),
                ami_type=gpu_ami_type(pool.machine),
                capacity_type=gpu_capacity_type(spec),
                min_nodes=limits.min_nodes,
                max_nodes=limits.max_nodes,
                disk_size_gib=spec.disk_size_gib,
                labels=pool.node_labels,
                taints=pool.taints,
                # An upgrade must not need a second p5.48xlarge (quota, capacity) for every one it replaces.
                update_strategy="MINIMAL",
            )
            # Auto-named (`<name>-ng-<zone>-<random>`): an instance type change replaces the group, and
            # Pulumi can then create the new group before deleting the old one, which a fixed name forbids.
            group = _node_group(
                node_group_resource_name(name, zone),
                shape,
                template,
                [ctx.subnet_ids[zone]],
                ctx,
                node_group_options(self, ctx.depends_on),
            )
            self.node_groups.append(group)
            group_name = group.resources.apply(_autoscaling_group_name)
            for key, suffix in tag_resource_suffixes(tags).items():
                aws.autoscaling.Tag(
                    f"{name}-{zone}-tag-{suffix}",
                    autoscaling_group_name=group_name,
                    tag=aws.autoscaling.TagTagArgs(key=key, value=tags[key], propagate_at_launch=False),
                    opts=pulumi.ResourceOptions(parent=self),
                )
        self.register_outputs({"nodeGroupNames": [g.node_group_name for g in self.node_groups]})

    def _efa_launch(
        self, name: str, pool: GpuPool, ctx: NodeGroupContext, block: CapacityBlockLaunch | None
    ) -> EfaLaunch | None:
        """EFA interfaces for an interconnect pool, and its placement group."""
        if not efa_interfaces(pool):
            return None
        assert ctx.cluster_security_group_id is not None, "EFA pools run on EKS, whose context names it"
        # The cluster security group admits EFA traffic between the nodes from Kubernetes 1.33 (eksctl
        # EFABuiltInSupportVersion): it is the one group of every interface.
        groups = [ctx.cluster_security_group_id]
        interfaces = efa_layout(network_cards(pool.machine.name), ctx.efa_only)
        return EfaLaunch(interfaces, groups, groups, efa_placement_group(name, block is not None, self))


def gpu_node_pools(
    name: str,
    pools: Sequence[GpuPool],
    ctx: NodeGroupContext,
    pool_zones: Mapping[str, Sequence[int]],
    placement: pulumi.Resource,
    parent: pulumi.Resource,
) -> list[GpuNodePool]:
    """A GpuNodePool per pool, in the zones (private subnet indexes) that offer its types; every group waits
    for `placement`, the guard that keeps pools where they run."""
    gpu_ctx = dataclasses.replace(ctx, depends_on=[*ctx.depends_on, placement])
    return [
        GpuNodePool(
            pool_child_name(name, pool.spec.name),
            pool,
            gpu_ctx,
            pool_zones[pool.spec.name],
            opts=pulumi.ResourceOptions(parent=parent),
        )
        for pool in pools
    ]


def gpu_capacity_type(spec: GpuPoolSpec) -> str:
    if spec.capacity_reservation_id is not None:
        return "CAPACITY_BLOCK"
    return "SPOT" if spec.spot else "ON_DEMAND"


def node_group_resource_name(pool_resource_name: str, zone: int) -> str:
    return f"{pool_resource_name}-ng-{zone}"


def _autoscaling_group_name(resources: Sequence[aws.eks.outputs.NodeGroupResource]) -> str:
    """The Auto Scaling group EKS created for a managed node group (one per group)."""
    groups = resources[0].autoscaling_groups or []
    assert groups and groups[0].name, "EKS reports one Auto Scaling group per managed node group"
    return groups[0].name


def tag_resource_suffixes(tags: dict[str, str]) -> dict[str, str]:
    """A readable, stable and unique resource-name suffix for each template tag key.

    Keys that differ only in punctuation would read alike ("a.b" and "a-b"); those get a short hash.
    """
    suffixes: dict[str, str] = {}
    for key in sorted(tags):
        kind, _, rest = key.removeprefix("k8s.io/cluster-autoscaler/node-template/").partition("/")
        readable = f"{kind}-{re.sub(r'[^a-z0-9]+', '-', rest.lower()).strip('-')}"
        if readable in suffixes.values():
            readable += "-" + hashlib.sha256(key.encode()).hexdigest()[:8]
        suffixes[key] = readable
    return suffixes
