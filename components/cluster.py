"""The `GpuCluster` handle every provider returns, and the GPU pool facts derived from the spec.

Whatever differs by platform reaches the cloud-agnostic components as data on this handle
(`PlatformTraits`), never as an `if cloud == ...` inside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components.catalog import Catalog, GpuModel, MachineType
from components.compat import DriverFacts, PoolDriverCheck, driver_issues
from components.configbase import ConfigIssue
from components.sharing import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    MIG_CONFIG_LABEL,
    NodeOffer,
    Sharing,
    cluster_mig_strategy,
    node_offer,
    resolve_sharing,
)
from components.spec import ClusterSpec, GpuPoolSpec, TaintSpec, mig_pools, pool_machine

# Every GPU node carries this taint so only pods that ask for GPUs (and tolerate it) land there.
GPU_TAINT = TaintSpec(key="nvidia.com/gpu", value="true", effect="NoSchedule")
POOL_LABEL = "gpu-k8s.io/pool"


@dataclass(frozen=True)
class PlatformTraits:
    """Facts about how a platform runs GPUs, read by the operator and autoscaler components."""

    # Who installs the NVIDIA kernel driver on GPU nodes, and which version (or branch) it is.
    driver: DriverFacts
    # The NVIDIA Container Toolkit is already installed and wired into containerd on the image.
    toolkit_preinstalled: bool
    # Label the cluster-autoscaler reads to treat a GPU node as not ready until its GPUs are advertised;
    # None where the platform sets it on GPU nodes itself (GKE: cloud.google.com/gke-accelerator).
    accelerator_label: str | None
    # containerd socket when it is not the upstream default (k3s); None keeps the operator's default.
    containerd_socket: str | None = None
    # Host paths of a driver/toolkit installed outside /run/nvidia (GKE's installer); None = defaults.
    driver_install_dir: str | None = None
    toolkit_install_dir: str | None = None
    # Where the container toolkit reads containerd's current config from; "file" works around GKE >= 1.33,
    # where the default (asking containerd) yields a config the toolkit then writes back wrong
    # (NVIDIA google-gke.rst known issue). None keeps the toolkit's default.
    toolkit_runtime_config_source: str | None = None
    # The platform admits system-node-critical/system-cluster-critical pods outside kube-system only under a
    # ResourceQuota for those priority classes (GKE), which the operator's namespace then needs.
    needs_priority_quota: bool = False

    @property
    def driver_preinstalled(self) -> bool:
        return self.driver.owner != "gpu-operator"


@dataclass(frozen=True)
class GpuPool:
    """A GPU pool resolved against the catalog: what its nodes are and how they present themselves."""

    spec: GpuPoolSpec
    machine: MachineType
    sharing: Sharing
    # What one node offers the scheduler once its GPUs are set up (and what scale-from-zero assumes).
    offer: NodeOffer
    node_labels: dict[str, str]
    taints: tuple[TaintSpec, ...]

    @property
    def gpus_per_node(self) -> int:
        return self.machine.gpu_count

    @property
    def gpu_model_id(self) -> str:
        return self.gpu_model.id

    @property
    def gpu_model(self) -> GpuModel:
        assert self.machine.gpu_model is not None, "validated by load_spec"
        return self.machine.gpu_model


def _gpu_model(spec: ClusterSpec, pool: GpuPoolSpec, catalog: Catalog) -> tuple[MachineType, GpuModel]:
    machine = pool_machine(spec.cloud, pool, catalog)
    assert machine is not None and machine.gpu_model is not None, "validated by load_spec"
    return machine, machine.gpu_model


def resolve_pools(spec: ClusterSpec, catalog: Catalog, accelerator_label: str | None) -> tuple[GpuPool, ...]:
    """Attach catalog facts, sharing, node labels and taints to every GPU pool of a validated spec."""
    mig_strategy = cluster_mig_strategy(mig_pools(spec, catalog))
    pools = []
    for pool in spec.gpu_pools:
        machine, model = _gpu_model(spec, pool, catalog)
        sharing = resolve_sharing(pool.sharing, model, pool.name, mig_strategy)
        offer = node_offer(sharing, model, machine.gpu_count)
        labels = {**pool.labels, POOL_LABEL: pool.name, DEVICE_PLUGIN_CONFIG_LABEL: pool.name}
        if sharing.mig is not None:
            # Set at creation so a node scaled up from zero is partitioned before it takes pods. A report
            # against the operator (NVIDIA/gpu-operator#2670, closed) saw the device plugin fail on such
            # nodes until the label was toggled; whether v26.7.0 fixes it is UNCONFIRMED here.
            labels[MIG_CONFIG_LABEL] = sharing.mig.name
        # The cluster-autoscaler treats a node with this label as unready until it advertises
        # nvidia.com/gpu (the name is hard-coded: kubernetes/autoscaler#8095). Pools that advertise MIG or
        # renamed shared resources instead would stay "unready" forever and stall scale-ups, so they go
        # without; the cost is that a fresh node looks ready a few minutes before its GPUs are.
        if accelerator_label is not None and offer.advertises_whole_gpu_resource:
            labels[accelerator_label] = model.id
        pools.append(
            GpuPool(
                spec=pool,
                machine=machine,
                sharing=sharing,
                offer=offer,
                node_labels=labels,
                taints=(GPU_TAINT, *pool.taints),
            )
        )
    return tuple(pools)


def platform_issues(spec: ClusterSpec, traits: PlatformTraits, catalog: Catalog) -> list[ConfigIssue]:
    """What the platform's driver cannot run, as errors; what runs only partly is logged as a warning."""
    checks = []
    for index, pool in enumerate(spec.gpu_pools):
        _, model = _gpu_model(spec, pool, catalog)
        checks.append(
            PoolDriverCheck(
                index=index,
                name=pool.name,
                gpu_model=model,
                uses_mig=pool.sharing.mode == "mig",
                cuda=pool.cuda or spec.cuda,
                cuda_is_pool_override=pool.cuda is not None,
            )
        )
    errors, warnings = driver_issues(spec, traits.driver, checks)
    for warning in warnings:
        pulumi.log.warn(str(warning))
    return errors


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
