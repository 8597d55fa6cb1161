"""The toy platform's own keys and rules."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import ClassVar

from gpu_k8s import ClusterSpec, ConfigIssue
from gpu_k8s.components.configbase import StrictModel, config_path
from gpu_k8s.components.spec import NetworkSettings, PoolRules

RACK = re.compile(r"^rack-\d+$")


class ToyNetwork(NetworkSettings):
    """The racks the GPU nodes stand in."""

    racks: tuple[str, ...] = ()


class ToySpec(StrictModel):
    """`toy:` settings: which kubeconfig context reaches the cluster."""

    context: str = ""


class ToyClusterSpec(ClusterSpec):
    network: ToyNetwork
    pool_rules: ClassVar[PoolRules] = PoolRules("aws")
    toy: ToySpec = ToySpec()

    def network_issues(self) -> Iterable[ConfigIssue]:
        for index, rack in enumerate(self.network.racks):
            if not RACK.match(rack):
                yield ConfigIssue(
                    config_path("network", "racks", index), rack, "not a rack", "write rack-<n>"
                )

    def platform_issues(self) -> Iterable[ConfigIssue]:
        if not self.toy.context:
            yield ConfigIssue(config_path("toy", "context"), None, "is missing", "name a kubeconfig context")
