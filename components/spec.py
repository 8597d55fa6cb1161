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
import json
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, ValidationError

from components.catalog import Catalog, load_catalog
from components.compat import GPU_OPERATOR_CHART_VERSION, addon_issues, cuda_version_issue
from components.configbase import CONFIG_KEY, ConfigError, ConfigIssue, StrictModel, config_path
from components.sharing import (
    DEFAULT_DEVICE_PLUGIN_CONFIG,
    PoolMig,
    SharingSpec,
    cluster_mig_issues,
    mig_layout,
    sharing_issues,
)

CLUSTER_AUTOSCALER_CHART_VERSION = "9.59.0"

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


def _quoted(key: str, example: str) -> BeforeValidator:
    """YAML reads 12.10 as the number 12.1: versions must be quoted strings."""

    def refuse_numbers(value: Any) -> Any:
        if isinstance(value, float | int) and not isinstance(value, bool):
            raise ValueError(f'YAML read this as a number; quote it, e.g. {key}: "{example}"')
        return value

    return BeforeValidator(refuse_numbers)


CudaRelease = Annotated[str | None, _quoted("cuda", "12.8")]


class TaintSpec(StrictModel):
    """A Kubernetes taint added to every node of a pool (and to its scale-from-zero template)."""

    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class NetworkSpec(StrictModel):
    """A new VPC (`cidr` + `availabilityZones`) or an existing one (`vpcId` + subnet ids)."""

    cidr: str | None = None
    availability_zones: Annotated[int, Field(ge=2, le=6)] = 3
    # One NAT gateway for all zones instead of one per zone: cheaper, but a zone outage cuts egress.
    single_nat_gateway: bool = False
    vpc_id: str | None = None
    private_subnet_ids: tuple[str, ...] = ()
    public_subnet_ids: tuple[str, ...] = ()

    @property
    def creates_vpc(self) -> bool:
        return self.vpc_id is None


class SystemPoolSpec(StrictModel):
    """On-demand CPU nodes for cluster add-ons (CoreDNS, the operator, the autoscaler)."""

    instance_type: str
    nodes: Annotated[int, Field(ge=1, le=100)] = 2
    disk_size_gib: Annotated[int, Field(ge=20, le=MAX_DISK_GIB, alias="diskSizeGiB")] = 50


class GpuPoolSpec(StrictModel):
    """One autoscaled group of identical GPU nodes."""

    name: str
    instance_type: str
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


class AddonVersions(StrictModel):
    """Chart versions; the defaults are the versions the contract tests check the rendered values against."""

    gpu_operator: str = GPU_OPERATOR_CHART_VERSION
    cluster_autoscaler: str = CLUSTER_AUTOSCALER_CHART_VERSION
    # The driver the GPU Operator installs, on platforms where it installs one (default: the chart's).
    nvidia_driver: str | None = None


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
    # The newest CUDA release the workloads are built for ("12.8"); checked against each pool's driver.
    cuda: CudaRelease = None


