"""Managed EKS with GPU node groups: `build` is what `pulumi up -s aws-eks` runs."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from gpu_k8s.components.autoscaler import cluster_scale_down_unneeded_time, install_gpu_addons
from gpu_k8s.components.catalog import Catalog, load_catalog
from gpu_k8s.components.cluster import GpuCluster, PlatformTraits, platform_issues, resolve_pools
from gpu_k8s.components.compat import DriverFacts, DriverVersion
from gpu_k8s.components.configbase import ConfigIssue, config_path, raise_if_any
from gpu_k8s.components.kubeconfig import exec_kubeconfig, kubernetes_provider
from gpu_k8s.components.prices import aws_pool_node_price
from gpu_k8s.components.spec import SUPPORTED_KUBERNETES_MINORS, GpuPoolSpec, minor_key, pool_child_name
from gpu_k8s.providers.aws import addons
from gpu_k8s.providers.aws.autoscaling import (
    ACCELERATOR_LABEL,
    EKS_EFA_HUGE_PAGES,
    AutoscalerIdentity,
    asg_tag_issues,
    autoscaler_cloud_values,
    aws_node_template,
    scale_from_zero_tags,
)
from gpu_k8s.providers.aws.efa import install_efa_device_plugin
from gpu_k8s.providers.aws.iam import (
    EKS_CLUSTER_POLICIES,
    EKS_NODE_POLICIES,
    log_group_key_policy,
    role_with_policies,
    secrets_encryption_policy,
    service_trust_policy,
)
from gpu_k8s.providers.aws.location import aws_provider, cluster_tags, region_from_config
from gpu_k8s.providers.aws.network import Network
from gpu_k8s.providers.aws.nodes import (
    AL2023_NVIDIA_DRIVER_BRANCH,
    AL2023_NVIDIA_FAMILIES,
    LATEST_IMAGE_RELEASE,
    NodeGroupContext,
    gpu_node_pools,
    node_group_resource_name,
    system_node_group,
)
from gpu_k8s.providers.aws.settings import EFS_STORAGE, EksClusterSpec
from gpu_k8s.providers.aws.shared_storage import EfsSharedStorage, EfsSharedStorageArgs, efs_csi_addon
from gpu_k8s.providers.aws.zones import ZonePlan, offering_issues, placement_guard, zone_issues, zone_plan

CONTROL_PLANE_LOG_TYPES = ("api", "audit", "authenticator", "controllerManager", "scheduler")
CLUSTER_ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
LOG_RETENTION_DAYS = 90
# "The node group name can't be longer than 63 characters" (pulumi_aws eks.NodeGroup docstring);
# Pulumi's auto-name appends "-" and 7 random characters.
MAX_NODE_GROUP_NAME = 63
AUTONAME_SUFFIX = 8

EKS_TRAITS = PlatformTraits(
    driver=DriverFacts(owner="node-image", version=DriverVersion.parse(AL2023_NVIDIA_DRIVER_BRANCH)),
    toolkit_preinstalled=True,
    accelerator_label=ACCELERATOR_LABEL,
)

# Tags EKS puts on each managed node group's Auto Scaling group itself: eks:cluster-name, eks:nodegroup-name,
# k8s.io/cluster-autoscaler/enabled, k8s.io/cluster-autoscaler/<cluster>, kubernetes.io/cluster/<cluster>
# (UNCONFIRMED against an EKS document; the scale-from-zero tags go next to them).
EKS_ASG_TAGS = 5


# An IAM role or user (access entries take no assumed-role session ARNs; EKS CreateAccessEntry): a path of
# segments, then the name, at most 64 characters for either (IAM quotas: role and user names).
IAM_PRINCIPAL_ARN = re.compile(
    r"^arn:(aws[a-z-]*):iam::\d{12}:(role|user)/((?:[\w+=,.@-]+/)*)([\w+=,.@-]{1,64})$", re.ASCII
)
# The only partition a stack runs in (providers/aws/location.py refuses the others' regions).
STACK_PARTITION = "aws"


def admin_slug(arn: str) -> str:
    """A stable resource-name part for an admin principal: its kind, name and a short hash of the ARN."""
    match = IAM_PRINCIPAL_ARN.match(arn)
    assert match is not None, "validated by eks_issues"
    name = re.sub(r"[^a-z0-9]+", "-", match.group(4).lower()).strip("-")
    return f"{match.group(2)}-{name}-{hashlib.sha256(arn.encode()).hexdigest()[:6]}"


def _admin_issues(admins: Sequence[str]) -> Iterable[ConfigIssue]:
    # IAM names are unique ignoring case: two spellings are one principal.
    seen: dict[str, int] = {}
    for index, arn in enumerate(admins):
        path = config_path("eks", "admins", index)
        match = IAM_PRINCIPAL_ARN.match(arn)
        if match is None:
            yield ConfigIssue(
                path,
                arn,
                "not the ARN of an IAM role or user (a name of 1-64 characters after role/ or user/)",
                "write arn:aws:iam::<account>:role/<name> (for an assumed-role session, its role's ARN)",
            )
            continue
        if match.group(1) != STACK_PARTITION:
            yield ConfigIssue(
                path,
                arn,
                f"is in partition {match.group(1)}, but the stack's region is in {STACK_PARTITION}",
                f"use the principal's ARN in {STACK_PARTITION} (arn:{STACK_PARTITION}:iam::...)",
            )
        key = arn.lower()
        if key in seen:
            yield ConfigIssue(
                path,
                arn,
                f"is the principal of eks.admins[{seen[key]}] (IAM names ignore case)",
                "list each principal once",
            )
        seen.setdefault(key, index)


def eks_issues(spec: EksClusterSpec, catalog: Catalog) -> Iterable[ConfigIssue]:
    """What the generic validation cannot know: the admin principals, EKS's node group name limit and which
    GPU types the EKS NVIDIA AMIs cover."""
    yield from _admin_issues(spec.eks.admins)
    yield from _image_release_issues(spec.eks.node_image_release, spec.kubernetes_version)
    net = spec.network
    zones = net.availability_zones if net.creates_vpc else len(net.private_subnet_ids)
    yield from node_group_issues(spec.name, spec.gpu_pools, zones, catalog)


# An EKS AMI release as EKS's public SSM parameter and DescribeNodegroup print it: "<minor>.<patch>-<date>".
IMAGE_RELEASE = re.compile(r"(\d+\.\d+)\.\d+-\d{8}", re.ASCII)


def _image_release_issues(release: str | None, kubernetes_version: str) -> Iterable[ConfigIssue]:
    if release is None or release == LATEST_IMAGE_RELEASE:
        return
    match = IMAGE_RELEASE.fullmatch(release)
    where = config_path("eks", "nodeImageRelease")
    if match is None:
        yield ConfigIssue(
            where,
            release,
            "is not an EKS AMI release",
            f"write one as EKS prints it, e.g. {kubernetes_version}.2-20261110 (aws ssm get-parameter --name "
            f"/aws/service/eks/optimized-ami/{kubernetes_version}/amazon-linux-2023/x86_64/nvidia/recommended/"
            f"release_version), or {LATEST_IMAGE_RELEASE}",
        )
    elif match.group(1) != kubernetes_version:
        yield ConfigIssue(
            where,
            release,
            f"is a release for Kubernetes {match.group(1)}, and kubernetesVersion is {kubernetes_version}",
            "move both together, or remove nodeImageRelease when you change kubernetesVersion",
        )


def node_group_issues(
    cluster_name: str, pools: Sequence[GpuPoolSpec], zones: int, catalog: Catalog
) -> Iterable[ConfigIssue]:
    """GPU pools EKS cannot run as managed node groups of `cluster_name` in `zones` zones: names past EKS's
    limit, instance types the EKS NVIDIA AMIs do not cover."""
    for index, pool in enumerate(pools):
        node_group_name = node_group_resource_name(pool_child_name(cluster_name, pool.name), zones - 1)
        if len(node_group_name) + AUTONAME_SUFFIX > MAX_NODE_GROUP_NAME:
            room = MAX_NODE_GROUP_NAME - AUTONAME_SUFFIX - len(node_group_name) + len(pool.name)
            yield ConfigIssue(
                config_path("gpuPools", index, "name"),
                pool.name,
                f'makes the node group name "{node_group_name}" plus its random suffix longer than '
                f"{MAX_NODE_GROUP_NAME} characters",
                f"shorten the pool name to at most {room} characters (or the cluster name)",
            )
        machine = catalog.machine_type("aws", pool.instance_type)
        assert machine is not None, "validated by load_spec"
        where = {
            config_path("gpuPools", index, "instanceType"): pool.instance_type,
            **{
                config_path("gpuPools", index, "extraInstanceTypes", extra): name
                for extra, name in enumerate(pool.extra_instance_types)
            },
        }
        for path, instance_type in where.items():
            family = instance_type.split(".")[0]
            if family not in AL2023_NVIDIA_FAMILIES[machine.arch]:
                covered = ", ".join(sorted(AL2023_NVIDIA_FAMILIES[machine.arch]))
                yield ConfigIssue(
                    path,
                    instance_type,
                    f"the EKS AL2023 NVIDIA AMI (driver {AL2023_NVIDIA_DRIVER_BRANCH}) "
                    f"does not cover the {family} family",
                    f"use one of the covered families: {covered}",
                )


def render_kubeconfig(cluster_name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig that authenticates with `aws eks get-token`."""
    return exec_kubeconfig(
        cluster_name,
        endpoint,
        ca_data,
        {
            "command": "aws",
            "args": [
                "eks",
                "get-token",
                "--cluster-name",
                cluster_name,
                "--region",
                region,
                "--output",
                "json",
            ],
        },
    )


