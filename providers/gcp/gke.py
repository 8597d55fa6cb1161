"""Managed GKE Standard with GPU node pools: `build` is what `pulumi up -s gcp-gke` runs."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import ipaddress
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_gcp as gcp

from gpu_k8s.components.batch import WEBHOOK_PORTS, BatchQueues
from gpu_k8s.components.catalog import Catalog, load_catalog
from gpu_k8s.components.cluster import (
    POOL_LABEL,
    GpuCluster,
    GpuPool,
    PlatformTraits,
    platform_issues,
    resolve_pools,
)
from gpu_k8s.components.compat import DriverFacts
from gpu_k8s.components.configbase import ConfigIssue, config_path, raise_if_any
from gpu_k8s.components.gpu_operator import GpuOperator, GpuOperatorArgs
from gpu_k8s.components.inference import KEDA_API_PORTS, install_inference
from gpu_k8s.components.kubeconfig import exec_kubeconfig, kubernetes_provider
from gpu_k8s.components.monitoring import install_monitoring
from gpu_k8s.components.prices import gcp_pool_node_price
from gpu_k8s.components.sharing import SharingSpec
from gpu_k8s.components.spec import (
    SUPPORTED_KUBERNETES_MINORS,
    TAINT_EFFECT_API_NAMES,
    GpuPoolSpec,
    SystemPoolSpec,
    TaintSpec,
    host_range_issue,
    pool_child_name,
)
from gpu_k8s.components.storage import (
    SharedStorage,
    shared_storage_class_manifest,
    shared_storage_classes,
)
from gpu_k8s.providers.gcp.iam import KMS_ENCRYPTER, NodeServiceAccount, gke_service_agent
from gpu_k8s.providers.gcp.location import (
    machine_type_issues,
    offering_issues,
    project_and_region,
    zone_issues,
)
from gpu_k8s.providers.gcp.machines import CLOUD_PLATFORM_SCOPE, boot_disk_type, system_pool_issues
from gpu_k8s.providers.gcp.network import Network
from gpu_k8s.providers.gcp.services import enabled_services
from gpu_k8s.providers.gcp.settings import COMPACT, FILESTORE_STORAGE, GkeClusterSpec, GkeSpec
from gpu_k8s.providers.gcp.shared_storage import FILESTORE_API

# GKE's managed driver install is finished by an init container of GKE's own device-plugin DaemonSet, so
# GKE's plugin stays on (never the `gke-no-default-nvidia-gpu-device-plugin` label: a labelled pool with the
# managed install comes up driverless; NVIDIA AICR docs/integrator/gke-gpu-setup.md, NVIDIA/aicr#2047).
# Where GKE's installer puts the driver on COS; the operator's toolkit goes beside it.
GKE_NVIDIA_DIR = "/home/kubernetes/bin/nvidia"
# GKE taints GPU nodes of clusters with non-GPU pools nvidia.com/gpu=present:NoSchedule itself and refuses a
# second taint with that key and effect (hashicorp/terraform-provider-google#7928; cluster-toolkit's
# gke-node-pool sets the same value for that reason).
GKE_GPU_TAINT_VALUE = "present"
# GKE's own GPU sharing (GPUSharingConfig.gpuSharingStrategy in the pinned discovery document).
GKE_SHARING_STRATEGY = {"timeSlicing": "TIME_SHARING", "mps": "MPS"}
# GKE >= 1.33: the toolkit must read containerd's config from its file (NVIDIA google-gke.rst known issue).
RUNTIME_CONFIG_FROM_FILE_SINCE = (1, 33)
NODE_IMAGE = "COS_CONTAINERD"
NODE_OAUTH_SCOPES = (CLOUD_PLATFORM_SCOPE,)
LOGGED_COMPONENTS = ("SYSTEM_COMPONENTS", "APISERVER", "CONTROLLER_MANAGER", "SCHEDULER", "WORKLOADS")
MONITORED_COMPONENTS = ("SYSTEM_COMPONENTS",)
# "Node pool names must be 40 characters or fewer" (gcloud container node-pools create); Pulumi's auto-name
# appends "-" and 7 random characters.
MAX_NODE_POOL_NAME = 40
AUTONAME_SUFFIX = 8
# NodeConfig.labels "supports up to 1,024 total characters in a single request" (GKE API discovery document;
# counted here as keys plus values).
MAX_NODE_LABEL_CHARACTERS = 1024
DAILY_WINDOW_START = re.compile(r"^([01][0-9]|2[0-3]):[0-5][0-9]$")
# A Cloud KMS key's resource name: a project ID (or a domain-scoped one), a region, and key ring and key IDs
# of letters, digits, underscores and hyphens, 1-63 characters (Cloud KMS resource IDs, recalled:
# UNCONFIRMED here). No version suffix: GKE takes the key.
KMS_KEY = re.compile(
    r"projects/((?:[a-z][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9])/locations/([a-z]+-[a-z]+[0-9]+)"
    r"/keyRings/[A-Za-z0-9_-]{1,63}/cryptoKeys/[A-Za-z0-9_-]{1,63}",
    re.ASCII,
)
DRIVER_CHANNEL = {"default": "DEFAULT", "latest": "LATEST"}
# Cloud Resource Manager serves project IAM bindings and project lookups; even reading a Service needs it,
# so on a project where it is off it must be enabled once by hand first (stacks/README.md, "GCP project").
REQUIRED_APIS = (
    "cloudresourcemanager.googleapis.com",
    "compute.googleapis.com",
    "container.googleapis.com",
    "iam.googleapis.com",
)
FILESTORE_PROVISIONER = "filestore.csi.storage.gke.io"


def filestore_storage_class_manifest(network_name: pulumi.Input[str]) -> dict[str, Any]:
    """`shared-rwx` on Filestore: each claim is a Filestore instance of the basic HDD tier (`standard`), in
    the zone of its first pod and on the cluster's VPC. The driver's default network is `default`, which a
    cluster on its own VPC cannot reach (parameters from the driver's README at v1.13.1)."""
    return shared_storage_class_manifest(
        FILESTORE_PROVISIONER, {"tier": "standard", "network": network_name}, zonal=True, expandable=True
    )


# The cluster is created with a default node pool that is removed at once; the API then reports nodeConfig
# from "the first node pool" (discovery document, Cluster.nodeConfig) and the provider reads an empty one
# back. nodeConfig is ForceNew, so without this every later `up` would replace the cluster
# (GoogleCloudPlatform/k8s-config-connector#8125; cluster-toolkit's gke-cluster ignores it for this reason).
#
# The dataplane is chosen at creation: GKE Dataplane V2 enforces NetworkPolicy ("always on", GKE's Dataplane
# V2 concepts page) and is what GKE multi-networking needs. The provider replaces a cluster whose
# datapathProvider changes (ForceNew in terraform-provider-google's container cluster schema), so a cluster
# made before this default keeps its legacy dataplane rather than being replaced; GKE documents moving one
# in place from 1.35.3-gke.1155000 (about-migrating-dataplane-v2).
CLUSTER_IGNORED_CHANGES = ("nodeConfig", "datapathProvider")
DATAPLANE_V2 = "ADVANCED_DATAPATH"
KMS_API = "cloudkms.googleapis.com"
# Cloud KMS's automatic rotation: a new key version every 90 days (the CIS Google Cloud benchmark's bound
# for KMS keys, recalled, not pinned here); old versions keep decrypting what they encrypted.
SECRETS_KEY_ROTATION = "7776000s"


def gke_traits(spec: GkeClusterSpec) -> PlatformTraits:
    """How GKE runs GPUs: Google's installer owns the driver; the operator adds toolkit and device plugin."""
    minor = tuple(int(part) for part in spec.kubernetes_version.split("."))
    return PlatformTraits(
        # GKE picks the DEFAULT or LATEST driver per GKE patch, COS release and GPU model; the mapping is a
        # table in GKE's docs that could not be retrieved here, so the version is left unknown and the
        # driver/CUDA check warns instead of guessing.
        driver=DriverFacts(
            owner="cloud-installer",
            version=None,
            upgrade_hint="set gke.gpuDriverVersion: latest for GKE's newest driver branch on COS",
            installer=f"GKE's installer ({DRIVER_CHANNEL[spec.gke.gpu_driver_version]} channel)",
        ),
        toolkit_preinstalled=False,
        # GKE labels GPU nodes cloud.google.com/gke-accelerator itself, on nodes and in its autoscaler.
        accelerator_label=None,
        driver_install_dir=GKE_NVIDIA_DIR,
        toolkit_install_dir=GKE_NVIDIA_DIR,
        toolkit_runtime_config_source="file" if minor >= RUNTIME_CONFIG_FROM_FILE_SINCE else None,
        needs_priority_quota=True,
        # GKE's device plugin advertises the GPUs, time-shared, MPS-shared or MIG-partitioned as the node
        # pool says, so GKE's autoscaler knows what a new node brings; the operator adds the toolkit, DCGM
        # exporter, GPU feature discovery and validation (NVIDIA AICR's gke-default profile).
        gpu_sharing_owner="platform",
        gpu_taint_value=GKE_GPU_TAINT_VALUE,
        cluster_dns="kube-dns",
    )


def accelerator_sharing(pool: GpuPool) -> dict[str, object]:
    """The guest accelerator's sharing fields for a pool (GKE docs "time-sharing GPUs", "NVIDIA MPS",
    "multi-instance GPUs"): GKE's device plugin then advertises replicas x GPUs, or the partitions, as
    nvidia.com/gpu."""
    sharing = pool.spec.sharing
    if sharing.mode in GKE_SHARING_STRATEGY:
        assert sharing.replicas is not None, "validated: timeSlicing and mps need replicas"
        return {
            "gpu_sharing_config": gcp.container.NodePoolNodeConfigGuestAcceleratorGpuSharingConfigArgs(
                gpu_sharing_strategy=GKE_SHARING_STRATEGY[sharing.mode],
                max_shared_clients_per_gpu=sharing.replicas,
            )
        }
    if sharing.mode == "mig":
        return {"gpu_partition_size": sharing.profile}
    return {}


def gke_pool_zones(spec: GkeClusterSpec) -> Callable[[GpuPoolSpec], Sequence[str]]:
    """A GKE pool's nodes go to its own zones, else the network's."""
    return lambda pool: pool.zones or spec.network.zones


def gke_issues(
    spec: GkeClusterSpec, catalog: Catalog, region: str, pools: Sequence[GpuPool]
) -> Iterable[ConfigIssue]:
    """What the generic validation cannot know: zones of the region, GKE's names and limits, and what GKE's
    own autoscaler can plan for."""
    yield from zone_issues(spec, region)
    yield from offering_issues(spec, gke_pool_zones(spec))
    yield from system_pool_issues(spec, catalog)
    yield from _control_plane_issues(spec.gke, region)
    yield from _control_plane_range_issues(spec)
    yield from _node_pool_issues(spec, pools)


def _control_plane_issues(gke: GkeSpec, region: str) -> Iterable[ConfigIssue]:
    try:
        master_range = ipaddress.IPv4Network(gke.master_ipv4_cidr_block)
        fits = master_range.prefixlen == 28 and master_range.is_private
        fits = fits and host_range_issue("", gke.master_ipv4_cidr_block) is None
    except ValueError:
        fits = False
    if not fits:
        yield ConfigIssue(
            config_path("gke", "masterIpv4CidrBlock"),
            gke.master_ipv4_cidr_block,
            "the control plane's range must be a private /28 hosts can have (no documentation range)",
            "use an unused /28 such as 172.16.0.0/28",
        )
    yield from _maintenance_issues(gke)
    key = gke.secrets_kms_key
    match = KMS_KEY.fullmatch(key) if key is not None else None
    if key is not None and match is None:
        yield ConfigIssue(
            config_path("gke", "secretsKmsKey"),
            key,
            "not a Cloud KMS key name",
            "write projects/<project>/locations/<region>/keyRings/<ring>/cryptoKeys/<key>",
        )
    elif match is not None and match.group(2) != region:
        # Application-layer secrets encryption needs the key in the cluster's region (GKE docs, recalled;
        # UNCONFIRMED here).
        yield ConfigIssue(
            config_path("gke", "secretsKmsKey"),
            key,
            f"the key is in {match.group(2)}, the cluster in {region}",
            f"use a key ring in {region}",
        )


def _control_plane_range_issues(spec: GkeClusterSpec) -> Iterable[ConfigIssue]:
    """The control plane's /28 is peered into the VPC: it must not share addresses with the subnet's node,
    pod or service ranges this stack creates."""
    try:
        master_range = ipaddress.IPv4Network(spec.gke.master_ipv4_cidr_block)
    except ValueError:
        return  # refused as malformed already
    net = spec.network
    for key, value in (("cidr", net.cidr), ("podsCidr", net.pods_cidr), ("servicesCidr", net.services_cidr)):
        # The stack's ranges are valid CIDRs here: load_spec refused any other.
        if value is not None and master_range.overlaps(ipaddress.IPv4Network(value)):
            yield ConfigIssue(
                config_path("gke", "masterIpv4CidrBlock"),
                spec.gke.master_ipv4_cidr_block,
                f"overlaps network.{key} ({value})",
                "pick a /28 outside the node, pod and service ranges, e.g. 172.16.0.0/28",
            )


# RFC 3339's date-time (section 5.6), which the GKE API takes: Python's fromisoformat also reads ISO 8601
# forms the API refuses (a space for the "T", no seconds, the basic format without dashes).
RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})", re.ASCII)