# Keys people reach for that this toolkit decides itself, with the reason.
_DECIDED_KEYS = {
    "amiType": "the AMI comes from the catalog (AL2023 NVIDIA); Bottlerocket is refused until its "
    "built-in device plugin is supported deliberately",
    "gpuCount": "the GPU model and count come from the catalog for the instance type",
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
        guess = difflib.get_close_matches(key, allowed, n=1)
        hint = f"did you mean '{guess[0]}'? " if guess else ""
        return ConfigIssue(path, error["input"], "unknown key", f"{hint}allowed keys: {', '.join(allowed)}")
    if kind == "missing":
        return ConfigIssue(path, None, "required key is missing", "add it; see stacks/README.md")
    problem = error["msg"].removeprefix("Value error, ")
    return ConfigIssue(path, error.get("input"), problem, "see stacks/README.md for the allowed values")


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
        issue = _cidr_issue(config_path("network", "cidr"), net.cidr)
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
    if len(net.private_subnet_ids) < 2:
        yield ConfigIssue(
            config_path("network", "privateSubnetIds"),
            list(net.private_subnet_ids),
            "at least 2 private subnets (in 2 availability zones) are required",
            "list the private subnet ids of at least two zones",
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
    machine = catalog.machine_type(spec.cloud, pool.instance_type)
    if machine is None:
        hint = ", ".join(catalog.nearest_gpu_types(spec.cloud, pool.instance_type))
        yield ConfigIssue(
            path("instanceType"),
            pool.instance_type,
            f"not a {spec.cloud} GPU type in the catalog (it lists every type with NVIDIA GPUs)",
            f"did you mean one of: {hint}?",
        )
    elif machine.gpu_fraction:
        yield ConfigIssue(
            path("instanceType"),
            pool.instance_type,
            f"has a fractional GPU ({machine.gpu_fraction:g} of one)",
            "fractional vGPU types are not supported; pick a type with whole GPUs, e.g. "
            + ", ".join(catalog.nearest_gpu_types(spec.cloud, pool.instance_type.replace("f.", "."))),
        )
    elif not machine.has_whole_gpus:
        yield ConfigIssue(
            path("instanceType"),
            pool.instance_type,
            "has no NVIDIA GPU",
            "use a GPU type, e.g. " + ", ".join(catalog.nearest_gpu_types(spec.cloud, pool.instance_type)),
        )
    else:
        assert machine.gpu_model is not None
        yield from sharing_issues(lambda key: path("sharing", key), pool.sharing, machine.gpu_model)
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
    for index, cidr in enumerate(spec.api_access_cidrs):
        issue = _cidr_issue(config_path("apiAccessCidrs", index), cidr)
        if issue:
            yield issue
        elif ipaddress.IPv4Network(cidr).prefixlen == 0 and not spec.allow_public_api_from_anywhere:
            yield ConfigIssue(
                config_path("apiAccessCidrs", index),
                cidr,
                "opens the Kubernetes API to the whole internet",
                "list your office/VPN/CI CIDRs, or set allowPublicApiFromAnywhere: true if you mean it",
            )
    if spec.cloud == "aws" and not AWS_INSTANCE_TYPE.match(spec.system_pool.instance_type):
        yield ConfigIssue(
            config_path("systemPool", "instanceType"),
            spec.system_pool.instance_type,
            "not an EC2 instance type name",
            "use a type like m7i.large",
        )
    if spec.cuda is not None:
        yield from filter(None, [cuda_version_issue(config_path("cuda"), spec.cuda)])
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


def mig_pools(spec: ClusterSpec, catalog: Catalog, among: Iterable[int] | None = None) -> list[PoolMig]:
    """The spec's MIG pools with their layouts, as the cluster-wide MIG rules take them (all pools, or only
    the indexes `among`, whose instance types must be valid)."""
    chosen = set(range(len(spec.gpu_pools)) if among is None else among)
    pools = []
    for index, pool in enumerate(spec.gpu_pools):
        if pool.sharing.mode != "mig" or index not in chosen:
            continue
        machine = catalog.machine_type(spec.cloud, pool.instance_type)
        assert machine is not None and machine.gpu_model is not None, "validated"
        layout = mig_layout(pool.sharing, machine.gpu_model, pool.name)
        pools.append(PoolMig(index, pool.name, layout, pool.sharing.strategy))
    return pools


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
    try:
        # JSON mode: strict types, yet YAML lists become tuples (Pulumi hands structured config over as JSON).
        spec = ClusterSpec.model_validate_json(json.dumps(raw))
    except ValidationError as exc:
        errors = exc.errors()
        # A list whose items all failed also reports itself as too short; the item errors say more.
        failed_parents = {tuple(e["loc"][:-2]) for e in errors if len(e["loc"]) > 2}
        errors = [e for e in errors if not (e["type"] == "too_short" and tuple(e["loc"]) in failed_parents)]
        raise ConfigError(_structural_issue(e) for e in errors) from None
    issues = list(_semantic_issues(spec, catalog or load_catalog()))
    if issues:
        raise ConfigError(issues)
    return spec


def pool_child_name(cluster_name: str, pool_name: str) -> str:
    """The base name of every resource a GPU pool owns; stable as long as the two names are."""
    return f"{cluster_name}-gpu-{pool_name}"
