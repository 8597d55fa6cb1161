"""The GPU layer on an EKS cluster made elsewhere, named in `gpu-k8s:gpuLayer`: GPU node pools that start
empty and scale to zero (one managed node group per zone, with scale-from-zero tags), the GPU Operator with
each pool's sharing, and the cluster-autoscaler. The cluster, its network, its other nodes and its add-ons
stay as they are; destroying the stack removes only what it added.

What the cluster must already have (the layer cannot check it before creating anything; examples/existing-eks
says how to check): the EKS Pod Identity Agent add-on (the autoscaler's AWS role reaches it that way), an
access entry that lets whoever runs `pulumi up` administer it, and no cluster-autoscaler or Karpenter of its
own managing node groups tagged for auto-discovery.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import pulumi
import pulumi_aws as aws
from pydantic import Field

from gpu_k8s.components.autoscaler import (
    ClusterAutoscaler,
    ClusterAutoscalerArgs,
    cluster_scale_down_unneeded_time,
)
from gpu_k8s.components.catalog import Catalog, load_catalog
from gpu_k8s.components.cluster import GpuCluster, GpuPool, platform_issues, resolve_pools
from gpu_k8s.components.compat import (
    GPU_OPERATOR_CHART_VERSION,
    AddonVersions,
    addon_issues,
    cuda_version_issue,
)
from gpu_k8s.components.configbase import (
    CONFIG_NAMESPACE,
    ConfigIssue,
    StrictModel,
    config_path,
    config_root,
    raise_if_any,
    stack_config_object,
)
from gpu_k8s.components.gpu_operator import GpuOperator, GpuOperatorArgs
from gpu_k8s.components.kubeconfig import kubernetes_provider
from gpu_k8s.components.spec import (
    SUPPORTED_KUBERNETES_MINORS,
    CudaRelease,
    GpuPoolSpec,
    PoolRules,
    gpu_pool_issues,
    minor_key,
    parse_structure,
)
from gpu_k8s.providers.aws.autoscaling import (
    EKS_EFA_HUGE_PAGES,
    AutoscalerIdentity,
    asg_tag_issues,
    autoscaler_cloud_values,
    aws_node_template,
    scale_from_zero_tags,
)
from gpu_k8s.providers.aws.efa import install_efa_device_plugin
from gpu_k8s.providers.aws.eks import EKS_ASG_TAGS, EKS_TRAITS, node_group_issues, render_kubeconfig
from gpu_k8s.providers.aws.iam import (
    EKS_NODE_POLICIES,
    cluster_autoscaler_tag,
    role_with_policies,
    service_trust_policy,
)
from gpu_k8s.providers.aws.location import aws_provider, cluster_tags, region_from_config
from gpu_k8s.providers.aws.nodes import NodeGroupContext, gpu_node_pools
from gpu_k8s.providers.aws.settings import AWS_POOL_RULES, AWS_SUBNET_ID, AwsNetwork
from gpu_k8s.providers.aws.zones import (
    Zone,
    ZonePlan,
    offering_issues,
    placement_guard,
    zone_issues,
    zone_plan,
)

GPU_LAYER = "gpuLayer"
# The EKS API's ClusterName shape (botocore's eks service model): 1-100 characters, a letter or digit
# first, then letters, digits, hyphens and underscores.
EKS_CLUSTER_NAME = re.compile(r"[0-9A-Za-z][A-Za-z0-9\-_]{0,99}")
GPU_LAYER_KEY = f"{CONFIG_NAMESPACE}:{GPU_LAYER}"


class ExistingEksSpec(StrictModel):
    """`gpu-k8s:gpuLayer`: the GPU layer for an EKS cluster that exists."""

    # The EKS cluster's name (its id in the EKS API).
    cluster: str
    # Private subnets for the GPU nodes, in the cluster's VPC, one per zone (required: the cluster's own
    # subnets often include public ones).
    subnet_ids: tuple[str, ...] = ()
    gpu_pools: Annotated[tuple[GpuPoolSpec, ...], Field(min_length=1)]
    addon_versions: AddonVersions = AddonVersions()
    cuda: CudaRelease = None

    pool_rules: ClassVar[PoolRules] = AWS_POOL_RULES

    @property
    def api_access_cidrs(self) -> tuple[str, ...]:
        """None: the cluster's endpoint is not this layer's to guard."""
        return ()


def load_existing_eks(raw: object, catalog: Catalog) -> ExistingEksSpec:
    """Parse and validate `gpu-k8s:gpuLayer`; a ConfigError naming every problem under that key."""
    with config_root(GPU_LAYER_KEY):
        spec = parse_structure(raw, ExistingEksSpec)
        raise_if_any(
            _layer_issues(spec),
            _cuda_issues(spec),
            addon_issues(spec.addon_versions),
            gpu_pool_issues(spec.gpu_pools, spec.pool_rules, catalog),
        )
    return spec


def _layer_issues(spec: ExistingEksSpec) -> Iterable[ConfigIssue]:
    """The cluster's name as EKS names clusters, and subnet IDs as EC2 writes them, each once."""
    if not EKS_CLUSTER_NAME.fullmatch(spec.cluster):
        yield ConfigIssue(
            config_path("cluster"),
            spec.cluster,
            "is not an EKS cluster name (1-100 letters, digits, hyphens and underscores, starting with a "
            "letter or digit)",
            "use the name `aws eks list-clusters` shows",
        )
    if not spec.subnet_ids:
        yield ConfigIssue(
            config_path("subnetIds"),
            None,
            "is required: the cluster's own subnets often include public ones, where a GPU node group fails "
            "or its nodes get public addresses",
            "list the private subnets of the cluster's VPC the GPU nodes go in, one per zone (aws ec2 "
            "describe-route-tables: a private subnet's routes lead to a NAT gateway, not an internet "
            "gateway)",
        )
    seen: set[str] = set()
    for index, subnet in enumerate(spec.subnet_ids):
        where = config_path("subnetIds", index)
        if not AWS_SUBNET_ID.fullmatch(subnet):
            yield ConfigIssue(
                where, subnet, "not a subnet ID", "use subnet IDs, e.g. subnet-0a1b2c3d4e5f60718"
            )
        elif subnet in seen:
            yield ConfigIssue(where, subnet, "listed twice", "list each subnet once")
        seen.add(subnet)


