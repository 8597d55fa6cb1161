"""Shared fixtures: the recorded aws-eks stack, example configs and upstream contract files."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tools.engine import PROJECT_ROOT, Recording, run_program, stack_config
from tools.upstream import UpstreamMissing, locate

STACKS = PROJECT_ROOT / "stacks"


@pytest.fixture(scope="session")
def aws_eks_config() -> dict[str, Any]:
    return stack_config(STACKS / "Pulumi.aws-eks.yaml")


@pytest.fixture(scope="session")
def aws_eks(aws_eks_config: dict[str, Any]) -> Recording:
    """The aws-eks stack program, run once under the recording mock engine."""
    return run_program("aws-eks", aws_eks_config)


@pytest.fixture
def cluster_raw(aws_eks_config: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of the aws-eks `gpu-k8s:cluster` value for tests to break."""
    return copy.deepcopy(aws_eks_config["gpu-k8s:cluster"])


def minimal_cluster(**overrides: Any) -> dict[str, Any]:
    """The smallest valid aws/eks `gpu-k8s:cluster` value, with top-level keys replaced by `overrides`."""
    return {
        "name": "ml",
        "cloud": "aws",
        "kind": "eks",
        "kubernetesVersion": "1.35",
        "network": {"cidr": "10.40.0.0/16"},
        "apiAccessCidrs": ["203.0.113.0/24"],
        "systemPool": {"instanceType": "m7i.large"},
        "gpuPools": [{"name": "l4", "instanceType": "g6.xlarge", "maxNodes": 1}],
        **overrides,
    }


def upstream(relative_path: str) -> Path:
    """A verified upstream contract file; skips with the fetch hint, or fails when CI=true."""
    try:
        return locate(relative_path)
    except UpstreamMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def upstream_yaml(relative_path: str) -> Any:
    return yaml.safe_load(upstream(relative_path).read_text())
