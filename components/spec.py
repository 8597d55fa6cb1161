"""The stack configuration model: `gpu-k8s:cluster` in camelCase YAML -> frozen, validated specs.

Validation runs in two passes, both before any resource exists:
1. structure (pydantic): types, ranges, unknown keys;
2. meaning (`_semantic_issues`): catalog lookups, supported versions, cross-field rules.
All problems of both passes are collected and raised together as one `ConfigError`, each naming the
YAML path, the bad value, what is allowed and how to fix it.
"""

from __future__ import annotations

import difflib
import ipaddress
import itertools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, ValidationError

from gpu_k8s.components.catalog import N1_MACHINE, Catalog, Cloud, MachineType, load_catalog
from gpu_k8s.components.compat import (
    CLUSTER_AUTOSCALER_CHART_VERSION,
    GPU_OPERATOR_CHART_VERSION,
    addon_issues,
    cuda_version_issue,
)
from gpu_k8s.components.configbase import (
    CONFIG_KEY,
    ConfigError,
    ConfigIssue,
    StrictModel,
    config_path,
    raise_if_any,
    raw_value_issues,
)
from gpu_k8s.components.sharing import (
    DEFAULT_DEVICE_PLUGIN_CONFIG,
    PoolMig,
    SharingSpec,
    cluster_mig_issues,
    mig_layout,
    sharing_issues,
)

# Kubernetes minors the pinned GPU Operator (v26.7.0) supports: NVIDIA platform-support.rst, 1.33-1.36.
SUPPORTED_KUBERNETES_MINORS = ("1.33", "1.34", "1.35", "1.36")

MIN_GPU_DISK_GIB = 50
# gp3 and pd-balanced volumes both stop at 16 TiB.
MAX_DISK_GIB = 16384

# Lowercase DNS label: usable as a Kubernetes label value, a node group name and a cloud resource name.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Kubernetes qualified name (label key) and label value syntax (apimachinery validation).
LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Label prefixes the kubelet may not set on itself (NodeRestriction) or that this toolkit owns.
RESERVED_LABEL_PREFIXES = ("kubernetes.io", "k8s.io", "nvidia.com", "gpu-k8s.io")

AWS_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")
# A Go-style duration limited to hours, minutes and seconds ("5m", "1h30m"); groups: h, m, s.
DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
# EC2 capacity reservation IDs: "cr-" and 17 hexadecimal digits (cr-02168da1478b509e0 in the EKS user guide,
# "Create a managed node group with Capacity Blocks for ML").
CAPACITY_RESERVATION_ID = re.compile(r"cr-[0-9a-f]{17}")
WHOLE_INTERNET = ipaddress.IPv4Network("0.0.0.0/0")
# EC2 resource IDs: the prefix and 8 or (since 2018) 17 hexadecimal digits.
AWS_VPC_ID = re.compile(r"vpc-(?:[0-9a-f]{8}|[0-9a-f]{17})")
AWS_SUBNET_ID = re.compile(r"subnet-(?:[0-9a-f]{8}|[0-9a-f]{17})")


def _quoted(key: str, example: str) -> BeforeValidator:
    """YAML reads 12.10 as the number 12.1: versions must be quoted strings."""

    def refuse_numbers(value: Any) -> Any:
        if isinstance(value, float | int) and not isinstance(value, bool):
            raise ValueError(f'YAML read this as a number; quote it, e.g. {key}: "{example}"')
        return value

    return BeforeValidator(refuse_numbers)


CudaRelease = Annotated[str | None, _quoted("cuda", "12.8")]


# How the EKS and GKE APIs spell a taint effect.
TAINT_EFFECT_API_NAMES = {
    "NoSchedule": "NO_SCHEDULE",
    "PreferNoSchedule": "PREFER_NO_SCHEDULE",
    "NoExecute": "NO_EXECUTE",
}


class TaintSpec(StrictModel):
    """A Kubernetes taint added to every node of a pool (and to its scale-from-zero template)."""

    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class NetworkSpec(StrictModel):
    """AWS: a new VPC (`cidr` + `availabilityZones`) or an existing one (`vpcId` + subnet ids).
    GCP: a new VPC-native subnet (`cidr` + `podsCidr` + `servicesCidr`) or an existing one
    (`networkName` + `subnetworkName` + secondary range names), and the `zones` nodes run in."""

    cidr: str | None = None
    availability_zones: Annotated[int, Field(ge=2, le=6)] = 3
    # One NAT gateway for all zones instead of one per zone: cheaper, but a zone outage cuts egress.
    single_nat_gateway: bool = False
    vpc_id: str | None = None
    private_subnet_ids: tuple[str, ...] = ()
    public_subnet_ids: tuple[str, ...] = ()
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
        return self.vpc_id is None and self.network_name is None


# Which network keys mean something on which cloud (YAML names).
NETWORK_KEYS = {
    "aws": {"cidr", "availabilityZones", "singleNatGateway", "vpcId", "privateSubnetIds", "publicSubnetIds"},
    "gcp": {
        "cidr",
        "zones",
        "podsCidr",
        "servicesCidr",
        "networkName",
        "subnetworkName",
        "podsRangeName",
        "servicesRangeName",
    },
}
# On k3s, flannel gives pods and services addresses of its own (k3s defaults, docs/cli/server.md): the VPC
# needs no ranges for them, and its own must not overlap them.
K3S_CLUSTER_CIDR = "10.42.0.0/16"
K3S_SERVICE_CIDR = "10.43.0.0/16"
_VPC_NATIVE_KEYS = {"podsCidr", "servicesCidr", "podsRangeName", "servicesRangeName"}


