"""Day 2 on AWS (#33, review-aws.md AN-B1): a GPU pool's zones are chosen at preview from what EC2 offers
then, and an unrelated `up` must not move them. Each trigger is two plans through the mock engine, the second
changed only by the trigger; the zone-placement guard, checked by the real dynamic-provider host, refuses the
second before any node group changes (every GPU group waits for it), and pinning the pool's zones keeps every
group as it was."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_k8s.components.configbase import ConfigError
from gpu_k8s.components.placement import placement_issues
from gpu_k8s.tools.engine import RealisticMocks, Recording, run_program
from tests.conftest import DynamicCheck

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
ASG = "aws:autoscaling/group:Group"
# The mock account's zones (engine.RealisticMocks): us-east-1a is use1-az2, c use1-az4, d use1-az5; b is
# use1-az3, where EKS refuses cluster subnets, so the cluster skips it.


class Offerings:
    """Mocks in which each listed instance type is offered only in the given zone IDs."""

    def __init__(self, offered: dict[str, list[str]]):
        self.inner = RealisticMocks()
        self.offered = offered

    def new_resource(self, args: Any) -> Any:
        return self.inner.new_resource(args)

    def call(self, args: Any) -> Any:
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            instance_type = args.args["filters"][0]["values"][0]
            if instance_type in self.offered:
                return {"locations": self.offered[instance_type], "id": "x"}, []
        return self.inner.call(args)


def pool_groups(rec: Recording, pool: str) -> dict[str, dict[str, Any]]:
    """A pool's GPU groups (EKS node groups or k3s Auto Scaling groups) by resource name: their inputs."""
    prefix = f"ml-gpu-{pool}-"
    return {
        r.name: r.inputs for r in [*rec.by_type(NODE_GROUP), *rec.by_type(ASG)] if r.name.startswith(prefix)
    }


def guard(rec: Recording) -> tuple[str, dict[str, Any]]:
    inputs = rec.by_name("ml-zone-placement").inputs
    provider = inputs["__provider"]
    return getattr(provider, "value", provider), {k: v for k, v in inputs.items() if not k.startswith("__")}


def with_pool(config: dict[str, Any], name: str, **changes: Any) -> dict[str, Any]:
    changed = copy.deepcopy(config)
    for pool in changed["gpu-k8s:cluster"]["gpuPools"]:
        if pool["name"] == name:
            pool.update(changes)
    return changed


PLATFORMS = [
    ("aws-eks", "aws_eks_config", "l40s", "g6e.xlarge"),
    ("aws-k3s", "aws_k3s_config", "l4", "g6.xlarge"),
]


@pytest.mark.parametrize(("stack", "config_fixture", "pool", "instance_type"), PLATFORMS)
def test_a_new_offering_in_another_zone_moves_no_pool(
    stack, config_fixture, pool, instance_type, request, dynamic_check: DynamicCheck
):
    config = with_pool(request.getfixturevalue(config_fixture), pool, maxNodes=2)
    day1 = run_program(stack, config, mocks=Offerings({instance_type: ["use1-az4", "use1-az5"]}))
    # EC2 now offers the type in use1-az2 too, the cluster's first zone.
    day2 = run_program(stack, config, mocks=Offerings({instance_type: ["use1-az2", "use1-az4", "use1-az5"]}))
    provider, recorded = guard(day1)
    index = [p["name"] for p in config["gpu-k8s:cluster"]["gpuPools"]].index(pool)
    assert recorded["pools"][pool] == {
        "path": f"gpu-k8s:cluster.gpuPools[{index}].zones",
        "zones": ["use1-az4", "use1-az5"],
        "pinned": False,
    }
    # Unguarded, the new plan would delete the group in use1-az5 with its nodes and make one in use1-az2.
    assert set(pool_groups(day2, pool)) != set(pool_groups(day1, pool))
    (reason,) = dynamic_check(provider, recorded, guard(day2)[1])
    assert ".gpuPools[" in reason and f"pool {pool}'s node groups run in use1-az4, use1-az5" in reason
    assert "deleting its groups and their nodes in use1-az5" in reason
    assert "Fix: to keep it where it runs, set zones: [use1-az4, use1-az5]" in reason
    # Every GPU group waits for the guard, so a refused check changes none of them.
    placement = day2.by_name("ml-zone-placement").urn
    for resource in [*day2.by_type(NODE_GROUP), *day2.by_type(ASG)]:
        if resource.name.startswith("ml-gpu-"):
            assert placement in resource.dependencies, resource.name
    # The fix: the pool pinned where it runs plans exactly its day-1 groups, and the guard lets it through.
    pinned = with_pool(config, pool, zones=["use1-az4", "use1-az5"])
    kept = run_program(stack, pinned, mocks=Offerings({instance_type: ["use1-az2", "use1-az4", "use1-az5"]}))
    assert pool_groups(kept, pool) == pool_groups(day1, pool)
    assert dynamic_check(provider, recorded, guard(kept)[1]) == []