@dataclass(frozen=True)
class EksClusterArgs:
    spec: EksClusterSpec
    region: str
    catalog: Catalog
    zones: ZonePlan
    # What every GPU node group waits for: the guard that keeps pools in their zones.
    placement: pulumi.Resource


class EksCluster(pulumi.ComponentResource):
    """An EKS control plane, its network, the system and GPU node groups, add-ons and default storage."""

    handle: GpuCluster
    autoscaler_identity: AutoscalerIdentity

    def __init__(self, name: str, args: EksClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-k8s:aws:EksCluster", name, None, opts)
        spec, child = args.spec, pulumi.ResourceOptions(parent=self)
        network = Network(
            f"{name}-network",
            spec.name,
            spec.network,
            args.region,
            [z.name for z in args.zones.zones],
            opts=child,
        )

        secrets_key = aws.kms.Key(
            f"{name}-secrets-key",
            description=f"Envelope encryption of Kubernetes secrets in EKS cluster {spec.name}",
            enable_key_rotation=True,
            opts=child,
        )
        # Created first so Pulumi owns the retention instead of EKS creating a never-expiring group. The API
        # server's audit log names users, roles and request paths: it is encrypted with a key of its own that
        # CloudWatch Logs may use for this group only (security.md, control-plane log group).
        log_group_name = f"/aws/eks/{spec.name}/cluster"
        account_id = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=self)).account_id
        log_key = aws.kms.Key(
            f"{name}-control-plane-logs-key",
            description=f"Encryption of EKS cluster {spec.name}'s control-plane log group",
            enable_key_rotation=True,
            policy=account_id.apply(
                lambda account: json.dumps(log_group_key_policy(account, args.region, log_group_name))
            ),
            opts=child,
        )
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-control-plane-logs",
            name=log_group_name,
            retention_in_days=LOG_RETENTION_DAYS,
            kms_key_id=log_key.arn,
            opts=child,
        )
        cluster_role = role_with_policies(
            f"{name}-cluster", service_trust_policy("eks.amazonaws.com"), EKS_CLUSTER_POLICIES, parent=self
        )
        key_access = aws.iam.RolePolicy(
            f"{name}-cluster-secrets-key",
            role=cluster_role.role.id,
            policy=secrets_key.arn.apply(lambda arn: json.dumps(secrets_encryption_policy(arn))),
            opts=pulumi.ResourceOptions(parent=cluster_role.role),
        )
        cluster = aws.eks.Cluster(
            f"{name}-eks",
            name=spec.name,
            version=spec.kubernetes_version,
            role_arn=cluster_role.arn,
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=network.private_subnet_ids,
                endpoint_private_access=True,
                endpoint_public_access=True,
                public_access_cidrs=list(spec.api_access_cidrs),
            ),
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API",
                # The deployer gets an explicit, reviewable access entry below instead.
                bootstrap_cluster_creator_admin_permissions=False,
            ),
            # CNI, kube-proxy and CoreDNS come back as managed add-ons, so upgrades are Pulumi's.
            bootstrap_self_managed_addons=False,
            encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=secrets_key.arn),
                resources=["secrets"],
            ),
            enabled_cluster_log_types=list(CONTROL_PLANE_LOG_TYPES),
            # Standard support only: a minor past it is upgraded by AWS instead of running on (and billing)
            # extended support unnoticed (EKS UpgradePolicyRequest.supportType).
            upgrade_policy=aws.eks.ClusterUpgradePolicyArgs(support_type="STANDARD"),
            deletion_protection=spec.eks.deletion_protection,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[log_group, *cluster_role.grants, key_access]
            ),
        )
        admin_access = self._admin_access(name, cluster.name, spec.eks.admins)

        pools = resolve_pools(spec, args.catalog, EKS_TRAITS)
        version = spec.kubernetes_version
        pre_node_addons = [addons.addon(name, a, cluster.name, version, self) for a in addons.PRE_NODE_ADDONS]
        node_role = role_with_policies(
            f"{name}-node",
            service_trust_policy("ec2.amazonaws.com"),
            EKS_NODE_POLICIES,
            parent=self,
            session_manager=True,
        )
        ctx = NodeGroupContext(
            cluster_name=cluster.name,
            kubernetes_version=spec.kubernetes_version,
            node_role_arn=node_role.arn,
            subnet_ids=network.private_subnet_ids,
            depends_on=[*pre_node_addons, *node_role.grants],
            cluster_unneeded_time=cluster_scale_down_unneeded_time(pools),
            launch_tags=cluster_tags(spec.name),
            cluster_security_group_id=cluster.vpc_config.cluster_security_group_id,
            image_release=spec.eks.node_image_release,
        )
        system_nodes = system_node_group(f"{name}-system", spec.system_pool, ctx, parent=self)
        coredns = addons.addon(name, "coredns", cluster.name, version, self, depends_on=[system_nodes])
        # Node auto-repair acts on what this agent reports besides NotReady: GPU Xid errors (from kernel
        # logs), kernel, network and storage faults (aws/eks-node-monitoring-agent README). Its agent runs on
        # every node, GPU ones included; its DCGM server tolerates no taint, so DCGM's own health checks do
        # not run on the tainted GPU nodes (the add-on's dcgmAgent.tolerations would change that; the live
        # add-on's configuration schema is UNCONFIRMED here, so it is left at its default).
        addons.addon(
            name, addons.NODE_MONITORING_ADDON, cluster.name, version, self, depends_on=[system_nodes]
        )
        ebs_csi = addons.ebs_csi_driver(
            name, cluster.name, version, self, [system_nodes, *pre_node_addons], spec.name
        )

        gpu_node_pools(name, pools, ctx, args.zones.pool_zones, args.placement, self)

        kubeconfig: pulumi.Output[str] = pulumi.Output.secret(
            pulumi.Output.all(cluster.name, cluster.endpoint, cluster.certificate_authority.data).apply(
                lambda parts: render_kubeconfig(parts[0], parts[1], parts[2], args.region)
            )
        )
        k8s_provider = kubernetes_provider(
            f"{name}-k8s", kubeconfig, cluster.certificate_authority.data, opts=child
        )
        system_ready = [system_nodes, coredns, *admin_access]
        addons.default_storage_class(name, ebs_csi, k8s_provider, self, system_ready)
        shared_storage = None
        if spec.storage.shared == EFS_STORAGE:
            efs_driver = efs_csi_addon(name, cluster.name, version, self, system_ready, spec.name)
            shared_storage = EfsSharedStorage(
                f"{name}-efs",
                EfsSharedStorageArgs(
                    network,
                    args.zones.zones,
                    cluster.vpc_config.cluster_security_group_id,
                    k8s_provider,
                    [efs_driver, *system_ready],
                ),
                opts=child,
            ).summary
        self.autoscaler_identity = AutoscalerIdentity(
            f"{name}-autoscaler-identity", cluster.name, spec.name, opts=child
        )

        self.handle = GpuCluster(
            name=spec.name,
            kubernetes_version=spec.kubernetes_version,
            kubeconfig=kubeconfig,
            k8s_provider=k8s_provider,
            pools=pools,
            traits=EKS_TRAITS,
            system_ready=system_ready,
            system_nodes=spec.system_pool.nodes,
            shared_storage=shared_storage,
        )
        self.register_outputs(
            {"clusterName": cluster.name, "endpoint": cluster.endpoint, "kubeconfig": kubeconfig}
        )

    def _admin_access(
        self, name: str, cluster_name: pulumi.Output[str], admins: Sequence[str]
    ) -> list[aws.eks.AccessPolicyAssociation]:
        """Cluster-admin access entries: for `eks.admins`, or else for whoever runs `pulumi up` (the IAM role
        behind an assumed-role session)."""
        if not admins:
            invoke = pulumi.InvokeOutputOptions(parent=self)
            caller = aws.get_caller_identity_output(opts=invoke)
            principal = aws.iam.get_session_context_output(arn=caller.arn, opts=invoke).issuer_arn
            return [self._cluster_admin(f"{name}-deployer", cluster_name, principal)]
        return [self._cluster_admin(f"{name}-admin-{admin_slug(arn)}", cluster_name, arn) for arn in admins]

    def _cluster_admin(
        self, prefix: str, cluster_name: pulumi.Output[str], principal: pulumi.Input[str]
    ) -> aws.eks.AccessPolicyAssociation:
        entry = aws.eks.AccessEntry(
            f"{prefix}-access",
            cluster_name=cluster_name,
            principal_arn=principal,
            type="STANDARD",
            opts=pulumi.ResourceOptions(parent=self),
        )
        return aws.eks.AccessPolicyAssociation(
            f"{prefix}-admin",
            cluster_name=cluster_name,
            principal_arn=entry.principal_arn,
            policy_arn=CLUSTER_ADMIN_POLICY,
            access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
            opts=pulumi.ResourceOptions(parent=self),
        )


