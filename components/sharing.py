"""How a GPU pool shares its GPUs: the `sharing` spec, its rules, and the text it renders. Pure, no Pulumi.

One mechanism on every platform: the GPU Operator's device plugin reads one config per pool from a
ConfigMap (selected by the node label `nvidia.com/device-plugin.config`), and its MIG manager partitions
the GPUs of nodes labelled `nvidia.com/mig.config`. Formats: k8s-device-plugin `api/config/v1`
(REFERENCE.md 1.2) and mig-parted `version: v1` configs; the operator's built-in MIG layouts are those of
its `default-mig-parted-config` (assets/state-mig-manager/0400_configmap.yaml at v26.7.0).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import field_validator

from gpu_k8s.components.catalog import GpuModel
from gpu_k8s.components.configbase import ConfigIssue, StrictModel

SharingMode = Literal["none", "timeSlicing", "mps", "mig"]
MigStrategy = Literal["single", "mixed"]
Isolation = Literal["none", "memory+compute limits", "hardware"]

WHOLE_GPU = "nvidia.com/gpu"
# With renameByDefault the device plugin advertises replicas under `<resource>.shared`.
SHARED_GPU = "nvidia.com/gpu.shared"
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
# The device-plugin config a GPU node gets when it carries no pool label: whole GPUs, nothing shared.
DEFAULT_DEVICE_PLUGIN_CONFIG = "default"
MIG_DISABLED_LAYOUT = "all-disabled"
BALANCED_LAYOUT = "all-balanced"
MIN_REPLICAS = 2
# The device plugin enforces a replica limit for MPS since v0.15.0 (its changelog); 48 is the MPS client
# limit per device as recalled from NVIDIA's MPS guide, UNCONFIRMED here. Time-slicing has no upstream
# limit; the same bound catches typos such as 400.
MAX_REPLICAS = 48
# Plain MIG profiles ("3g.40gb"). Variants (+me, +gfx, -me) are refused: the Kubernetes resource name the
# device plugin gives them is not confirmed here.
MIG_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb$")

# The operator's `all-balanced` layout per GPU model (0400_configmap.yaml at v26.7.0, one entry per
# device-filter); a contract test compares this table with that file.
BALANCED_LAYOUTS: Mapping[str, Mapping[str, int]] = {
    "nvidia-a100-40gb": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
    "nvidia-a100-80gb": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
    "nvidia-h100-80gb": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
    "nvidia-h100-94gb": {"1g.12gb": 2, "2g.24gb": 1, "3g.47gb": 1},
    "nvidia-h200-141gb": {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1},
    "nvidia-a30": {"1g.6gb": 2, "2g.12gb": 1},
    "nvidia-b200": {"1g.23gb": 2, "2g.45gb": 1, "3g.90gb": 1},
    "nvidia-gb200": {"1g.23gb": 2, "2g.47gb": 1, "3g.93gb": 1},
    "nvidia-b300": {"1g.34gb": 2, "2g.67gb": 1, "3g.135gb": 1},
    "nvidia-rtx-pro-6000-blackwell-server": {"1g.24gb": 2, "2g.48gb": 1},
}


class SharingSpec(StrictModel):
    """`gpuPools[].sharing`: how the GPUs of one pool are handed to pods."""

    mode: SharingMode = "none"
    # timeSlicing / mps: how many pods share one GPU.
    replicas: int | None = None
    rename_by_default: bool | None = None
    fail_requests_greater_than_one: bool | None = None
    # mig: one profile on every GPU ("1g.10gb"), or a layout: a built-in name ("all-balanced") or
    # a custom profile -> count per GPU.
    profile: str | None = None
    layout: str | dict[str, int] | None = None
    strategy: MigStrategy | None = None

    @field_validator("layout", mode="before")
    @classmethod
    def _layout_shape(cls, value: Any) -> Any:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in value.items()
        ):
            return value
        raise ValueError(
            'a built-in layout name (e.g. all-balanced) or a mapping like {"1g.10gb": 2, "3g.40gb": 1}'
        )


@dataclass(frozen=True)
class MigProfileShape:
    """A plain MIG profile read from its name: compute slices and memory in GB."""

    compute: int
    memory_gb: int

    @classmethod
    def of(cls, profile: str) -> MigProfileShape:
        match = MIG_PROFILE.fullmatch(profile)
        assert match is not None, "validated"
        return cls(int(match.group(1)), int(match.group(2)))


@dataclass(frozen=True)
class MigGeometry:
    """How one GPU model divides into MIG slices, derived from its profile table.

    The whole-GPU profile (most compute slices) sets the compute and memory budget; the smallest one-slice
    profile is one memory slice. On every MIG GPU in the catalog this gives 7/8, 4/4 or 2/2 slices, the
    numbers NVIDIA's MIG guide uses.
    """

    profiles: Mapping[str, int]
    compute_slices: int
    memory_slices: int
    memory_slice_gb: float

    @classmethod
    def of(cls, model: GpuModel) -> MigGeometry:
        plain = {p.name: p.max_instances for p in model.mig_profiles if MIG_PROFILE.fullmatch(p.name)}
        shapes = {name: MigProfileShape.of(name) for name in plain}
        whole = max(shapes.values(), key=lambda s: (s.compute, s.memory_gb))
        smallest = min(s.memory_gb for s in shapes.values() if s.compute == 1)
        return cls(
            profiles=plain,
            compute_slices=whole.compute,
            memory_slices=round(whole.memory_gb / smallest),
            memory_slice_gb=smallest,
        )

    def memory_slices_of(self, profile: str) -> int:
        return round(MigProfileShape.of(profile).memory_gb / self.memory_slice_gb)

    def misfit(self, devices: Mapping[str, int]) -> str | None:
        """Why a per-GPU layout cannot be built, or None when it fits the slice budget.

        The budget is necessary, not sufficient: NVIDIA's placement rules can still refuse a layout that
        fits it, and then the MIG manager labels the node `nvidia.com/mig.config.state=failed`.
        """
        for profile, count in devices.items():
            if count > self.profiles[profile]:
                return f"{profile} fits at most {self.profiles[profile]} times on one GPU"
        compute = sum(MigProfileShape.of(p).compute * n for p, n in devices.items())
        if compute > self.compute_slices:
            return f"uses {compute} compute slices; the GPU has {self.compute_slices}"
        memory = sum(self.memory_slices_of(p) * n for p, n in devices.items())
        if memory > self.memory_slices:
            slice_gb = f"{self.memory_slice_gb:g} GB"
            return f"uses {memory} memory slices of {slice_gb}; the GPU has {self.memory_slices}"
        return None


# MIG GPUs the operator's static default config has no entries for; a `profile` on them gets a custom layout
# that this toolkit writes itself.
NOT_IN_OPERATOR_CONFIG = frozenset({"nvidia-rtx-pro-4500-blackwell"})


def builtin_layouts(model: GpuModel) -> dict[str, dict[str, int]]:
    """The operator's built-in layouts for this GPU: `all-<profile>` per plain profile, and `all-balanced`."""
    if model.id in NOT_IN_OPERATOR_CONFIG:
        return {}
    geometry = MigGeometry.of(model)
    layouts = {f"all-{profile}": {profile: count} for profile, count in geometry.profiles.items()}
    if model.id in BALANCED_LAYOUTS:
        layouts[BALANCED_LAYOUT] = dict(BALANCED_LAYOUTS[model.id])
    return layouts