def _one_subnet_per_zone(subnet_ids: Sequence[str], zones: Sequence[Zone]) -> Iterable[ConfigIssue]:
    """A pool keeps one node group per listed subnet: two subnets of one zone would make two alike groups
    there, which the autoscaler balances as if they were two zones."""
    first: dict[str, str] = {}
    for index, (subnet, zone) in enumerate(zip(subnet_ids, zones, strict=True)):
        if zone.zone_id in first:
            yield ConfigIssue(
                config_path("subnetIds", index),
                subnet,
                f"is in {zone.name} ({zone.zone_id}), like {first[zone.zone_id]}",
                "list one subnet per zone",
            )
        first.setdefault(zone.zone_id, subnet)


def _cuda_issues(spec: ExistingEksSpec) -> Iterable[ConfigIssue]:
    issue = cuda_version_issue(config_path("cuda"), spec.cuda) if spec.cuda is not None else None
    return [issue] if issue else []


@dataclass(frozen=True)
class ExistingCluster:
    """What EKS says about the cluster the layer joins."""

    name: str
    minor: str
    endpoint: str
    ca_data: str
    vpc_id: str
    subnet_ids: tuple[str, ...]
    security_group_id: str


def existing_cluster(name: str, invoke: pulumi.InvokeOptions) -> ExistingCluster:
    found = aws.eks.get_cluster(name=name, opts=invoke)
    return ExistingCluster(
        name=found.name,
        minor=".".join(found.version.split(".")[:2]),
        endpoint=found.endpoint,
        ca_data=found.certificate_authorities[0].data,
        vpc_id=found.vpc_config.vpc_id,
        subnet_ids=tuple(found.vpc_config.subnet_ids),
        security_group_id=found.vpc_config.cluster_security_group_id,
    )


