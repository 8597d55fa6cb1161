"""GPU hardware facts: which instance or machine type carries which GPUs.

The data file `data/gpu-catalog.yaml` is the project's own copy of the curated catalog; every row names
its source (ids explained in `data/gpu-catalog-sources.md`). Validation and the autoscaler's
scale-from-zero templates read it, so the GPU model, count and memory of a pool always come from here,
never from the user.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import yaml

Cloud = Literal["aws", "gcp"]

CATALOG_FILE = Path(__file__).parent / "data" / "gpu-catalog.yaml"


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile of a GPU model and how many instances of it fit on one GPU."""

    name: str
    max_instances: int


@dataclass(frozen=True)
class GpuModel:
    """A GPU part as NVIDIA documents it."""

    id: str
    display_name: str
    # None where the catalog leaves the nominal size UNCONFIRMED; then the size NVML/EC2 reports is used.
    memory_gib: float | None
    architecture: str | None
    compute_capability: str | None
    mig_profiles: tuple[MigProfile, ...]
    min_mig_driver_version: str | None

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)


@dataclass(frozen=True)
class MachineType:
    """An AWS instance type or a GCP machine type with its GPUs."""

    cloud: Cloud
    name: str
    gpu_model: GpuModel | None
    gpu_count: int
    # None where the catalog marks the value UNCONFIRMED (see its unconfirmed_fields).
    vcpu: int | None
    memory_gib: float | None
    arch: Literal["x86_64", "arm64"]
    efa_max_interfaces: int
    source: str
    # Fractional GPUs (AWS g6f/gr6f): the cloud reports 0 whole GPUs and this share of one.
    gpu_fraction: float | None = None
    # GCP accelerator type name; also the value of the `cloud.google.com/gke-accelerator` label.
    accelerator: str | None = None

    @property
    def has_whole_gpus(self) -> bool:
        return self.gpu_model is not None and self.gpu_count > 0

    @property
    def kubernetes_arch(self) -> str:
        """The `kubernetes.io/arch` label value for this type."""
        return {"x86_64": "amd64", "arm64": "arm64"}[self.arch]


# GCP N1 machine types (Compute Engine "N1 machine series" page, recalled; the page was not retrieved here,
# so these shapes are UNCONFIRMED): memory per vCPU and the vCPU counts each family comes in. They decide how
# many vCPUs/GB a host may have for a number of attached GPUs.
N1_MACHINE = re.compile(r"^n1-(standard|highmem|highcpu)-(\d+)$")
N1_GB_PER_VCPU = {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9}
N1_VCPUS = {
    "standard": (1, 2, 4, 8, 16, 32, 64, 96),
    "highmem": (2, 4, 8, 16, 32, 64, 96),
    "highcpu": (2, 4, 8, 16, 32, 64, 96),
}


@dataclass(frozen=True)
class AttachableAccelerator:
    """A GCP GPU attached to an N1 VM: how many per VM, and the largest host each count allows."""

    type: str
    gpu_model: GpuModel
    allowed_counts: tuple[int, ...]
    max_vcpu_by_count: dict[int, int]
    max_memory_gb_by_count: dict[int, float]
    source: str


