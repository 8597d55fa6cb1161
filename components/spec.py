"""The stack configuration model: `gpu-k8s:cluster` in camelCase YAML -> frozen, validated specs.

`ClusterSpec` holds what every platform shares (name, versions, pools, sharing, CUDA, API access). Each
platform subclasses it with its network shape, its own section (`eks`, `gke`, `k3s`) and its rules (the
hook methods below), and registers the subclass with `register_platform` from its own package
(`providers/<cloud>/platforms.py`): the core never asks which cloud or kind it is validating.

Validation runs in two passes, both before any resource exists:
1. structure (pydantic), against every registered platform's keys at once: types, ranges, unknown keys;
2. meaning (`_semantic_issues` and the platform's hooks): catalog lookups, supported versions, cross-field
   rules, keys of another platform.
All problems of both passes are collected and raised together as one `ConfigError`, each naming the
YAML path, the bad value, what is allowed and how to fix it.
"""

from __future__ import annotations

import difflib
import functools
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, Field, ValidationError, create_model

from gpu_k8s.components.batch_spec import BatchSpec, batch_issues
from gpu_k8s.components.catalog import Catalog, Cloud, MachineType, load_catalog
from gpu_k8s.components.compat import (
    GPU_OPERATOR_CHART_VERSION,
    AddonVersions,
    addon_issues,
    cuda_version_issue,
)
from gpu_k8s.components.configbase import (
    DNS_LABEL,
    ConfigError,
    ConfigIssue,
    StrictModel,
    config_key,
    config_path,
    duration_seconds,
    raise_if_any,
    raw_value_issues,
)
from gpu_k8s.components.monitoring_spec import MonitoringSpec, monitoring_issues
from gpu_k8s.components.sharing import (
    DEFAULT_DEVICE_PLUGIN_CONFIG,
    PoolMig,
    SharingSpec,
    cluster_mig_issues,
    mig_layout,
    sharing_issues,
)

M = TypeVar("M", bound=BaseModel)

# Kubernetes minors the pinned GPU Operator (v26.7.0) supports: NVIDIA platform-support.rst, 1.33-1.36.
SUPPORTED_KUBERNETES_MINORS = ("1.33", "1.34", "1.35", "1.36")


def minor_key(version: str) -> tuple[int, ...]:
    """A Kubernetes version's minor ("1.35", or "1.35.2" from EKS) as numbers, for ordering."""
    return tuple(int(part) for part in version.split(".")[:2])


MIN_GPU_DISK_GIB = 50
# gp3 and pd-balanced volumes both stop at 16 TiB.
MAX_DISK_GIB = 16384

# Kubernetes qualified name (label key) and label value syntax (apimachinery validation).
LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Label prefixes the kubelet may not set on itself (NodeRestriction) or that this toolkit owns.
RESERVED_LABEL_PREFIXES = ("kubernetes.io", "k8s.io", "nvidia.com", "gpu-k8s.io")

WHOLE_INTERNET = ipaddress.IPv4Network("0.0.0.0/0")


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


class NetworkSettings(StrictModel):
    """The `network` section; each platform subclasses it with its keys."""


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
    # A fast interconnect between the pool's nodes for multi-node training, where the cloud offers one for
    # the instance type (AWS: efa).
    interconnect: str | None = None


class InferenceSpec(StrictModel):
    """`inference`: KEDA, which scales Deployments on load (Prometheus queries, queues, schedules) and to
    zero replicas (components/inference.py). No keys of its own yet: `inference: {}` turns it on."""


class StorageSpec(StrictModel):
    """`storage`: what pods can mount besides the default block volumes."""

    # A file system that pods on many nodes mount at once (ReadWriteMany), for datasets and checkpoints:
    # the StorageClass `shared-rwx`, backed by the service named here (the platform's `shared_storage`).
    shared: str | None = None


