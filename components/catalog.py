"""GPU hardware facts: which instance or machine type carries which GPUs.

The data file `data/gpu-catalog.yaml` is the project's own copy of the curated catalog; every row names
its source (ids explained in `data/gpu-catalog-sources.md`). Validation and the autoscaler's
scale-from-zero templates read it, so the GPU model, count and memory of a pool always come from here,
never from the user.
"""

from __future__ import annotations

import difflib
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


@dataclass(frozen=True)
class Catalog:
    """All machine types by cloud and all GPU models, loaded once from the data file."""

    machine_types: dict[Cloud, dict[str, MachineType]]
    gpu_models: dict[str, GpuModel]

    def machine_type(self, cloud: Cloud, name: str) -> MachineType | None:
        return self.machine_types[cloud].get(name)

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
    )


@cache
def load_catalog() -> Catalog:
    """The project's catalog, parsed once per process."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with CATALOG_FILE.open() as handle:
        return parse_catalog(yaml.load(handle, Loader=loader))