def running_version_issues(spec: EksClusterSpec, invoke: pulumi.InvokeOptions) -> Iterable[ConfigIssue]:
    """The stack's cluster, where it already runs, on a newer minor than `kubernetesVersion`: with standard
    support only, AWS upgrades a cluster itself at the end of its minor's standard support (review-aws.md
    AN-B7), and EKS cannot go back a minor, so the `up` would fail on the cluster after changing other
    things. Asked at preview, like the zones: a cluster that does not exist yet is not looked up."""
    if spec.name not in aws.eks.get_clusters(opts=invoke).names:
        return
    running = aws.eks.get_cluster(name=spec.name, opts=invoke).version
    if minor_key(running) <= minor_key(spec.kubernetes_version):
        return
    supported = running in SUPPORTED_KUBERNETES_MINORS
    yield ConfigIssue(
        config_path("kubernetesVersion"),
        spec.kubernetes_version,
        f"the cluster {spec.name} already runs Kubernetes {running} (AWS upgrades a cluster at the end of "
        "its minor's standard support, and someone may have upgraded it by hand); EKS cannot go back a minor",
        f'set kubernetesVersion: "{running}"; the node groups and add-ons follow in the same up'
        if supported
        else f"the GPU Operator this toolkit pins supports {SUPPORTED_KUBERNETES_MINORS[-1]} at most, so "
        f"{running} cannot be run from this version of gpu-k8s: pin an older cluster, or upgrade gpu-k8s",
    )


