"""k3s on EC2 GPU VMs: `build` is what `pulumi up -s aws-k3s` runs.

Servers are plain EC2 instances (1, or 3 with embedded etcd) behind a network load balancer; each GPU pool
is an Auto Scaling group the cluster-autoscaler scales from zero. No SSH anywhere: nodes read their
bootstrap secrets from Secrets Manager with their instance role, and shell access, when needed, goes
through SSM Session Manager. Here: the servers, their roles and secrets, the add-ons; k3s_network.py: the
security groups and balancers; k3s_agents.py: the GPU pools; k3s_bootstrap.py: what a node boots with.
"""

from __future__ import annotations

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
from gpu_k8s.components.k3s.cloudinit import SnapshotStore
from gpu_k8s.components.k3s.control_plane import (
    AUTOSCALER_ON_HOST_NETWORK,
    K3sControlPlane,
    admin_access_binding,
    k3s_traits,
    server_user_data,
)
from gpu_k8s.components.k3s.paths import API_PORT
from gpu_k8s.components.k3s.readiness import gated_kubernetes_provider
from gpu_k8s.components.k3s.server_count import server_count
from gpu_k8s.components.k3s.upgrades import K3sUpgrades
from gpu_k8s.components.prices import aws_pool_node_price
from gpu_k8s.components.spec import pool_child_name
from gpu_k8s.providers.aws import addons
from gpu_k8s.providers.aws.autoscaling import (
    ACCELERATOR_LABEL,
    asg_tag_issues,
    autoscaler_cloud_values,
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
    efa_plugin_pull_policy,
    efa_pools,
    install_efa_device_plugin,
)
from gpu_k8s.providers.aws.iam import (
    EBS_CSI_POLICIES,
    EFS_CSI_POLICIES,
    GrantedRole,
    cluster_autoscaler_policy,
    role_with_policies,
    service_trust_policy,
)
from gpu_k8s.providers.aws.k3s_agents import (
    NTH_CHART,
    NTH_CHART_VERSION,
    NTH_REPO,
    asg_tags,
    gpu_pool_groups,
    termination_handler_values,
)
from gpu_k8s.providers.aws.k3s_bootstrap import (
    IMDS_HOP_LIMIT,
    aws_node_bootstrap,
    ec2_user_data,
    read_secrets_policy,
    ubuntu_ami,
)
from gpu_k8s.providers.aws.k3s_network import load_balancer, security_groups, server_interfaces
from gpu_k8s.providers.aws.location import aws_provider, region_from_config
from gpu_k8s.providers.aws.network import Network
from gpu_k8s.providers.aws.nodes import (
    cpu_arch,
)
from gpu_k8s.providers.aws.settings import EFS_STORAGE, Ec2K3sClusterSpec
from gpu_k8s.providers.aws.shared_storage import EfsSharedStorage, EfsSharedStorageArgs, efs_csi_chart
from gpu_k8s.providers.aws.zones import ZonePlan, offering_issues, placement_guard, zone_issues, zone_plan

# The EBS CSI controller runs on the servers with their instance role (no EKS Pod Identity here), with the
# policy EKS gives it (V2: volumes tagged for the driver only); the agents' node plugin calls no AWS API.
SERVER_POLICIES = EBS_CSI_POLICIES
EBS_CSI_CHART = "aws-ebs-csi-driver"
EBS_CSI_CHART_VERSION = "2.64.0"
EBS_CSI_REPO = "https://kubernetes-sigs.github.io/aws-ebs-csi-driver"
# The chart's controller Deployment (templates/controller.yaml) and its default replica count (values.yaml).
EBS_CONTROLLER = "ebs-csi-controller"
EBS_CONTROLLER_REPLICAS = 2


def aws_k3s_issues(spec: Ec2K3sClusterSpec) -> Iterable[ConfigIssue]:
    """The API load balancer is internet-facing: an existing VPC must name public subnets for it."""
    if not spec.network.creates_vpc and not spec.network.public_subnet_ids:
        yield ConfigIssue(
            config_path("network", "publicSubnetIds"),
            [],
            "the k3s API load balancer needs public subnets",
            "list the VPC's public subnet ids (one per zone the servers use)",
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
        groups = security_groups(self, name, spec, network.vpc_id, bool(efa_pools(args.pools)))

        interfaces = server_interfaces(self, name, spec, network, groups)
        api = load_balancer(
            self,
            f"{name}-api",
            network.public_subnet_ids,
            groups.api,
            network.vpc_id,
            interfaces,
            internal=False,
        )
        # Agents register through a fixed address in front of every server (k3s "High Availability Embedded
        # etcd"), so a new GPU node joins while any server is up. One server is its own fixed address.
        registration = (
            load_balancer(
                self,
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
            gpu_pool_groups(
                self,
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
        spec,
        cluster,
        {**autoscaler_cloud_values(spec.name, region), **AUTOSCALER_ON_HOST_NETWORK},
        node_price=aws_pool_node_price(region),
    )
    install_efa_device_plugin(spec.name, cluster)
    return cluster
