"""The `GpuCluster` handle every provider returns, and the GPU pool facts derived from the spec.

Whatever differs by platform reaches the cloud-agnostic components as data on this handle
(`PlatformTraits`), never as an `if cloud == ...` inside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import pulumi
import pulumi_kubernetes as k8s

from components.catalog import Catalog, MachineType
from components.spec import ClusterSpec, GpuPoolSpec, TaintSpec

# Every GPU node carries this taint so only pods that ask for GPUs (and tolerate it) land there.
GPU_TAINT = TaintSpec(key="nvidia.com/gpu", value="true", effect="NoSchedule")
POOL_LABEL = "gpu-k8s.io/pool"


@dataclass(frozen=True)
class PlatformTraits:
    """Facts about how a platform runs GPUs, read by the operator and autoscaler components."""

    # Who installs the NVIDIA kernel driver, and which branch it is (e.g. "580").
    driver_owner: Literal["node-image", "cloud-installer", "gpu-operator"]
    driver_branch: str
    # The NVIDIA Container Toolkit is already installed and wired into containerd on the image.
    toolkit_preinstalled: bool
    # Label the cluster-autoscaler reads to treat a GPU node as not ready until its GPUs are advertised.
    accelerator_label: str
    # containerd socket when it is not the upstream default (k3s); None keeps the operator's default.
    containerd_socket: str | None = None
    # Host paths of a driver/toolkit installed outside /run/nvidia (GKE's installer); None = defaults.
    driver_install_dir: str | None = None
    toolkit_install_dir: str | None = None

    @property
    def driver_preinstalled(self) -> bool:
        return self.driver_owner != "gpu-operator"


@dataclass(frozen=True)
class GpuPool:
    """A GPU pool resolved against the catalog: what its nodes are and how they present themselves."""

    spec: GpuPoolSpec
    machine: MachineType
    node_labels: dict[str, str]
    taints: tuple[TaintSpec, ...]

    @property
    def gpus_per_node(self) -> int:
        return self.machine.gpu_count

    @property
    def gpu_model_id(self) -> str:
        assert self.machine.gpu_model is not None, "validated by load_spec"
        return self.machine.gpu_model.id


def resolve_pools(spec: ClusterSpec, catalog: Catalog, accelerator_label: str) -> tuple[GpuPool, ...]:
    """Attach catalog facts, node labels and taints to every GPU pool of a validated spec."""
    pools = []
    for pool in spec.gpu_pools:
        machine = catalog.machine_type(spec.cloud, pool.instance_type)
        assert machine is not None and machine.gpu_model is not None, "validated by load_spec"
        labels = {**pool.labels, POOL_LABEL: pool.name, accelerator_label: machine.gpu_model.id}
        pools.append(
            GpuPool(spec=pool, machine=machine, node_labels=labels, taints=(GPU_TAINT, *pool.taints))
        )
    return tuple(pools)


@dataclass(frozen=True)
class GpuCluster:
    """What a provider hands to the cluster-level components and to the stack outputs."""

    name: str
    kubernetes_version: str
    kubeconfig: pulumi.Output[str]
    k8s_provider: k8s.Provider
    pools: tuple[GpuPool, ...]
    traits: PlatformTraits
    # Resources that must exist before workloads are installed (system nodes, CNI, DNS).
    system_ready: Sequence[pulumi.Resource]