def _timestamp(text: str) -> datetime.datetime | None:
    if not RFC3339.fullmatch(text):
        return None
    try:
        parsed = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def _maintenance_issues(gke: GkeSpec) -> Iterable[ConfigIssue]:
    if not DAILY_WINDOW_START.match(gke.maintenance_window_start):
        yield ConfigIssue(
            config_path("gke", "maintenanceWindowStart"),
            gke.maintenance_window_start,
            'not a time of day "HH:MM" (GMT)',
            'write it like "03:00"',
        )
    names: dict[str, int] = {}
    for index, exclusion in enumerate(gke.maintenance_exclusions):
        path = functools.partial(config_path, "gke", "maintenanceExclusions", index)
        if not exclusion.name:
            yield ConfigIssue(path("name"), exclusion.name, "is empty", "name the exclusion, e.g. year-end")
        elif exclusion.name in names:
            yield ConfigIssue(
                path("name"),
                exclusion.name,
                f"is the name of maintenanceExclusions[{names[exclusion.name]}] (GKE keys them by name)",
                "give each exclusion its own name",
            )
        names.setdefault(exclusion.name, index)
        times = {}
        for key, text in (("startTime", exclusion.start_time), ("endTime", exclusion.end_time)):
            times[key] = _timestamp(text)
            if times[key] is None:
                yield ConfigIssue(
                    path(key),
                    text,
                    "not an RFC 3339 timestamp with a time zone",
                    "write 2027-01-04T00:00:00Z",
                )
        start, end = times["startTime"], times["endTime"]
        if start is not None and end is not None and end <= start:
            yield ConfigIssue(
                path("endTime"), exclusion.end_time, "ends before it starts", "end it after startTime"
            )


