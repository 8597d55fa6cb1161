"""The GPU pools of a k3s cluster on EC2: a launch template and one Auto Scaling group per zone each, which
the cluster-autoscaler scales from zero, and the termination handler that drains spot nodes."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from gpu_k8s.components.cluster import GpuPool
from gpu_k8s.components.k3s.cloudinit import AgentNode, ImageCredentialProvider, agent_cloud_config
from gpu_k8s.components.k3s.control_plane import agent_taints
from gpu_k8s.components.spec import GpuPoolSpec
from gpu_k8s.providers.aws.autoscaling import (
    EFA_HUGE_PAGES,
    aws_node_template,
    scale_from_zero_tags,
    zone_limits,
)
from gpu_k8s.providers.aws.cloud_controller import cluster_owned_tag
from gpu_k8s.providers.aws.efa import (
    EFA_AGENT_SERVICE_SETTINGS,
    EFA_AGENT_SYSCTLS,
    EFA_PLUGIN_REGISTRY,
    efa_interfaces,
    efa_layout,
    network_cards,
)
from gpu_k8s.providers.aws.iam import cluster_autoscaler_tag
from gpu_k8s.providers.aws.k3s_bootstrap import (
    ECR_CREDENTIAL_PROVIDER_SCRIPT,
    IMDS_HOP_LIMIT,
    UBUNTU_ROOT_DEVICE,
    aws_node_bootstrap,
    ec2_user_data,
    ubuntu_ami,
)
from gpu_k8s.providers.aws.k3s_network import SecurityGroups
from gpu_k8s.providers.aws.location import cluster_tags
from gpu_k8s.providers.aws.network import Network
from gpu_k8s.providers.aws.nodes import (
    CAPACITY_BLOCK_MARKET,
    EfaLaunch,
    capacity_block_target,
    efa_network_interfaces,
    efa_placement,
    efa_placement_group,
    launch_tag_specifications,
)
from gpu_k8s.providers.aws.settings import Ec2K3sClusterSpec

CAPACITY_LABEL = "gpu-k8s.io/capacity-type"
AUTO_DISCOVERY_TAG = "k8s.io/cluster-autoscaler/enabled"
NTH_CHART = "aws-node-termination-handler"
NTH_CHART_VERSION = "0.27.6"
# Published only as an OCI artifact since 2024 (the chart's README at v1.25.6); aws/eks-charts' index stops
# at 0.21.0 (upstream/charts/sources.json has the evidence).
NTH_REPO = "oci://public.ecr.aws/aws-ec2/helm"


def efa_image_credentials() -> ImageCredentialProvider:
    """EFA agents pull the EFA device plugin from AWS's EKS registry with the node's ECR credentials."""
    return ImageCredentialProvider(
        name="ecr-credential-provider",
        match_images=(EFA_PLUGIN_REGISTRY,),
        script=ECR_CREDENTIAL_PROVIDER_SCRIPT.read_text(),
    )


def agent_labels(pool: GpuPool) -> dict[str, str]:
    """The pool's node labels plus its capacity type, which the termination handler selects spot nodes by."""
    if pool.spec.capacity_reservation_id is not None:
        capacity = "capacity-block"
    else:
        capacity = "spot" if pool.spec.spot else "on-demand"
    return {**pool.node_labels, CAPACITY_LABEL: capacity}


def asg_tags(cluster_name: str, pool: GpuPool, cluster_unneeded_time: str) -> dict[str, str]:
    """Auto-discovery tags (the autoscaler's policy may write only to groups tagged `owned`) and the pool's
    scale-from-zero template."""
    template = dataclasses.replace(
        aws_node_template(pool, cluster_unneeded_time, EFA_HUGE_PAGES), labels=agent_labels(pool)
    )
    return {
        AUTO_DISCOVERY_TAG: "true",
        cluster_autoscaler_tag(cluster_name): "owned",
        **scale_from_zero_tags(template),
    }


def agent_market_options(spec: GpuPoolSpec) -> aws.ec2.LaunchTemplateInstanceMarketOptionsArgs | None:
    if spec.capacity_reservation_id is not None:
        return CAPACITY_BLOCK_MARKET
    return aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type="spot") if spec.spot else None


def mixed_instances_policy(
    template: aws.ec2.LaunchTemplate, spec: GpuPoolSpec
) -> aws.autoscaling.GroupMixedInstancesPolicyArgs:
    """A pool of several instance types: on demand, the first that has capacity in the listed order (the
    `instanceType` first, which the autoscaler plans with); spot, the pools likeliest to last at the lowest
    price."""
    return aws.autoscaling.GroupMixedInstancesPolicyArgs(
        launch_template=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateArgs(
            launch_template_specification=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateLaunchTemplateSpecificationArgs(
                launch_template_id=template.id, version="$Latest"
            ),
            overrides=[
                aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideArgs(instance_type=name)
                for name in (spec.instance_type, *spec.extra_instance_types)
            ],
        ),
        instances_distribution=aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs(
            on_demand_base_capacity=0,
            on_demand_percentage_above_base_capacity=0 if spec.spot else 100,
            on_demand_allocation_strategy="prioritized",
            spot_allocation_strategy="price-capacity-optimized",
        ),
    )


def termination_handler_values() -> dict[str, object]:
    """IMDS mode on spot GPU nodes only: cordon and drain when EC2 announces an interruption, and on a
    rebalance recommendation, when the group's capacity rebalancing starts a replacement (NTH values.yaml:
    enableRebalanceDraining)."""
    return {
        "daemonsetNodeSelector": {CAPACITY_LABEL: "spot"},
        "enableSpotInterruptionDraining": True,
        "enableRebalanceDraining": True,
    }


