"""One package per cloud. Adding a platform = adding a folder and one line to REGISTRY.

Providers are imported only when their stack is built, so an AWS plan never loads pulumi_gcp.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from gpu_k8s.components.cluster import GpuCluster
from gpu_k8s.components.configbase import ConfigError, ConfigIssue, config_path
from gpu_k8s.components.spec import ClusterSpec

# (cloud, kind) -> "module:function" that builds the whole stack and returns its GpuCluster.
REGISTRY: dict[tuple[str, str], str] = {
    ("aws", "eks"): "gpu_k8s.providers.aws.eks:build",
    ("aws", "k3s"): "gpu_k8s.providers.aws.k3s:build",
    ("gcp", "gke"): "gpu_k8s.providers.gcp.gke:build",
    ("gcp", "k3s"): "gpu_k8s.providers.gcp.k3s:build",
}


def builder_for(spec: ClusterSpec) -> Callable[[ClusterSpec], GpuCluster]:
    """The build function for the spec's platform, or a ConfigError naming what is available."""
    target = REGISTRY.get((spec.cloud, spec.kind))
    if target is None:
        built = ", ".join(f"{cloud}/{kind}" for cloud, kind in sorted(REGISTRY))
        raise ConfigError(
            [
                ConfigIssue(
                    config_path("kind"),
                    f"{spec.cloud}/{spec.kind}",
                    "this platform is not yet supported",
                    f"use one of the platforms built so far: {built}",
                )
            ]
        )
    module_name, function_name = target.split(":")
    return getattr(importlib.import_module(module_name), function_name)