def _node_pool_issues(spec: GkeClusterSpec, pools: Sequence[GpuPool]) -> Iterable[ConfigIssue]:
    for index, pool in enumerate(pools):
        path = functools.partial(config_path, "gpuPools", index)
        resource_name = pool_child_name(spec.name, pool.spec.name)
        if len(resource_name) + AUTONAME_SUFFIX > MAX_NODE_POOL_NAME:
            room = MAX_NODE_POOL_NAME - AUTONAME_SUFFIX - len(resource_name) + len(pool.spec.name)
            fix = (
                f"shorten the pool name to at most {room} characters (or the cluster name)"
                if room > 0
                else "shorten the cluster name (gpu-k8s:cluster.name) to leave room for the pool's: together "
                f"they take at most {MAX_NODE_POOL_NAME - AUTONAME_SUFFIX - len('-gpu-')} characters"
            )
            yield ConfigIssue(
                path("name"),
                pool.spec.name,
                f'makes the node pool name "{resource_name}" plus its random suffix longer than '
                f"{MAX_NODE_POOL_NAME} characters",
                fix,
            )
        if "scale_down_unneeded_time" in pool.spec.model_fields_set:
            yield ConfigIssue(
                path("scaleDownUnneededTime"),
                pool.spec.scale_down_unneeded_time,
                "GKE's autoscaler has no per-pool scale-down time (the cluster runs OPTIMIZE_UTILIZATION, "
                "which removes idle nodes sooner than the default profile)",
                "remove it",
            )
        size = sum(len(key) + len(value) for key, value in pool.node_labels.items())
        if size > MAX_NODE_LABEL_CHARACTERS:
            yield ConfigIssue(
                path("labels"),
                dict(pool.spec.labels),
                f"the pool's node labels come to {size} characters; GKE takes at most "
                f"{MAX_NODE_LABEL_CHARACTERS} in one request",
                "shorten or drop some of your labels",
            )
        yield from _sharing_issues(functools.partial(path, "sharing"), pool.spec.sharing)