class PoolRules:
    """A cloud's rules for GPU pools: what a pool's node is, and the pool keys only some clouds take. The
    defaults suit a cloud whose instance types carry their GPUs and whose pools have one machine type in
    the network's zones; a cloud's subclass overrides what differs."""

    def __init__(self, cloud: Cloud):
        self.cloud = cloud

    def pool_machine(self, pool: GpuPoolSpec, catalog: Catalog) -> MachineType | None:
        """What one node of the pool is: its catalog machine type."""
        return catalog.machine_type(self.cloud, pool.instance_type)

    def accelerator_issues(
        self, path: Callable[..., str], pool: GpuPoolSpec, catalog: Catalog
    ) -> Iterable[ConfigIssue]:
        if pool.accelerator is not None:
            yield ConfigIssue(
                path("accelerator"),
                pool.accelerator.model_dump(),
                f"{self.cloud} instance types carry their GPUs",
                "remove accelerator; instanceType decides the GPUs",
            )

    def pool_zone_issues(self, index: int, pool: GpuPoolSpec) -> Iterable[ConfigIssue]:
        if pool.zones:
            yield ConfigIssue(
                config_path("gpuPools", index, "zones"),
                list(pool.zones),
                f"not a setting on {self.cloud}",
                "remove it; the network decides the zones",
            )

    def capacity_block_issues(self, where: str, pool: GpuPoolSpec) -> Iterable[ConfigIssue]:
        yield ConfigIssue(
            where,
            pool.capacity_reservation_id,
            f"EC2 Capacity Blocks are an AWS offer, not {self.cloud}'s",
            "remove it",
        )

    def extra_type_issues(
        self, path: Callable[..., str], pool: GpuPoolSpec, catalog: Catalog
    ) -> Iterable[ConfigIssue]:
        yield ConfigIssue(
            path("extraInstanceTypes"),
            list(pool.extra_instance_types),
            f"a {self.cloud} pool has one machine type",
            "remove it; make another pool for another machine type",
        )

    def interconnect_issues(
        self, path: Callable[..., str], pool: GpuPoolSpec, catalog: Catalog
    ) -> Iterable[ConfigIssue]:
        yield ConfigIssue(
            path("interconnect"),
            pool.interconnect,
            f"no interconnect is built for {self.cloud} yet",
            "remove it",
        )

    def interconnect_resources(self, pool: GpuPoolSpec, machine: MachineType) -> dict[str, int]:
        """Extended resources a node of the pool advertises for its interconnect (per node)."""
        return {}


class ClusterSpec(StrictModel):
    """The whole cluster as the stack file describes it: the part every platform shares.

    A platform subclasses it with its `network` model, its own section and its cloud's `pool_rules`, and
    overrides the hooks below; each hook's issues are listed at its place among the generic ones."""

    name: str
    cloud: Cloud
    kind: str
    kubernetes_version: Annotated[str, _quoted("kubernetesVersion", "1.35")]
    network: NetworkSettings
    api_access_cidrs: Annotated[tuple[str, ...], Field(min_length=1)]
    # Escape hatch for labs: lets apiAccessCidrs contain 0.0.0.0/0.
    allow_public_api_from_anywhere: bool = False
    system_pool: SystemPoolSpec
    gpu_pools: Annotated[tuple[GpuPoolSpec, ...], Field(min_length=1)]
    addon_versions: AddonVersions = AddonVersions()
    batch: BatchSpec | None = None
    # On unless the stack says `monitoring: false`: its idle cost is a small volume and pods on the system
    # nodes, and without it nobody hears of an idle GPU node.
    monitoring: MonitoringSpec | None = MonitoringSpec()
    inference: InferenceSpec | None = None
    storage: StorageSpec = StorageSpec()
    # The newest CUDA release the workloads are built for ("12.8"); checked against each pool's driver.
    cuda: CudaRelease = None

    # Network keys of other platforms that this one refuses with a reason of its own (YAML name -> problem).
    refused_network_keys: ClassVar[Mapping[str, str]] = {}
    # The cloud's rules for GPU pools (each platform sets its cloud's).
    pool_rules: ClassVar[PoolRules]
    # `storage.shared` values the platform builds (value -> the service), and why there are none if so.
    shared_storage: ClassVar[Mapping[str, str]] = {}
    no_shared_storage: ClassVar[str] = "no shared file system is built for this platform"
    # Why the platform builds no `gpuPools[].interconnect` that its cloud's pool rules accept, and the way
    # out (None: it builds what the rules accept).
    no_interconnect: ClassVar[tuple[str, str] | None] = None

    @classmethod
    def with_defaults(cls, raw: Mapping[str, Any]) -> Mapping[str, Any]:
        """The raw config with the defaults that depend on other keys filled in."""
        return raw

    def network_issues(self) -> Iterable[ConfigIssue]:
        """The network's own rules (run only when it holds no other platform's keys)."""
        return ()

    def system_pool_issues(self) -> Iterable[ConfigIssue]:
        return ()

    def platform_issues(self) -> Iterable[ConfigIssue]:
        """Rules across the platform's own section and the generic keys."""
        return ()

    def pool_machine(self, pool: GpuPoolSpec, catalog: Catalog) -> MachineType | None:
        """What one node of the pool is (never `catalog.machine_type` directly: GCP attaches GPUs to N1)."""
        return self.pool_rules.pool_machine(pool, catalog)