def existing_cluster_issues(cluster: ExistingCluster) -> Iterable[ConfigIssue]:
    if cluster.minor not in SUPPORTED_KUBERNETES_MINORS:
        newer = minor_key(cluster.minor) > minor_key(SUPPORTED_KUBERNETES_MINORS[-1])
        yield ConfigIssue(
            f"{GPU_LAYER_KEY}.cluster",
            cluster.name,
            f"runs Kubernetes {cluster.minor}; the pinned GPU Operator {GPU_OPERATOR_CHART_VERSION} supports "
            f"{SUPPORTED_KUBERNETES_MINORS[0]}-{SUPPORTED_KUBERNETES_MINORS[-1]} only",
            "use a gpu-k8s release whose GPU Operator supports it (EKS clusters cannot be downgraded)"
            if newer
            else "upgrade the cluster first (aws eks update-cluster-version)",
        )


@dataclass(frozen=True)
class ExistingEksGpuLayerArgs:
    """Inputs of the ExistingEksGpuLayer component: the validated layer, the cluster as EKS describes it,
    the GPU nodes' subnets and the zones offering each pool's types there."""

    spec: ExistingEksSpec
    cluster: ExistingCluster
    region: str
    network: AwsNetwork
    zones: ZonePlan
    pools: tuple[GpuPool, ...]
    # What every GPU node group waits for: the guard that keeps pools in their zones.
    placement: pulumi.Resource


def layer_tag(layer: str) -> str:
    """The tag of the layer's own Auto Scaling groups. EKS tags every managed node group of a cluster for
    auto-discovery (`k8s.io/cluster-autoscaler/enabled`, `k8s.io/cluster-autoscaler/<cluster>`): an
    autoscaler that discovered by those would adopt, and scale down, the cluster's other node groups."""
    return f"gpu-k8s.io/autoscale/{layer}"


def layer_autoscaler_values(layer: str, cluster_name: str, region: str) -> dict[str, Any]:
    """The AWS autoscaler values, discovering the layer's groups of this cluster only (chart
    autoDiscovery.tags: every tag listed must be on a group): the cluster's tag, which EKS sets on every
    managed node group of the cluster, and the layer's, which another layer of that name on another cluster
    of the account also sets."""
    values = autoscaler_cloud_values(cluster_name, region)
    tags = [cluster_autoscaler_tag(cluster_name), layer_tag(layer)]
    return {**values, "autoDiscovery": {**values["autoDiscovery"], "tags": tags}}


