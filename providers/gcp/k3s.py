"""k3s on Compute Engine GPU VMs: `build` is what `pulumi up -s gcp-k3s` runs.

Servers are plain VMs (1, or 3 with embedded etcd) behind an external passthrough load balancer with a static
address; each GPU pool is a zonal managed instance group the cluster-autoscaler scales from zero. No SSH
anywhere: nodes read their bootstrap secrets from Secret Manager as their own service account, OS Login
governs any future login and project-wide SSH keys are blocked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from gpu_k8s.components.autoscaler import (
    SYSTEM_POOL_NAME,
    cluster_scale_down_unneeded_time,
    install_gpu_addons,
    node_template,
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
from gpu_k8s.components.k3s.admission import ServerPodPolicy, k3s_system_namespaces
from gpu_k8s.components.k3s.cloudinit import API_PORT, AgentNode, SnapshotStore, agent_cloud_config
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
from gpu_k8s.components.storage import default_storage_class_manifest, storage_class
from gpu_k8s.providers.gcp.autoscaling import (
    ACCELERATOR_LABEL,
    AUTOSCALER_READ_PERMISSIONS,
    AUTOSCALER_RESIZE_PERMISSIONS,
    KUBE_ENV_KEY,
    autoscaler_cloud_values,
    instance_group_url,
    kube_env,
)
from gpu_k8s.providers.gcp.backups import SnapshotBucket
from gpu_k8s.providers.gcp.cloud_controller import (
    CLOUD_CONFIG_PATH,
    LOAD_BALANCER_ROLES,
    GceCloudController,
    cloud_config,
    cloud_controller_manifests,
)
from gpu_k8s.providers.gcp.cloud_controller import PERMISSIONS as CCM_PERMISSIONS
from gpu_k8s.providers.gcp.iam import NodeServiceAccount, custom_role
from gpu_k8s.providers.gcp.k3s_bootstrap import gce_node_bootstrap
from gpu_k8s.providers.gcp.location import (
    machine_type_issues,
    offering_issues,
    project_and_region,
    zone_issues,
)
from gpu_k8s.providers.gcp.machines import (
    BALANCED_PD,
    CLOUD_PLATFORM_SCOPE,
    boot_disk_type,
    gce_arch,
    system_pool_issues,
    ubuntu_image,
)
from gpu_k8s.providers.gcp.network import Network
from gpu_k8s.providers.gcp.pd_csi import PROVISIONER, PdCsiDriver, custom_role_permissions, pd_csi_manifests
from gpu_k8s.providers.gcp.services import enabled_services
from gpu_k8s.providers.gcp.settings import FILESTORE_STORAGE, GceK3sClusterSpec
from gpu_k8s.providers.gcp.shared_storage import (
    FILESTORE_API,
    FilestoreSharedStorage,
    FilestoreSharedStorageArgs,
)

# Cloud Resource Manager for the project-level IAM grants, Cloud Storage for the snapshot bucket and its
# HMAC key (on by default in a new project, enabled here so a project where it is off works too).
REQUIRED_APIS = (
    "cloudresourcemanager.googleapis.com",
    "compute.googleapis.com",
    "iam.googleapis.com",
    "secretmanager.googleapis.com",
    "storage.googleapis.com",
)
FLANNEL_VXLAN_PORT = 8472
KUBELET_PORT = 10250
ETCD_PORTS = "2379-2380"
# Where an external passthrough load balancer's health checks come from (Google Cloud load-balancing
# "Firewall rules" page; the row for this balancer was cut off in the excerpt retrieved, ranges recalled,
# UNCONFIRMED).
HEALTH_CHECK_RANGES = ("35.191.0.0/16", "209.85.152.0/22", "209.85.204.0/22")
# And an internal passthrough one's (Fortinet's FortiProxy GCP guide quoting Google's table; Google's own row
# was cut off in the excerpts retrieved, UNCONFIRMED there).
INTERNAL_HEALTH_CHECK_RANGES = ("35.191.0.0/16", "130.211.0.0/22")
# Metadata every node gets: OS Login decides who may log in (nobody can: no port 22 is open), project-wide
# SSH keys do not reach the node, and the interactive serial console is off (its output stays readable).
NODE_ACCESS_METADATA = {
    "enable-oslogin": "TRUE",
    "block-project-ssh-keys": "TRUE",
    "serial-port-enable": "FALSE",
}
# Spot VMs get 30 seconds between the preemption notice and the hard stop (Compute Engine). The kubelet
# holds the shutdown 25 of them, so the OS powers off before the stop instead of racing it: workload pods
# keep GKE's 15 s (GKE graceful node shutdown docs) and critical pods get the next 10. The kubelet raises
# logind's InhibitDelayMaxSec itself when that is shorter.
SPOT_GRACEFUL_SHUTDOWN = {"shutdownGracePeriod": "25s", "shutdownGracePeriodCriticalPods": "10s"}
# The PD CSI controller creates, resizes, snapshots and deletes disks: upstream names this role as required
# next to its custom attach/detach role and a scoped serviceAccountUser (docs/kubernetes/user-guides/
# driver-install.md at v1.26.4, commit 6e7ea1c). It documents no narrower set, so none is guessed here.
PD_CSI_ROLES = ("roles/compute.storageAdmin",)
SERVICE_ACCOUNT_USER = "roles/iam.serviceAccountUser"
SECRET_ACCESSOR = "roles/secretmanager.secretAccessor"
# InstanceGroupManager.baseInstanceName: "The maximum character length is 58" (Compute API discovery
# document, upstream/compute-api).
MAX_BASE_INSTANCE_NAME = 58
# Metadata.items: "The total size of all keys and values must be less than 512 KB" (same document).
MAX_METADATA_BYTES = 512 * 1024
# What the agents' user data can hold at most: the API load balancer's address, and a secret's resource
# name (a project ID is at most 30 characters; a secret ID at most 255, Secret Manager docs as recalled,
# UNCONFIRMED here).
LONGEST_SERVER_URL = f"https://255.255.255.255:{API_PORT}"
LONGEST_SECRET_NAME = f"projects/{'p' * 30}/secrets/{'s' * 255}"


def k3s_pool_zones(spec: GceK3sClusterSpec) -> Callable[[GpuPoolSpec], Sequence[str]]:
    """A k3s pool is one zonal group: its own zone, else the network's first."""
    return lambda pool: list((pool.zones or spec.network.zones)[:1])