@dataclass(frozen=True)
class Platform:
    """A (cloud, kind) a stack can name: its spec class and the function that builds it."""

    cloud: Cloud
    kind: str
    spec: type[ClusterSpec]
    # "module:function", imported only when a stack of this platform is built (an AWS plan never loads
    # pulumi_gcp).
    build: str


# (cloud, kind) -> Platform. The platforms of this package register from `gpu_k8s.providers`, which
# `gpu_k8s` imports; a program or a test may register its own.
PLATFORMS: dict[tuple[str, str], Platform] = {}


def register_platform(platform: Platform) -> None:
    """Make a platform available to `load_spec` and `build_cluster`."""
    PLATFORMS[(platform.cloud, platform.kind)] = platform


def platform_of(spec: ClusterSpec) -> Platform:
    return PLATFORMS[(spec.cloud, spec.kind)]


# Sections whose keys differ by platform: the structural pass takes every platform's keys, and a key of
# another platform is then refused with a message saying so.
MERGED_SECTIONS = ("network", "storage")


@functools.cache
def _structure_model(platforms: tuple[Platform, ...]) -> type[StrictModel]:
    """The model the structural pass validates against: the generic keys, every platform's network and
    storage keys and every platform's section. A key of another platform then gets a message saying so
    (semantic pass) instead of "unknown key"."""
    merged_fields: dict[str, dict[str, Any]] = {section: {} for section in MERGED_SECTIONS}
    sections: dict[str, Any] = {}
    for platform in platforms:
        for section, fields_of_section in merged_fields.items():
            for name, field in _section_model(platform.spec, section).model_fields.items():
                fields_of_section.setdefault(name, (field.annotation, field))
        for name, field in platform.spec.model_fields.items():
            if name not in ClusterSpec.model_fields:
                sections.setdefault(name, (field.annotation, field))
    fields: dict[str, Any] = {}
    for name, field in ClusterSpec.model_fields.items():
        if name == "cuda":
            fields.update(sorted(sections.items()))
        fields[name] = (field.annotation, field)
    clouds = tuple(sorted({p.cloud for p in platforms}))
    kinds = tuple(sorted({p.kind for p in platforms}))
    fields["cloud"] = (Literal[clouds], ...)  # type: ignore[valid-type]
    fields["kind"] = (Literal[kinds], ...)  # type: ignore[valid-type]
    for section, fields_of_section in merged_fields.items():
        model = create_model(f"{section.title()}Spec", __base__=StrictModel, **fields_of_section)
        fields[section] = (model, ... if ClusterSpec.model_fields[section].is_required() else model())
    return create_model("ClusterSpec", __base__=StrictModel, **fields)