# Sharing keys of the operator's device plugin that GKE's plugin has no equivalent for.
GKE_UNSHARABLE = {
    "layout": (
        "GKE cuts every GPU of a node into partitions of one size (gpuPartitionSize)",
        "use profile: <one size>; for a layout of several sizes use kind: k3s on GCE, where the GPU "
        "Operator's MIG manager applies it",
    ),
    "renameByDefault": (
        "GKE's device plugin always advertises shared GPUs as nvidia.com/gpu",
        "remove it; pods pick shared nodes by the cloud.google.com/gke-gpu-sharing-strategy label",
    ),
    "failRequestsGreaterThanOne": (
        "GKE's device plugin decides how requests for several shared GPUs are handled",
        "remove it",
    ),
}


def _sharing_issues(path: Callable[..., str], sharing: SharingSpec) -> Iterable[ConfigIssue]:
    set_keys = sharing.model_dump(by_alias=True, exclude_none=True)
    for key, (problem, fix) in GKE_UNSHARABLE.items():
        if set_keys.get(key) not in (None, False):
            yield ConfigIssue(path(key), set_keys[key], f"not available on gke: {problem}", fix)
    if sharing.strategy == "mixed":
        yield ConfigIssue(
            path("strategy"),
            sharing.strategy,
            "not available on gke: GKE advertises MIG partitions as nvidia.com/gpu (the single strategy)",
            "remove it",
        )


def render_kubeconfig(cluster_name: str, endpoint: str, ca_data: str | None) -> str:
    """A kubeconfig that authenticates with `gke-gcloud-auth-plugin` as the application default credentials,
    the identity the GCP provider deploys with (without the flag the plugin asks the gcloud CLI, which CI
    with workload identity federation does not log in: kubernetes/cloud-provider-gcp#264).

    `ca_data` is the cluster CA for the IP endpoint; None for the DNS endpoint, whose certificate the
    system's trust store verifies (UNCONFIRMED here: taken from gcloud's --dns-endpoint kubeconfigs)."""
    return exec_kubeconfig(
        cluster_name,
        f"https://{endpoint}",
        ca_data,
        {
            "command": "gke-gcloud-auth-plugin",
            "args": ["--use_application_default_credentials"],
            "installHint": "gcloud components install gke-gcloud-auth-plugin",
            "provideClusterInfo": True,
        },
    )


def system_node_layout(nodes: int, zones: Sequence[str]) -> tuple[list[str], int]:
    """The zones of a fixed-size pool and the nodes in each: the most zones that split `nodes` evenly,
    so the pool holds exactly `nodes` (GKE counts a pool's nodes per zone)."""
    spread = max(k for k in range(1, min(nodes, len(zones)) + 1) if nodes % k == 0)
    return list(zones[:spread]), nodes // spread