@dataclass(frozen=True)
class MigLayout:
    """The MIG partition of every GPU of a pool's nodes."""

    # Value of the `nvidia.com/mig.config` node label and key in the mig-parted config.
    name: str
    devices: Mapping[str, int]
    builtin: bool

    @property
    def single_profile(self) -> bool:
        return len(self.devices) == 1


def custom_layout_name(pool_name: str) -> str:
    return f"custom-{pool_name}"


def mig_layout(spec: SharingSpec, model: GpuModel, pool_name: str) -> MigLayout:
    """The layout a valid `mig` sharing spec asks for."""
    builtins = builtin_layouts(model)
    if spec.profile is not None and f"all-{spec.profile}" in builtins:
        name = f"all-{spec.profile}"
        return MigLayout(name, builtins[name], builtin=True)
    if spec.profile is not None:
        devices = {spec.profile: MigGeometry.of(model).profiles[spec.profile]}
        return MigLayout(custom_layout_name(pool_name), devices, builtin=False)
    if isinstance(spec.layout, str):
        return MigLayout(spec.layout, builtins[spec.layout], builtin=True)
    assert spec.layout is not None, "validated"
    return MigLayout(custom_layout_name(pool_name), dict(spec.layout), builtin=False)


_MODE_KEYS = {
    "timeSlicing": {"replicas", "renameByDefault", "failRequestsGreaterThanOne"},
    "mps": {"replicas", "renameByDefault", "failRequestsGreaterThanOne"},
    "mig": {"profile", "layout", "strategy"},
    "none": set(),
}
_MPS_NOT_ON_MIG = "MPS does not run on MIG devices (k8s-device-plugin README); a pool shares one way"
_WHY_NOT = {
    ("mig", "replicas"): "replicas belong to time-slicing and MPS, not to MIG: " + _MPS_NOT_ON_MIG,
    ("mps", "profile"): _MPS_NOT_ON_MIG,
    ("mps", "layout"): _MPS_NOT_ON_MIG,
}
PathOf = Callable[[str], str]