def server_zones(spec: GceK3sClusterSpec) -> list[str]:
    """Each server's zone: the network's zones in turn."""
    zones = spec.network.zones
    return [zones[index % len(zones)] for index in range(spec.system_pool.nodes)]


def gcp_k3s_issues(spec: GceK3sClusterSpec, region: str) -> Iterable[ConfigIssue]:
    """Zones of the region, names Compute Engine takes, and one zone per GPU pool (a zonal group)."""
    yield from zone_issues(spec, region)
    yield from offering_issues(spec, k3s_pool_zones(spec))
    for index, pool in enumerate(spec.gpu_pools):
        base_name = instance_base_name(spec, pool.name)
        if len(base_name) > MAX_BASE_INSTANCE_NAME:
            room = MAX_BASE_INSTANCE_NAME - len(spec.name) - 1
            yield ConfigIssue(
                config_path("gpuPools", index, "name"),
                pool.name,
                f'makes the VM name prefix "{base_name}" {len(base_name)} characters long; Compute Engine '
                f"takes at most {MAX_BASE_INSTANCE_NAME}",
                f"shorten the pool name to at most {room} characters (or the cluster name)",
            )
        if len(pool.zones) > 1:
            yield ConfigIssue(
                config_path("gpuPools", index, "zones"),
                list(pool.zones),
                "a k3s GPU pool on Compute Engine is one zonal managed instance group",
                "list one zone, or make one pool per zone",
            )


def agent_user_data(spec: GceK3sClusterSpec, pool: GpuPool, server_url: str, secret_name: str) -> str:
    """The cloud-init document a GPU agent of the pool boots from."""
    return agent_cloud_config(
        AgentNode(
            k3s_version=spec.k3s.version,
            server_url=server_url,
            secret_name=secret_name,
            labels=pool.node_labels,
            taints=agent_taints(pool),
            kubelet_config=SPOT_GRACEFUL_SHUTDOWN if pool.spec.spot else {},
            external_cloud_provider=True,
        ),
        gce_node_bootstrap(),
    )


def agent_metadata(pool: GpuPool, cluster_unneeded_time: str) -> dict[str, str]:
    """The agents' instance metadata next to their user data: the autoscaler's template and node access."""
    template = node_template(pool, cluster_unneeded_time)
    return {KUBE_ENV_KEY: kube_env(template, gce_arch(pool.machine.name)), **NODE_ACCESS_METADATA}