def _registered() -> tuple[Platform, ...]:
    return tuple(PLATFORMS[key] for key in sorted(PLATFORMS))


# Keys people reach for that this toolkit decides itself, with the reason.
_DECIDED_KEYS = {
    "amiType": "the AMI comes from the catalog (AL2023 NVIDIA); Bottlerocket is refused until its "
    "built-in device plugin is supported deliberately",
    "gpuCount": "the GPU model and count come from the catalog for the instance type (GCP N1 VMs attach "
    "GPUs with accelerator: {type, count})",
    "gpuModel": "the GPU model and count come from the catalog for the instance type",
    "desiredNodes": "the autoscaler owns the node count; set minNodes/maxNodes",
}


def _model_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The pydantic model under `root` that owns the mapping at `loc` (for listing its allowed keys)."""
    model: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        field = next((f for f in model.model_fields.values() if f.alias == part), None)
        if field is None:
            return None
        model = _model_in(field.annotation)
        if model is None:
            return None
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds, through Optional, Annotated and tuples of it
    (`tuple[TeamSpec, ...] | None`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _structural_issue(root: type[BaseModel], error: Mapping[str, Any]) -> ConfigIssue:
    loc = tuple(error["loc"])
    path = config_path(*loc)
    error_type = error["type"]
    if error_type == "extra_forbidden":
        key = str(loc[-1])
        owner = _model_at(root, loc[:-1])
        allowed = sorted(f.alias for f in owner.model_fields.values() if f.alias) if owner else []
        if key in _DECIDED_KEYS:
            return ConfigIssue(path, error["input"], "not a setting", _DECIDED_KEYS[key])
        by_lowercase = {name.lower(): name for name in allowed}
        guess = difflib.get_close_matches(key.lower(), list(by_lowercase), n=1)
        hint = f"did you mean {by_lowercase[guess[0]]}? " if guess else ""
        return ConfigIssue(path, error["input"], "unknown key", f"{hint}allowed keys: {', '.join(allowed)}")
    if error_type == "missing":
        parent = config_path(*loc[:-1])
        return ConfigIssue(path, None, "is missing", f"add `{loc[-1]}:` under {parent}; see stacks/README.md")
    value = error.get("input")
    ctx = error.get("ctx") or {}
    if error_type in _EXPECTED_TYPES:
        problem = f"is {_kind_of(value)}, not {_EXPECTED_TYPES[error_type]}"
        return ConfigIssue(
            path, value, problem, f"write {_EXPECTED_TYPES[error_type]} here; see stacks/README.md"
        )
    if error_type in _BOUNDS:
        wording, bound_key = _BOUNDS[error_type]
        return ConfigIssue(path, value, f"must be {wording} {ctx[bound_key]}", "change the number")
    if error_type == "literal_error":
        return ConfigIssue(path, value, f"must be {ctx['expected']}", "pick one of those")
    if error_type == "too_short":
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
        issue = cidr_issue(config_path("apiAccessCidrs", index), cidr)
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


# RFC 5737: reserved for documentation, never routed; no host has addresses there.
DOCUMENTATION_RANGES = tuple(
    ipaddress.IPv4Network(r) for r in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")
)


def host_range_issue(path: str, value: str) -> ConfigIssue | None:
    """A range for a network's hosts (a VPC, a subnet, pod or service ranges, a control plane's, a file
    server's): unicast, and not an RFC 5737 documentation range (Python counts those as private)."""
    issue = unicast_issue(path, value)
    if issue is not None:
        return issue
    if any(ipaddress.IPv4Network(value).overlaps(example) for example in DOCUMENTATION_RANGES):
        return ConfigIssue(
            path, value, "is an RFC 5737 documentation range, which no host has", "use RFC 1918 space"
        )
    return None


def unicast_issue(path: str, value: str) -> ConfigIssue | None:
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