def gke_taints(taints: Iterable[TaintSpec]) -> list[gcp.container.NodePoolNodeConfigTaintArgs]:
    return [
        gcp.container.NodePoolNodeConfigTaintArgs(
            key=t.key, value=t.value, effect=TAINT_EFFECT_API_NAMES[t.effect]
        )
        for t in taints
    ]


def node_config(
    service_account: pulumi.Input[str],
    machine_type: str,
    disk_size_gib: int,
    labels: dict[str, str],
    taints: Iterable[TaintSpec] = (),
    accelerators: list[gcp.container.NodePoolNodeConfigGuestAcceleratorArgs] | None = None,
    spot: bool = False,
    gvnic: bool = False,
) -> gcp.container.NodePoolNodeConfigArgs:
    """Node settings every pool shares: its own service account, GKE metadata server, shielded VM."""
    return gcp.container.NodePoolNodeConfigArgs(
        machine_type=machine_type,
        image_type=NODE_IMAGE,
        disk_size_gb=disk_size_gib,
        disk_type=boot_disk_type(machine_type),
        service_account=service_account,
        # Access is decided by IAM on the service account; the scope only has to allow it.
        oauth_scopes=list(NODE_OAUTH_SCOPES),
        workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(
            mode="GKE_METADATA"
        ),
        shielded_instance_config=gcp.container.NodePoolNodeConfigShieldedInstanceConfigArgs(
            enable_secure_boot=True, enable_integrity_monitoring=True
        ),
        labels=labels,
        taints=gke_taints(taints),
        guest_accelerators=accelerators,
        spot=spot,
        # Google's virtual NIC: more bandwidth between GPU nodes (GKE "Use gVNIC": GPU nodes, COS images).
        gvnic=gcp.container.NodePoolNodeConfigGvnicArgs(enabled=True) if gvnic else None,
    )


@dataclass(frozen=True)
class GkeClusterArgs:
    spec: GkeClusterSpec
    project: str
    region: str
    traits: PlatformTraits
    pools: tuple[GpuPool, ...]


