"""Keep each GPU pool's node groups in the zones they were first placed in, until the user moves them.

Where a cloud's zones for a pool are chosen at preview from what the cloud offers then (AWS: the zones whose
ID offers the pool's instance types, at most `maxNodes` of them, one for a pool with an interconnect), an
unrelated `pulumi up` after the cloud adds an offering in another zone, or after `maxNodes` goes down, would
place the pool elsewhere: it deletes node groups with running nodes and moves a training pool's placement
group (review-aws.md AN-B1). `ZonePlacement` records each pool's zones in the stack's state; its `check`,
which the engine runs in the preview with the last update's values, refuses a plan that would take a pool
out of a zone it runs in when the user did not place it (`gpuPools[].zones`, or a Capacity Block, whose
zone is the block's), before any node group changes: every GPU node group waits for it. Zones added beside
the running ones pass; a pool added or removed is not compared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi.dynamic

from gpu_k8s.components.configbase import ConfigIssue, config_path


@dataclass(frozen=True)
class PoolPlacement:
    # The pool's `zones` key, as the stack names it (gpu-k8s:cluster.gpuPools[0].zones).
    path: str
    zones: tuple[str, ...]
    # The zones are the user's (gpuPools[].zones), not chosen from the cloud's offerings.
    pinned: bool


def placement_issues(olds: Mapping[str, Any], news: Mapping[str, Any]) -> list[ConfigIssue]:
    """Pools of `news` (the guard's inputs) that would leave the zones `olds` recorded without the user
    placing them there."""
    issues = []
    recorded = olds.get("pools") or {}
    for name, pool in (news.get("pools") or {}).items():
        before = recorded.get(name)
        if before is None or pool["pinned"]:
            continue
        # Zones added beside the running ones (a higher maxNodes) delete nothing.
        left = [zone for zone in before["zones"] if zone not in pool["zones"]]
        if not left:
            continue
        issues.append(
            ConfigIssue(
                str(pool["path"]),
                list(pool["zones"]),
                f"pool {name}'s node groups run in {', '.join(before['zones'])}; this plan would place it in "
                f"{', '.join(pool['zones'])} (the cloud's offerings, maxNodes or the pool's types changed), "
                f"deleting its groups and their nodes in {', '.join(left)}",
                f"to keep it where it runs, set zones: [{', '.join(before['zones'])}]; to move it, set the "
                "zones it should run in",
            )
        )
    return issues


class _PlacementProvider(pulumi.dynamic.ResourceProvider):
    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.CheckResult:
        failures = [
            pulumi.dynamic.CheckFailure("pools", str(issue)) for issue in placement_issues(olds, news)
        ]
        return pulumi.dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        return pulumi.dynamic.CreateResult(id_="zone-placement", outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        changes = olds.get("pools") != news.get("pools")
        return pulumi.dynamic.DiffResult(changes=changes, replaces=[], delete_before_replace=False)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        return pulumi.dynamic.UpdateResult(outs=news)


class ZonePlacement(pulumi.dynamic.Resource):
    """Each GPU pool's zones as the stack placed them; GPU node groups depend on it."""

    def __init__(
        self, name: str, pools: Mapping[str, PoolPlacement], opts: pulumi.ResourceOptions | None = None
    ):
        inputs = {
            "pools": {
                name: {"path": pool.path, "zones": list(pool.zones), "pinned": pool.pinned}
                for name, pool in pools.items()
            }
        }
        super().__init__(_PlacementProvider(), name, inputs, opts)


def zone_placement(cluster_name: str, pools: Mapping[str, PoolPlacement]) -> ZonePlacement:
    return ZonePlacement(f"{cluster_name}-zone-placement", pools)


def placement_of(
    names: Sequence[str], zones: Mapping[str, Sequence[str]], pinned: Sequence[bool]
) -> dict[str, PoolPlacement]:
    """Per pool (in config order): its `zones` key, zones and whether the user placed it."""
    return {
        name: PoolPlacement(config_path("gpuPools", index, "zones"), tuple(zones[name]), is_pinned)
        for index, (name, is_pinned) in enumerate(zip(names, pinned, strict=True))
    }