def network_keys(cloud: Cloud, kind: str) -> set[str]:
    """The network keys that mean something for this platform (YAML names)."""
    keys = NETWORK_KEYS[cloud]
    return keys - _VPC_NATIVE_KEYS if kind == "k3s" else keys


GCP_ZONE = re.compile(r"^([a-z]+-[a-z]+\d+)-[a-z]$")


class SystemPoolSpec(StrictModel):
    """On-demand CPU nodes for cluster add-ons (CoreDNS, the operator, the autoscaler)."""

    instance_type: str
    nodes: Annotated[int, Field(ge=1, le=100)] = 2
    disk_size_gib: Annotated[int, Field(ge=20, le=MAX_DISK_GIB, alias="diskSizeGiB")] = 50


class AcceleratorSpec(StrictModel):
    """GPUs attached to a GCP VM: needed for N1 (T4, V100, P4, P100); optional and checked elsewhere."""

    type: str
    count: Annotated[int, Field(ge=1)]


class GpuPoolSpec(StrictModel):
    """One autoscaled group of identical GPU nodes."""

    name: str
    instance_type: str
    accelerator: AcceleratorSpec | None = None
    # GCP: the zones of this pool when not all of network.zones offer its GPU.
    zones: tuple[str, ...] = ()
    min_nodes: Annotated[int, Field(ge=0)] = 0
    max_nodes: Annotated[int, Field(ge=1)]
    spot: bool = False
    disk_size_gib: Annotated[int, Field(le=MAX_DISK_GIB, alias="diskSizeGiB")] = 200
    labels: Mapping[str, str] = Field(default_factory=dict)
    taints: tuple[TaintSpec, ...] = ()
    # How long a GPU node may sit unneeded before the autoscaler removes it; GPUs are the expensive part.
    scale_down_unneeded_time: str = "5m"
    sharing: SharingSpec = SharingSpec()
    # Overrides the cluster's `cuda` for this pool (e.g. an older GPU that newer CUDA dropped).
    cuda: CudaRelease = None
    # AWS: more instance types the pool may launch when `instanceType` has no capacity (spot above all). Each
    # has the same GPUs and at least its vCPUs and memory: the autoscaler plans every node of the pool as an
    # `instanceType` node, which then never promises more than a node brings.
    extra_instance_types: tuple[str, ...] = ()
    # AWS: the reservation ID (cr-...) of the EC2 Capacity Block for ML the pool launches into; the pool then
    # lives in the block's zone, and starts nodes only while the block is active. On-Demand Capacity
    # Reservations are not supported (yet).
    capacity_reservation_id: str | None = None


class AddonVersions(StrictModel):
    """Chart versions; the defaults are the versions the contract tests check the rendered values against."""

    gpu_operator: str = GPU_OPERATOR_CHART_VERSION
    cluster_autoscaler: str = CLUSTER_AUTOSCALER_CHART_VERSION
    # The driver the GPU Operator installs, on platforms where it installs one (default: the chart's).
    nvidia_driver: str | None = None


class MaintenanceExclusionSpec(StrictModel):
    """`gke.maintenanceExclusions[]`: a period in which GKE does not upgrade what `scope` names."""

    name: str
    # RFC 3339 timestamps, e.g. 2027-01-04T00:00:00Z.
    start_time: str
    end_time: str
    scope: Literal["NO_UPGRADES", "NO_MINOR_UPGRADES", "NO_MINOR_OR_NODE_UPGRADES"] = "NO_MINOR_UPGRADES"


class EksSpec(StrictModel):
    """Settings only EKS has."""

    # EKS refuses to delete the cluster until this is false and applied.
    deletion_protection: bool = True
    # IAM roles and users (ARNs) that get cluster-admin. Empty: whoever runs `pulumi up` (its role), which
    # changes when CI and a person take turns.
    admins: tuple[str, ...] = ()


class GkeSpec(StrictModel):
    """Settings only GKE has."""

    # Regional: control plane and default node locations in the region's zones; zonal: all in zones[0].
    regional: bool = True
    release_channel: Literal["RAPID", "REGULAR", "STABLE", "EXTENDED"] = "REGULAR"
    # The control plane's private range (a /28) that private nodes reach it on.
    master_ipv4_cidr_block: str = "172.16.0.0/28"
    # Cloud KMS key (projects/<p>/locations/<region>/keyRings/<r>/cryptoKeys/<k>) that encrypts Secrets.
    secrets_kms_key: str | None = None
    filestore_csi: bool = False
    deletion_protection: bool = True
    # Google's driver installer: "default" (COS and Ubuntu) or "latest" (COS only).
    gpu_driver_version: Literal["default", "latest"] = "default"
    # Reach the API through GKE's DNS-based endpoint (access decided by IAM, from anywhere) instead of the
    # IP endpoint, which only apiAccessCidrs reach.
    control_plane_dns_endpoint: bool = False
    # Daily maintenance window start, "HH:MM" GMT: auto-upgrades and repairs of GPU nodes happen then.
    maintenance_window_start: str = "03:00"
    maintenance_exclusions: tuple[MaintenanceExclusionSpec, ...] = ()