def gpu_pool_groups(
    parent: pulumi.Resource,
    name: str,
    spec: Ec2K3sClusterSpec,
    pool: GpuPool,
    network: Network,
    groups: SecurityGroups,
    profile: aws.iam.InstanceProfile,
    secret: aws.secretsmanager.Secret,
    server_url: pulumi.Output[str],
    cluster_unneeded_time: str,
    zone_indexes: Sequence[int],
    boot_after: Sequence[pulumi.Resource],
) -> list[aws.autoscaling.Group]:
    """A launch template and one Auto Scaling group per zone for one GPU pool, its limits split over them.

    One zone per group: the autoscaler models a group's nodes in one zone, so a pod bound to a volume in
    another zone would never scale a multi-zone group up, and AZ rebalancing would terminate busy nodes.
    """
    child = pulumi.ResourceOptions(parent=parent)
    block = pool.spec.capacity_reservation_id
    several_types = bool(pool.spec.extra_instance_types)
    efa = efa_launch(parent, name, pool, network, groups, zone_indexes, block is not None)
    user_data = pulumi.Output.all(server_url, secret.arn).apply(
        lambda parts: ec2_user_data(
            agent_cloud_config(
                AgentNode(
                    k3s_version=spec.k3s.version,
                    server_url=parts[0],
                    secret_name=parts[1],
                    labels=agent_labels(pool),
                    taints=agent_taints(pool),
                    external_cloud_provider=True,
                    sysctls=EFA_AGENT_SYSCTLS if efa else {},
                    service_settings=EFA_AGENT_SERVICE_SETTINGS if efa else {},
                    image_credential_provider=efa_image_credentials() if efa else None,
                ),
                aws_node_bootstrap(),
            )
        )
    )
    template = aws.ec2.LaunchTemplate(
        f"{name}-lt",
        image_id=ubuntu_ami(pool.machine.arch, parent),
        # With several types, the group's mixed instances policy names them and buys the spot.
        instance_type=None if several_types else pool.machine.name,
        iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=profile.arn),
        # With EFA, the groups go on each interface instead.
        vpc_security_group_ids=None if efa else [groups.nodes.id],
        network_interfaces=efa_network_interfaces(efa) if efa else None,
        placement=efa_placement(efa),
        block_device_mappings=[
            aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name=UBUNTU_ROOT_DEVICE,
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    volume_size=pool.spec.disk_size_gib,
                    volume_type="gp3",
                    encrypted="true",
                    delete_on_termination="true",
                ),
            )
        ],
        metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
            http_endpoint="enabled",
            http_tokens="required",
            http_put_response_hop_limit=IMDS_HOP_LIMIT,
        ),
        instance_market_options=None if several_types else agent_market_options(pool.spec),
        capacity_reservation_specification=capacity_block_target(block) if block is not None else None,
        user_data=user_data,
        update_default_version=True,
        tag_specifications=launch_tag_specifications(
            {
                **cluster_tags(spec.name),
                **cluster_owned_tag(spec.name),
                "Name": f"{spec.name}-gpu-{pool.spec.name}",
            }
        ),
        opts=child,
    )
    tags = [
        aws.autoscaling.GroupTagArgs(key=key, value=value, propagate_at_launch=False)
        for key, value in sorted(asg_tags(spec.name, pool, cluster_unneeded_time).items())
    ]
    return [
        aws.autoscaling.Group(
            f"{name}-asg-{limits.zone_index}",
            min_size=limits.min_nodes,
            max_size=limits.max_nodes,
            vpc_zone_identifiers=[network.private_subnet_ids[limits.zone_index]],
            launch_template=(
                None
                if several_types
                else aws.autoscaling.GroupLaunchTemplateArgs(id=template.id, version="$Latest")
            ),
            mixed_instances_policy=mixed_instances_policy(template, pool.spec) if several_types else None,
            # Spot: replace a node at risk of interruption before it is taken.
            capacity_rebalance=pool.spec.spot,
            # One zone per group: nothing to rebalance, and rebalancing terminates running nodes.
            suspended_processes=["AZRebalance"],
            tags=tags,
            # The autoscaler owns the size.
            opts=pulumi.ResourceOptions(
                parent=parent, depends_on=list(boot_after), ignore_changes=["desiredCapacity"]
            ),
        )
        for limits in zone_limits(pool.spec.min_nodes, pool.spec.max_nodes, zone_indexes)
    ]


def efa_launch(
    parent: pulumi.Resource,
    name: str,
    pool: GpuPool,
    network: Network,
    groups: SecurityGroups,
    zone_indexes: Sequence[int],
    in_capacity_block: bool,
) -> EfaLaunch | None:
    """EFA interfaces in the pool's one subnet (an EFA pool keeps to one zone: `zone_plan`), the node's
    own group on the primary and the EFA group on all, and the pool's placement group. EFA-only
    interfaces: flannel uses the primary interface alone, and they take no address from the subnet."""
    if not efa_interfaces(pool):
        return None
    assert groups.efa is not None and len(zone_indexes) == 1, "made for clusters with EFA pools"
    return EfaLaunch(
        efa_layout(network_cards(pool.machine.name), efa_only=True),
        primary_security_group_ids=[groups.nodes.id, groups.efa.id],
        efa_security_group_ids=[groups.efa.id],
        placement_group=efa_placement_group(name, in_capacity_block, parent),
        subnet_id=network.private_subnet_ids[zone_indexes[0]],
    )
