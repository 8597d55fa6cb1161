"""What only GCP stacks configure: the subnet (new or existing) and the zones nodes run in, the `gke`
section, and the GCP rules for GPUs (attached to N1 VMs or built into the machine type) and per-pool zones.
Registered in `platforms.py`."""

from __future__ import annotations

import ipaddress
import itertools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from gpu_k8s.components.catalog import N1_MACHINE, Catalog, MachineType
from gpu_k8s.components.configbase import ConfigIssue, StrictModel, config_path
from gpu_k8s.components.k3s.settings import (
    K3S_CLUSTER_CIDR,
    K3S_SERVICE_CIDR,
    POD_AND_SERVICE_RANGE_KEYS,
    K3sClusterSpec,
    overlay_issues,
)
from gpu_k8s.components.spec import (
    ClusterSpec,
    GpuPoolSpec,
    NetworkSettings,
    PoolRules,
    StorageSpec,
    cidr_issue,
    host_range_issue,
)

GCP_ZONE = re.compile(r"^([a-z]+-[a-z]+\d+)-[a-z]$")


class GcpNetwork(NetworkSettings):
    """A new VPC-native subnet (`cidr` + `podsCidr` + `servicesCidr`) or an existing one (`networkName` +
    `subnetworkName` + secondary range names), and the `zones` nodes run in."""

    cidr: str | None = None
    # GPUs are zonal and each zone offers different models, so GCP nodes go only where they are named.
    zones: tuple[str, ...] = ()
    pods_cidr: str | None = None
    services_cidr: str | None = None
    network_name: str | None = None
    subnetwork_name: str | None = None
    pods_range_name: str | None = None
    services_range_name: str | None = None

    @property
    def creates_vpc(self) -> bool:
        return self.network_name is None


class MaintenanceExclusionSpec(StrictModel):
    """`gke.maintenanceExclusions[]`: a period in which GKE does not upgrade what `scope` names."""

    name: str
    # RFC 3339 timestamps, e.g. 2027-01-04T00:00:00Z.
    start_time: str
    end_time: str
    scope: Literal["NO_UPGRADES", "NO_MINOR_UPGRADES", "NO_MINOR_OR_NODE_UPGRADES"] = "NO_MINOR_UPGRADES"


class GkeSpec(StrictModel):
    """Settings only GKE has."""

    # Regional: control plane and default node locations in the region's zones; zonal: all in zones[0].
    regional: bool = True
    release_channel: Literal["RAPID", "REGULAR", "STABLE", "EXTENDED"] = "REGULAR"
    # The control plane's private range (a /28) that private nodes reach it on.
    master_ipv4_cidr_block: str = "172.16.0.0/28"
    # Cloud KMS key (projects/<p>/locations/<region>/keyRings/<r>/cryptoKeys/<k>) that encrypts Secrets.
    secrets_kms_key: str | None = None
    # GKE's own Filestore classes (standard-rwx, ...), which create instances on the `default` network;
    # `storage.shared: filestore` turns the add-on on too, with `shared-rwx` on the cluster's VPC.
    filestore_csi: bool = False
    # Cloud Storage buckets as volumes (Cloud Storage FUSE CSI add-on; pods reach buckets through Workload
    # Identity, which the cluster always has).
    gcs_fuse_csi: bool = False
    deletion_protection: bool = True
    # Google's driver installer: "default" (COS and Ubuntu) or "latest" (COS only).
    gpu_driver_version: Literal["default", "latest"] = "default"
    # Reach the API through GKE's DNS-based endpoint (access decided by IAM, from anywhere) instead of the
    # IP endpoint, which only apiAccessCidrs reach.
    control_plane_dns_endpoint: bool = False
    # Daily maintenance window start, "HH:MM" GMT: auto-upgrades and repairs of GPU nodes happen then.
    maintenance_window_start: str = "03:00"
    maintenance_exclusions: tuple[MaintenanceExclusionSpec, ...] = ()


COMPACT = "compact"
# The GPUs GKE places compactly ("Define compact placement for GKE nodes", limitations: "Available only with
# A100, L4, and H100 GPUs"); catalog model ids.
COMPACT_PLACEMENT_GPUS = ("nvidia-a100-40gb", "nvidia-a100-80gb", "nvidia-h100-80gb", "nvidia-l4")
GPUDIRECT_NOT_BUILT = (
    "GPUDirect-TCPX/TCPXO/RDMA on A3/A4 machines need multi-networking (extra VPCs, GKE Network objects "
    "and Google's NCCL plugin), which this toolkit does not create"
)