# The k3s release a stack runs when `k3s.version` is not set, per `kubernetesVersion`. 1.36: the stable
# channel when k3s v1.37.0 came out ("Update stable channel to v1.36.3+k3s1", k3s-io/docs
# release-notes/v1.37.X.md); 1.35 and 1.34: the releases of the 2026-06 backports (github.com/k3s-io/k3s
# releases v1.35.6+k3s1 and v1.34.9+k3s1). None for 1.33: Kubernetes 1.33 reached end of life on 2026-06-28
# (kubernetes.io/releases/1.33).
K3S_RELEASES = {"1.34": "v1.34.9+k3s1", "1.35": "v1.35.6+k3s1", "1.36": "v1.36.3+k3s1"}
DEFAULT_K3S_VERSION = K3S_RELEASES["1.36"]
K3S_VERSION = re.compile(r"^v1\.(\d+)\.(\d+)\+k3s(\d+)$")
# One server, or three with embedded etcd (etcd needs a majority; two servers tolerate no failure).
K3S_SERVER_COUNTS = (1, 3)


class K3sSpec(StrictModel):
    """Settings only k3s clusters have."""

    version: str = DEFAULT_K3S_VERSION
    # Pod Security level enforced outside the exempt namespaces; warnings and audit are always `restricted`.
    # `baseline` by default: many ML images run as root, which `restricted` refuses.
    pod_security: Literal["baseline", "restricted"] = "baseline"


class ClusterSpec(StrictModel):
    """The whole cluster as the stack file describes it."""

    name: str
    cloud: Literal["aws", "gcp"]
    kind: Literal["eks", "gke", "k3s"]
    kubernetes_version: Annotated[str, _quoted("kubernetesVersion", "1.35")]
    network: NetworkSpec
    api_access_cidrs: Annotated[tuple[str, ...], Field(min_length=1)]
    # Escape hatch for labs: lets apiAccessCidrs contain 0.0.0.0/0.
    allow_public_api_from_anywhere: bool = False
    system_pool: SystemPoolSpec
    gpu_pools: Annotated[tuple[GpuPoolSpec, ...], Field(min_length=1)]
    addon_versions: AddonVersions = AddonVersions()
    eks: EksSpec = EksSpec()
    gke: GkeSpec = GkeSpec()
    # to_camel would spell it "k3S".
    k3s: Annotated[K3sSpec, Field(alias="k3s")] = K3sSpec()
    # The newest CUDA release the workloads are built for ("12.8"); checked against each pool's driver.
    cuda: CudaRelease = None


# Keys people reach for that this toolkit decides itself, with the reason.
_DECIDED_KEYS = {
    "amiType": "the AMI comes from the catalog (AL2023 NVIDIA); Bottlerocket is refused until its "
    "built-in device plugin is supported deliberately",
    "gpuCount": "the GPU model and count come from the catalog for the instance type (GCP N1 VMs attach "
    "GPUs with accelerator: {type, count})",
    "gpuModel": "the GPU model and count come from the catalog for the instance type",
    "desiredNodes": "the autoscaler owns the node count; set minNodes/maxNodes",
}