def metadata_issues(spec: GceK3sClusterSpec, pools: Sequence[GpuPool]) -> Iterable[ConfigIssue]:
    """A pool whose labels and taints would make its instance template's metadata too large to create: they
    are in the user data (k3s flags) and in the autoscaler's template. Measured with the longest server URL
    and secret name the program can produce."""
    unneeded_time = cluster_scale_down_unneeded_time(pools)
    for index, pool in enumerate(pools):
        metadata = {
            "user-data": agent_user_data(spec, pool, LONGEST_SERVER_URL, LONGEST_SECRET_NAME),
            **agent_metadata(pool, unneeded_time),
        }
        size = sum(len(key.encode()) + len(value.encode()) for key, value in metadata.items())
        if size >= MAX_METADATA_BYTES:
            yield ConfigIssue(
                config_path("gpuPools", index, "labels"),
                None,
                f"with the pool's taints they make its VMs' metadata {size:,} bytes; Compute Engine takes "
                f"less than {MAX_METADATA_BYTES:,}",
                "drop or shorten labels",
            )


def instance_base_name(spec: GceK3sClusterSpec, pool_name: str) -> str:
    """The prefix of the pool's VM names (the group appends "-" and four random characters)."""
    return f"{spec.name}-{pool_name}"


def node_tag(spec: GceK3sClusterSpec) -> str:
    """The network tag of every node: the firewall rules the cloud controller makes for a Service target
    it, named in the servers' cloud config (`node-tags`). Servers created before it was there read no
    `node-tags` (their user data is never changed), and then the controller takes, per instance, the
    longest tag that begins the instance's name (gce_instances.go computeHostTags at v36.3.8): the
    cluster's name begins the name of every server and agent this stack makes, and it is a valid tag (a
    DNS label starting with a letter)."""
    return spec.name


def pool_zone(spec: GceK3sClusterSpec, pool: GpuPool) -> str:
    """The pool's own zone, or the network's first: GPU models differ by zone, so name it when it matters."""
    return (pool.spec.zones or spec.network.zones)[0]


@dataclass(frozen=True)
class IngressRule:
    """One firewall rule to the `targets` service accounts, from CIDR `ranges` or service `accounts`."""

    name: str
    protocol: str
    port: str
    targets: Sequence[pulumi.Output[str]]
    ranges: Sequence[str] = ()
    accounts: Sequence[pulumi.Output[str]] = ()


@dataclass(frozen=True)
class Identities:
    servers: NodeServiceAccount
    agents: NodeServiceAccount


@dataclass(frozen=True)
class GpuGroup:
    pool: GpuPool
    zone: str
    manager: gcp.compute.InstanceGroupManager


@dataclass(frozen=True)
class GcpK3sClusterArgs:
    spec: GceK3sClusterSpec
    project: str
    region: str
    traits: PlatformTraits
    pools: tuple[GpuPool, ...]


