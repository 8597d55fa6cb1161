"""gpu-k8s: GPU-ready Kubernetes on AWS and GCP as Pulumi components.

The names imported here are the stable public API (README.md "Extend"); modules under
`gpu_k8s.components` and `gpu_k8s.providers` may change between minor versions.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable

import pulumi

from gpu_k8s.components.cluster import GpuCluster, PlatformTraits
from gpu_k8s.components.configbase import ConfigError, ConfigIssue, stack_cluster_config
from gpu_k8s.components.monitoring import monitoring_access
from gpu_k8s.components.outputs import stack_outputs
from gpu_k8s.components.spec import ClusterSpec, Platform, load_spec, platform_of, register_platform

# Registers the platforms this package builds (aws/eks, aws/k3s, gcp/gke, gcp/k3s).
import gpu_k8s.providers  # noqa: F401  isort: skip

__all__ = [
    "ClusterSpec",
    "ConfigError",
    "ConfigIssue",
    "GpuCluster",
    "Platform",
    "PlatformTraits",
    "build_cluster",
    "build_existing_eks_gpu_layer",
    "deploy_stack",
    "load_spec",
    "monitoring_access",
    "register_platform",
    "stack_cluster_config",
    "stack_outputs",
]


# The cloud SDK each cloud's platforms import, and the extra that installs it.
CLOUD_SDKS = {"aws": ("pulumi_aws", "gpu-k8s[aws]"), "gcp": ("pulumi_gcp", "gpu-k8s[gcp]")}


def build_cluster(spec: ClusterSpec) -> GpuCluster:
    """Every resource of the spec's platform (network, cluster, GPU pools, GPU Operator, CSI, autoscaler)."""
    module_name, function_name = platform_of(spec).build.split(":")
    _require_sdk(spec.cloud, "gpu-k8s:cluster.cloud")
    build: Callable[[ClusterSpec], GpuCluster] = getattr(importlib.import_module(module_name), function_name)
    return build(spec)


def _require_sdk(cloud: str, key: str) -> None:
    """A clear refusal, before any resource, where the cloud's SDK is not installed (an extra)."""
    if cloud not in CLOUD_SDKS:
        return
    module, extra = CLOUD_SDKS[cloud]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            [
                ConfigIssue(
                    key,
                    cloud,
                    f"needs the Pulumi {cloud.upper()} SDK ({module}), which this installation lacks",
                    f"pip install '{extra}' (or both clouds: 'gpu-k8s[aws,gcp]')",
                )
            ]
        )


def build_existing_eks_gpu_layer(name: str, raw: object | None = None) -> GpuCluster:
    """The GPU layer alone on an EKS cluster you already have (`gpu-k8s:gpuLayer`, or `raw`): GPU node groups,
    the GPU Operator and the cluster-autoscaler; nothing of the cluster itself is created or changed."""
    _require_sdk("aws", "gpu-k8s:gpuLayer")
    from gpu_k8s.providers.aws.existing import build_existing_eks_gpu_layer as build_layer

    return build_layer(name, raw)


def deploy_stack() -> GpuCluster:
    """The whole stack program: read `gpu-k8s:cluster`, build it, export kubeconfig and the pool facts (and
    with `monitoring`, where to look)."""
    spec = load_spec(stack_cluster_config())
    cluster = build_cluster(spec)
    for output_name, value in stack_outputs(cluster).items():
        pulumi.export(output_name, value)
    if spec.monitoring is not None:
        pulumi.export("monitoring", monitoring_access(spec.monitoring))
    return cluster