def _mode_key_issues(path: PathOf, spec: SharingSpec) -> Iterable[ConfigIssue]:
    allowed = _MODE_KEYS[spec.mode]
    for field_name, field in SharingSpec.model_fields.items():
        key = field.alias or field_name
        if key == "mode" or getattr(spec, field_name) is None or key in allowed:
            continue
        owners = " / ".join(mode for mode, keys in _MODE_KEYS.items() if key in keys)
        reason = _WHY_NOT.get((spec.mode, key), f"applies to mode {owners} only, not to {spec.mode}")
        yield ConfigIssue(path(key), getattr(spec, field_name), reason, f"remove {key}")


def allowed_modes(model: GpuModel) -> list[str]:
    return ["none", "timeSlicing", "mps", *(["mig"] if model.mig_capable else [])]


def sharing_issues(path: PathOf, spec: SharingSpec, model: GpuModel) -> Iterable[ConfigIssue]:
    """Every problem of one pool's sharing spec against its GPU model; `path(key)` names the YAML path."""
    yield from _mode_key_issues(path, spec)
    if spec.mode in ("timeSlicing", "mps"):
        if spec.replicas is None:
            yield ConfigIssue(path("replicas"), None, f"{spec.mode} needs replicas", "set replicas, e.g. 4")
        elif not MIN_REPLICAS <= spec.replicas <= MAX_REPLICAS:
            why = (
                "fewer than 2 shares nothing"
                if spec.replicas < MIN_REPLICAS
                else "more slots than pods can use"
            )
            yield ConfigIssue(
                path("replicas"),
                spec.replicas,
                f"must be {MIN_REPLICAS}-{MAX_REPLICAS} ({why})",
                "pick how many pods share one GPU, e.g. 4",
            )
        if spec.mode == "mps" and spec.fail_requests_greater_than_one is False:
            yield ConfigIssue(
                path("failRequestsGreaterThanOne"),
                False,
                "the device plugin always refuses MPS requests for more than one replica (since v0.15.0)",
                "remove failRequestsGreaterThanOne",
            )
    if spec.mode != "mig":
        return
    if not model.mig_capable:
        yield ConfigIssue(
            path("mode"),
            "mig",
            f"{model.display_name} has no MIG support",
            f"use one of the modes this GPU allows: {', '.join(allowed_modes(model))}; MIG needs A100, A30, "
            "H100, H200, B200 or newer data-center GPUs",
        )
        return
    yield from _mig_issues(path, spec, model)