def build(spec: EksClusterSpec) -> GpuCluster:
    """Everything `pulumi up -s aws-eks` creates; validation runs before the first resource."""
    catalog = load_catalog()
    region = region_from_config()
    raise_if_any(
        eks_issues(spec, catalog),
        platform_issues(spec, EKS_TRAITS, catalog),
        offering_issues(spec.gpu_pools, region, catalog),
    )
    pools = resolve_pools(spec, catalog, EKS_TRAITS)
    unneeded_time = cluster_scale_down_unneeded_time(pools)
    raise_if_any(
        asg_tag_issues(
            pools,
            lambda pool: scale_from_zero_tags(aws_node_template(pool, unneeded_time, EKS_EFA_HUGE_PAGES)),
            EKS_ASG_TAGS,
        )
    )
    provider = aws_provider(spec.name, region)
    # What the account's zones offer is known only by asking AWS, so after the provider exists.
    invoke = pulumi.InvokeOptions(provider=provider)
    zones = zone_plan(spec.network, spec.gpu_pools, invoke)
    raise_if_any(zone_issues(spec.network, spec.gpu_pools, zones), running_version_issues(spec, invoke))
    eks = EksCluster(
        spec.name,
        EksClusterArgs(spec, region, catalog, zones, placement_guard(spec.name, spec.gpu_pools, zones)),
        opts=pulumi.ResourceOptions(providers=[provider]),
    )
    cluster = install_gpu_addons(
        spec,
        eks.handle,
        autoscaler_cloud_values(spec.name, region),
        [eks.autoscaler_identity.association],
        node_price=aws_pool_node_price(region),
    )
    install_efa_device_plugin(spec.name, cluster)
    return cluster