def cidr_issue(path: str, value: str) -> ConfigIssue | None:
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


def _foreign_section_issues(
    spec: ClusterSpec, section: str, given: BaseModel, scope: str
) -> Iterable[ConfigIssue]:
    """Keys of a merged section (`MERGED_SECTIONS`) set that only another platform has; `scope` is what
    they are not a setting of ("aws", "gcp/k3s")."""
    allowed = platform_keys(type(spec), section)
    refused = _refused_keys(type(spec), section)
    for key in sorted(_set_aliases(given) - allowed):
        yield ConfigIssue(
            config_path(section, key),
            getattr(given, _field_named(type(given), key)),
            refused.get(key, f"not a {section} setting on {scope}"),
            f"{spec.cloud}/{spec.kind} {section} keys: {', '.join(sorted(allowed))}",
        )


def platform_keys(spec_class: type[ClusterSpec], section: str) -> set[str]:
    """The keys (YAML names) of a merged section that mean something on the platform."""
    fields = _section_model(spec_class, section).model_fields
    return {field.alias or name for name, field in fields.items()} - set(_refused_keys(spec_class, section))


def _refused_keys(spec_class: type[ClusterSpec], section: str) -> Mapping[str, str]:
    """Keys the platform's model has but refuses with a reason of its own (only network keys so far)."""
    return spec_class.refused_network_keys if section == "network" else {}


def _section_model(spec_class: type[ClusterSpec], section: str) -> type[BaseModel]:
    model = spec_class.model_fields[section].annotation
    assert isinstance(model, type) and issubclass(model, BaseModel), f"a platform's {section} is a model"
    return model


def _set_aliases(model: BaseModel) -> set[str]:
    return {type(model).model_fields[name].alias or name for name in model.model_fields_set}


def _field_named(model: type[BaseModel], alias: str) -> str:
    return next(name for name, info in model.model_fields.items() if (info.alias or name) == alias)