def _mig_issues(path: PathOf, spec: SharingSpec, model: GpuModel) -> Iterable[ConfigIssue]:
    geometry = MigGeometry.of(model)
    profiles = ", ".join(geometry.profiles)
    if (spec.profile is None) == (spec.layout is None):
        yield ConfigIssue(
            path("profile"),
            {"profile": spec.profile, "layout": spec.layout},
            "mig needs exactly one of profile or layout",
            f"set profile (one of {profiles}) or layout (a built-in name or a profile -> count mapping)",
        )
        return
    if spec.profile is not None and spec.profile not in geometry.profiles:
        yield ConfigIssue(
            path("profile"),
            spec.profile,
            f"not a MIG profile of {model.display_name}",
            f"use one of: {profiles}",
        )
        return
    if isinstance(spec.layout, str) and spec.layout not in builtin_layouts(model):
        yield ConfigIssue(
            path("layout"),
            spec.layout,
            f"not a built-in MIG layout for {model.display_name}",
            f"use one of: {', '.join(builtin_layouts(model)) or '(none for this GPU)'}, or a mapping "
            "profile -> count per GPU",
        )
        return
    if isinstance(spec.layout, dict):
        unknown = [p for p in spec.layout if p not in geometry.profiles]
        if unknown or not spec.layout:
            yield ConfigIssue(
                path("layout"),
                spec.layout,
                f"names no MIG profile of {model.display_name}"
                if not unknown
                else f"unknown profiles {', '.join(unknown)}",
                f"use profiles of this GPU: {profiles}",
            )
            return
        if any(count < 1 for count in spec.layout.values()):
            yield ConfigIssue(
                path("layout"), spec.layout, "counts must be at least 1", "remove profiles you do not want"
            )
            return
        misfit = geometry.misfit(spec.layout)
        if misfit:
            yield ConfigIssue(
                path("layout"),
                spec.layout,
                f"does not fit one {model.display_name}: {misfit}",
                f"reduce the counts; one GPU has {geometry.compute_slices} compute and "
                f"{geometry.memory_slices} memory slices (the operator's {BALANCED_LAYOUT} for it: "
                f"{builtin_layouts(model).get(BALANCED_LAYOUT)})",
            )
            return
    layout = mig_layout(spec, model, "pool")
    if spec.strategy == "single" and not layout.single_profile:
        yield ConfigIssue(
            path("strategy"),
            "single",
            f"the single strategy needs one profile on every GPU of the node; layout {layout.name} has "
            f"{', '.join(layout.devices)} (the device plugin fails on more than one MIG device type)",
            "use strategy: mixed, or a single profile",
        )


@dataclass(frozen=True)
class PoolMig:
    """A pool's MIG choice as the cluster-level rules need it."""

    index: int
    pool_name: str
    layout: MigLayout
    strategy: MigStrategy | None


def cluster_mig_strategy(pools: Sequence[PoolMig]) -> MigStrategy | None:
    """The operator's `mig.strategy` (one value for the cluster): mixed when any MIG pool needs it."""
    if not pools:
        return None
    return "mixed" if any(_needs_mixed(p) for p in pools) else "single"


def _needs_mixed(pool: PoolMig) -> bool:
    return pool.strategy == "mixed" or (pool.strategy is None and not pool.layout.single_profile)


def cluster_mig_issues(pools: Sequence[PoolMig], path: Callable[[int, str], str]) -> Iterable[ConfigIssue]:
    """Rules across pools: one MIG strategy per cluster, one meaning per layout name in a custom config."""
    strategy = cluster_mig_strategy(pools)
    mixed_by = [p.pool_name for p in pools if _needs_mixed(p)]
    for pool in pools:
        if pool.strategy == "single" and strategy == "mixed":
            yield ConfigIssue(
                path(pool.index, "strategy"),
                "single",
                f"the GPU Operator has one MIG strategy per cluster, and pools {mixed_by} need mixed",
                "use strategy: mixed here too (the pool then advertises nvidia.com/mig-<profile> resources)",
            )
    if all(p.layout.builtin for p in pools):
        return
    seen: dict[str, PoolMig] = {}
    for pool in pools:
        first = seen.setdefault(pool.layout.name, pool)
        if first.layout.devices != pool.layout.devices:
            yield ConfigIssue(
                path(pool.index, "layout"),
                pool.layout.name,
                f"means {json.dumps(dict(pool.layout.devices))} here but "
                f'{json.dumps(dict(first.layout.devices))} in pool "{first.pool_name}"; with a custom '
                "layout in the cluster the toolkit writes one mig-parted config, which cannot tell the two "
                "GPU models apart",
                "give one of the pools a custom layout (a profile -> count mapping)",
            )


@dataclass(frozen=True)
class Sharing:
    """A pool's sharing, resolved: what the device plugin and the MIG manager are told to do."""

    mode: SharingMode = "none"
    replicas: int = 1
    rename_by_default: bool | None = None
    fail_requests_greater_than_one: bool | None = None
    mig: MigLayout | None = None
    # The cluster's MIG strategy, for MIG pools.
    mig_strategy: MigStrategy | None = None