class GcpPoolRules(PoolRules):
    """Compute Engine pools: GPUs built into the machine type or attached to N1 VMs, zones per pool."""

    def pool_machine(self, pool: GpuPoolSpec, catalog: Catalog) -> MachineType | None:
        """A catalog machine type, or an N1 VM with its attached GPUs."""
        if pool.accelerator is not None and N1_MACHINE.match(pool.instance_type):
            return catalog.n1_with_gpus(pool.instance_type, pool.accelerator.type, pool.accelerator.count)
        return super().pool_machine(pool, catalog)

    def interconnect_issues(
        self, path: Callable[..., str], pool: GpuPoolSpec, catalog: Catalog
    ) -> Iterable[ConfigIssue]:
        """Compact placement (with gVNIC) for the GPUs GKE places compactly, in one zone."""
        if pool.interconnect != COMPACT:
            yield ConfigIssue(
                path("interconnect"),
                pool.interconnect,
                f"not an interconnect of gcp ({GPUDIRECT_NOT_BUILT})",
                f"use {COMPACT}: the pool's nodes close together in one zone, with gVNIC; NCCL then uses "
                "the nodes' primary network",
            )
            return
        machine = self.pool_machine(pool, catalog)
        model = machine.gpu_model.id if machine is not None and machine.gpu_model is not None else None
        if machine is not None and model not in COMPACT_PLACEMENT_GPUS:
            yield ConfigIssue(
                path("interconnect"),
                pool.interconnect,
                f"{pool.instance_type} ({model or 'no GPU'}) is not placed compactly: GKE's compact "
                "placement takes A100, L4 and H100 GPUs only",
                "remove it, or use an a2-, a3-high/mega/edge or g2- machine type",
            )
        if len(pool.zones) > 1:
            yield ConfigIssue(
                path("zones"),
                list(pool.zones),
                "a compact pool lives in one zone (its nodes are placed close together)",
                f"keep one zone, e.g. zones: [{pool.zones[0]}]",
            )

    def accelerator_issues(
        self, path: Callable[..., str], pool: GpuPoolSpec, catalog: Catalog
    ) -> Iterable[ConfigIssue]:
        """GPUs are either attached to an N1 VM (type and count required) or built into the machine type
        (then an accelerator, if given, must say exactly what the type carries)."""
        wanted = pool.accelerator
        if N1_MACHINE.match(pool.instance_type):
            if wanted is None:
                yield ConfigIssue(
                    path("accelerator"),
                    None,
                    f"{pool.instance_type} has no GPU of its own",
                    "attach GPUs, e.g. accelerator: {type: nvidia-tesla-t4, count: 1}",
                )
                return
            problem = catalog.n1_attachment_problem(pool.instance_type, wanted.type, wanted.count)
            if problem is not None:
                built_in = catalog.machine_types_with("gcp", wanted.type)
                fix = (
                    f"use a machine type that carries {wanted.type}: {', '.join(built_in[:4])}"
                    if built_in
                    else "pick an allowed count, or a smaller or larger N1 machine type"
                )
                yield ConfigIssue(path("accelerator"), wanted.model_dump(), problem, fix)
            return
        machine = catalog.machine_type("gcp", pool.instance_type)
        if wanted is None or machine is None or not machine.has_whole_gpus:
            return
        if wanted.type != machine.accelerator:
            built_in = catalog.machine_types_with("gcp", wanted.type)
            elsewhere = (
                f"; {wanted.type} comes with {', '.join(built_in[:4])}"
                if built_in
                else f"; {wanted.type} attaches to n1 machine types"
                if wanted.type in catalog.n1_accelerators
                else ""
            )
            yield ConfigIssue(
                path("accelerator", "type"),
                wanted.type,
                f"is not attachable to {pool.instance_type}, which carries {machine.accelerator}",
                f"remove accelerator (the machine type decides its GPUs){elsewhere}",
            )
        elif wanted.count != machine.gpu_count:
            yield ConfigIssue(
                path("accelerator", "count"),
                wanted.count,
                f"{pool.instance_type} carries {machine.gpu_count} x {machine.accelerator} (fixed)",
                f"set count: {machine.gpu_count}, or remove accelerator",
            )

    def pool_zone_issues(self, index: int, pool: GpuPoolSpec) -> Iterable[ConfigIssue]:
        yield from zone_issues(("gpuPools", index, "zones"), pool.zones)


GCP_POOL_RULES = GcpPoolRules("gcp")
FILESTORE_STORAGE = "filestore"
# pulumi-gcp InstanceNetwork `reserved_ip_range`: "A /29 CIDR block" (the basic tiers').
FILESTORE_RANGE_PREFIX = 29
DEFAULT_FILESTORE_RANGE = "10.44.0.0/29"
# pulumi-gcp InstanceFileShares `capacity_gb`: "BASIC_HDD: 1024-65433 GiB".
FILESTORE_CAPACITY_GIB = (1024, 65433)


