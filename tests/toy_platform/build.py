"""Everything a toy stack creates: a Kubernetes provider for the named context, and the generic GPU layer
(the GPU Operator with each pool's sharing config) on it."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from gpu_k8s import GpuCluster, PlatformTraits
from gpu_k8s.components.catalog import load_catalog
from gpu_k8s.components.cluster import platform_issues, resolve_pools
from gpu_k8s.components.compat import DriverFacts, operator_driver
from gpu_k8s.components.configbase import raise_if_any
from gpu_k8s.components.gpu_operator import GpuOperator, GpuOperatorArgs
from tests.toy_platform.settings import ToyClusterSpec


def build(spec: ToyClusterSpec) -> GpuCluster:
    catalog = load_catalog()
    traits = PlatformTraits(
        driver=DriverFacts(owner="gpu-operator", version=operator_driver(spec.addon_versions)),
        toolkit_preinstalled=False,
        accelerator_label="toy.example/accelerator",
    )
    raise_if_any(platform_issues(spec, traits, catalog))
    provider = k8s.Provider(f"{spec.name}-k8s", context=spec.toy.context)
    cluster = GpuCluster(
        name=spec.name,
        kubernetes_version=spec.kubernetes_version,
        kubeconfig=pulumi.Output.secret(""),
        k8s_provider=provider,
        pools=resolve_pools(spec, catalog, traits),
        traits=traits,
        system_ready=[],
        system_nodes=spec.system_pool.nodes,
    )
    GpuOperator(f"{spec.name}-gpu-operator", GpuOperatorArgs(cluster, spec.addon_versions.gpu_operator))
    return cluster