def resolve_sharing(
    spec: SharingSpec, model: GpuModel, pool_name: str, mig_strategy: MigStrategy | None
) -> Sharing:
    if spec.mode == "mig":
        return Sharing(mode="mig", mig=mig_layout(spec, model, pool_name), mig_strategy=mig_strategy)
    if spec.mode in ("timeSlicing", "mps"):
        assert spec.replicas is not None, "validated"
        return Sharing(
            mode=spec.mode,
            replicas=spec.replicas,
            rename_by_default=spec.rename_by_default,
            fail_requests_greater_than_one=spec.fail_requests_greater_than_one,
        )
    return Sharing()


@dataclass(frozen=True)
class SlotKind:
    """One kind of schedulable GPU slot a node offers."""

    resource: str
    per_node: int
    memory_gib: float


@dataclass(frozen=True)
class NodeOffer:
    """What one node of a pool offers to the scheduler once its GPUs are set up."""

    slots: tuple[SlotKind, ...]
    isolation: Isolation

    @property
    def slots_per_node(self) -> int:
        return sum(kind.per_node for kind in self.slots)

    @property
    def resources(self) -> dict[str, int]:
        return {kind.resource: kind.per_node for kind in self.slots}

    @property
    def advertises_whole_gpu_resource(self) -> bool:
        return WHOLE_GPU in self.resources


def node_offer(sharing: Sharing, model: GpuModel, gpus: int) -> NodeOffer:
    """Slots per node, memory per slot and isolation for `gpus` GPUs of `model` shared as `sharing` says.

    Time-slicing does not limit memory: its figure is the fair share. MPS enforces it (the device plugin
    pins each client to 1/replicas of memory and compute); MIG slices are separate hardware.
    """
    assert model.memory_gib is not None, "every catalog GPU model has a memory size"
    memory = model.memory_gib
    if sharing.mode in ("timeSlicing", "mps"):
        resource = SHARED_GPU if sharing.rename_by_default else WHOLE_GPU
        isolation: Isolation = "none" if sharing.mode == "timeSlicing" else "memory+compute limits"
        slot = SlotKind(resource, gpus * sharing.replicas, round(memory / sharing.replicas, 2))
        return NodeOffer((slot,), isolation)
    if sharing.mode == "mig":
        assert sharing.mig is not None
        geometry = MigGeometry.of(model)
        per_slice = memory / geometry.memory_slices
        kinds = [
            SlotKind(
                WHOLE_GPU if sharing.mig_strategy == "single" else f"nvidia.com/mig-{profile}",
                gpus * count,
                round(per_slice * geometry.memory_slices_of(profile), 2),
            )
            for profile, count in sharing.mig.devices.items()
        ]
        return NodeOffer(tuple(kinds), "hardware")
    return NodeOffer((SlotKind(WHOLE_GPU, gpus, memory),), "hardware")


def device_plugin_config(sharing: Sharing) -> dict[str, Any]:
    """The k8s-device-plugin config (`version: v1`) for a pool's nodes.

    No `flags.migStrategy`: the operator passes the cluster's strategy to the plugin as MIG_STRATEGY, which
    takes precedence over the file.
    """
    config: dict[str, Any] = {"version": "v1"}
    if sharing.mode in ("timeSlicing", "mps"):
        replicated: dict[str, Any] = {}
        if sharing.rename_by_default is not None:
            replicated["renameByDefault"] = sharing.rename_by_default
        if sharing.fail_requests_greater_than_one is not None:
            replicated["failRequestsGreaterThanOne"] = sharing.fail_requests_greater_than_one
        replicated["resources"] = [{"name": WHOLE_GPU, "replicas": sharing.replicas}]
        config["sharing"] = {sharing.mode: replicated}
    return config


def mig_parted_config(layouts: Iterable[MigLayout]) -> dict[str, Any]:
    """A mig-parted config (`version: v1`) with `all-disabled` and every given layout, on all GPUs."""
    configs: dict[str, Any] = {MIG_DISABLED_LAYOUT: [{"devices": "all", "mig-enabled": False}]}
    for layout in layouts:
        configs[layout.name] = [{"devices": "all", "mig-enabled": True, "mig-devices": dict(layout.devices)}]
    return {"version": "v1", "mig-configs": configs}