class GcpClusterSpec(ClusterSpec):
    """What every GCP platform configures and checks the same way."""

    network: GcpNetwork
    pool_rules: ClassVar[PoolRules] = GCP_POOL_RULES
    # The subnet carries the pods' and services' ranges (VPC-native, GKE), or only node addresses (k3s).
    subnet_has_pod_ranges: ClassVar[bool] = True

    def network_issues(self) -> Iterable[ConfigIssue]:
        yield from _subnet_issues(self.network, self.subnet_has_pod_ranges)


class GkeClusterSpec(GcpClusterSpec):
    """A GKE cluster with GPU node pools."""

    gke: GkeSpec = GkeSpec()

    @property
    def runs_filestore_csi(self) -> bool:
        """Whether the cluster runs the Filestore CSI add-on."""
        return self.gke.filestore_csi or self.storage.shared == FILESTORE_STORAGE

    shared_storage: ClassVar[Mapping[str, str]] = {
        FILESTORE_STORAGE: "Filestore, through GKE's Filestore CSI add-on, on the cluster's VPC"
    }


class GceK3sStorageSpec(StorageSpec):
    """`storage` on gcp-k3s: the shared file system, and the range its Filestore instance takes."""

    # The /29 a basic-tier Filestore instance takes its address from (pulumi-gcp InstanceNetwork
    # `reserved_ip_range`). Set, not left to Filestore: it sees the VPC's subnets but not k3s's pod and
    # service ranges, which only the nodes route. Immutable: changing it replaces the instance and its data
    # (`networks` is `immutable` in magic-modules mmv1/products/filestore/Instance.yaml).
    filestore_range: str = DEFAULT_FILESTORE_RANGE
    # The instance's size in GiB, shared by every claim. Grows in place; a basic instance never shrinks
    # (Filestore docs, "Edit instances": capacity decreases only on the zonal, regional and enterprise tiers).
    filestore_capacity_gib: Annotated[
        int, Field(ge=FILESTORE_CAPACITY_GIB[0], le=FILESTORE_CAPACITY_GIB[1], alias="filestoreCapacityGiB")
    ] = FILESTORE_CAPACITY_GIB[0]


class GceK3sClusterSpec(K3sClusterSpec, GcpClusterSpec):
    """k3s on Compute Engine VMs: servers in the system pool, agents in zonal GPU instance groups."""

    network: GcpNetwork
    storage: GceK3sStorageSpec = GceK3sStorageSpec()

    subnet_has_pod_ranges: ClassVar[bool] = False
    # GKE's Filestore driver needs a service-account key off GKE and has no pinnable image for its newest
    # release (upstream-charts MANIFEST), so the stack makes one Filestore instance itself and serves its
    # share through the NFS CSI driver.
    shared_storage: ClassVar[Mapping[str, str]] = {
        FILESTORE_STORAGE: "one Filestore instance on the cluster's VPC, through the NFS CSI driver"
    }
    # Sources disagree: pulumi-gcp's ResourcePolicy docs (magic-modules ResourcePolicy.yaml) say COLLOCATED
    # "can only be specified with vm_count" and that exactly that many VMs be created at once, which an
    # instance group growing from zero never does; the Compute API's own vmCount description (compute.v1
    # rev20261106, upstream/compute-api) only advises against vmCount. Instance templates do carry resource
    # policies (InstanceProperties.resourcePolicies), but how a compact one behaves as the autoscaler adds
    # VMs one by one was not confirmable here, so nothing is built on a guess.
    no_interconnect: ClassVar[tuple[str, str] | None] = (
        "compact placement on k3s agents is not built: pulumi-gcp documents a Compute Engine compact "
        "placement policy as needing its VMs created together, not one by one as the autoscaler adds them",
        "remove it, or use kind: gke, where GKE places the pool's nodes compactly",
    )

    def network_issues(self) -> Iterable[ConfigIssue]:
        yield from super().network_issues()
        yield from overlay_issues(self.network.cidr)

    def platform_issues(self) -> Iterable[ConfigIssue]:
        yield from super().platform_issues()
        yield from filestore_issues(self)


def filestore_issues(spec: GceK3sClusterSpec) -> Iterable[ConfigIssue]:
    """The Filestore keys are read only with `storage.shared: filestore`."""
    storage = spec.storage
    if storage.shared != FILESTORE_STORAGE:
        for field in sorted(storage.model_fields_set - {"shared"}):
            key = GceK3sStorageSpec.model_fields[field].alias or field
            value = getattr(storage, field)
            yield ConfigIssue(
                config_path("storage", key), value, "is only used with storage.shared: filestore", "remove it"
            )
        return
    yield from filestore_range_issues(spec)