def _model_at(loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the mapping at `loc` (for listing its allowed keys)."""
    model: Any = ClusterSpec
    for part in loc:
        if isinstance(part, int):
            continue
        field = next((f for f in model.model_fields.values() if f.alias == part), None)
        if field is None:
            return None
        annotation = field.annotation
        args = getattr(annotation, "__args__", ()) or (annotation,)
        model = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None:
            return None
    return model


def _structural_issue(error: Mapping[str, Any]) -> ConfigIssue:
    loc = tuple(error["loc"])
    path = config_path(*loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        owner = _model_at(loc[:-1])
        allowed = sorted(f.alias for f in owner.model_fields.values() if f.alias) if owner else []
        if key in _DECIDED_KEYS:
            return ConfigIssue(path, error["input"], "not a setting", _DECIDED_KEYS[key])
        by_lowercase = {name.lower(): name for name in allowed}
        guess = difflib.get_close_matches(key.lower(), list(by_lowercase), n=1)
        hint = f"did you mean {by_lowercase[guess[0]]}? " if guess else ""
        return ConfigIssue(path, error["input"], "unknown key", f"{hint}allowed keys: {', '.join(allowed)}")
    if kind == "missing":
        parent = config_path(*loc[:-1])
        return ConfigIssue(path, None, "is missing", f"add `{loc[-1]}:` under {parent}; see stacks/README.md")
    value = error.get("input")
    ctx = error.get("ctx") or {}
    if kind in _EXPECTED_TYPES:
        problem = f"is {_kind_of(value)}, not {_EXPECTED_TYPES[kind]}"
        return ConfigIssue(path, value, problem, f"write {_EXPECTED_TYPES[kind]} here; see stacks/README.md")
    if kind in _BOUNDS:
        wording, bound_key = _BOUNDS[kind]
        return ConfigIssue(path, value, f"must be {wording} {ctx[bound_key]}", "change the number")
    if kind == "literal_error":
        return ConfigIssue(path, value, f"must be {ctx['expected']}", "pick one of those")
    if kind == "too_short":
        return ConfigIssue(
            path, value, f"must list at least {ctx['min_length']} item(s)", "add one; see stacks/README.md"
        )
    problem = error["msg"].removeprefix("Value error, ")
    return ConfigIssue(path, value, problem, "see stacks/README.md for the allowed values")


# Pydantic's error types for a value of the wrong type, with what the key takes.
_EXPECTED_TYPES = {
    "string_type": "text",
    "int_type": "a whole number",
    "bool_type": "true or false",
    "dict_type": "a mapping (key: value lines)",
    "model_type": "a mapping (key: value lines)",
    "tuple_type": "a list",
    "list_type": "a list",
}
_BOUNDS = {
    "greater_than": ("more than", "gt"),
    "greater_than_equal": ("at least", "ge"),
    "less_than": ("less than", "lt"),
    "less_than_equal": ("at most", "le"),
}


def _kind_of(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    names: dict[type, str] = {str: "text", dict: "a mapping", list: "a list"}
    return names.get(type(value), "something else")


def _api_access_issues(spec: ClusterSpec) -> Iterable[ConfigIssue]:
    """Who may reach the API: valid ranges, and not the whole internet unless the user opted in, whether one
    range says so or several add up to it (0.0.0.0/1 + 128.0.0.0/1)."""
    ranges = []
    for index, cidr in enumerate(spec.api_access_cidrs):
        issue = _cidr_issue(config_path("apiAccessCidrs", index), cidr)
        if issue:
            yield issue
        else:
            ranges.append(ipaddress.IPv4Network(cidr))
    if spec.allow_public_api_from_anywhere or WHOLE_INTERNET not in ipaddress.collapse_addresses(ranges):
        return
    whole = [index for index, cidr in enumerate(spec.api_access_cidrs) if cidr.endswith("/0")]
    yield ConfigIssue(
        config_path("apiAccessCidrs", *whole[:1]),
        spec.api_access_cidrs[whole[0]] if whole else list(spec.api_access_cidrs),
        "opens the Kubernetes API to the whole internet" + ("" if whole else " (the ranges add up to it)"),
        "list your office/VPN/CI CIDRs, or set allowPublicApiFromAnywhere: true if you mean it",
    )


def _unicast_issue(path: str, value: str) -> ConfigIssue | None:
    """A network range hosts can have addresses in: not multicast, loopback, link-local, "this network"
    (0.0.0.0/8) or reserved (240.0.0.0/4)."""
    network = ipaddress.IPv4Network(value)
    if (
        network.is_multicast
        or network.is_loopback
        or network.is_link_local
        or network.is_reserved
        or network.overlaps(ipaddress.IPv4Network("0.0.0.0/8"))
    ):
        return ConfigIssue(
            path, value, "is not a range hosts can have addresses in", "use RFC 1918 space, e.g. 10.40.0.0/16"
        )
    return None


def _cidr_issue(path: str, value: str) -> ConfigIssue | None:
    if "/" not in value:
        return ConfigIssue(path, value, "has no prefix length", "write it as a CIDR, e.g. 203.0.113.7/32")
    try:
        ipaddress.IPv4Network(value)
    except ValueError as exc:
        return ConfigIssue(path, value, f"not a valid IPv4 CIDR ({exc})", "write it as a.b.c.d/nn")
    return None


def _label_key_issue(path: str, key: str) -> ConfigIssue | None:
    prefix, _, name = key.rpartition("/")
    if (prefix and (len(prefix) > 253 or not LABEL_PREFIX.match(prefix))) or not (
        0 < len(name) <= 63 and LABEL_NAME.match(name)
    ):
        return ConfigIssue(
            path,
            key,
            "not a valid Kubernetes label/taint key",
            "use [prefix/]name, name <= 63 chars of [A-Za-z0-9-_.]",
        )
    if prefix and any(prefix == p or prefix.endswith("." + p) for p in RESERVED_LABEL_PREFIXES):
        return ConfigIssue(
            path,
            key,
            "uses a reserved prefix",
            f"pick your own prefix; reserved: {', '.join(RESERVED_LABEL_PREFIXES)}",
        )
    return None


def _label_value_issue(path: str, value: str) -> ConfigIssue | None:
    if len(value) > 63 or not LABEL_VALUE.match(value):
        return ConfigIssue(path, value, "not a valid Kubernetes label value", "<= 63 chars of [A-Za-z0-9-_.]")
    return None


def _network_issues(spec: ClusterSpec) -> Iterable[ConfigIssue]:
    net = spec.network
    set_keys = {NetworkSpec.model_fields[f].alias or f for f in net.model_fields_set}
    allowed = network_keys(spec.cloud, spec.kind)
    foreign = sorted(set_keys - allowed)
    for key in foreign:
        if spec.kind == "k3s" and key in _VPC_NATIVE_KEYS:
            problem = f"k3s gives pods and services addresses itself ({K3S_CLUSTER_CIDR}, {K3S_SERVICE_CIDR})"
        else:
            problem = f"not a network setting on {spec.cloud}"
        yield ConfigIssue(
            config_path("network", key),
            getattr(net, _field(key)),
            problem,
            f"{spec.cloud}/{spec.kind} network keys: {', '.join(sorted(allowed))}",
        )
    if foreign:
        return
    if spec.cloud == "aws":
        yield from _aws_network_issues(net)
    else:
        yield from _gcp_network_issues(net, vpc_native=spec.kind != "k3s")
    if spec.kind == "k3s":
        yield from _k3s_overlay_issues(net)


def _k3s_overlay_issues(net: NetworkSpec) -> Iterable[ConfigIssue]:
    """A VPC range that overlaps k3s's pod or service range makes those addresses unreachable."""
    if net.cidr is None or _cidr_issue("", net.cidr) is not None:
        return
    vpc = ipaddress.IPv4Network(net.cidr)
    for overlay, what in ((K3S_CLUSTER_CIDR, "pod"), (K3S_SERVICE_CIDR, "service")):
        if vpc.overlaps(ipaddress.IPv4Network(overlay)):
            yield ConfigIssue(
                config_path("network", "cidr"),
                net.cidr,
                f"overlaps k3s's {what} range {overlay}",
                "pick a VPC range outside 10.42.0.0/15, e.g. 10.40.0.0/16",
            )


def _aws_network_issues(net: NetworkSpec) -> Iterable[ConfigIssue]:
    if net.cidr is not None and net.vpc_id is not None:
        yield ConfigIssue(
            config_path("network"),
            {"cidr": net.cidr, "vpcId": net.vpc_id},
            "cidr and vpcId exclude each other",
            "set cidr to create a VPC, or vpcId + privateSubnetIds + publicSubnetIds to use one",
        )
        return
    if net.cidr is None and net.vpc_id is None:
        yield ConfigIssue(
            config_path("network"),
            None,
            "neither cidr nor vpcId is set",
            "set cidr (e.g. 10.40.0.0/16) or vpcId with subnet ids",
        )
        return
    if net.cidr is not None:
        issue = _cidr_issue(config_path("network", "cidr"), net.cidr) or _unicast_issue(
            config_path("network", "cidr"), net.cidr
        )
        if issue:
            yield issue
        elif not 16 <= ipaddress.IPv4Network(net.cidr).prefixlen <= 20:
            yield ConfigIssue(
                config_path("network", "cidr"),
                net.cidr,
                "prefix must be /16 to /20",
                "a GPU cluster needs room for pod IPs; use a /16",
            )
        if net.private_subnet_ids or net.public_subnet_ids:
            yield ConfigIssue(
                config_path("network"),
                net.cidr,
                "subnet ids are only used with vpcId",
                "remove privateSubnetIds/publicSubnetIds or replace cidr with vpcId",
            )
        return
    if not AWS_VPC_ID.fullmatch(net.vpc_id or ""):
        yield ConfigIssue(
            config_path("network", "vpcId"),
            net.vpc_id,
            "not a VPC ID",
            "use the VPC's ID, e.g. vpc-0a1b2c3d4e5f60718 (aws ec2 describe-vpcs)",
        )
    seen: dict[str, str] = {}
    for key, ids in (
        ("privateSubnetIds", net.private_subnet_ids),
        ("publicSubnetIds", net.public_subnet_ids),
    ):
        for index, subnet in enumerate(ids):
            where = config_path("network", key, index)
            if not AWS_SUBNET_ID.fullmatch(subnet):
                yield ConfigIssue(
                    where, subnet, "not a subnet ID", "use subnet IDs, e.g. subnet-0a1b2c3d4e5f60718"
                )
            elif subnet in seen:
                yield ConfigIssue(
                    where, subnet, f"is listed already in network.{seen[subnet]}", "list each subnet once"
                )
            seen.setdefault(subnet, key)
    if len(set(net.private_subnet_ids)) < 2:
        yield ConfigIssue(
            config_path("network", "privateSubnetIds"),
            list(net.private_subnet_ids),
            "at least 2 private subnets (in 2 availability zones) are required",
            "list the private subnet ids of at least two zones",
        )


# (key, example) of the new subnet's ranges and of an existing subnet's names, in the order they are listed.
_GCP_NEW_SUBNET = (("cidr", "10.40.0.0/20"), ("podsCidr", "10.64.0.0/14"), ("servicesCidr", "10.68.0.0/20"))
_GCP_EXISTING_SUBNET = (
    ("networkName", "shared-vpc"),
    ("subnetworkName", "gpu-nodes"),
    ("podsRangeName", "pods"),
    ("servicesRangeName", "services"),
)


def _gcp_network_issues(net: NetworkSpec, vpc_native: bool) -> Iterable[ConfigIssue]:
    """`vpc_native`: the subnet carries pod and service ranges (GKE), or only node addresses (k3s)."""
    if not net.zones:
        yield ConfigIssue(
            config_path("network", "zones"),
            None,
            "GCP clusters need the zones their nodes run in",
            "list zones of gcp:region that offer your GPUs, e.g. zones: [us-central1-a, us-central1-b]",
        )
    yield from _zone_issues(("network", "zones"), net.zones)
    new_subnet, existing_subnet = (
        [(key, example) for key, example in keys if vpc_native or key not in _VPC_NATIVE_KEYS]
        for keys in (_GCP_NEW_SUBNET, _GCP_EXISTING_SUBNET)
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
            issue = _cidr_issue(config_path("network", key), given[key])
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


def _zone_issues(where: tuple[str | int, ...], zones: Iterable[str]) -> Iterable[ConfigIssue]:
    seen: set[str] = set()
    for index, zone in enumerate(zones):
        if not GCP_ZONE.match(zone):
            yield ConfigIssue(
                config_path(*where, index), zone, "not a GCP zone name", "write it like us-central1-a"
            )
        elif zone in seen:
            yield ConfigIssue(config_path(*where, index), zone, "listed twice", "list each zone once")
        seen.add(zone)


def _field(alias: str) -> str:
    return next(name for name, info in NetworkSpec.model_fields.items() if info.alias == alias)


def pool_machine(cloud: Cloud, pool: GpuPoolSpec, catalog: Catalog) -> MachineType | None:
    """What one node of the pool is: a catalog machine type, or a GCP N1 VM with its attached GPUs."""
    if cloud == "gcp" and pool.accelerator is not None and N1_MACHINE.match(pool.instance_type):
        return catalog.n1_with_gpus(pool.instance_type, pool.accelerator.type, pool.accelerator.count)
    return catalog.machine_type(cloud, pool.instance_type)


def _accelerator_issues(
    path: Callable[..., str], pool: GpuPoolSpec, cloud: Cloud, catalog: Catalog
) -> Iterable[ConfigIssue]:
    """GCP GPUs are either attached to an N1 VM (type and count required) or built into the machine type
    (then an accelerator, if given, must say exactly what the type carries)."""
    wanted = pool.accelerator
    if cloud != "gcp":
        if wanted is not None:
            yield ConfigIssue(
                path("accelerator"),
                wanted.model_dump(),
                f"{cloud} instance types carry their GPUs",
                "remove accelerator; instanceType decides the GPUs",
            )
        return
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


def _machine_issues(
    path: Callable[..., str], pool: GpuPoolSpec, cloud: Cloud, catalog: Catalog
) -> Iterable[ConfigIssue]:
    """The pool's node must be a type with whole NVIDIA GPUs; then its sharing must suit that GPU."""
    accelerator_issues = list(_accelerator_issues(path, pool, cloud, catalog))
    if accelerator_issues:
        yield from accelerator_issues
        return
    machine = pool_machine(cloud, pool, catalog)
    if machine is None:
        hint = ", ".join(catalog.nearest_gpu_types(cloud, pool.instance_type))
        yield ConfigIssue(
            path("instanceType"),
            pool.instance_type,
            f"not a GPU type of {cloud} in the catalog (it lists every type with NVIDIA GPUs)",
            f"did you mean one of: {hint}?",
        )
    elif machine.gpu_fraction:
        yield ConfigIssue(
            path("instanceType"),
            pool.instance_type,
            f"has a fractional GPU ({machine.gpu_fraction:g} of one)",
            "fractional vGPU types are not supported; pick a type with whole GPUs, e.g. "
            + ", ".join(catalog.nearest_gpu_types(cloud, pool.instance_type.replace("f.", "."))),
        )
    else:
        assert machine.gpu_model is not None
        yield from sharing_issues(lambda key: path("sharing", key), pool.sharing, machine.gpu_model)


def _extra_type_issues(
    path: Callable[..., str], pool: GpuPoolSpec, cloud: Cloud, catalog: Catalog
) -> Iterable[ConfigIssue]:
    if cloud != "aws":
        yield ConfigIssue(
            path("extraInstanceTypes"),
            list(pool.extra_instance_types),
            f"a {cloud} pool has one machine type",
            "remove it; make another pool for another machine type",
        )
        return
    if pool.capacity_reservation_id is not None:
        yield ConfigIssue(
            path("extraInstanceTypes"),
            list(pool.extra_instance_types),
            "a pool in a Capacity Block launches the block's instance type only",
            "remove it, or capacityReservationId",
        )
    first = catalog.machine_type(cloud, pool.instance_type)
    seen = {pool.instance_type}
    for index, name in enumerate(pool.extra_instance_types):
        where = path("extraInstanceTypes", index)
        machine = catalog.machine_type(cloud, name)
        if name in seen:
            yield ConfigIssue(where, name, "listed twice (or is the pool's instanceType)", "list it once")
            continue
        seen.add(name)
        if machine is None:
            hint = ", ".join(catalog.nearest_gpu_types(cloud, name))
            yield ConfigIssue(
                where, name, "not a GPU type of aws in the catalog", f"did you mean one of: {hint}?"
            )
        elif first is None:  # the pool's instanceType is refused already
            continue
        elif _gpus(machine) != _gpus(first):
            yield ConfigIssue(
                where,
                name,
                f"has {machine.gpu_count} x {_model_name(machine)} ({machine.arch}), "
                f"not the {first.gpu_count} x {_model_name(first)} ({first.arch}) of {pool.instance_type}",
                "list only types with the same GPUs and CPU architecture; make another pool for others",
            )
        elif (machine.vcpu or 0) < (first.vcpu or 0) or (machine.memory_gib or 0) < (first.memory_gib or 0):
            yield ConfigIssue(
                where,
                name,
                f"is smaller than {pool.instance_type} ({machine.vcpu} vCPUs and {machine.memory_gib} GiB "
                f"against {first.vcpu} and {first.memory_gib}): the autoscaler would plan pods onto a node "
                "that cannot hold them",
                f"make {name} the pool's instanceType and list {pool.instance_type} here",
            )


def _gpus(machine: MachineType) -> tuple[object, ...]:
    return machine.gpu_model, machine.gpu_count, machine.arch


def _model_name(machine: MachineType) -> str:
    return machine.gpu_model.id if machine.gpu_model is not None else "no GPU"


def _capacity_block_issues(where: str, pool: GpuPoolSpec, cloud: str) -> Iterable[ConfigIssue]:
    block = pool.capacity_reservation_id
    if cloud != "aws":
        yield ConfigIssue(where, block, f"EC2 Capacity Blocks are an AWS offer, not {cloud}'s", "remove it")
    elif not CAPACITY_RESERVATION_ID.fullmatch(block or ""):
        yield ConfigIssue(
            where,
            block,
            "not a capacity reservation ID",
            "use the Capacity Block's reservation ID, e.g. cr-02168da1478b509e0 "
            "(aws ec2 describe-capacity-reservations --filters Name=reservation-type,Values=capacity-block)",
        )
    if pool.spot:
        yield ConfigIssue(
            where, block, "a Capacity Block is reserved capacity, not spot", "set spot: false for this pool"
        )


def _pool_issues(index: int, pool: GpuPoolSpec, spec: ClusterSpec, catalog: Catalog) -> Iterable[ConfigIssue]:
    path = lambda *parts: config_path("gpuPools", index, *parts)  # noqa: E731
    if len(pool.name) > 40 or not DNS_LABEL.match(pool.name):
        yield ConfigIssue(
            path("name"),
            pool.name,
            "not a valid pool name",
            "use a lowercase DNS label (a-z, 0-9, '-', at most 40 chars), e.g. h100-spot",
        )
    if pool.min_nodes > pool.max_nodes:
        yield ConfigIssue(
            path("minNodes"),
            pool.min_nodes,
            f"is greater than maxNodes ({pool.max_nodes})",
            "set minNodes <= maxNodes (minNodes 0 lets the pool scale to zero)",
        )
    if pool.disk_size_gib < MIN_GPU_DISK_GIB:
        yield ConfigIssue(
            path("diskSizeGiB"),
            pool.disk_size_gib,
            f"GPU nodes need at least {MIN_GPU_DISK_GIB} GiB",
            "CUDA images are large; use 200 or more",
        )
    if not pool.scale_down_unneeded_time or not DURATION.fullmatch(pool.scale_down_unneeded_time):
        yield ConfigIssue(
            path("scaleDownUnneededTime"),
            pool.scale_down_unneeded_time,
            "not a duration",
            'write it like "5m", "1h" or "90s"',
        )
    yield from _machine_issues(path, pool, spec.cloud, catalog)
    if pool.zones and spec.cloud != "gcp":
        yield ConfigIssue(
            path("zones"),
            list(pool.zones),
            f"not a setting on {spec.cloud}",
            "remove it; the network decides the zones",
        )
    yield from _zone_issues(("gpuPools", index, "zones"), pool.zones)
    if pool.capacity_reservation_id is not None:
        yield from _capacity_block_issues(path("capacityReservationId"), pool, spec.cloud)
    if pool.extra_instance_types:
        yield from _extra_type_issues(path, pool, spec.cloud, catalog)
    if pool.name == DEFAULT_DEVICE_PLUGIN_CONFIG:
        yield ConfigIssue(
            path("name"),
            pool.name,
            "is the device-plugin config GPU nodes outside any pool get",
            "pick another pool name",
        )
    if pool.cuda is not None:
        yield from filter(None, [cuda_version_issue(path("cuda"), pool.cuda)])
    for key, value in pool.labels.items():
        yield from filter(
            None, [_label_key_issue(path("labels", key), key), _label_value_issue(path("labels", key), value)]
        )
    for t_index, taint in enumerate(pool.taints):
        yield from filter(
            None,
            [
                _label_key_issue(path("taints", t_index, "key"), taint.key),
                _label_value_issue(path("taints", t_index, "value"), taint.value),
            ],
        )
        if taint.key == "nvidia.com/gpu":
            yield ConfigIssue(
                path("taints", t_index, "key"),
                taint.key,
                "is added to every GPU pool already",
                "remove this taint",
            )


def _semantic_issues(spec: ClusterSpec, catalog: Catalog) -> Iterable[ConfigIssue]:
    if len(spec.name) > 32 or not DNS_LABEL.match(spec.name) or not spec.name[0].isalpha():
        yield ConfigIssue(
            config_path("name"),
            spec.name,
            "not a valid cluster name",
            "use a lowercase DNS label that starts with a letter, at most 32 chars, e.g. ml",
        )
    valid_kinds = {"aws": ("eks", "k3s"), "gcp": ("gke", "k3s")}[spec.cloud]
    if spec.kind not in valid_kinds:
        yield ConfigIssue(
            config_path("kind"),
            spec.kind,
            f"does not exist on {spec.cloud}",
            f"use one of: {', '.join(valid_kinds)}",
        )
    if not re.fullmatch(r"1\.\d+", spec.kubernetes_version):
        yield ConfigIssue(
            config_path("kubernetesVersion"),
            spec.kubernetes_version,
            "must be a minor version",
            f'write it like "1.35"; supported: {", ".join(SUPPORTED_KUBERNETES_MINORS)}',
        )
    elif spec.kubernetes_version not in SUPPORTED_KUBERNETES_MINORS:
        yield ConfigIssue(
            config_path("kubernetesVersion"),
            spec.kubernetes_version,
            f"the pinned GPU Operator {GPU_OPERATOR_CHART_VERSION} supports Kubernetes "
            f"{SUPPORTED_KUBERNETES_MINORS[0]}-{SUPPORTED_KUBERNETES_MINORS[-1]} only",
            f"use one of: {', '.join(SUPPORTED_KUBERNETES_MINORS)}",
        )
    yield from _network_issues(spec)
    yield from _api_access_issues(spec)
    if spec.cloud == "aws" and not AWS_INSTANCE_TYPE.match(spec.system_pool.instance_type):
        yield ConfigIssue(
            config_path("systemPool", "instanceType"),
            spec.system_pool.instance_type,
            "not an EC2 instance type name",
            "use a type like m7i.large",
        )
    if spec.cuda is not None:
        yield from filter(None, [cuda_version_issue(config_path("cuda"), spec.cuda)])
    for section in ("eks", "gke", "k3s"):
        if section in spec.model_fields_set and spec.kind != section:
            yield ConfigIssue(
                config_path(section),
                getattr(spec, section).model_dump(by_alias=True, exclude_unset=True),
                f"{section} settings only apply to kind {section}, not {spec.cloud}/{spec.kind}",
                f"remove the {section} section",
            )
    if spec.kind == "k3s":
        yield from _k3s_issues(spec)
    yield from addon_issues(spec)
    seen: dict[str, int] = {}
    sound_pools: set[int] = set()
    for index, pool in enumerate(spec.gpu_pools):
        if pool.name in seen:
            yield ConfigIssue(
                config_path("gpuPools", index, "name"),
                pool.name,
                f"duplicates gpuPools[{seen[pool.name]}].name",
                "give every pool its own name",
            )
        seen.setdefault(pool.name, index)
        pool_issues = list(_pool_issues(index, pool, spec, catalog))
        yield from pool_issues
        if not pool_issues:
            sound_pools.add(index)
    yield from cluster_mig_issues(
        mig_pools(spec, catalog, sound_pools),
        lambda index, key: config_path("gpuPools", index, "sharing", key),
    )


def _k3s_issues(spec: ClusterSpec) -> Iterable[ConfigIssue]:
    version = spec.k3s.version
    match = K3S_VERSION.match(version)
    if "version" not in spec.k3s.model_fields_set:
        yield ConfigIssue(
            config_path("k3s", "version"),
            None,
            f"is not set, and no k3s release is pinned for kubernetesVersion {spec.kubernetes_version}",
            f"set k3s.version to a k3s {spec.kubernetes_version} release (github.com/k3s-io/k3s/releases), "
            f"or kubernetesVersion to one of {', '.join(K3S_RELEASES)}",
        )
    elif match is None:
        yield ConfigIssue(
            config_path("k3s", "version"),
            version,
            "not a k3s release name",
            f'write it like "{DEFAULT_K3S_VERSION}" (see github.com/k3s-io/k3s/releases)',
        )
    elif (minor := f"1.{match.group(1)}") not in SUPPORTED_KUBERNETES_MINORS:
        yield ConfigIssue(
            config_path("k3s", "version"),
            version,
            f"Kubernetes {minor}; the pinned GPU Operator {GPU_OPERATOR_CHART_VERSION} supports "
            f"{SUPPORTED_KUBERNETES_MINORS[0]}-{SUPPORTED_KUBERNETES_MINORS[-1]} only",
            f'use a k3s release of one of those minors, e.g. "{DEFAULT_K3S_VERSION}"',
        )
    elif minor != spec.kubernetes_version:
        yield ConfigIssue(
            config_path("k3s", "version"),
            version,
            f"is Kubernetes {minor} but kubernetesVersion says {spec.kubernetes_version}",
            f'set kubernetesVersion: "{minor}" or pick a k3s {spec.kubernetes_version} release',
        )
    if spec.system_pool.nodes not in K3S_SERVER_COUNTS:
        yield ConfigIssue(
            config_path("systemPool", "nodes"),
            spec.system_pool.nodes,
            "k3s runs 1 server, or 3 with embedded etcd (an even count tolerates no more failures than one "
            "server fewer)",
            "set systemPool.nodes to 1 or 3",
        )


def mig_pools(spec: ClusterSpec, catalog: Catalog, among: Iterable[int] | None = None) -> list[PoolMig]:
    """The spec's MIG pools with their layouts, as the cluster-wide MIG rules take them (all pools, or only
    the indexes `among`, whose instance types must be valid)."""
    chosen = set(range(len(spec.gpu_pools)) if among is None else among)
    pools = []
    for index, pool in enumerate(spec.gpu_pools):
        if pool.sharing.mode != "mig" or index not in chosen:
            continue
        machine = pool_machine(spec.cloud, pool, catalog)
        assert machine is not None and machine.gpu_model is not None, "validated"
        layout = mig_layout(pool.sharing, machine.gpu_model, pool.name)
        pools.append(PoolMig(index, pool.name, layout, pool.sharing.strategy))
    return pools


def _kind_defaults(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """Defaults that depend on the kind: on k3s the system pool is the servers, one unless asked for three,
    and the k3s release is the one pinned for `kubernetesVersion`."""
    if raw.get("kind") != "k3s":
        return raw
    defaulted = dict(raw)
    pool = raw.get("systemPool")
    if isinstance(pool, Mapping) and "nodes" not in pool:
        defaulted["systemPool"] = {**pool, "nodes": 1}
    k3s = raw.get("k3s", {})
    minor = raw.get("kubernetesVersion")
    release = K3S_RELEASES.get(minor) if isinstance(minor, str) else None
    if isinstance(k3s, Mapping) and "version" not in k3s and release is not None:
        defaulted["k3s"] = {**k3s, "version": release}
    return defaulted


def load_spec(raw: Any, catalog: Catalog | None = None) -> ClusterSpec:
    """Parse and validate the `gpu-k8s:cluster` value; raise ConfigError listing every problem."""
    if raw is None:
        raise ConfigError(
            [
                ConfigIssue(
                    CONFIG_KEY,
                    None,
                    "is not set",
                    "add it to stacks/Pulumi.<stack>.yaml; see stacks/README.md",
                )
            ]
        )
    if not isinstance(raw, Mapping):
        raise ConfigError(
            [
                ConfigIssue(
                    CONFIG_KEY,
                    raw,
                    "must be a mapping",
                    "set it in stacks/Pulumi.<stack>.yaml; see stacks/README.md",
                )
            ]
        )
    raise_if_any(raw_value_issues(raw))
    try:
        # JSON mode: strict types, yet YAML lists become tuples (Pulumi hands structured config over as JSON).
        spec = ClusterSpec.model_validate_json(json.dumps(_kind_defaults(raw)))
    except ValidationError as exc:
        errors = exc.errors()
        # A list whose items all failed also reports itself as too short; the item errors say more.
        inner = {tuple(e["loc"])[:depth] for e in errors for depth in range(len(e["loc"]))}
        errors = [e for e in errors if not (e["type"] == "too_short" and tuple(e["loc"]) in inner)]
        raise ConfigError(_structural_issue(e) for e in errors) from None
    issues = list(_semantic_issues(spec, catalog or load_catalog()))
    if issues:
        raise ConfigError(issues)
    return spec


def pool_child_name(cluster_name: str, pool_name: str) -> str:
    """The base name of every resource a GPU pool owns; stable as long as the two names are."""
    return f"{cluster_name}-gpu-{pool_name}"