def _machine_issues(
    path: Callable[..., str], pool: GpuPoolSpec, rules: PoolRules, catalog: Catalog
) -> Iterable[ConfigIssue]:
    """The pool's node must be a type with whole NVIDIA GPUs; then its sharing must suit that GPU."""
    accelerator_issues = list(rules.accelerator_issues(path, pool, catalog))
    if accelerator_issues:
        yield from accelerator_issues
        return
    cloud = rules.cloud
    machine = rules.pool_machine(pool, catalog)
    if machine is None:
        elsewhere = _same_gpu_elsewhere(catalog, cloud, pool.instance_type)
        hint = (
            elsewhere
            or f"did you mean one of: {', '.join(catalog.nearest_gpu_types(cloud, pool.instance_type))}?"
        )
        yield ConfigIssue(
            path("instanceType"),
            pool.instance_type,
            f"not a GPU type of {cloud} in the catalog (it lists every type with NVIDIA GPUs)",
            hint,
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


def _pool_issues(index: int, pool: GpuPoolSpec, rules: PoolRules, catalog: Catalog) -> Iterable[ConfigIssue]:
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
    if duration_seconds(pool.scale_down_unneeded_time) is None:
        yield ConfigIssue(
            path("scaleDownUnneededTime"),
            pool.scale_down_unneeded_time,
            "not a duration",
            'write it like "5m", "1h" or "90s"',
        )
    yield from _machine_issues(path, pool, rules, catalog)
    yield from rules.pool_zone_issues(index, pool)
    if pool.capacity_reservation_id is not None:
        yield from rules.capacity_block_issues(path("capacityReservationId"), pool)
        if pool.spot:
            yield ConfigIssue(
                path("capacityReservationId"),
                pool.capacity_reservation_id,
                "a Capacity Block is reserved capacity, not spot",
                "set spot: false for this pool",
            )
    if pool.extra_instance_types:
        yield from rules.extra_type_issues(path, pool, catalog)
    if pool.interconnect is not None:
        yield from rules.interconnect_issues(path, pool, catalog)
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


def _name_issues(name: str) -> Iterable[ConfigIssue]:
    if len(name) > 32 or not DNS_LABEL.match(name) or not name[0].isalpha():
        yield ConfigIssue(
            config_path("name"),
            name,
            "not a valid cluster name",
            "use a lowercase DNS label that starts with a letter, at most 32 chars, e.g. ml",
        )


def _kind_issues(cloud: str, kind: str) -> Iterable[ConfigIssue]:
    kinds = sorted(k for c, k in PLATFORMS if c == cloud)
    if (cloud, kind) not in PLATFORMS:
        yield ConfigIssue(
            config_path("kind"), kind, f"does not exist on {cloud}", f"use one of: {', '.join(kinds)}"
        )


def _semantic_issues(spec: ClusterSpec, given: Any, catalog: Catalog) -> Iterable[ConfigIssue]:
    """`spec`: the platform's spec (keys of other platforms left out); `given`: everything the stack set, as
    the structure model (built at run time) read it."""
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
    foreign_network = list(_foreign_section_issues(spec, "network", given.network, spec.cloud))
    yield from foreign_network
    if not foreign_network:
        yield from spec.network_issues()
    yield from _api_access_issues(spec)
    yield from spec.system_pool_issues()
    if spec.cuda is not None:
        yield from filter(None, [cuda_version_issue(config_path("cuda"), spec.cuda)])
    for section in sorted(given.model_fields_set - set(ClusterSpec.model_fields)):
        if section not in type(spec).model_fields:
            yield ConfigIssue(
                config_path(section),
                getattr(given, section).model_dump(by_alias=True, exclude_unset=True),
                f"{section} settings only apply to kind {section}, not {spec.cloud}/{spec.kind}",
                f"remove the {section} section",
            )
    yield from spec.platform_issues()
    yield from addon_issues(spec.addon_versions)
    if spec.batch is not None:
        yield from batch_issues(spec.batch, [pool.name for pool in spec.gpu_pools])
    if spec.monitoring is not None:
        yield from monitoring_issues(spec.monitoring)
    yield from _foreign_section_issues(spec, "storage", given.storage, f"{spec.cloud}/{spec.kind}")
    yield from _storage_issues(spec)
    yield from _interconnect_issues(spec)
    yield from gpu_pool_issues(spec.gpu_pools, spec.pool_rules, catalog)


def _storage_issues(spec: ClusterSpec) -> Iterable[ConfigIssue]:
    shared = spec.storage.shared
    if shared is None or shared in spec.shared_storage:
        return
    offered = spec.shared_storage
    yield ConfigIssue(
        config_path("storage", "shared"),
        shared,
        f"not a shared file system of {spec.cloud}/{spec.kind}"
        + ("" if offered else f": {spec.no_shared_storage}"),
        "use one of: " + "; ".join(f"{value} ({service})" for value, service in offered.items())
        if offered
        else "remove it",
    )


def _interconnect_issues(spec: ClusterSpec) -> Iterable[ConfigIssue]:
    if spec.no_interconnect is None:
        return
    problem, fix = spec.no_interconnect
    for index, pool in enumerate(spec.gpu_pools):
        if pool.interconnect is not None:
            yield ConfigIssue(config_path("gpuPools", index, "interconnect"), pool.interconnect, problem, fix)


def gpu_pool_issues(
    pools: Sequence[GpuPoolSpec], rules: PoolRules, catalog: Catalog
) -> Iterable[ConfigIssue]:
    """Every rule on `gpuPools` (YAML paths under gpuPools): each pool's own, unique names, and the
    cluster-wide MIG rules."""
    seen: dict[str, int] = {}
    sound_pools: set[int] = set()
    for index, pool in enumerate(pools):
        if pool.name in seen:
            yield ConfigIssue(
                config_path("gpuPools", index, "name"),
                pool.name,
                f"duplicates gpuPools[{seen[pool.name]}].name",
                "give every pool its own name",
            )
        seen.setdefault(pool.name, index)
        pool_issues = list(_pool_issues(index, pool, rules, catalog))
        yield from pool_issues
        if not pool_issues:
            sound_pools.add(index)
    yield from cluster_mig_issues(
        mig_pools(pools, rules, catalog, sound_pools),
        lambda index, key: config_path("gpuPools", index, "sharing", key),
    )


def mig_pools(
    pools: Sequence[GpuPoolSpec], rules: PoolRules, catalog: Catalog, among: Iterable[int] | None = None
) -> list[PoolMig]:
    """The MIG pools with their layouts, as the cluster-wide MIG rules take them (all pools, or only the
    indexes `among`, whose instance types must be valid)."""
    chosen = set(range(len(pools)) if among is None else among)
    found = []
    for index, pool in enumerate(pools):
        if pool.sharing.mode != "mig" or index not in chosen:
            continue
        machine = rules.pool_machine(pool, catalog)
        assert machine is not None and machine.gpu_model is not None, "validated"
        layout = mig_layout(pool.sharing, machine.gpu_model, pool.name)
        found.append(PoolMig(index, pool.name, layout, pool.sharing.strategy))
    return found


def _platform_for_raw(raw: Mapping[str, Any]) -> Platform | None:
    key = (raw.get("cloud"), raw.get("kind"))
    return PLATFORMS.get(key) if all(isinstance(part, str) for part in key) else None  # type: ignore[arg-type]


def load_spec(raw: Any, catalog: Catalog | None = None) -> ClusterSpec:
    """Parse and validate the `gpu-k8s:cluster` value into its platform's spec; raise ConfigError listing
    every problem."""
    raw = _mapping_issues_raised(raw)
    if "batch" in raw and raw["batch"] is None:
        # `batch:` with nothing under it would read as no batch at all.
        raise ConfigError(
            [
                ConfigIssue(
                    config_path("batch"),
                    None,
                    "is empty, so no queue would be made",
                    "list the teams' namespaces under it (batch: {namespaces: [research]}), or remove it",
                )
            ]
        )
    for section in ("monitoring", "inference"):
        if section in raw and raw[section] is None:
            # `monitoring:` with nothing under it asks for it with its defaults, like `monitoring: {}`.
            raw = {**raw, section: {}}
    monitoring = raw.get("monitoring")
    if isinstance(monitoring, bool):
        # `monitoring: false` is how a stack goes without it; `true` is its defaults.
        raw = {**raw, "monitoring": {} if monitoring else None}
    elif "monitoring" in raw and not isinstance(monitoring, Mapping):
        raise ConfigError(
            [
                ConfigIssue(
                    config_path("monitoring"),
                    monitoring,
                    "is neither true/false nor a mapping of its keys",
                    "write `monitoring: false` (no quotes) to leave it out, or its keys (stacks/README.md, "
                    "`monitoring`)",
                )
            ]
        )
    platform = _platform_for_raw(raw)
    defaulted = platform.spec.with_defaults(raw) if platform else raw
    given: Any = parse_structure(defaulted, _structure_model(_registered()))
    name_issues = list(_name_issues(given.name))
    kind_issues = list(_kind_issues(given.cloud, given.kind))
    if platform is None or kind_issues:
        raise ConfigError(name_issues + kind_issues)
    spec = platform.spec.model_validate_json(
        json.dumps(_own_keys(given, platform.spec)), by_alias=True, by_name=False
    )
    raise_if_any(name_issues, _semantic_issues(spec, given, catalog or load_catalog()))
    return spec


def _mapping_issues_raised(raw: Any) -> Mapping[str, Any]:
    """The config value, if it is a mapping of clean values; else a ConfigError."""
    if raw is None:
        raise ConfigError(
            [
                ConfigIssue(
                    config_key(),
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
                    config_key(),
                    raw,
                    "must be a mapping",
                    "set it in stacks/Pulumi.<stack>.yaml; see stacks/README.md",
                )
            ]
        )
    raise_if_any(raw_value_issues(raw))
    return raw


def parse_structure(raw: Any, model: type[M]) -> M:
    """The structural pass: `model` read from the config value `raw` (a mapping), or a ConfigError naming
    every type, range and unknown-key problem under the current config key."""
    raw = _mapping_issues_raised(raw)
    try:
        # JSON mode: strict types, yet YAML lists become tuples (Pulumi hands structured config over as JSON).
        # Keys by their camelCase names only: the models also take field names, for code, not for stacks.
        return model.model_validate_json(json.dumps(raw), by_alias=True, by_name=False)
    except ValidationError as exc:
        errors = exc.errors()
        # A list whose items all failed also reports itself as too short; the item errors say more.
        inner = {tuple(e["loc"])[:depth] for e in errors for depth in range(len(e["loc"]))}
        errors = [e for e in errors if not (e["type"] == "too_short" and tuple(e["loc"]) in inner)]
        raise ConfigError(_misspelt_required_keys([_structural_issue(model, e) for e in errors])) from None


def _same_gpu_elsewhere(catalog: Catalog, cloud: Cloud, name: str) -> str | None:
    """For another cloud's type (a3-highgpu-8g on AWS): this cloud's types with the same GPU model."""
    for other in sorted(catalog.machine_types):
        machine = catalog.machine_type(other, name) if other != cloud else None
        if machine is not None and machine.gpu_model is not None:
            same = sorted(
                (mt.gpu_count, mt.name)
                for mt in catalog.machine_types[cloud].values()
                if mt.gpu_model is not None and mt.gpu_model.id == machine.gpu_model.id and mt.has_whole_gpus
            )
            gpus = f"{machine.gpu_count} x {machine.gpu_model.display_name}"
            if same:
                listed = ", ".join(f"{n} ({count} GPU{'s' if count > 1 else ''})" for count, n in same[:4])
                return f"{name} is a {other.upper()} type ({gpus}); on {cloud.upper()} the same GPU: {listed}"
            return f"{name} is a {other.upper()} type ({gpus}); {cloud.upper()} offers no type with that GPU"
    return None


def _misspelt_required_keys(issues: list[ConfigIssue]) -> list[ConfigIssue]:
    """One problem, not two, for a required key written with a typo (`maxNode` for `maxNodes`): the
    unknown key's closest match is the key reported missing beside it."""
    missing = {issue.path: issue for issue in issues if issue.problem == "is missing"}
    merged: list[ConfigIssue] = []
    for issue in issues:
        if issue.problem == "unknown key" and issue.fix.startswith("did you mean "):
            guess = issue.fix.removeprefix("did you mean ").split("?", 1)[0]
            required = f"{issue.path.rsplit('.', 1)[0]}.{guess}"
            if required in missing:
                missing.pop(required)
                merged.append(
                    ConfigIssue(
                        issue.path,
                        issue.value,
                        f"unknown key, and {guess} is missing",
                        f"rename it to {guess}",
                    )
                )
                continue
        merged.append(issue)
    return [issue for issue in merged if issue.problem != "is missing" or issue.path in missing]


def _own_keys(given: BaseModel, spec_class: type[ClusterSpec]) -> dict[str, Any]:
    """What the stack set, without the keys and sections of other platforms (refused with their own
    messages)."""
    own = given.model_dump(mode="json", by_alias=True, exclude_unset=True)
    own_sections = {field.alias or name for name, field in spec_class.model_fields.items()}
    own = {key: value for key, value in own.items() if key in own_sections}
    for section in MERGED_SECTIONS:
        if section in own:
            allowed = platform_keys(spec_class, section)
            own[section] = {key: value for key, value in own[section].items() if key in allowed}
    return own


def pool_child_name(cluster_name: str, pool_name: str) -> str:
    """The base name of every resource a GPU pool owns; stable as long as the two names are."""
    return f"{cluster_name}-gpu-{pool_name}"