@pytest.mark.parametrize(("stack", "config_fixture", "pool", "instance_type"), PLATFORMS)
def test_lowering_max_nodes_deletes_no_zone_group_unless_the_zone_is_dropped(
    stack, config_fixture, pool, instance_type, request, dynamic_check: DynamicCheck
):
    config = with_pool(request.getfixturevalue(config_fixture), pool, maxNodes=3)
    day1 = run_program(stack, config)
    day2 = run_program(stack, with_pool(config, pool, maxNodes=2))
    provider, recorded = guard(day1)
    assert len(recorded["pools"][pool]["zones"]) == 3
    (reason,) = dynamic_check(provider, recorded, guard(day2)[1])
    assert "deleting its groups and their nodes in use1-az5" in reason
    # Pinned to three zones, maxNodes 2 cannot give each zone's group a node: refused, naming the fix.
    three = recorded["pools"][pool]["zones"]
    registered: list[Any] = []
    with pytest.raises(ConfigError) as refused:
        registered = run_program(stack, with_pool(config, pool, maxNodes=2, zones=three)).registrations
    assert ".zones: " in str(refused.value) and "raise maxNodes to 3, or list fewer zones" in str(
        refused.value
    )
    assert registered == []
    # Dropping a zone is the user's move: the guard lets it through.
    dropped = run_program(stack, with_pool(config, pool, maxNodes=2, zones=three[:2]))
    assert dynamic_check(provider, recorded, guard(dropped)[1]) == []


def test_a_training_pool_stays_in_its_zone_when_another_zone_starts_offering_its_type(
    aws_eks_config, dynamic_check: DynamicCheck
):
    """An interconnect pool lives in one zone (one placement group): the first offering zone. A new
    offering in a zone before it would move the pool, and its placement group, there."""
    day1 = run_program("aws-eks", aws_eks_config, mocks=Offerings({"p5.48xlarge": ["use1-az5"]}))
    day2 = run_program("aws-eks", aws_eks_config, mocks=Offerings({"p5.48xlarge": ["use1-az4", "use1-az5"]}))
    provider, recorded = guard(day1)
    assert recorded["pools"]["h100-train"]["zones"] == ["use1-az5"]
    reasons = dynamic_check(provider, recorded, guard(day2)[1])
    assert any("pool h100-train's node groups run in use1-az5" in r for r in reasons), reasons


def test_pools_added_or_removed_zones_added_and_the_first_up_are_not_compared():
    recorded = {"pools": {"a": {"path": "p.a", "zones": ["use1-az2"], "pinned": False}}}
    assert placement_issues({}, recorded) == []
    added = {"pools": {**recorded["pools"], "b": {"path": "p.b", "zones": ["use1-az3"], "pinned": False}}}
    assert placement_issues(recorded, added) == []
    assert placement_issues(added, recorded) == []
    # A higher maxNodes adds a zone and deletes nothing.
    wider = {"pools": {"a": {"path": "p.a", "zones": ["use1-az2", "use1-az4"], "pinned": False}}}
    assert placement_issues(recorded, wider) == []
    moved = {"pools": {"a": {"path": "p.a", "zones": ["use1-az3"], "pinned": False}}}
    (issue,) = placement_issues(recorded, moved)
    assert issue.path == "p.a"
    assert placement_issues(recorded, {"pools": {"a": {**moved["pools"]["a"], "pinned": True}}}) == []


def test_a_capacity_block_pool_moves_with_its_block(aws_eks_config, dynamic_check: DynamicCheck):
    """A new block in another zone is the user's move: recorded as placed, never refused (the guard's
    usual fix, `zones`, is refused with a block)."""
    block = {
        "name": "blk",
        "instanceType": "p5.48xlarge",
        "maxNodes": 2,
        "capacityReservationId": "cr-02168da1478b509e0",
    }
    config = copy.deepcopy(aws_eks_config)
    config["gpu-k8s:cluster"]["gpuPools"].append(block)
    provider, recorded = guard(run_program("aws-eks", config))
    assert recorded["pools"]["blk"]["pinned"] is True
    moved = copy.deepcopy(recorded)
    moved["pools"]["blk"]["zones"] = ["use1-az2"]
    assert dynamic_check(provider, recorded, moved) == []


@pytest.mark.parametrize(
    ("zones", "words"),
    [
        (["us-east-1a", "us-east-1a"], "lists a zone twice"),
        (["us-east-1"], "is not a zone name or zone ID"),
        (["use1-az3"], "is not a zone of the cluster's subnets"),
    ],
)
def test_bad_zones_are_refused_before_any_node_group(aws_eks_config, zones, words):
    """The shape is refused before any resource; a zone the cluster's subnets are not in, at preview (the
    zones are EC2's answer), before any node group."""
    with pytest.raises(ConfigError) as refused:
        run_program("aws-eks", with_pool(aws_eks_config, "l40s", zones=zones))
    assert "gpu-k8s:cluster.gpuPools[0].zones: " in str(refused.value) and words in str(refused.value)


def test_a_pool_placed_by_zone_name_or_id_gets_the_same_groups(aws_eks_config):
    by_name = run_program("aws-eks", with_pool(aws_eks_config, "l40s", zones=["us-east-1c", "us-east-1d"]))
    by_id = run_program("aws-eks", with_pool(aws_eks_config, "l40s", zones=["use1-az4", "use1-az5"]))
    assert pool_groups(by_name, "l40s") == pool_groups(by_id, "l40s")
    assert len(pool_groups(by_id, "l40s")) == 2