def filestore_range_issues(spec: GceK3sClusterSpec) -> Iterable[ConfigIssue]:
    """The Filestore range must be a private /29 that neither the subnet nor k3s's overlay uses."""
    path = config_path("storage", "filestoreRange")
    value = spec.storage.filestore_range
    issue = cidr_issue(path, value) or host_range_issue(path, value)
    if issue is not None:
        yield issue
        return
    network = ipaddress.IPv4Network(value)
    if network.prefixlen != FILESTORE_RANGE_PREFIX or not network.is_private:
        yield ConfigIssue(
            path,
            value,
            f"a basic-tier Filestore instance takes a private /{FILESTORE_RANGE_PREFIX}",
            f"use a private /{FILESTORE_RANGE_PREFIX}, e.g. {DEFAULT_FILESTORE_RANGE}",
        )
        return
    taken = [(K3S_CLUSTER_CIDR, "k3s's pod range"), (K3S_SERVICE_CIDR, "k3s's service range")]
    if spec.network.cidr is not None and cidr_issue("", spec.network.cidr) is None:
        taken.append((spec.network.cidr, "network.cidr"))
    for cidr, what in taken:
        if network.overlaps(ipaddress.IPv4Network(cidr)):
            yield ConfigIssue(
                path, value, f"overlaps {what} {cidr}", "pick a private /29 outside both, e.g. 10.44.0.0/29"
            )


def zone_issues(where: tuple[str | int, ...], zones: Iterable[str]) -> Iterable[ConfigIssue]:
    seen: set[str] = set()
    for index, zone in enumerate(zones):
        if not GCP_ZONE.match(zone):
            yield ConfigIssue(
                config_path(*where, index), zone, "not a GCP zone name", "write it like us-central1-a"
            )
        elif zone in seen:
            yield ConfigIssue(config_path(*where, index), zone, "listed twice", "list each zone once")
        seen.add(zone)


# (key, example) of the new subnet's ranges and of an existing subnet's names, in the order they are listed.
_NEW_SUBNET = (("cidr", "10.40.0.0/20"), ("podsCidr", "10.64.0.0/14"), ("servicesCidr", "10.68.0.0/20"))
_EXISTING_SUBNET = (
    ("networkName", "shared-vpc"),
    ("subnetworkName", "gpu-nodes"),
    ("podsRangeName", "pods"),
    ("servicesRangeName", "services"),
)


def _subnet_issues(net: GcpNetwork, pod_ranges: bool) -> Iterable[ConfigIssue]:
    """`pod_ranges`: the subnet carries pod and service ranges (GKE), or only node addresses (k3s)."""
    if not net.zones:
        yield ConfigIssue(
            config_path("network", "zones"),
            None,
            "GCP clusters need the zones their nodes run in",
            "list zones of gcp:region that offer your GPUs, e.g. zones: [us-central1-a, us-central1-b]",
        )
    yield from zone_issues(("network", "zones"), net.zones)
    new_subnet, existing_subnet = (
        [(key, example) for key, example in keys if pod_ranges or key not in POD_AND_SERVICE_RANGE_KEYS]
        for keys in (_NEW_SUBNET, _EXISTING_SUBNET)
    )
    given = {key: getattr(net, _field(key)) for key, _ in new_subnet + existing_subnet}
    new = [key for key, _ in new_subnet if given[key] is not None]
    existing = [key for key, _ in existing_subnet if given[key] is not None]
    if new and existing:
        yield ConfigIssue(
            config_path("network"),
            {key: given[key] for key in new + existing},
            "a new subnet's ranges and an existing subnet's names exclude each other",
            f"set {_listed(new_subnet)} to create a subnet, or {_listed(existing_subnet)} to use one",
        )
        return
    wanted = existing_subnet if existing else new_subnet
    for key, example in wanted:
        if given[key] is None:
            yield ConfigIssue(
                config_path("network", key),
                None,
                "is missing",
                f"add it under network, e.g. {key}: {example}",
            )
    if existing:
        return
    ranges = {}
    for key, _ in new_subnet:
        if given[key] is not None:
            issue = cidr_issue(config_path("network", key), given[key]) or host_range_issue(
                config_path("network", key), given[key]
            )
            if issue:
                yield issue
            elif not ipaddress.IPv4Network(given[key]).is_private:
                yield ConfigIssue(
                    config_path("network", key),
                    given[key],
                    "not a private range",
                    "use RFC 1918 space, e.g. 10.0.0.0/8",
                )
            else:
                ranges[key] = ipaddress.IPv4Network(given[key])
    for (key_a, a), (key_b, b) in itertools.combinations(ranges.items(), 2):
        if a.overlaps(b):
            yield ConfigIssue(
                config_path("network", key_b),
                str(b),
                f"overlaps network.{key_a} ({a})",
                "node, pod and service ranges must be disjoint",
            )


def _listed(keys: Sequence[tuple[str, str]]) -> str:
    names = [key for key, _ in keys]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


def _field(alias: str) -> str:
    return next(name for name, info in GcpNetwork.model_fields.items() if info.alias == alias)