class GcpK3sCluster(pulumi.ComponentResource):
    """The network, firewall, identities, secrets, servers, API load balancer and GPU instance groups of a
    k3s cluster on Compute Engine, and its storage and autoscaler identity."""

    handle: GpuCluster
    groups: list[GpuGroup]
    autoscaler_identity: list[pulumi.Resource]

    def __init__(self, name: str, args: GcpK3sClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-k8s:gcp:K3sCluster", name, None, opts)
        spec, child = args.spec, pulumi.ResourceOptions(parent=self)
        shares_filestore = spec.storage.shared == FILESTORE_STORAGE
        apis = enabled_services(
            name, args.project, [*REQUIRED_APIS, *([FILESTORE_API] if shares_filestore else [])], self
        )
        network = Network(
            f"{name}-network",
            spec.name,
            spec.network,
            args.region,
            after=[apis["compute.googleapis.com"]],
            opts=child,
        )
        iam_api = [apis["iam.googleapis.com"]]
        identities = Identities(
            servers=NodeServiceAccount(
                f"{name}-servers",
                spec.name,
                args.project,
                after=iam_api,
                purpose="k3s-servers",
                display_name=f"k3s servers of {spec.name}",
                roles=(*PD_CSI_ROLES, *LOAD_BALANCER_ROLES),
                opts=child,
            ),
            agents=NodeServiceAccount(
                f"{name}-agents",
                spec.name,
                args.project,
                after=iam_api,
                purpose="k3s-agents",
                display_name=f"k3s GPU agents of {spec.name}",
                roles=(),
                opts=child,
            ),
        )
        self._firewall(name, spec, network, identities)
        api_address = gcp.compute.Address(
            f"{name}-api-address",
            address_type="EXTERNAL",
            region=args.region,
            description=f"Kubernetes API of {spec.name}",
            opts=child,
        )
        server_addresses = [
            gcp.compute.Address(
                f"{name}-server-{index}-address",
                address_type="INTERNAL",
                subnetwork=network.subnetwork,
                region=args.region,
                opts=child,
            )
            for index in range(spec.system_pool.nodes)
        ]
        # Agents register through a fixed address in front of every server (k3s "High Availability Embedded
        # etcd"), so a new GPU node joins while any server is up. One server is its own fixed address.
        registration_address = (
            gcp.compute.Address(
                f"{name}-registration-address",
                address_type="INTERNAL",
                subnetwork=network.subnetwork,
                region=args.region,
                description=f"k3s registration address of {spec.name}",
                opts=child,
            )
            if spec.system_pool.nodes > 1
            else server_addresses[0]
        )
        snapshots = SnapshotBucket(
            f"{name}-etcd-snapshots",
            spec.name,
            args.project,
            args.region,
            identities.servers,
            after=[apis["storage.googleapis.com"]],
            opts=child,
        )
        control_plane = K3sControlPlane(
            f"{name}-control-plane",
            spec.name,
            api_address.address,
            server_files=snapshots.credentials,
            opts=child,
        )
        secret_api = [apis["secretmanager.googleapis.com"]]
        server_secret, server_boot = self._secret(
            name,
            "servers",
            control_plane.server_secret,
            identities.servers,
            secret_api,
            kept_for_cluster=control_plane.cluster_id,
        )
        agent_secret, agent_boot = self._secret(
            name, "agents", control_plane.agent_secret, identities.agents, secret_api
        )
        servers = self._servers(
            name,
            args,
            network,
            identities.servers,
            server_secret,
            server_addresses,
            [api_address.address, registration_address.address],
            snapshots.store,
            [*server_boot, *snapshots.ready],
        )
        forwarding = self._load_balancers(
            name, args, network, servers, api_address, registration_address if len(servers) > 1 else None
        )
        registration_url = pulumi.Output.format("https://{0}:{1}", registration_address.address, API_PORT)
        unneeded = cluster_scale_down_unneeded_time(args.pools)
        self.groups = [
            self._gpu_group(
                pool_child_name(name, pool.spec.name),
                args,
                pool,
                network,
                identities.agents,
                agent_secret,
                registration_url,
                unneeded,
                agent_boot,
            )
            for pool in args.pools
        ]
        pd_csi_access = self._pd_csi_access(name, args.project, identities)
        self.autoscaler_identity = self._autoscaler_access(name, args.project, identities.servers)

        servers_reachable: list[pulumi.Resource] = [*servers, *forwarding]
        k8s_provider = gated_kubernetes_provider(
            name, control_plane.deployer_kubeconfig, control_plane.root_cert_pem, servers_reachable, self
        )
        # Every node waits, tainted, for the cloud controller manager to initialise it: it goes first.
        cloud_controller = GceCloudController(
            f"{name}-cloud-controller",
            cloud_controller_manifests(spec.kubernetes_version, spec.name, args.traits.system_tolerations),
            k8s_provider,
            [*servers_reachable, self._cloud_controller_access(name, args.project, identities.servers)],
            opts=child,
        )
        system_ready: list[pulumi.Resource] = [*servers_reachable, *cloud_controller.objects]
        # Only the API: the admin kubeconfig must work even when an add-on's install fails.
        system_ready.append(
            admin_access_binding(name, control_plane.admin_user, k8s_provider, self, servers_reachable)
        )
        pd_manifests = pd_csi_manifests({POOL_LABEL: SYSTEM_POOL_NAME}, args.traits.system_tolerations)
        pd_csi_namespace = next(m for m in pd_manifests if m["kind"] == "Namespace")["metadata"]["name"]
        pd_csi = PdCsiDriver(
            f"{name}-pd-csi",
            pd_manifests,
            k8s_provider,
            [*system_ready, *pd_csi_access],
            opts=child,
        )
        storage_class(
            f"{name}-storage-class",
            default_storage_class_manifest(BALANCED_PD, PROVISIONER, {"type": BALANCED_PD}),
            k8s_provider,
            self,
            [pd_csi],
        )
        shared_storage = None
        if shares_filestore:
            shared_storage = FilestoreSharedStorage(
                f"{name}-filestore",
                FilestoreSharedStorageArgs(
                    network,
                    spec.network.zones[0],
                    spec.storage.filestore_capacity_gib,
                    spec.storage.filestore_range,
                    apis[FILESTORE_API],
                    {POOL_LABEL: SYSTEM_POOL_NAME},
                    args.traits.system_tolerations,
                    k8s_provider,
                    system_ready,
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
            k3s_system_namespaces(spec, pd_csi_namespace),
            args.traits,
            k8s_provider,
            system_ready,
            opts=child,
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
        self.register_outputs({"apiEndpoint": api_address.address, "kubeconfig": control_plane.kubeconfig})

    def _firewall(self, name: str, spec: GceK3sClusterSpec, network: Network, identities: Identities) -> None:
        """Exactly the k3s ports, between the cluster's service accounts; the API also from the admin CIDRs
        and the load balancer's health checks. Compute Engine denies all other ingress."""
        servers, agents = identities.servers.email, identities.agents.email
        nodes = [servers, agents]
        health_check_ranges = sorted(
            {*HEALTH_CHECK_RANGES, *(INTERNAL_HEALTH_CHECK_RANGES if spec.system_pool.nodes > 1 else ())}
        )
        rules = [
            IngressRule("api-admins", "tcp", str(API_PORT), [servers], ranges=list(spec.api_access_cidrs)),
            IngressRule("api-health-checks", "tcp", str(API_PORT), [servers], ranges=health_check_ranges),
            IngressRule("api-nodes", "tcp", str(API_PORT), [servers], accounts=nodes),
            IngressRule("vxlan", "udp", str(FLANNEL_VXLAN_PORT), nodes, accounts=nodes),
            IngressRule("kubelet", "tcp", str(KUBELET_PORT), nodes, accounts=nodes),
        ]
        if spec.system_pool.nodes > 1:
            rules.append(IngressRule("etcd", "tcp", ETCD_PORTS, [servers], accounts=[servers]))
        for rule in rules:
            gcp.compute.Firewall(
                f"{name}-{rule.name}",
                network=network.network,
                direction="INGRESS",
                allows=[gcp.compute.FirewallAllowArgs(protocol=rule.protocol, ports=[rule.port])],
                source_ranges=rule.ranges or None,
                source_service_accounts=rule.accounts or None,
                target_service_accounts=rule.targets,
                description=f"k3s {rule.name} of {spec.name}",
                opts=pulumi.ResourceOptions(parent=self),
            )

    def _secret(
        self,
        name: str,
        audience: str,
        payload: pulumi.Output[str],
        reader: NodeServiceAccount,
        after: Sequence[pulumi.Resource],
        kept_for_cluster: pulumi.Output[str] | None = None,
    ) -> tuple[gcp.secretmanager.Secret, list[pulumi.Resource]]:
        """A secret only `reader` may read; returns it and what must exist before a node reads it.

        With `kept_for_cluster` (the control plane's cluster ID) the secret and its value are kept after
        `destroy`, like the snapshot bucket: they hold the server token and the CA keys, without which no
        snapshot can be restored (k3s "Backup and Restore"). Its ID ends in the cluster ID, so a stack made
        again under the same name makes a secret of its own."""
        kept = kept_for_cluster is not None
        secret_id: pulumi.Input[str] = (
            pulumi.Output.concat(f"{name}-k3s-{audience}-", kept_for_cluster)
            if kept_for_cluster is not None
            else f"{name}-k3s-{audience}"
        )
        child = pulumi.ResourceOptions(parent=self)
        secret = gcp.secretmanager.Secret(
            f"{name}-{audience}-bootstrap",
            secret_id=secret_id,
            replication=gcp.secretmanager.SecretReplicationArgs(
                auto=gcp.secretmanager.SecretReplicationAutoArgs()
            ),
            labels={"gpu-k8s-purpose": "k3s-bootstrap"},
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(after), retain_on_delete=kept),
        )
        version = gcp.secretmanager.SecretVersion(
            f"{name}-{audience}-bootstrap-value",
            secret=secret.id,
            secret_data=payload,
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=kept),
        )
        access = gcp.secretmanager.SecretIamMember(
            f"{name}-{audience}-bootstrap-reader",
            secret_id=secret.id,
            role=SECRET_ACCESSOR,
            member=reader.member,
            opts=child,
        )
        return secret, [version, access]

    def _servers(
        self,
        name: str,
        args: GcpK3sClusterArgs,
        network: Network,
        identity: NodeServiceAccount,
        secret: gcp.secretmanager.Secret,
        addresses: Sequence[gcp.compute.Address],
        tls_sans: Sequence[pulumi.Output[str]],
        snapshots: pulumi.Output[SnapshotStore],
        boot_after: Sequence[pulumi.Resource],
    ) -> list[gcp.compute.Instance]:
        """The servers on their reserved internal addresses, which outlive them: the other servers, the
        balancers and a replacement keep finding a server there. Server 0 founds the cluster."""
        spec = args.spec
        system = spec.system_pool
        zones = server_zones(spec)
        ccm_config = pulumi.Output.all(network.network, network.subnetwork).apply(
            lambda names: {
                CLOUD_CONFIG_PATH: cloud_config(
                    args.project, names[0].rsplit("/", 1)[-1], names[1].rsplit("/", 1)[-1], node_tag(spec)
                )
            }
        )
        urls = [pulumi.Output.format("https://{0}:{1}", a.address, API_PORT) for a in addresses]
        servers: list[gcp.compute.Instance] = []
        for index, address in enumerate(addresses):
            peers = [url for other, url in enumerate(urls) if other != index]
            user_data = server_user_data(
                spec,
                secret.id,
                tls_sans,
                peers,
                index == 0,
                snapshots,
                gce_node_bootstrap(),
                external_cloud_provider=True,
                extra_files=ccm_config,
            )
            servers.append(
                gcp.compute.Instance(
                    f"{name}-server-{index}",
                    machine_type=system.instance_type,
                    zone=zones[index],
                    boot_disk=gcp.compute.InstanceBootDiskArgs(
                        initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
                            image=ubuntu_image(system.instance_type),
                            size=system.disk_size_gib,
                            type=BALANCED_PD,
                        )
                    ),
                    network_interfaces=[
                        gcp.compute.InstanceNetworkInterfaceArgs(
                            subnetwork=network.subnetwork, network_ip=address.address
                        )
                    ],
                    service_account=gcp.compute.InstanceServiceAccountArgs(
                        email=identity.email, scopes=[CLOUD_PLATFORM_SCOPE]
                    ),
                    shielded_instance_config=gcp.compute.InstanceShieldedInstanceConfigArgs(
                        enable_secure_boot=True, enable_vtpm=True, enable_integrity_monitoring=True
                    ),
                    metadata={"user-data": user_data, **NODE_ACCESS_METADATA},
                    tags=[node_tag(spec)],
                    allow_stopping_for_update=True,
                    # A newer Ubuntu image must not replace a running server; new ones take the current image.
                    # User data runs at first boot only: a changed one would do nothing on a running server
                    # and only show as a change (upgrades: stacks/K3S.md, "Upgrading k3s").
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        depends_on=list(boot_after),
                        ignore_changes=["bootDisk.initializeParams.image", 'metadata["user-data"]'],
                    ),
                )
            )
        return servers

    def _load_balancers(
        self,
        name: str,
        args: GcpK3sClusterArgs,
        network: Network,
        servers: Sequence[gcp.compute.Instance],
        api_address: gcp.compute.Address,
        registration_address: gcp.compute.Address | None,
    ) -> list[gcp.compute.ForwardingRule]:
        """The API on the static external address through an external passthrough load balancer (clients
        keep their source address, so the servers' firewall still decides who gets in), and with more than
        one server, the registration address through an internal passthrough one. Both reach every server."""
        child = pulumi.ResourceOptions(parent=self)
        by_zone: dict[str, list[gcp.compute.Instance]] = {}
        for zone, server in zip(server_zones(args.spec), servers, strict=True):
            by_zone.setdefault(zone, []).append(server)
        groups = [
            gcp.compute.InstanceGroup(
                f"{name}-servers-{zone}",
                zone=zone,
                instances=[server.self_link for server in members],
                network=network.network,
                opts=child,
            )
            for zone, members in sorted(by_zone.items())
        ]
        health = gcp.compute.RegionHealthCheck(
            f"{name}-api-health",
            region=args.region,
            tcp_health_check=gcp.compute.RegionHealthCheckTcpHealthCheckArgs(port=API_PORT),
            opts=child,
        )
        balancers = [("api", "EXTERNAL", api_address)]
        if registration_address is not None:
            balancers.append(("registration", "INTERNAL", registration_address))
        rules = []
        for purpose, scheme, address in balancers:
            backend = gcp.compute.RegionBackendService(
                f"{name}-{purpose}-backend",
                region=args.region,
                load_balancing_scheme=scheme,
                protocol="TCP",
                health_checks=health.id,
                backends=[
                    gcp.compute.RegionBackendServiceBackendArgs(
                        group=group.self_link, balancing_mode="CONNECTION"
                    )
                    for group in groups
                ],
                opts=child,
            )
            internal = scheme == "INTERNAL"
            rules.append(
                gcp.compute.ForwardingRule(
                    f"{name}-{purpose}",
                    region=args.region,
                    load_balancing_scheme=scheme,
                    ip_address=address.address,
                    ip_protocol="TCP",
                    ports=[str(API_PORT)],
                    backend_service=backend.id,
                    network=network.network if internal else None,
                    subnetwork=network.subnetwork if internal else None,
                    opts=child,
                )
            )
        return rules

    def _gpu_group(
        self,
        name: str,
        args: GcpK3sClusterArgs,
        pool: GpuPool,
        network: Network,
        identity: NodeServiceAccount,
        secret: gcp.secretmanager.Secret,
        server_url: pulumi.Output[str],
        cluster_unneeded_time: str,
        boot_after: Sequence[pulumi.Resource],
    ) -> GpuGroup:
        """An instance template and a zonal managed instance group from zero to maxNodes for one GPU pool."""
        spec, machine = args.spec, pool.machine
        assert machine.accelerator is not None, "GPU types in the GCP catalog name their accelerator"
        user_data = pulumi.Output.all(server_url, secret.id).apply(
            lambda parts: agent_user_data(spec, pool, parts[0], parts[1])
        )
        template = gcp.compute.InstanceTemplate(
            f"{name}-template",
            description=f"k3s GPU agents of pool {pool.spec.name} in {spec.name}",
            machine_type=machine.name,
            disks=[
                gcp.compute.InstanceTemplateDiskArgs(
                    boot=True,
                    auto_delete=True,
                    # The family, resolved as each VM starts. Resolving it at `up` would replace the template
                    # with every new image, and Compute Engine refuses to delete a template that running
                    # instances of the group still use (pulumi-gcp#680), failing that `up`.
                    source_image=ubuntu_image(machine.name),
                    disk_size_gb=pool.spec.disk_size_gib,
                    disk_type=boot_disk_type(machine.name),
                )
            ],
            # The autoscaler counts a node's GPUs from these (templates.go BuildCapacity), so they are listed
            # even where the machine type brings its GPUs.
            guest_accelerators=[
                gcp.compute.InstanceTemplateGuestAcceleratorArgs(
                    type=machine.accelerator, count=pool.gpus_per_node
                )
            ],
            scheduling=gcp.compute.InstanceTemplateSchedulingArgs(
                # GPU VMs cannot live-migrate.
                on_host_maintenance="TERMINATE",
                automatic_restart=not pool.spec.spot,
                preemptible=pool.spec.spot,
                provisioning_model="SPOT" if pool.spec.spot else "STANDARD",
                # The group recreates a preempted VM when the autoscaler still wants it.
                instance_termination_action="DELETE" if pool.spec.spot else None,
            ),
            network_interfaces=[
                gcp.compute.InstanceTemplateNetworkInterfaceArgs(subnetwork=network.subnetwork)
            ],
            service_account=gcp.compute.InstanceTemplateServiceAccountArgs(
                email=identity.email, scopes=[CLOUD_PLATFORM_SCOPE]
            ),
            # No Secure Boot: the GPU Operator builds the NVIDIA kernel modules on the node, unsigned.
            shielded_instance_config=gcp.compute.InstanceTemplateShieldedInstanceConfigArgs(
                enable_secure_boot=False, enable_vtpm=True, enable_integrity_monitoring=True
            ),
            metadata={
                "user-data": user_data,
                **agent_metadata(pool, cluster_unneeded_time),
            },
            tags=[node_tag(spec)],
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(boot_after)),
        )
        zone = pool_zone(spec, pool)
        manager = gcp.compute.InstanceGroupManager(
            f"{name}-group",
            zone=zone,
            base_instance_name=instance_base_name(spec, pool.spec.name),
            versions=[
                gcp.compute.InstanceGroupManagerVersionArgs(instance_template=template.self_link_unique)
            ],
            target_size=pool.spec.min_nodes,
            # A new template reaches new nodes only: running GPU jobs are not restarted by an update.
            update_policy=gcp.compute.InstanceGroupManagerUpdatePolicyArgs(
                type="OPPORTUNISTIC", minimal_action="REPLACE"
            ),
            # The autoscaler owns the size.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["targetSize"]),
        )
        return GpuGroup(pool=pool, zone=zone, manager=manager)

    def _cloud_controller_access(
        self, name: str, project: str, servers: NodeServiceAccount
    ) -> gcp.projects.IAMMember:
        """The CCM runs on the servers, on their network, as their service account: read instances, zones
        and the network."""
        role = custom_role(
            f"{name}-cloud-controller-role",
            project,
            f"cloud controller manager of {name}",
            CCM_PERMISSIONS,
            self,
        )
        return gcp.projects.IAMMember(
            f"{name}-cloud-controller-reads",
            project=project,
            role=role.name,
            member=servers.member,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _pd_csi_access(self, name: str, project: str, identities: Identities) -> list[pulumi.Resource]:
        """The driver's controller runs on the servers as their service account: upstream's custom role for
        attaching disks, and acting as the node accounts whose VMs it attaches disks to (granted on those two
        accounts, not project-wide)."""
        child = pulumi.ResourceOptions(parent=self)
        role = custom_role(
            f"{name}-pd-csi-role", project, f"PD CSI driver of {name}", custom_role_permissions(), self
        )
        grants: list[pulumi.Resource] = [
            *identities.servers.bindings,
            gcp.projects.IAMMember(
                f"{name}-pd-csi-attaches",
                project=project,
                role=role.name,
                member=identities.servers.member,
                opts=child,
            ),
        ]
        for target, identity in (("servers", identities.servers), ("agents", identities.agents)):
            grants.append(
                gcp.serviceaccount.IAMMember(
                    f"{name}-pd-csi-acts-as-{target}",
                    service_account_id=identity.account.name,
                    role=SERVICE_ACCOUNT_USER,
                    member=identities.servers.member,
                    opts=child,
                )
            )
        return grants

    def _autoscaler_access(
        self, name: str, project: str, servers: NodeServiceAccount
    ) -> list[pulumi.Resource]:
        """The autoscaler runs on the servers as their service account: read what it plans with, and resize
        instance groups, project-wide. It cannot be narrowed to this cluster's groups: instance group
        managers take no IAM policy of their own (Compute API v1: no setIamPolicy among their methods), and
        they are not among the resource types IAM Conditions evaluate `resource.name` for (Google Cloud,
        "Resource attributes for IAM Conditions": the Compute types go from Instance to InstanceTemplate),
        so a condition on their names would not grant the resize. A project per cluster bounds it."""
        child = pulumi.ResourceOptions(parent=self)
        grants: list[pulumi.Resource] = []
        for purpose, what, permissions, verb in (
            ("reader", "read", AUTOSCALER_READ_PERMISSIONS, "reads"),
            ("resizer", "resize", AUTOSCALER_RESIZE_PERMISSIONS, "resizes"),
        ):
            role = custom_role(
                f"{name}-autoscaler-{purpose}",
                project,
                f"cluster-autoscaler of {name}: {what}",
                permissions,
                self,
            )
            grants.append(
                gcp.projects.IAMMember(
                    f"{name}-autoscaler-{verb}",
                    project=project,
                    role=role.name,
                    member=servers.member,
                    opts=child,
                )
            )
        return grants


def build(spec: GceK3sClusterSpec) -> GpuCluster:
    """Everything `pulumi up -s gcp-k3s` creates; validation runs before the first resource."""
    catalog = load_catalog()
    project, region = project_and_region()
    traits = k3s_traits(spec, ACCELERATOR_LABEL)
    raise_if_any(
        gcp_k3s_issues(spec, region),
        system_pool_issues(spec, catalog),
        platform_issues(spec, traits, catalog),
    )
    pools = resolve_pools(spec, catalog, traits)
    raise_if_any(metadata_issues(spec, pools))
    # Every resource of the stack goes through the provider, which waits for the server count's check: a
    # preview or `up` that changes the count fails there, before anything else is touched.
    provider = gcp.Provider(
        f"{spec.name}-gcp",
        project=project,
        region=region,
        default_labels={"gpu-k8s-cluster": spec.name},
        opts=pulumi.ResourceOptions(
            depends_on=[server_count(spec, config_path("network", "zones"), server_zones(spec))]
        ),
    )
    # Whether the project can start each pool's machine type in its zone is known only by asking.
    raise_if_any(
        machine_type_issues(
            spec,
            project,
            k3s_pool_zones(spec),
            server_zones(spec),
            pulumi.InvokeOptions(provider=provider),
        )
    )
    k3s = GcpK3sCluster(
        spec.name,
        GcpK3sClusterArgs(spec, project, region, traits, pools),
        opts=pulumi.ResourceOptions(providers=[provider]),
    )
    cluster = k3s.handle
    groups = [
        {
            "name": instance_group_url(project, group.zone, group.manager.name),
            "minSize": group.pool.spec.min_nodes,
            "maxSize": group.pool.spec.max_nodes,
        }
        for group in k3s.groups
    ]
    return install_gpu_addons(
        spec,
        cluster,
        {**autoscaler_cloud_values(groups), **AUTOSCALER_ON_HOST_NETWORK},
        k3s.autoscaler_identity,
    )