class ExistingEksGpuLayer(pulumi.ComponentResource):
    """GPU node pools, the GPU Operator and the cluster-autoscaler on an EKS cluster made elsewhere."""

    handle: GpuCluster

    def __init__(self, name: str, args: ExistingEksGpuLayerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-k8s:aws:ExistingEksGpuLayer", name, None, opts)
        cluster, child = args.cluster, pulumi.ResourceOptions(parent=self)
        node_role = role_with_policies(
            f"{name}-node",
            service_trust_policy("ec2.amazonaws.com"),
            EKS_NODE_POLICIES,
            parent=self,
            session_manager=True,
        )
        ctx = NodeGroupContext(
            cluster_name=cluster.name,
            kubernetes_version=cluster.minor,
            node_role_arn=node_role.arn,
            subnet_ids=list(args.network.private_subnet_ids),
            depends_on=list(node_role.grants),
            cluster_unneeded_time=cluster_scale_down_unneeded_time(args.pools),
            launch_tags=cluster_tags(cluster.name),
            cluster_security_group_id=cluster.security_group_id,
            discovery_tags={layer_tag(name): "owned"},
            efa_only=False,
        )
        gpu_node_pools(name, args.pools, ctx, args.zones.pool_zones, args.placement, self)
        kubeconfig = pulumi.Output.secret(
            render_kubeconfig(cluster.name, cluster.endpoint, cluster.ca_data, args.region)
        )
        self.handle = GpuCluster(
            name=cluster.name,
            kubernetes_version=cluster.minor,
            kubeconfig=kubeconfig,
            k8s_provider=kubernetes_provider(f"{name}-k8s", kubeconfig, cluster.ca_data, opts=child),
            pools=args.pools,
            traits=EKS_TRAITS,
            # The cluster's own nodes run the operator and the autoscaler.
            system_ready=[],
            system_nodes=0,
        )
        identity = AutoscalerIdentity(
            f"{name}-autoscaler-identity", cluster.name, cluster.name, opts=child, scope_tag=layer_tag(name)
        )
        operator = GpuOperator(
            f"{name}-gpu-operator",
            GpuOperatorArgs(self.handle, args.spec.addon_versions.gpu_operator),
            opts=child,
        )
        ClusterAutoscaler(
            f"{name}-autoscaler",
            ClusterAutoscalerArgs(
                cluster=self.handle,
                chart_version=args.spec.addon_versions.cluster_autoscaler,
                cloud_values=layer_autoscaler_values(name, cluster.name, args.region),
                identity=[identity.association],
                node_selector={},
            ),
            opts=child,
        )
        install_efa_device_plugin(name, self.handle, child)
        self.handle = dataclasses.replace(self.handle, gpu_operator=operator)
        self.register_outputs({"clusterName": cluster.name, "kubeconfig": kubeconfig})


def build_existing_eks_gpu_layer(name: str, raw: object | None = None) -> GpuCluster:
    """Everything the layer creates on the cluster `gpu-k8s:gpuLayer` names (or `raw`, the same value),
    validated before the first resource but the AWS provider, which the questions to EKS need."""
    catalog = load_catalog()
    region = region_from_config()
    spec = load_existing_eks(
        stack_config_object(
            GPU_LAYER, "write the layer's keys indented under it, as in examples/existing-eks"
        )
        if raw is None
        else raw,
        catalog,
    )
    with config_root(GPU_LAYER_KEY):
        raise_if_any(offering_issues(spec.gpu_pools, region, catalog))
    provider = aws_provider(name, region)
    invoke = pulumi.InvokeOptions(provider=provider)
    cluster = existing_cluster(spec.cluster, invoke)
    raise_if_any(existing_cluster_issues(cluster))
    network = AwsNetwork(vpc_id=cluster.vpc_id, private_subnet_ids=spec.subnet_ids)
    zones = zone_plan(network, spec.gpu_pools, invoke)
    with config_root(GPU_LAYER_KEY):
        raise_if_any(
            _one_subnet_per_zone(spec.subnet_ids, zones.zones),
            zone_issues(network, spec.gpu_pools, zones),
            node_group_issues(name, spec.gpu_pools, len(network.private_subnet_ids), catalog),
            platform_issues(spec, EKS_TRAITS, catalog),
        )
        pools = resolve_pools(spec, catalog, EKS_TRAITS)
        unneeded_time = cluster_scale_down_unneeded_time(pools)
        raise_if_any(
            asg_tag_issues(
                pools,
                lambda pool: scale_from_zero_tags(aws_node_template(pool, unneeded_time, EKS_EFA_HUGE_PAGES)),
                EKS_ASG_TAGS + 1,  # and the layer's tag
            )
        )
        placement = placement_guard(name, spec.gpu_pools, zones)
    layer = ExistingEksGpuLayer(
        name,
        ExistingEksGpuLayerArgs(spec, cluster, region, network, zones, pools, placement),
        opts=pulumi.ResourceOptions(providers=[provider]),
    )
    return layer.handle