class GkeCluster(pulumi.ComponentResource):
    """A GKE Standard control plane, its network and node identity, the system and GPU node pools, and
    default storage."""

    handle: GpuCluster

    def __init__(self, name: str, args: GkeClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-k8s:gcp:GkeCluster", name, None, opts)
        spec, gke, child = args.spec, args.spec.gke, pulumi.ResourceOptions(parent=self)
        own_key = gke.secrets_kms_key is None
        apis = enabled_services(
            name,
            args.project,
            [
                *REQUIRED_APIS,
                *([FILESTORE_API] if spec.runs_filestore_csi else []),
                *([KMS_API] if own_key else []),
            ],
            self,
        )
        network = Network(
            f"{name}-network",
            spec.name,
            spec.network,
            args.region,
            after=[apis["compute.googleapis.com"]],
            opts=child,
        )
        nodes = NodeServiceAccount(
            f"{name}-nodes", spec.name, args.project, after=[apis["iam.googleapis.com"]], opts=child
        )
        prerequisites: list[pulumi.Resource] = [*nodes.bindings, apis["container.googleapis.com"]]
        if spec.runs_filestore_csi:
            # The cluster turns GKE's Filestore CSI add-on on: the API it calls is enabled first.
            prerequisites.append(apis[FILESTORE_API])
        secrets_key = (
            gke.secrets_kms_key
            if gke.secrets_kms_key is not None
            else self._secrets_key(name, args.project, args.region, apis[KMS_API])
        )
        project = gcp.organizations.get_project_output(
            project_id=args.project, opts=pulumi.InvokeOutputOptions(parent=self)
        )
        prerequisites.append(
            gcp.kms.CryptoKeyIAMMember(
                f"{name}-secrets-key-access",
                crypto_key_id=secrets_key,
                role=KMS_ENCRYPTER,
                member=gke_service_agent(project.number),
                # Enabling the GKE API creates the service agent this binding names.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[apis["container.googleapis.com"]]),
            )
        )
        zones = list(spec.network.zones)
        location = args.region if gke.regional else zones[0]
        cluster = gcp.container.Cluster(
            f"{name}-gke",
            name=spec.name,
            project=args.project,
            location=location,
            # For a zonal cluster the provider's docs say to omit its own zone here.
            node_locations=zones if gke.regional else (zones[1:] or None),
            min_master_version=spec.kubernetes_version,
            release_channel=gcp.container.ClusterReleaseChannelArgs(channel=gke.release_channel),
            network=network.network,
            subnetwork=network.subnetwork,
            networking_mode="VPC_NATIVE",
            datapath_provider=DATAPLANE_V2,
            ip_allocation_policy=gcp.container.ClusterIpAllocationPolicyArgs(
                cluster_secondary_range_name=network.pods_range_name,
                services_secondary_range_name=network.services_range_name,
            ),
            private_cluster_config=gcp.container.ClusterPrivateClusterConfigArgs(
                enable_private_nodes=True,
                enable_private_endpoint=False,
                master_ipv4_cidr_block=gke.master_ipv4_cidr_block,
            ),
            master_authorized_networks_config=gcp.container.ClusterMasterAuthorizedNetworksConfigArgs(
                cidr_blocks=[
                    gcp.container.ClusterMasterAuthorizedNetworksConfigCidrBlockArgs(
                        cidr_block=cidr, display_name=f"apiAccessCidrs-{index}"
                    )
                    for index, cidr in enumerate(spec.api_access_cidrs)
                ]
            ),
            control_plane_endpoints_config=(
                gcp.container.ClusterControlPlaneEndpointsConfigArgs(
                    dns_endpoint_config=gcp.container.ClusterControlPlaneEndpointsConfigDnsEndpointConfigArgs(
                        allow_external_traffic=True
                    )
                )
                if gke.control_plane_dns_endpoint
                else None
            ),
            maintenance_policy=gcp.container.ClusterMaintenancePolicyArgs(
                daily_maintenance_window=gcp.container.ClusterMaintenancePolicyDailyMaintenanceWindowArgs(
                    start_time=gke.maintenance_window_start
                ),
                maintenance_exclusions=[
                    gcp.container.ClusterMaintenancePolicyMaintenanceExclusionArgs(
                        exclusion_name=exclusion.name,
                        start_time=exclusion.start_time,
                        end_time=exclusion.end_time,
                        exclusion_options=(
                            gcp.container.ClusterMaintenancePolicyMaintenanceExclusionExclusionOptionsArgs(
                                scope=exclusion.scope
                            )
                        ),
                    )
                    for exclusion in gke.maintenance_exclusions
                ]
                or None,
            ),
            master_auth=gcp.container.ClusterMasterAuthArgs(
                client_certificate_config=gcp.container.ClusterMasterAuthClientCertificateConfigArgs(
                    issue_client_certificate=False
                )
            ),
            workload_identity_config=gcp.container.ClusterWorkloadIdentityConfigArgs(
                workload_pool=f"{args.project}.svc.id.goog"
            ),
            enable_shielded_nodes=True,
            enable_legacy_abac=False,
            database_encryption=gcp.container.ClusterDatabaseEncryptionArgs(
                state="ENCRYPTED", key_name=secrets_key
            ),
            logging_config=gcp.container.ClusterLoggingConfigArgs(enable_components=list(LOGGED_COMPONENTS)),
            monitoring_config=gcp.container.ClusterMonitoringConfigArgs(
                enable_components=list(MONITORED_COMPONENTS)
            ),
            cluster_autoscaling=gcp.container.ClusterClusterAutoscalingArgs(
                autoscaling_profile="OPTIMIZE_UTILIZATION"
            ),
            addons_config=gcp.container.ClusterAddonsConfigArgs(
                gce_persistent_disk_csi_driver_config=(
                    gcp.container.ClusterAddonsConfigGcePersistentDiskCsiDriverConfigArgs(enabled=True)
                ),
                gcp_filestore_csi_driver_config=gcp.container.ClusterAddonsConfigGcpFilestoreCsiDriverConfigArgs(
                    enabled=spec.runs_filestore_csi
                ),
                gcs_fuse_csi_driver_config=gcp.container.ClusterAddonsConfigGcsFuseCsiDriverConfigArgs(
                    enabled=gke.gcs_fuse_csi
                ),
            ),
            # The default pool is created and removed at once; give it the node identity so not even it runs
            # as the Compute Engine default account.
            remove_default_node_pool=True,
            initial_node_count=1,
            node_config=gcp.container.ClusterNodeConfigArgs(
                service_account=nodes.email,
                oauth_scopes=list(NODE_OAUTH_SCOPES),
                workload_metadata_config=gcp.container.ClusterNodeConfigWorkloadMetadataConfigArgs(
                    mode="GKE_METADATA"
                ),
                shielded_instance_config=gcp.container.ClusterNodeConfigShieldedInstanceConfigArgs(
                    enable_secure_boot=True, enable_integrity_monitoring=True
                ),
            ),
            deletion_protection=gke.deletion_protection,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=prerequisites, ignore_changes=list(CLUSTER_IGNORED_CHANGES)
            ),
        )
        system_nodes = self._system_pool(name, spec.system_pool, cluster, location, zones, nodes.email)
        control_plane_ports = sorted(
            {
                *(WEBHOOK_PORTS if spec.batch is not None else ()),
                *(KEDA_API_PORTS if spec.inference is not None else ()),
            }
        )
        if control_plane_ports:
            # A private cluster's control plane reaches the nodes on 443 and 10250 only (GKE's own
            # firewall rule): the webhooks and KEDA's metrics API listen elsewhere, so without this the API
            # server's calls to them time out.
            gcp.compute.Firewall(
                f"{name}-control-plane-to-add-ons",
                network=network.network,
                direction="INGRESS",
                allows=[
                    gcp.compute.FirewallAllowArgs(protocol="tcp", ports=[str(p) for p in control_plane_ports])
                ],
                source_ranges=[gke.master_ipv4_cidr_block],
                target_service_accounts=[nodes.email],
                description=f"GKE control plane of {spec.name} to its add-ons' webhooks and APIs",
                opts=pulumi.ResourceOptions(parent=self, depends_on=[apis["compute.googleapis.com"]]),
            )

        pools = args.pools
        for pool in pools:
            self._gpu_pool(name, pool, cluster, location, zones, nodes.email, gke.gpu_driver_version)

        if gke.control_plane_dns_endpoint:
            endpoint = cluster.control_plane_endpoints_config.apply(
                lambda config: config["dns_endpoint_config"]["endpoint"]  # type: ignore[index]
            )
            ca_data: pulumi.Input[str | None] = None
        else:
            endpoint, ca_data = cluster.endpoint, cluster.master_auth.cluster_ca_certificate
        kubeconfig: pulumi.Output[str] = pulumi.Output.secret(
            pulumi.Output.all(cluster.name, endpoint, ca_data).apply(
                lambda parts: render_kubeconfig(parts[0], parts[1], parts[2])
            )
        )
        k8s_provider = kubernetes_provider(
            f"{name}-k8s", kubeconfig, cluster.master_auth.cluster_ca_certificate, opts=child
        )
        # No default StorageClass of our own: GKE's `standard-rwo` (pd-balanced, WaitForFirstConsumer,
        # expandable) is already the default, and a second default only makes the newest one win silently.
        shared_storage = None
        if spec.storage.shared == FILESTORE_STORAGE:
            shared_storage = SharedStorage(FILESTORE_STORAGE)
            shared_storage_classes(
                f"{name}-shared-storage-class",
                filestore_storage_class_manifest(network.network_name),
                k8s_provider,
                self,
                [system_nodes, apis[FILESTORE_API]],
            )
        self.handle = GpuCluster(
            name=spec.name,
            kubernetes_version=spec.kubernetes_version,
            kubeconfig=kubeconfig,
            k8s_provider=k8s_provider,
            pools=pools,
            traits=args.traits,
            system_ready=[system_nodes],
            system_nodes=spec.system_pool.nodes,
            shared_storage=shared_storage,
        )
        self.register_outputs(
            {"clusterName": cluster.name, "endpoint": cluster.endpoint, "kubeconfig": kubeconfig}
        )

    def _secrets_key(
        self, name: str, project: str, region: str, kms_api: pulumi.Resource
    ) -> pulumi.Output[str]:
        """A key of the stack's own for Secret encryption, in the cluster's region (GKE wants the key where
        the cluster is, and Cloud KMS has no zonal locations). Both are auto-named: Cloud KMS never deletes a
        key ring or key, so `destroy` only disables the key's versions (30 days later they are destroyed),
        and a stack made again gets new ones instead of colliding with the old names."""
        ring = gcp.kms.KeyRing(
            f"{name}-secrets",
            project=project,
            location=region,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[kms_api]),
        )
        key = gcp.kms.CryptoKey(
            f"{name}-secrets-key",
            key_ring=ring.id,
            rotation_period=SECRETS_KEY_ROTATION,
            opts=pulumi.ResourceOptions(parent=self),
        )
        return key.id

    def _system_pool(
        self,
        name: str,
        pool: SystemPoolSpec,
        cluster: gcp.container.Cluster,
        location: str,
        zones: list[str],
        service_account: pulumi.Input[str],
    ) -> gcp.container.NodePool:
        """On-demand CPU nodes for the add-ons: exactly `nodes` of them, a fixed number per zone."""
        system_zones, per_zone = system_node_layout(pool.nodes, zones)
        return gcp.container.NodePool(
            f"{name}-system",
            cluster=cluster.name,
            location=location,
            node_locations=system_zones,
            # node_count is per zone of node_locations (pulumi-gcp NodePool docs).
            node_count=per_zone,
            management=gcp.container.NodePoolManagementArgs(auto_repair=True, auto_upgrade=True),
            node_config=node_config(
                service_account, pool.instance_type, pool.disk_size_gib, labels={POOL_LABEL: "system"}
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _gpu_pool(
        self,
        name: str,
        pool: GpuPool,
        cluster: gcp.container.Cluster,
        location: str,
        zones: list[str],
        service_account: pulumi.Input[str],
        driver_channel: str,
    ) -> gcp.container.NodePool:
        """A GPU node pool that GKE's autoscaler takes down to zero nodes; a compact one in one zone."""
        spec = pool.spec
        assert pool.machine.accelerator is not None, "GPU types in the GCP catalog name their accelerator"
        compact = spec.interconnect == COMPACT
        pool_zones = list(spec.zones) or zones
        return gcp.container.NodePool(
            pool_child_name(name, spec.name),
            cluster=cluster.name,
            location=location,
            node_locations=pool_zones[:1] if compact else pool_zones,
            # GKE places the nodes close together in the zone ("Define compact placement for GKE nodes");
            # only a new node pool takes it (placement_policy is ForceNew in the Google Terraform provider
            # that pulumi-gcp wraps), so setting or removing it replaces the pool.
            placement_policy=gcp.container.NodePoolPlacementPolicyArgs(type="COMPACT") if compact else None,
            initial_node_count=0,
            autoscaling=gcp.container.NodePoolAutoscalingArgs(
                total_min_node_count=spec.min_nodes,
                total_max_node_count=spec.max_nodes,
                # ANY lets spot pools go where capacity is; BALANCED spreads on-demand nodes evenly.
                location_policy="ANY" if spec.spot else "BALANCED",
            ),
            management=gcp.container.NodePoolManagementArgs(auto_repair=True, auto_upgrade=True),
            # Upgrade one node at a time without a surge node: a surge GPU node needs spare GPU quota, which
            # GPU projects rarely have, and the upgrade would stall waiting for it.
            upgrade_settings=gcp.container.NodePoolUpgradeSettingsArgs(max_surge=0, max_unavailable=1),
            node_config=node_config(
                service_account,
                pool.machine.name,
                spec.disk_size_gib,
                labels=pool.node_labels,
                taints=pool.taints,
                accelerators=[
                    gcp.container.NodePoolNodeConfigGuestAcceleratorArgs(
                        type=pool.machine.accelerator,
                        count=pool.gpus_per_node,
                        gpu_driver_installation_config=(
                            gcp.container.NodePoolNodeConfigGuestAcceleratorGpuDriverInstallationConfigArgs(
                                gpu_driver_version=DRIVER_CHANNEL[driver_channel]
                            )
                        ),
                        **accelerator_sharing(pool),  # type: ignore[arg-type]
                    )
                ],
                spot=spec.spot,
                gvnic=compact,
            ),
            # The autoscaler owns the node count.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["initialNodeCount", "nodeCount"]),
        )


# Exclusions that keep GKE from moving the cluster to another minor on its own.
MINOR_FREEZES = ("NO_UPGRADES", "NO_MINOR_UPGRADES", "NO_MINOR_OR_NODE_UPGRADES")


def minor_upgrade_warning(spec: GkeClusterSpec) -> str | None:
    """The release channel upgrades the cluster's minor on its own (review-gcp.md NG11): from the newest minor
    the GPU Operator supports, the next one leaves its support, unless an exclusion freezes the minor."""
    if spec.kubernetes_version != SUPPORTED_KUBERNETES_MINORS[-1]:
        return None
    if any(exclusion.scope in MINOR_FREEZES for exclusion in spec.gke.maintenance_exclusions):
        return None
    return (
        f"gpu-k8s:cluster.kubernetesVersion: {spec.kubernetes_version} is the newest minor the GPU Operator "
        f"supports here ({SUPPORTED_KUBERNETES_MINORS[0]}-{SUPPORTED_KUBERNETES_MINORS[-1]}), and the "
        f"{spec.gke.release_channel} channel upgrades the cluster to the next one on its own. Fix: a "
        "gke.maintenanceExclusions entry with scope NO_MINOR_UPGRADES, renewed until gpu-k8s supports the "
        "next minor."
    )


def build(spec: GkeClusterSpec) -> GpuCluster:
    """Everything `pulumi up -s gcp-gke` creates; validation runs before the first resource."""
    catalog = load_catalog()
    project, region = project_and_region()
    traits = gke_traits(spec)
    pools = resolve_pools(spec, catalog, traits)
    raise_if_any(
        gke_issues(spec, catalog, region, pools),
        platform_issues(spec, traits, catalog, api_reached_by_cidr=not spec.gke.control_plane_dns_endpoint),
    )
    system_zones, _ = system_node_layout(spec.system_pool.nodes, list(spec.network.zones))
    if spec.system_pool.nodes > 1 and len(system_zones) == 1 and len(spec.network.zones) > 1:
        pulumi.log.warn(
            f"gpu-k8s:cluster.systemPool.nodes: {spec.system_pool.nodes} nodes do not divide evenly over "
            f"{len(spec.network.zones)} zones, so all run in {system_zones[0]}; a zone outage takes the "
            "add-ons down. Fix: a node count that the zone count (or a part of it) divides."
        )
    if warning := minor_upgrade_warning(spec):
        pulumi.log.warn(warning)
    provider = gcp.Provider(
        f"{spec.name}-gcp",
        project=project,
        region=region,
        default_labels={"gpu-k8s-cluster": spec.name},
    )
    # Whether the project can start each pool's machine type in its zones is known only by asking.
    raise_if_any(
        machine_type_issues(
            spec, project, gke_pool_zones(spec), system_zones, pulumi.InvokeOptions(provider=provider)
        )
    )
    gke = GkeCluster(
        spec.name,
        GkeClusterArgs(spec, project, region, traits, pools),
        opts=pulumi.ResourceOptions(providers=[provider]),
    )
    # GKE's own autoscaler runs in the control plane, out of Prometheus' reach.
    metrics = install_monitoring(spec, gke.handle, autoscaled=False, node_price=gcp_pool_node_price(region))
    install_inference(spec, gke.handle)
    operator = GpuOperator(
        f"{spec.name}-gpu-operator",
        GpuOperatorArgs(gke.handle, spec.addon_versions.gpu_operator, metrics=metrics),
    )
    if spec.batch is not None:
        BatchQueues(f"{spec.name}-batch", gke.handle, spec.batch, metrics=metrics)
    return dataclasses.replace(gke.handle, gpu_operator=operator)
