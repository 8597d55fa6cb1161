"""The toy platform as `register_platform` takes it."""

from gpu_k8s import Platform
from tests.toy_platform.settings import ToyClusterSpec

TOY = Platform("aws", "toy", ToyClusterSpec, build="tests.toy_platform.build:build")
