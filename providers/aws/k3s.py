"""k3s on EC2 GPU VMs: `build` is what `pulumi up -s aws-k3s` runs.

Servers are plain EC2 instances (1, or 3 with embedded etcd) behind a network load balancer; each GPU pool
is an Auto Scaling group the cluster-autoscaler scales from zero. No SSH anywhere: nodes read their
bootstrap secrets from Secrets Manager with their instance role, and shell access, when needed, goes
through SSM Session Manager.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from gpu_k8s.components.autoscaler import (
    SYSTEM_POOL_NAME,
    cluster_scale_down_unneeded_time,
    install_gpu_addons,
)
from gpu_k8s.components.catalog import load_catalog
from gpu_k8s.components.cluster import (
    POOL_LABEL,
    GpuCluster,
    GpuPool,
    PlatformTraits,
    platform_issues,
    resolve_pools,
)
from gpu_k8s.components.configbase import ConfigIssue, config_path, raise_if_any
from gpu_k8s.components.helm import helm_release
from gpu_k8s.components.k3s.admission import ServerPodPolicy, k3s_system_namespaces
from gpu_k8s.components.k3s.cloudinit import (
    API_PORT,
    AgentNode,
    ImageCredentialProvider,
    SnapshotStore,
    agent_cloud_config,
)
from gpu_k8s.components.k3s.control_plane import (
    AUTOSCALER_ON_HOST_NETWORK,
    K3sControlPlane,
    admin_access_binding,
    agent_taints,
    k3s_traits,
    server_user_data,
)
from gpu_k8s.components.k3s.readiness import gated_kubernetes_provider
from gpu_k8s.components.k3s.server_count import server_count
from gpu_k8s.components.k3s.upgrades import K3sUpgrades
from gpu_k8s.components.spec import GpuPoolSpec, pool_child_name
from gpu_k8s.providers.aws import addons
from gpu_k8s.providers.aws.autoscaling import (
    ACCELERATOR_LABEL,
    asg_tag_issues,
    autoscaler_cloud_values,
    aws_node_template,
    scale_from_zero_tags,
    zone_limits,
)
from gpu_k8s.providers.aws.backups import SnapshotBucket, snapshot_access_policy
from gpu_k8s.providers.aws.cloud_controller import (
    CCM_CHART,
    CCM_CHART_VERSION,
    CCM_REPO,
    cloud_controller_policy,
    cloud_controller_values,
    cluster_owned_tag,
)
from gpu_k8s.providers.aws.efa import (
    EFA_AGENT_SERVICE_SETTINGS,
    EFA_AGENT_SYSCTLS,
    EFA_PLUGIN_REGISTRY,
    efa_interfaces,
    efa_plugin_pull_policy,
    efa_pools,
    install_efa_device_plugin,
)
from gpu_k8s.providers.aws.iam import (
    EBS_CSI_POLICIES,
    EFS_CSI_POLICIES,
    GrantedRole,
    cluster_autoscaler_policy,
    cluster_autoscaler_tag,
    role_with_policies,
    service_trust_policy,
)
from gpu_k8s.providers.aws.k3s_bootstrap import (
    ECR_CREDENTIAL_PROVIDER_SCRIPT,
    aws_node_bootstrap,
    ec2_user_data,
    read_secrets_policy,
)
from gpu_k8s.providers.aws.location import aws_provider, cluster_tags, region_from_config
from gpu_k8s.providers.aws.network import Network
from gpu_k8s.providers.aws.nodes import (
    CAPACITY_BLOCK_MARKET,
    EfaLaunch,
    capacity_block_target,
    cpu_arch,
    efa_network_interfaces,
    efa_placement,
    efa_placement_group,
    launch_tag_specifications,
)
from gpu_k8s.providers.aws.settings import EFS_STORAGE, Ec2K3sClusterSpec
from gpu_k8s.providers.aws.shared_storage import EfsSharedStorage, EfsSharedStorageArgs, efs_csi_chart
from gpu_k8s.providers.aws.zones import ZonePlan, offering_issues, placement_guard, zone_issues, zone_plan

CAPACITY_LABEL = "gpu-k8s.io/capacity-type"
# Canonical's public SSM parameters for the current Ubuntu 24.04 LTS server AMI (parameter scheme from
# Canonical's "Finding Ubuntu images with the AWS SSM Parameter Store"; the ebs-gp3 volume type of 24.04
# images is recalled, UNCONFIRMED). Read at `up` (ubuntu_ami), so new nodes get the image of the last `up`.
UBUNTU_AMI_PARAMETER = "/aws/service/canonical/ubuntu/server/24.04/stable/current/{arch}/hvm/ebs-gp3/ami-id"
UBUNTU_ARCH = {"x86_64": "amd64", "arm64": "arm64"}
UBUNTU_ROOT_DEVICE = "/dev/sda1"
# The EBS CSI controller runs on the servers with their instance role (no EKS Pod Identity here), with the
# policy EKS gives it (V2: volumes tagged for the driver only); the agents' node plugin calls no AWS API.
SERVER_POLICIES = EBS_CSI_POLICIES
# Hop limit 1 on every node: an IMDSv2 token answer does not survive the hop into a pod's network namespace,
# so only the node and host-network pods reach IMDS (on servers the cloud controller, the EBS and EFS CSI
# controllers and the cluster-autoscaler; on agents the termination handler; the EBS node plugin reads its
# node from Kubernetes). The pod-metadata rule of every node's user data refuses the rest too.
IMDS_HOP_LIMIT = 1
EBS_CSI_CHART = "aws-ebs-csi-driver"
EBS_CSI_CHART_VERSION = "2.64.0"
EBS_CSI_REPO = "https://kubernetes-sigs.github.io/aws-ebs-csi-driver"
# The chart's controller Deployment (templates/controller.yaml) and its default replica count (values.yaml).
EBS_CONTROLLER = "ebs-csi-controller"
EBS_CONTROLLER_REPLICAS = 2
NTH_CHART = "aws-node-termination-handler"
NTH_CHART_VERSION = "0.27.6"
# Published only as an OCI artifact since 2024 (the chart's README at v1.25.6); aws/eks-charts' index stops
# at 0.21.0 (upstream/charts/sources.json has the evidence).
NTH_REPO = "oci://public.ecr.aws/aws-ec2/helm"
FLANNEL_VXLAN_PORT = 8472
KUBELET_PORT = 10250
ETCD_PORTS = (2379, 2380)
AUTO_DISCOVERY_TAG = "k8s.io/cluster-autoscaler/enabled"


def efa_image_credentials() -> ImageCredentialProvider:
    """EFA agents pull the EFA device plugin from AWS's EKS registry with the node's ECR credentials."""
    return ImageCredentialProvider(
        name="ecr-credential-provider",
        match_images=(EFA_PLUGIN_REGISTRY,),
        script=ECR_CREDENTIAL_PROVIDER_SCRIPT.read_text(),
    )


def aws_k3s_issues(spec: Ec2K3sClusterSpec) -> Iterable[ConfigIssue]:
    """The API load balancer is internet-facing: an existing VPC must name public subnets for it."""
    if not spec.network.creates_vpc and not spec.network.public_subnet_ids:
        yield ConfigIssue(
            config_path("network", "publicSubnetIds"),
            [],
            "the k3s API load balancer needs public subnets",
            "list the VPC's public subnet ids (one per zone the servers use)",
        )


def ubuntu_ami(arch: str, parent: pulumi.Resource) -> pulumi.Output[str]:
    """The newest Ubuntu AMI ID, read from Canonical's SSM parameter at `up`: a new image reaches a pool's
    nodes only through an `up`, whose diff shows the launch template's new ID (with `resolve:ssm:` every
    launch would take whatever is newest, so a new kernel could break every new GPU node with no `up`)."""
    return aws.ssm.get_parameter_output(
        name=UBUNTU_AMI_PARAMETER.format(arch=UBUNTU_ARCH[arch]),
        opts=pulumi.InvokeOutputOptions(parent=parent),
    ).value


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
    template = dataclasses.replace(aws_node_template(pool, cluster_unneeded_time), labels=agent_labels(pool))
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


def server_placement(spec: Ec2K3sClusterSpec) -> tuple[str, list[str]]:
    """What decides the servers' subnets (server i in private subnet i modulo their count): each server's
    subnet where they are given (adding one for GPU pools moves no server), or how many zones the new VPC
    spans."""
    network = spec.network
    if network.creates_vpc:
        # The zone count re-carves the new VPC's subnets (every count, conservatively: 3 <-> 4 moves none).
        return config_path("network", "availabilityZones"), [str(network.availability_zones)]
    subnets = network.private_subnet_ids
    return config_path("network", "privateSubnetIds"), [
        subnets[index % len(subnets)] for index in range(spec.system_pool.nodes)
    ]


def ebs_csi_values(region: str, servers: int) -> dict[str, object]:
    """The controller runs on the servers and knows its region without asking instance metadata; the node
    plugin takes its node's zone and instance type from the Node object (no pod reaches IMDS).

    The controller moves to the host network (`ebs_controller_on_host_network`), where its health port
    (9808) is a host port: one replica per server, at most the chart's two, and a rollout replaces a pod
    before it starts another (the chart's maxUnavailable 1, with no surge)."""
    return {
        "controller": {
            "region": region,
            "nodeSelector": {POOL_LABEL: SYSTEM_POOL_NAME},
            "replicaCount": min(EBS_CONTROLLER_REPLICAS, servers),
            "updateStrategy": {"rollingUpdate": {"maxSurge": 0}},
        },
        "node": {"metadataSources": "kubernetes"},
    }


def ebs_controller_on_host_network(
    name: str, release: k8s.helm.v3.Release, provider: k8s.Provider, parent: pulumi.Resource
) -> k8s.apps.v1.DeploymentPatch:
    """The EBS CSI controller calls EC2 with the servers' role, which only the host network reaches; the
    chart has no host-network value for the controller (its node DaemonSet has one), so a server-side apply
    patch sets it on the Deployment the release made. Helm's three-way merge leaves a field its manifests do
    not carry alone, so a chart upgrade keeps it; `destroy` removes the patch before the release."""
    return k8s.apps.v1.DeploymentPatch(
        f"{name}-ebs-csi-controller-host-network",
        metadata=k8s.meta.v1.ObjectMetaPatchArgs(name=EBS_CONTROLLER, namespace=release.namespace),
        spec=k8s.apps.v1.DeploymentSpecPatchArgs(
            template=k8s.core.v1.PodTemplateSpecPatchArgs(
                spec=k8s.core.v1.PodSpecPatchArgs(host_network=True)
            )
        ),
        opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=[release]),
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


@dataclass(frozen=True)
class SecurityGroups:
    nodes: aws.ec2.SecurityGroup
    servers: aws.ec2.SecurityGroup
    api: aws.ec2.SecurityGroup
    # The internal registration balancer's, with more than one server.
    registration: aws.ec2.SecurityGroup | None
    # What every EFA interface carries, where some pool has EFA.
    efa: aws.ec2.SecurityGroup | None


@dataclass(frozen=True)
class ServerBalancer:
    load_balancer: aws.lb.LoadBalancer
    # What must exist before the balancer forwards to the servers.
    ready: list[pulumi.Resource]


def _ingress(
    name: str,
    group: aws.ec2.SecurityGroup,
    port: int | tuple[int, int],
    protocol: str,
    parent: pulumi.Resource,
    source: aws.ec2.SecurityGroup | None = None,
    cidr: str | None = None,
    description: str = "",
) -> aws.vpc.SecurityGroupIngressRule:
    low, high = port if isinstance(port, tuple) else (port, port)
    return aws.vpc.SecurityGroupIngressRule(
        name,
        security_group_id=group.id,
        ip_protocol=protocol,
        from_port=low,
        to_port=high,
        referenced_security_group_id=source.id if source is not None else None,
        cidr_ipv4=cidr,
        description=description,
        opts=pulumi.ResourceOptions(parent=parent),
    )


def _egress_anywhere(name: str, group: aws.ec2.SecurityGroup, parent: pulumi.Resource) -> None:
    """Nodes reach registries, AWS APIs and the NAT gateway; nothing is allowed in this way."""
    aws.vpc.SecurityGroupEgressRule(
        name,
        security_group_id=group.id,
        ip_protocol="-1",
        cidr_ipv4="0.0.0.0/0",
        description="outbound to registries and AWS APIs",
        opts=pulumi.ResourceOptions(parent=parent),
    )


def _egress_to_servers(
    name: str, group: aws.ec2.SecurityGroup, servers: aws.ec2.SecurityGroup, parent: pulumi.Resource
) -> None:
    """A balancer's only way out: the servers' API port."""
    aws.vpc.SecurityGroupEgressRule(
        name,
        security_group_id=group.id,
        ip_protocol="tcp",
        from_port=API_PORT,
        to_port=API_PORT,
        referenced_security_group_id=servers.id,
        description="forward to the servers",
        opts=pulumi.ResourceOptions(parent=parent),
    )


@dataclass(frozen=True)
class AwsK3sClusterArgs:
    spec: Ec2K3sClusterSpec
    region: str
    traits: PlatformTraits
    pools: tuple[GpuPool, ...]
    zones: ZonePlan
    # What every GPU group waits for: the guard that keeps pools in their zones.
    placement: pulumi.Resource


class AwsK3sCluster(pulumi.ComponentResource):
    """The network, security groups, secrets, identities, servers, load balancer and GPU node groups of a
    k3s cluster on EC2, and its storage, termination handling and autoscaling add-ons."""

    handle: GpuCluster

    def __init__(self, name: str, args: AwsK3sClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-k8s:aws:K3sCluster", name, None, opts)
        spec, child = args.spec, pulumi.ResourceOptions(parent=self)
        network = Network(
            f"{name}-network",
            spec.name,
            spec.network,
            args.region,
            [z.name for z in args.zones.zones],
            opts=child,
        )
        groups = self._security_groups(name, spec, network.vpc_id, bool(efa_pools(args.pools)))

        interfaces = self._server_interfaces(name, spec, network, groups)
        api = self._load_balancer(
            f"{name}-api", network.public_subnet_ids, groups.api, network.vpc_id, interfaces, internal=False
        )
        # Agents register through a fixed address in front of every server (k3s "High Availability Embedded
        # etcd"), so a new GPU node joins while any server is up. One server is its own fixed address.
        registration = (
            self._load_balancer(
                f"{name}-registration",
                network.private_subnet_ids,
                groups.registration,
                network.vpc_id,
                interfaces,
                internal=True,
            )
            if groups.registration is not None
            else None
        )
        registration_host = (
            registration.load_balancer.dns_name if registration is not None else interfaces[0].private_ip
        )
        api_host = api.load_balancer.dns_name
        control_plane = K3sControlPlane(f"{name}-control-plane", spec.name, api_host, opts=child)
        server_secret, server_secret_value = self._secret(
            name, "servers", control_plane.server_secret, kept_after_destroy=True
        )
        agent_secret, agent_secret_value = self._secret(name, "agents", control_plane.agent_secret)

        shares_efs = spec.storage.shared == EFS_STORAGE
        server_role = role_with_policies(
            f"{name}-server",
            service_trust_policy("ec2.amazonaws.com"),
            # The EFS CSI controller runs on the servers too, with their role.
            (*SERVER_POLICIES, *(EFS_CSI_POLICIES if shares_efs else ())),
            parent=self,
            inline_policy=cluster_autoscaler_policy(spec.name),
            session_manager=True,
        )
        server_reads = self._reads_secrets(f"{name}-server", server_role, [server_secret, agent_secret])
        server_ccm = aws.iam.RolePolicy(
            f"{name}-server-cloud-controller",
            role=server_role.role.id,
            policy=json.dumps(cloud_controller_policy(spec.name)),
            opts=pulumi.ResourceOptions(parent=server_role.role),
        )
        snapshots = SnapshotBucket(f"{name}-etcd-snapshots", spec.name, args.region, opts=child)
        server_snapshots = aws.iam.RolePolicy(
            f"{name}-server-snapshots",
            role=server_role.role.id,
            policy=snapshots.bucket.arn.apply(lambda arn: json.dumps(snapshot_access_policy(arn))),
            opts=pulumi.ResourceOptions(parent=server_role.role),
        )
        agent_role = role_with_policies(
            f"{name}-agent",
            service_trust_policy("ec2.amazonaws.com"),
            (),
            parent=self,
            session_manager=True,
        )
        agent_reads = self._reads_secrets(f"{name}-agent", agent_role, [agent_secret])
        agent_grants: list[pulumi.Resource] = [agent_reads, *agent_role.grants]
        if efa_pools(args.pools):
            agent_grants.append(
                aws.iam.RolePolicy(
                    f"{name}-agent-efa-plugin-pull",
                    role=agent_role.role.id,
                    policy=json.dumps(efa_plugin_pull_policy()),
                    opts=pulumi.ResourceOptions(parent=agent_role.role),
                )
            )

        # A node reads its secret once, at first boot: the value and the permission must exist by then.
        servers = self._servers(
            name,
            spec,
            interfaces,
            server_role,
            server_secret,
            [api_host, registration_host],
            snapshots.store,
            boot_after=[
                server_secret_value,
                server_reads,
                server_snapshots,
                server_ccm,
                *snapshots.ready,
                *server_role.grants,
            ],
        )
        registration_url = pulumi.Output.format("https://{0}:{1}", registration_host, API_PORT)

        agent_profile = aws.iam.InstanceProfile(f"{name}-agent-profile", role=agent_role.name, opts=child)
        unneeded = cluster_scale_down_unneeded_time(args.pools)
        for pool in args.pools:
            self._gpu_pool(
                pool_child_name(name, pool.spec.name),
                spec,
                pool,
                network,
                groups,
                agent_profile,
                agent_secret,
                registration_url,
                unneeded,
                args.zones.pool_zones[pool.spec.name],
                boot_after=[agent_secret_value, *agent_grants, args.placement],
            )

        servers_reachable: list[pulumi.Resource] = [
            *servers,
            *api.ready,
            *(registration.ready if registration is not None else ()),
        ]
        k8s_provider = gated_kubernetes_provider(
            name, control_plane.deployer_kubeconfig, control_plane.root_cert_pem, servers_reachable, self
        )
        # Every node waits, tainted, for the cloud controller manager to initialise it: it goes first.
        cloud_controller = helm_release(
            f"{name}-cloud-controller",
            chart=CCM_CHART,
            version=CCM_CHART_VERSION,
            repository=CCM_REPO,
            namespace="kube-system",
            values=cloud_controller_values(
                spec.name, spec.kubernetes_version, args.traits.system_tolerations
            ),
            parent=self,
            provider=k8s_provider,
            depends_on=[*servers_reachable, server_ccm],
        )
        system_ready: list[pulumi.Resource] = [*servers_reachable, cloud_controller]
        # Only the API: the admin kubeconfig must work even when an add-on's install fails.
        system_ready.append(
            admin_access_binding(name, control_plane.admin_user, k8s_provider, self, servers_reachable)
        )
        ebs_csi = helm_release(
            f"{name}-ebs-csi",
            chart=EBS_CSI_CHART,
            version=EBS_CSI_CHART_VERSION,
            repository=EBS_CSI_REPO,
            namespace="kube-system",
            values=ebs_csi_values(args.region, len(servers)),
            parent=self,
            provider=k8s_provider,
            depends_on=system_ready,
        )
        ebs_controller_on_host_network(name, ebs_csi, k8s_provider, self)
        addons.default_storage_class(name, ebs_csi, k8s_provider, self, system_ready)
        shared_storage = None
        if shares_efs:
            efs_driver = efs_csi_chart(
                name,
                {POOL_LABEL: SYSTEM_POOL_NAME},
                len(servers),
                args.traits.system_tolerations,
                k8s_provider,
                self,
                system_ready,
            )
            shared_storage = EfsSharedStorage(
                f"{name}-efs",
                EfsSharedStorageArgs(
                    network, args.zones.zones, groups.nodes.id, k8s_provider, [efs_driver, *system_ready]
                ),
                opts=child,
            ).summary
        K3sUpgrades(
            f"{name}-upgrades",
            spec.k3s.version,
            args.traits.system_tolerations,
            k8s_provider,
            system_ready,
            opts=child,
        )
        ServerPodPolicy(
            f"{name}-server-pods",
            k3s_system_namespaces(spec),
            args.traits,
            k8s_provider,
            system_ready,
            opts=child,
        )
        if any(pool.spec.spot for pool in args.pools):
            helm_release(
                f"{name}-termination-handler",
                chart=NTH_CHART,
                version=NTH_CHART_VERSION,
                repository=NTH_REPO,
                namespace="kube-system",
                values=termination_handler_values(),
                parent=self,
                provider=k8s_provider,
                depends_on=system_ready,
            )
        self.handle = GpuCluster(
            name=spec.name,
            kubernetes_version=spec.kubernetes_version,
            kubeconfig=control_plane.kubeconfig,
            k8s_provider=k8s_provider,
            pools=args.pools,
            traits=args.traits,
            system_ready=system_ready,
            system_nodes=len(servers),
            shared_storage=shared_storage,
        )
        self.register_outputs({"apiEndpoint": api_host, "kubeconfig": control_plane.kubeconfig})

    def _security_groups(
        self, name: str, spec: Ec2K3sClusterSpec, vpc_id: pulumi.Input[str], with_efa: bool
    ) -> SecurityGroups:
        """Exactly the k3s ports, between the cluster's own nodes; the API also from the admin CIDRs,
        through the load balancer. Nothing is open to the internet until a `Service type=LoadBalancer`
        asks for it: the cloud controller manager then opens the `nodes` group to its load balancer. EFA
        interfaces also carry a group open to itself only, in and out, as EFA's OS bypass requires (EC2 user
        guide, "Create and attach an EFA"); it has no cluster tag, so the controller never picks it."""
        child = pulumi.ResourceOptions(parent=self)
        roles = (
            "nodes",
            "servers",
            "api",
            *(("registration",) if spec.system_pool.nodes > 1 else ()),
            *(("efa",) if with_efa else ()),
        )
        groups = {
            role: aws.ec2.SecurityGroup(
                f"{name}-{role}-sg",
                vpc_id=vpc_id,
                description=f"k3s {role} of {spec.name}",
                tags={
                    "Name": f"{spec.name}-{role}",
                    **(cluster_owned_tag(spec.name) if role == "nodes" else {}),
                },
                opts=child,
            )
            for role in roles
        }
        nodes, servers, api = groups["nodes"], groups["servers"], groups["api"]
        registration = groups.get("registration")
        _ingress(f"{name}-vxlan", nodes, FLANNEL_VXLAN_PORT, "udp", self, nodes, description="flannel VXLAN")
        _ingress(f"{name}-kubelet", nodes, KUBELET_PORT, "tcp", self, nodes, description="kubelet")
        _ingress(f"{name}-api-nodes", servers, API_PORT, "tcp", self, nodes, description="API from nodes")
        _ingress(f"{name}-api-lb", servers, API_PORT, "tcp", self, api, description="API via load balancer")
        for index, cidr in enumerate(spec.api_access_cidrs):
            _ingress(f"{name}-api-admin-{index}", api, API_PORT, "tcp", self, cidr=cidr, description="admins")
        _egress_to_servers(f"{name}-api-to-servers", api, servers, self)
        if registration is not None:
            _ingress(f"{name}-etcd", servers, ETCD_PORTS, "tcp", self, servers, description="embedded etcd")
            _ingress(
                f"{name}-registration-nodes", registration, API_PORT, "tcp", self, nodes, description="agents"
            )
            _ingress(
                f"{name}-api-registration",
                servers,
                API_PORT,
                "tcp",
                self,
                registration,
                description="API via registration balancer",
            )
            _egress_to_servers(f"{name}-registration-to-servers", registration, servers, self)
        _egress_anywhere(f"{name}-nodes-egress", nodes, self)
        _egress_anywhere(f"{name}-servers-egress", servers, self)
        efa = groups.get("efa")
        if efa is not None:
            for direction, rule in (
                ("in", aws.vpc.SecurityGroupIngressRule),
                ("out", aws.vpc.SecurityGroupEgressRule),
            ):
                rule(
                    f"{name}-efa-{direction}",
                    security_group_id=efa.id,
                    ip_protocol="-1",
                    referenced_security_group_id=efa.id,
                    description="EFA between EFA nodes",
                    opts=child,
                )
        return SecurityGroups(nodes=nodes, servers=servers, api=api, registration=registration, efa=efa)

    def _secret(
        self, name: str, audience: str, payload: pulumi.Output[str], kept_after_destroy: bool = False
    ) -> tuple[aws.secretsmanager.Secret, aws.secretsmanager.SecretVersion]:
        """The servers' secret is kept after `destroy`, like the snapshot bucket: it holds the server token
        and the CA keys, without which no snapshot can be restored (k3s "Backup and Restore": a snapshot's
        bootstrap data is encrypted with the token). Pulumi names it with a random suffix, so a stack made
        again under the same name makes a secret of its own."""
        child = pulumi.ResourceOptions(parent=self, retain_on_delete=kept_after_destroy)
        secret = aws.secretsmanager.Secret(
            f"{name}-{audience}-bootstrap",
            description=f"k3s bootstrap files for the {audience} of cluster {name}",
            # A secret not kept goes at once on destroy, with no recovery window to hold its name.
            recovery_window_in_days=0,
            opts=child,
        )
        value = aws.secretsmanager.SecretVersion(
            f"{name}-{audience}-bootstrap-value", secret_id=secret.id, secret_string=payload, opts=child
        )
        return secret, value

    def _reads_secrets(
        self, name: str, role: GrantedRole, secrets: list[aws.secretsmanager.Secret]
    ) -> aws.iam.RolePolicy:
        return aws.iam.RolePolicy(
            f"{name}-read-secrets",
            role=role.role.id,
            policy=pulumi.Output.all(*(s.arn for s in secrets)).apply(
                lambda arns: json.dumps(read_secrets_policy(list(arns)))
            ),
            opts=pulumi.ResourceOptions(parent=role.role),
        )

    def _server_interfaces(
        self, name: str, spec: Ec2K3sClusterSpec, network: Network, groups: SecurityGroups
    ) -> list[aws.ec2.NetworkInterface]:
        """One network interface per server: its address outlives the instance, so the other servers, the
        balancers and a replacement keep finding the server there."""
        subnets = network.private_subnet_ids
        return [
            aws.ec2.NetworkInterface(
                f"{name}-server-{index}-eni",
                subnet_id=subnets[index % len(subnets)],
                security_groups=[groups.nodes.id, groups.servers.id],
                tags={"Name": f"{spec.name}-server-{index}"},
                opts=pulumi.ResourceOptions(parent=self),
            )
            for index in range(spec.system_pool.nodes)
        ]

    def _load_balancer(
        self,
        name: str,
        subnets: Sequence[pulumi.Input[str]],
        group: aws.ec2.SecurityGroup,
        vpc_id: pulumi.Input[str],
        interfaces: Sequence[aws.ec2.NetworkInterface],
        internal: bool,
    ) -> ServerBalancer:
        """A network load balancer forwarding the API port to every server's interface address."""
        child = pulumi.ResourceOptions(parent=self)
        load_balancer = aws.lb.LoadBalancer(
            name,
            load_balancer_type="network",
            internal=internal,
            subnets=subnets,
            security_groups=[group.id],
            tags={"Name": name},
            opts=child,
        )
        target_group = aws.lb.TargetGroup(
            f"{name}-targets",
            port=API_PORT,
            protocol="TCP",
            target_type="ip",
            vpc_id=vpc_id,
            health_check=aws.lb.TargetGroupHealthCheckArgs(protocol="TCP", port=str(API_PORT)),
            opts=child,
        )
        listener = aws.lb.Listener(
            f"{name}-listener",
            load_balancer_arn=load_balancer.arn,
            port=API_PORT,
            protocol="TCP",
            default_actions=[
                aws.lb.ListenerDefaultActionArgs(type="forward", target_group_arn=target_group.arn)
            ],
            opts=child,
        )
        targets = [
            aws.lb.TargetGroupAttachment(
                f"{name}-target-{index}",
                target_group_arn=target_group.arn,
                target_id=interface.private_ip,
                port=API_PORT,
                opts=child,
            )
            for index, interface in enumerate(interfaces)
        ]
        return ServerBalancer(load_balancer, [listener, *targets])

    def _servers(
        self,
        name: str,
        spec: Ec2K3sClusterSpec,
        interfaces: Sequence[aws.ec2.NetworkInterface],
        role: GrantedRole,
        secret: aws.secretsmanager.Secret,
        tls_sans: Sequence[pulumi.Output[str]],
        snapshots: pulumi.Output[SnapshotStore],
        boot_after: Sequence[pulumi.Resource],
    ) -> list[aws.ec2.Instance]:
        """The servers on their interfaces; each knows the others' addresses, server 0 founds the cluster."""
        child = pulumi.ResourceOptions(parent=self)
        profile = aws.iam.InstanceProfile(f"{name}-server-profile", role=role.name, opts=child)
        ami = ubuntu_ami(cpu_arch(spec.system_pool.instance_type), self)
        urls = [pulumi.Output.format("https://{0}:{1}", i.private_ip, API_PORT) for i in interfaces]
        servers: list[aws.ec2.Instance] = []
        for index, interface in enumerate(interfaces):
            peers = [url for other, url in enumerate(urls) if other != index]
            user_data = server_user_data(
                spec,
                secret.arn,
                tls_sans,
                peers,
                index == 0,
                snapshots,
                aws_node_bootstrap(),
                external_cloud_provider=True,
            )
            servers.append(
                aws.ec2.Instance(
                    f"{name}-server-{index}",
                    ami=ami,
                    instance_type=spec.system_pool.instance_type,
                    iam_instance_profile=profile.name,
                    network_interfaces=[
                        aws.ec2.InstanceNetworkInterfaceArgs(
                            network_interface_id=interface.id, device_index=0
                        )
                    ],
                    metadata_options=aws.ec2.InstanceMetadataOptionsArgs(
                        http_endpoint="enabled",
                        http_tokens="required",
                        http_put_response_hop_limit=IMDS_HOP_LIMIT,
                    ),
                    root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                        volume_size=spec.system_pool.disk_size_gib,
                        volume_type="gp3",
                        encrypted=True,
                    ),
                    user_data_base64=user_data.apply(ec2_user_data),
                    tags={"Name": f"{spec.name}-server-{index}", **cluster_owned_tag(spec.name)},
                    # A new Ubuntu release must not replace a running server. User data runs at first boot
                    # only, and EC2 applies a change by stopping and starting the instance: every server at
                    # once. New servers take the current image and data; running ones are upgraded in place
                    # (stacks/K3S.md, "Upgrading k3s").
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        depends_on=list(boot_after),
                        # userData: what servers made before the user data was gzipped were given.
                        ignore_changes=["ami", "userData", "userDataBase64"],
                    ),
                )
            )
        return servers

    def _gpu_pool(
        self,
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
        child = pulumi.ResourceOptions(parent=self)
        block = pool.spec.capacity_reservation_id
        several_types = bool(pool.spec.extra_instance_types)
        efa = self._efa_launch(name, pool, network, groups, zone_indexes, block is not None)
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
            image_id=ubuntu_ami(pool.machine.arch, self),
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
                    parent=self, depends_on=list(boot_after), ignore_changes=["desiredCapacity"]
                ),
            )
            for limits in zone_limits(pool.spec.min_nodes, pool.spec.max_nodes, zone_indexes)
        ]

    def _efa_launch(
        self,
        name: str,
        pool: GpuPool,
        network: Network,
        groups: SecurityGroups,
        zone_indexes: Sequence[int],
        in_capacity_block: bool,
    ) -> EfaLaunch | None:
        """EFA interfaces in the pool's one subnet (an EFA pool keeps to one zone: `zone_plan`), the node's
        own group on the primary and the EFA group on all, and the pool's placement group."""
        interfaces = efa_interfaces(pool)
        if not interfaces:
            return None
        assert groups.efa is not None and len(zone_indexes) == 1, "made for clusters with EFA pools"
        return EfaLaunch(
            interfaces,
            primary_security_group_ids=[groups.nodes.id, groups.efa.id],
            efa_security_group_ids=[groups.efa.id],
            placement_group=efa_placement_group(name, in_capacity_block, self),
            subnet_id=network.private_subnet_ids[zone_indexes[0]],
        )


