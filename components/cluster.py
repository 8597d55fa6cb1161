"""The `GpuCluster` handle every provider returns, and the GPU pool facts derived from the spec.

Whatever differs by platform reaches the cloud-agnostic components as data on this handle
(`PlatformTraits`), never as a test of the cloud or kind inside them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import pulumi
import pulumi_kubernetes as k8s

from gpu_k8s.components.catalog import Catalog, GpuModel, MachineType
from gpu_k8s.components.compat import AddonVersions, DriverFacts, PoolDriverCheck, driver_issues
from gpu_k8s.components.configbase import ConfigIssue, config_path
from gpu_k8s.components.sharing import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    MIG_CONFIG_LABEL,
    NodeOffer,
    Sharing,
    cluster_mig_strategy,
    node_offer,
    resolve_sharing,
)
from gpu_k8s.components.spec import DOCUMENTATION_RANGES, GpuPoolSpec, PoolRules, TaintSpec, mig_pools
from gpu_k8s.components.storage import SharedStorage

# Every GPU node carries a taint on this key so only pods that ask for GPUs (and tolerate it) land there.
GPU_TAINT_KEY = "nvidia.com/gpu"
# Nodes whose slots are not whole GPUs (time-sliced, MPS, MIG) also carry the taint
# gpu-k8s.io/sharing=<mode>:NoSchedule.
# Every slot is an `nvidia.com/gpu` to the scheduler: without it a training pod could land on a quarter of a
# time-sliced GPU, or start a p5.48xlarge for one MIG slice. Pods meant for such pools tolerate it.
SHARING_TAINT_KEY = "gpu-k8s.io/sharing"
# Nodes of a pool whose interconnect is a device the pods ask for (AWS EFA interfaces) also carry
# gpu-k8s.io/interconnect=<interconnect>:NoSchedule: without it any GPU pod that fits could start a
# p5.48xlarge (review-aws.md AN-D1). Jobs for such pools tolerate it (Kueue adds the pool's tolerations to
# the jobs it admits); the GPU Operator, the EFA device plugin and the autoscaler's templates carry it.
INTERCONNECT_TAINT_KEY = "gpu-k8s.io/interconnect"
POOL_LABEL = "gpu-k8s.io/pool"
# The pool label's value on the system nodes (k3s servers, EKS/GKE system node groups).
SYSTEM_POOL_NAME = "system"


def pod_security_labels(level: str) -> dict[str, str]:
    """Labels of a namespace the toolkit makes for workloads or for an add-on that needs no host access:
    `level` enforced, `restricted` warned of and audited (as k3s's cluster-wide default here)."""
    return {
        "pod-security.kubernetes.io/enforce": level,
        "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/warn": "restricted",
        "pod-security.kubernetes.io/warn-version": "latest",
        "pod-security.kubernetes.io/audit": "restricted",
        "pod-security.kubernetes.io/audit-version": "latest",
    }


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
    # Who advertises the GPUs of a node and cuts them into slots: the GPU Operator's device plugin and MIG
    # manager, configured per pool ("operator"), or the platform itself from the node pool's settings
    # ("platform": GKE's device plugin with gpuSharingConfig / gpuPartitionSize).
    gpu_sharing_owner: Literal["operator", "platform"] = "operator"
    # The value of the GPU taint; GKE taints GPU nodes nvidia.com/gpu=present:NoSchedule itself.
    gpu_taint_value: str = "true"
    # A taint on the non-GPU nodes that keeps workloads off them (k3s servers hold the cluster's keys); the
    # add-ons that must run there tolerate it. None where those nodes take any pod.
    system_taint: TaintSpec | None = None
    # The Pod Security level workloads run under (Kubernetes Pod Security Standards). EKS and GKE apply none
    # cluster-wide, which admits privileged pods; k3s here sets its `podSecurity` for the whole cluster.
    pod_security: Literal["baseline", "restricted"] = "baseline"
    # The cluster DNS: CoreDNS (with its metrics port) everywhere but GKE Standard, which runs kube-dns.
    cluster_dns: Literal["coredns", "kube-dns"] = "coredns"

    @property
    def system_tolerations(self) -> list[dict[str, str]]:
        """Tolerations for pods that run on the system nodes."""
        taint = self.system_taint
        return [] if taint is None else [{"key": taint.key, "operator": "Exists", "effect": taint.effect}]

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
    # Extended resources one node advertises for the pool's interconnect (e.g. its EFA interfaces).
    interconnect_resources: Mapping[str, int] = field(default_factory=dict)

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


class GpuLayerSpec(Protocol):
    """What the GPU layer (pools, operator, autoscaler) reads of a spec: a whole cluster's (`ClusterSpec`),
    or the GPU layer's alone on a cluster made elsewhere."""

    @property
    def gpu_pools(self) -> tuple[GpuPoolSpec, ...]: ...

    @property
    def cuda(self) -> str | None: ...

    @property
    def addon_versions(self) -> AddonVersions: ...

    @property
    def api_access_cidrs(self) -> tuple[str, ...]: ...

    @property
    def pool_rules(self) -> PoolRules: ...


def _gpu_model(spec: GpuLayerSpec, pool: GpuPoolSpec, catalog: Catalog) -> tuple[MachineType, GpuModel]:
    machine = spec.pool_rules.pool_machine(pool, catalog)
    assert machine is not None and machine.gpu_model is not None, "validated by load_spec"
    return machine, machine.gpu_model


def resolve_pools(spec: GpuLayerSpec, catalog: Catalog, traits: PlatformTraits) -> tuple[GpuPool, ...]:
    """Attach catalog facts, sharing, node labels and taints to every GPU pool of a validated spec."""
    mig_strategy = cluster_mig_strategy(mig_pools(spec.gpu_pools, spec.pool_rules, catalog))
    accelerator_label = traits.accelerator_label
    gpu_taint = TaintSpec(key=GPU_TAINT_KEY, value=traits.gpu_taint_value, effect="NoSchedule")
    operator_shares = traits.gpu_sharing_owner == "operator"
    pools = []
    for pool in spec.gpu_pools:
        machine, model = _gpu_model(spec, pool, catalog)
        sharing = resolve_sharing(pool.sharing, model, pool.name, mig_strategy)
        offer = node_offer(sharing, model, machine.gpu_count)
        labels = {**pool.labels, POOL_LABEL: pool.name}
        if operator_shares:
            labels[DEVICE_PLUGIN_CONFIG_LABEL] = pool.name
        if operator_shares and sharing.mig is not None:
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
        sharing_taints = (
            (TaintSpec(key=SHARING_TAINT_KEY, value=sharing.mode, effect="NoSchedule"),)
            if sharing.mode != "none"
            else ()
        )
        interconnect_resources = spec.pool_rules.interconnect_resources(pool, machine)
        interconnect_taints = (
            (TaintSpec(key=INTERCONNECT_TAINT_KEY, value=str(pool.interconnect), effect="NoSchedule"),)
            if interconnect_resources
            else ()
        )
        pools.append(
            GpuPool(
                spec=pool,
                machine=machine,
                sharing=sharing,
                offer=offer,
                node_labels=labels,
                taints=(gpu_taint, *sharing_taints, *interconnect_taints, *pool.taints),
                interconnect_resources=interconnect_resources,
            )
        )
    return tuple(pools)


def documentation_range_issues(spec: GpuLayerSpec) -> list[ConfigIssue]:
    """apiAccessCidrs that lie in a documentation range: every Kubernetes resource would time out after the
    cloud resources exist, since nothing the deployer runs on has such an address."""
    return [
        ConfigIssue(
            config_path("apiAccessCidrs", index),
            cidr,
            "is an RFC 5737 documentation range that no real host has; the Kubernetes API would admit no "
            "one, so every Kubernetes resource would time out after the cloud resources are created",
            "list the CIDRs `pulumi up` and your users run from (office, VPN, CI egress)",
        )
        for index, cidr in enumerate(spec.api_access_cidrs)
        if any(ipaddress.IPv4Network(cidr).subnet_of(example) for example in DOCUMENTATION_RANGES)
    ]


def platform_issues(
    spec: GpuLayerSpec, traits: PlatformTraits, catalog: Catalog, api_reached_by_cidr: bool = True
) -> list[ConfigIssue]:
    """What the platform cannot run, as errors; what runs only partly is logged as a warning.

    `api_reached_by_cidr`: the program reaches the Kubernetes API through the endpoint apiAccessCidrs
    guards. Documentation ranges there lock it out: refused on `pulumi up`, a warning in a preview (the
    example stacks use them)."""
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
    errors, warnings = driver_issues(spec.addon_versions, traits.driver, checks)
    lockouts = documentation_range_issues(spec) if api_reached_by_cidr else []
    if pulumi.runtime.is_dry_run():
        warnings = [*warnings, *lockouts]
    else:
        errors = [*errors, *lockouts]
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
    # How many non-GPU nodes the cluster runs (system pool or k3s servers).
    system_nodes: int
    # The file system of `storage.shared`, when the stack asks for one.
    shared_storage: SharedStorage | None = None
    # The NVIDIA GPU Operator once installed: depend on it for "GPUs are advertised" (a component waits for
    # its children: the operator's release and the sharing configs).
    gpu_operator: pulumi.ComponentResource | None = None
