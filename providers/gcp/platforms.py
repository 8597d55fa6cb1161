"""The GCP platforms, registered when `gpu_k8s.providers` is imported."""

from gpu_k8s.components.spec import Platform, register_platform
from gpu_k8s.providers.gcp.settings import GceK3sClusterSpec, GkeClusterSpec

register_platform(Platform("gcp", "gke", GkeClusterSpec, build="gpu_k8s.providers.gcp.gke:build"))
register_platform(Platform("gcp", "k3s", GceK3sClusterSpec, build="gpu_k8s.providers.gcp.k3s:build"))
