"""k3s on Compute Engine GPU VMs: `build` is what `pulumi up -s gcp-k3s` runs.

Servers are plain VMs (1, or 3 with embedded etcd) behind an external passthrough load balancer with a static
address; each GPU pool is a zonal managed instance group the cluster-autoscaler scales from zero. No SSH
anywhere: nodes read their bootstrap secrets from Secret Manager as their own service account, OS Login
governs any future login and project-wide SSH keys are blocked. Here: the servers, identities, secrets and
add-ons; k3s_network.py: firewall and balancers; k3s_agents.py: the GPU pools; k3s_access.py: what the
servers' account may do for the add-ons on them; k3s_bootstrap.py: what a node boots with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from gpu_k8s.components.autoscaler import cluster_scale_down_unneeded_time, install_gpu_addons
from gpu_k8s.components.catalog import load_catalog
from gpu_k8s.components.cluster import (
    POOL_LABEL,
    SYSTEM_POOL_NAME,
    GpuCluster,
    GpuPool,
    PlatformTraits,
    platform_issues,
    resolve_pools,
)
from gpu_k8s.components.configbase import ConfigIssue, config_path, raise_if_any
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
from gpu_k8s.components.prices import gcp_pool_node_price
from gpu_k8s.components.spec import GpuPoolSpec, pool_child_name
from gpu_k8s.components.storage import default_storage_class_manifest, storage_class
from gpu_k8s.providers.gcp.autoscaling import (
    ACCELERATOR_LABEL,
    autoscaler_cloud_values,
    instance_group_url,
)
from gpu_k8s.providers.gcp.backups import SnapshotBucket
from gpu_k8s.providers.gcp.cloud_controller import (
    CLOUD_CONFIG_PATH,
    GceCloudController,
    cloud_config,
    cloud_controller_manifests,
)
from gpu_k8s.providers.gcp.iam import NodeServiceAccount
from gpu_k8s.providers.gcp.k3s_access import (
    PD_CSI_ROLES,
    autoscaler_access,
    cloud_controller_access,
    pd_csi_access,
)
from gpu_k8s.providers.gcp.k3s_agents import (
    MAX_BASE_INSTANCE_NAME,
    GpuGroup,
    gpu_group,
    instance_base_name,
    metadata_issues,
)
from gpu_k8s.providers.gcp.k3s_bootstrap import NODE_ACCESS_METADATA, gce_node_bootstrap
from gpu_k8s.providers.gcp.k3s_network import Identities, firewall, load_balancers, node_tag, server_zones
from gpu_k8s.providers.gcp.location import (
    machine_type_issues,
    offering_issues,
    project_and_region,
    zone_issues,
)
from gpu_k8s.providers.gcp.machines import (
    BALANCED_PD,
    CLOUD_PLATFORM_SCOPE,
    system_pool_issues,
    ubuntu_image,
)
from gpu_k8s.providers.gcp.network import Network
from gpu_k8s.providers.gcp.pd_csi import PROVISIONER, PdCsiDriver, pd_csi_manifests
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
SECRET_ACCESSOR = "roles/secretmanager.secretAccessor"


def k3s_pool_zones(spec: GceK3sClusterSpec) -> Callable[[GpuPoolSpec], Sequence[str]]:
    """A k3s pool is one zonal group: its own zone, else the network's first."""
    return lambda pool: list((pool.zones or spec.network.zones)[:1])


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
                roles=PD_CSI_ROLES,
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
        firewall(self, name, spec, network, identities)
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
            after=[apis["storage.googleapis.com"], *iam_api],
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
        forwarding = load_balancers(
            self,
            name,
            spec,
            args.region,
            network,
            servers,
            api_address,
            registration_address if len(servers) > 1 else None,
        )
        registration_url = pulumi.Output.format("https://{0}:{1}", registration_address.address, API_PORT)
        unneeded = cluster_scale_down_unneeded_time(args.pools)
        self.groups = [
            gpu_group(
                self,
                pool_child_name(name, pool.spec.name),
                spec,
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
        pd_csi_grants = pd_csi_access(self, name, args.project, identities, iam_api)
        self.autoscaler_identity = autoscaler_access(self, name, args.project, identities.servers, iam_api)

        servers_reachable: list[pulumi.Resource] = [*servers, *forwarding]
        k8s_provider = gated_kubernetes_provider(
            name, control_plane.deployer_kubeconfig, control_plane.root_cert_pem, servers_reachable, self
        )
        # Every node waits, tainted, for the cloud controller manager to initialise it: it goes first.
        cloud_controller = GceCloudController(
            f"{name}-cloud-controller",
            cloud_controller_manifests(spec.kubernetes_version, spec.name, args.traits.system_tolerations),
            k8s_provider,
            [
                *servers_reachable,
                *cloud_controller_access(self, name, args.project, identities.servers, iam_api),
            ],
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
            [*system_ready, *pd_csi_grants],
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
        node_price=gcp_pool_node_price(region),
    )