def build(spec: Ec2K3sClusterSpec) -> GpuCluster:
    """Everything `pulumi up -s aws-k3s` creates; validation runs before the first resource."""
    catalog = load_catalog()
    region = region_from_config()
    traits = k3s_traits(spec, ACCELERATOR_LABEL)
    raise_if_any(
        aws_k3s_issues(spec),
        platform_issues(spec, traits, catalog),
        offering_issues(spec.gpu_pools, region, catalog),
    )
    pools = resolve_pools(spec, catalog, traits)
    unneeded_time = cluster_scale_down_unneeded_time(pools)
    raise_if_any(asg_tag_issues(pools, lambda pool: asg_tags(spec.name, pool, unneeded_time), 0))
    # Every resource of the stack goes through the provider, which waits for the server count's check: a
    # preview or `up` that changes the count fails there, before anything else is touched.
    provider = aws_provider(spec.name, region, after=[server_count(spec, *server_placement(spec))])
    # What the account's zones offer is known only by asking AWS, so after the provider exists.
    zones = zone_plan(spec.network, spec.gpu_pools, pulumi.InvokeOptions(provider=provider))
    raise_if_any(zone_issues(spec.network, spec.gpu_pools, zones))
    cluster = AwsK3sCluster(
        spec.name,
        AwsK3sClusterArgs(
            spec, region, traits, pools, zones, placement_guard(spec.name, spec.gpu_pools, zones)
        ),
        opts=pulumi.ResourceOptions(providers=[provider]),
    ).handle
    cluster = install_gpu_addons(
        spec, cluster, {**autoscaler_cloud_values(spec.name, region), **AUTOSCALER_ON_HOST_NETWORK}
    )
    install_efa_device_plugin(spec.name, cluster)
    return cluster