@dataclass(frozen=True)
class Catalog:
    """All machine types by cloud and all GPU models, loaded once from the data file."""

    machine_types: dict[Cloud, dict[str, MachineType]]
    gpu_models: dict[str, GpuModel]
    # GCP accelerator types that attach to N1 VMs (T4, V100, P4, P100); other GCP GPUs come built into
    # their machine type (A2, A3, A4, G2, G4).
    n1_accelerators: dict[str, AttachableAccelerator]

    def machine_type(self, cloud: Cloud, name: str) -> MachineType | None:
        return self.machine_types[cloud].get(name)

    def n1_with_gpus(self, name: str, accelerator: str, count: int) -> MachineType | None:
        """An N1 VM with `count` attached `accelerator` GPUs, or None when that is not a valid combination
        (see `n1_attachment_problem`)."""
        if self.n1_attachment_problem(name, accelerator, count) is not None:
            return None
        family, vcpus = _n1_shape(name)
        attached = self.n1_accelerators[accelerator]
        return MachineType(
            cloud="gcp",
            name=name,
            gpu_model=attached.gpu_model,
            gpu_count=count,
            vcpu=vcpus,
            memory_gib=round(vcpus * N1_GB_PER_VCPU[family], 2),
            arch="x86_64",
            efa_max_interfaces=0,
            source=attached.source,
            accelerator=accelerator,
        )

    def n1_attachment_problem(self, name: str, accelerator: str, count: int) -> str | None:
        """Why `count` x `accelerator` cannot attach to N1 machine type `name`, or None when it can."""
        shape = N1_MACHINE.match(name)
        if shape is None or int(shape.group(2)) not in N1_VCPUS[shape.group(1)]:
            return f"{name} is not an N1 machine type (n1-standard|highmem|highcpu-<vCPUs>)"
        attached = self.n1_accelerators.get(accelerator)
        if attached is None:
            attachable = ", ".join(sorted(self.n1_accelerators))
            return (
                f"{accelerator} does not attach to N1 VMs (attachable: {attachable}); "
                "other GPUs come built into their machine type"
            )
        if count not in attached.allowed_counts:
            counts = " / ".join(map(str, attached.allowed_counts))
            return f"{accelerator} attaches {counts} at a time, not {count}"
        family, vcpus = _n1_shape(name)
        max_vcpu, max_memory = attached.max_vcpu_by_count[count], attached.max_memory_gb_by_count[count]
        if vcpus > max_vcpu:
            return f"{count} x {accelerator} allows at most {max_vcpu} vCPUs; {name} has {vcpus}"
        memory = vcpus * N1_GB_PER_VCPU[family]
        if memory > max_memory:
            return f"{count} x {accelerator} allows at most {max_memory:g} GB; {name} has {memory:g} GB"
        return None

    def machine_types_with(self, cloud: Cloud, accelerator: str) -> list[str]:
        """The machine types whose built-in GPUs are `accelerator`, sorted."""
        return sorted(n for n, mt in self.machine_types[cloud].items() if mt.accelerator == accelerator)

    def gpu_types(self, cloud: Cloud) -> list[str]:
        """Names of the types that carry at least one whole GPU, sorted."""
        return sorted(name for name, mt in self.machine_types[cloud].items() if mt.has_whole_gpus)

    def nearest_gpu_types(self, cloud: Cloud, name: str, limit: int = 3) -> list[str]:
        """The GPU types whose names look most like `name`, for "did you mean" hints.

        Falls back to the smallest type of each family when nothing looks alike, so a hint is never empty.
        """
        candidates = self.gpu_types(cloud)
        close = difflib.get_close_matches(name, candidates, n=limit, cutoff=0.5)
        if close:
            return close
        family = name.split(".")[0].split("-")[0]
        same_family = [c for c in candidates if c.startswith(family)]
        return (same_family or candidates)[:limit]


def _n1_shape(name: str) -> tuple[str, int]:
    shape = N1_MACHINE.match(name)
    assert shape is not None
    return shape.group(1), int(shape.group(2))


def _optional_float(value: float | int | None, scale: float = 1.0) -> float | None:
    return None if value is None else round(float(value) * scale, 2)


def _gpu_model(model_id: str, row: dict) -> GpuModel:
    return GpuModel(
        id=model_id,
        display_name=row["display_name"],
        memory_gib=_optional_float(row.get("memory_gib"))
        or _optional_float(row.get("memory_mib_reported"), scale=1 / 1024),
        architecture=row.get("architecture"),
        compute_capability=row.get("compute_capability"),
        mig_profiles=tuple(
            MigProfile(name=p["profile"], max_instances=int(p["max_instances"]))
            for p in row.get("mig_profiles") or []
        ),
        min_mig_driver_version=row.get("min_driver_version"),
    )


def _machine_type(cloud: Cloud, name: str, row: dict, models: dict[str, GpuModel]) -> MachineType:
    model_id = row.get("gpu_model")
    return MachineType(
        cloud=cloud,
        name=name,
        gpu_model=models[model_id] if model_id else None,
        gpu_count=int(row.get("gpu_count") or 0),
        vcpu=int(row["vcpu"]) if row.get("vcpu") is not None else None,
        memory_gib=_optional_float(row.get("memory_gib")),
        arch=row["arch"],
        efa_max_interfaces=int(row.get("efa_max_interfaces") or 0),
        source=row["source"],
        gpu_fraction=row.get("gpu_fraction"),
        accelerator=row.get("accelerator"),
    )


def parse_catalog(document: dict) -> Catalog:
    """Build a Catalog from the parsed data file; raises KeyError on a row that names an unknown model."""
    models = {mid: _gpu_model(mid, row) for mid, row in document["gpu_models"].items()}
    return Catalog(
        machine_types={
            "aws": {n: _machine_type("aws", n, r, models) for n, r in document["aws_instance_types"].items()},
            "gcp": {n: _machine_type("gcp", n, r, models) for n, r in document["gcp_machine_types"].items()},
        },
        gpu_models=models,
        n1_accelerators={
            type_: AttachableAccelerator(
                type=type_,
                gpu_model=models[row["gpu_model"]],
                allowed_counts=tuple(row["allowed_counts"]),
                max_vcpu_by_count={int(k): int(v) for k, v in row["max_vcpu_by_count"].items()},
                max_memory_gb_by_count={int(k): float(v) for k, v in row["max_memory_gb_by_count"].items()},
                source=row["source"],
            )
            for type_, row in document["gcp_n1_attachable_accelerators"].items()
        },
    )


@cache
def load_catalog() -> Catalog:
    """The project's catalog, parsed once per process."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with CATALOG_FILE.open() as handle:
        return parse_catalog(yaml.load(handle, Loader=loader))
