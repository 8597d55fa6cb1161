"""The AWS platforms, registered when `gpu_k8s.providers` is imported."""

from gpu_k8s.components.spec import Platform, register_platform
from gpu_k8s.providers.aws.settings import Ec2K3sClusterSpec, EksClusterSpec

register_platform(Platform("aws", "eks", EksClusterSpec, build="gpu_k8s.providers.aws.eks:build"))
register_platform(Platform("aws", "k3s", Ec2K3sClusterSpec, build="gpu_k8s.providers.aws.k3s:build"))
