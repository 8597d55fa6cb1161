"""Several instance types per GPU pool (gpuPools[].extraInstanceTypes), on aws-eks and aws-k3s.

A spot pool that can take any of several types with the same GPUs gets capacity where one type alone has
none. The autoscaler plans a node of the pool as the first type, so the others must bring at least as much.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_k8s.components.configbase import ConfigError
from gpu_k8s.tools.engine import Recording, run_program
from tests.conftest import assert_refused_before_any_resource, set_path, some

L40S_TYPES = ["g6e.xlarge", "g6e.2xlarge", "g6e.4xlarge"]
L4_TYPES = ["g6.xlarge", "g6.2xlarge"]


def _with_extra_types(config: dict[str, Any], pool: int, extra: list[str]) -> dict[str, Any]:
    config = copy.deepcopy(config)
    config["gpu-k8s:cluster"]["gpuPools"][pool]["extraInstanceTypes"] = extra
    return config


@pytest.fixture(scope="module")
def eks_several_types(aws_eks_config) -> Recording:
    return run_program("eks-types", _with_extra_types(aws_eks_config, 0, L40S_TYPES[1:]))


@pytest.fixture(scope="module")
def k3s_several_types(aws_k3s_config) -> Recording:
    return run_program("k3s-types", _with_extra_types(aws_k3s_config, 0, L4_TYPES[1:]))


def test_eks_groups_of_the_pool_list_every_type_the_first_planned_with(eks_several_types, aws_eks):
    def groups(rec: Recording, pool: str) -> list[dict[str, Any]]:
        return [
            g.inputs
            for g in rec.by_type("aws:eks/nodeGroup:NodeGroup")
            if g.inputs["labels"]["gpu-k8s.io/pool"] == pool
        ]

    for group in some(groups(eks_several_types, "l40s"), at_least=3):
        assert group["instanceTypes"] == L40S_TYPES
        assert group["capacityType"] == "SPOT"
    # The autoscaler's template of the pool is the same as with one type: same GPUs, first type's shape.
    tags = lambda rec: sorted(  # noqa: E731
        (t.inputs["tag"]["key"], t.inputs["tag"]["value"])
        for t in rec.by_type("aws:autoscaling/tag:Tag")
        if "-l40s-" in t.name
    )
    assert tags(eks_several_types) == tags(aws_eks) != []


def test_a_k3s_pool_of_several_types_buys_spot_through_a_mixed_instances_policy(k3s_several_types):
    (template,) = [
        t.inputs
        for t in k3s_several_types.by_type("aws:ec2/launchTemplate:LaunchTemplate")
        if "-l4-" in t.name
    ]
    # An Auto Scaling group takes the types and the market from its policy, not the template.
    assert "instanceType" not in template and "instanceMarketOptions" not in template
    for group in some(
        [g for g in k3s_several_types.by_type("aws:autoscaling/group:Group") if "-l4-" in g.name]
    ):
        assert "launchTemplate" not in group.inputs
        policy = group.inputs["mixedInstancesPolicy"]
        assert policy["launchTemplate"]["launchTemplateSpecification"]["version"] == "$Latest"
        assert [o["instanceType"] for o in policy["launchTemplate"]["overrides"]] == L4_TYPES
        assert policy["instancesDistribution"] == {
            "onDemandBaseCapacity": 0,
            "onDemandPercentageAboveBaseCapacity": 0,
            "onDemandAllocationStrategy": "prioritized",
            "spotAllocationStrategy": "price-capacity-optimized",
        }
        assert group.inputs["capacityRebalance"] is True


def test_k3s_pools_of_one_type_keep_their_template(k3s_several_types):
    (template,) = [
        t.inputs
        for t in k3s_several_types.by_type("aws:ec2/launchTemplate:LaunchTemplate")
        if "-h100-" in t.name
    ]
    assert template["instanceType"] == "p5.48xlarge"
    for group in some(
        [g for g in k3s_several_types.by_type("aws:autoscaling/group:Group") if "-h100-" in g.name]
    ):
        assert "mixedInstancesPolicy" not in group.inputs and group.inputs["launchTemplate"]


def test_the_policy_is_what_the_auto_scaling_api_takes(k3s_several_types):
    import botocore.session

    model = botocore.session.get_session().get_service_model("autoscaling")
    for group in some(
        [g for g in k3s_several_types.by_type("aws:autoscaling/group:Group") if "-l4-" in g.name]
    ):
        policy = group.inputs["mixedInstancesPolicy"]
        pascal = lambda key: key[0].upper() + key[1:]  # noqa: E731
        assert {pascal(k) for k in policy} <= set(model.shape_for("MixedInstancesPolicy").members)
        assert {pascal(k) for k in policy["instancesDistribution"]} <= set(
            model.shape_for("InstancesDistribution").members
        )
        for override in policy["launchTemplate"]["overrides"]:
            assert {pascal(k) for k in override} <= set(model.shape_for("LaunchTemplateOverrides").members)


# --- refused -------------------------------------------------------------------------------------------

REFUSALS = [
    ("listed-twice", ["g6e.2xlarge", "g6e.2xlarge"], "extraInstanceTypes[1]", ("listed twice",)),
    ("the-pools-own-type", ["g6e.xlarge"], "extraInstanceTypes[0]", ("listed twice",)),
    ("not-a-gpu-type", ["m7i.large"], "extraInstanceTypes[0]", ("not a GPU type of aws", "did you mean")),
    (
        "other-gpus",
        ["g5.2xlarge"],
        "extraInstanceTypes[0]",
        ("has 1 x nvidia-a10g (x86_64), not the 1 x nvidia-l40s (x86_64) of g6e.xlarge", "same GPUs"),
    ),
    (
        "more-gpus",
        ["g6e.12xlarge"],
        "extraInstanceTypes[0]",
        ("has 4 x nvidia-l40s",),
    ),
]


@pytest.mark.parametrize(("extra", "path", "words"), [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_a_type_that_does_not_fit_the_pool_is_refused(aws_eks_config, extra, path, words):
    assert_refused_before_any_resource(
        aws_eks_config, set_path("gpuPools.0.extraInstanceTypes", extra), f"gpuPools[0].{path}", words
    )


def test_a_smaller_type_is_refused_with_the_swap_that_fixes_it(aws_eks_config):
    def mutate(cluster: dict[str, Any]) -> None:
        cluster["gpuPools"][0].update(instanceType="g6e.2xlarge", extraInstanceTypes=["g6e.xlarge"])

    assert_refused_before_any_resource(
        aws_eks_config,
        mutate,
        "gpuPools[0].extraInstanceTypes[0]",
        (
            "is smaller than g6e.2xlarge (4 vCPUs and 32.0 GiB against 8 and 64.0)",
            "make g6e.xlarge the pool's",
        ),
    )


def test_several_types_on_gcp_or_in_a_capacity_block_are_refused(gcp_k3s_config, aws_eks_config):
    assert_refused_before_any_resource(
        gcp_k3s_config,
        set_path("gpuPools.0.extraInstanceTypes", ["g2-standard-8"]),
        "gpuPools[0].extraInstanceTypes",
        ("has one machine type",),
    )

    def in_a_block(cluster: dict[str, Any]) -> None:
        cluster["gpuPools"][3].update(
            capacityReservationId="cr-02168da1478b509e0", extraInstanceTypes=["p5e.48xlarge"]
        )

    assert_refused_before_any_resource(
        aws_eks_config,
        in_a_block,
        "gpuPools[3].extraInstanceTypes",
        ("launches the block's instance type only",),
    )


class _OfferedApart:
    """Mocks in which g6e.xlarge is offered in use1-az2 only and g6e.2xlarge in use1-az4 only."""

    def __init__(self):
        from gpu_k8s.tools.engine import RealisticMocks

        self.inner = RealisticMocks()

    def new_resource(self, args):
        return self.inner.new_resource(args)

    def call(self, args):
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            located = {"g6e.xlarge": ["use1-az2"], "g6e.2xlarge": ["use1-az4"]}
            instance_type = args.args["filters"][0]["values"][0]
            if instance_type in located:
                return {"locations": located[instance_type], "id": "x"}, []
        return self.inner.call(args)


def test_types_no_zone_offers_together_are_refused(aws_eks_config):
    config = _with_extra_types(aws_eks_config, 0, ["g6e.2xlarge"])
    with pytest.raises(ConfigError) as caught:
        run_program("apart", config, mocks=_OfferedApart())
    (issue,) = caught.value.issues
    assert issue.path == "gpu-k8s:cluster.gpuPools[0].extraInstanceTypes"
    assert "g6e.xlarge in use1-az2; g6e.2xlarge in use1-az4" in issue.problem


def test_a_pool_lives_in_the_zones_that_offer_all_its_types(aws_eks_config):
    class _MostlyTogether(_OfferedApart):
        def call(self, args):
            offerings = args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings"
            if offerings and args.args["filters"][0]["values"][0] == "g6e.2xlarge":
                return {"locations": ["use1-az2", "use1-az5"], "id": "x"}, []
            return self.inner.call(args)

    rec = run_program(
        "together", _with_extra_types(aws_eks_config, 0, ["g6e.2xlarge"]), mocks=_MostlyTogether()
    )
    groups = [
        g
        for g in rec.by_type("aws:eks/nodeGroup:NodeGroup")
        if g.inputs["labels"]["gpu-k8s.io/pool"] == "l40s"
    ]
    # us-east-1a (use1-az2) and us-east-1d (use1-az5): private subnets 0 and 2; maxNodes 4 split 2 + 2.
    assert sorted((g.inputs["subnetIds"][0], g.inputs["scalingConfig"]["maxSize"]) for g in groups) == sorted(
        [(rec.by_name("ml-network-private-0").id, 2), (rec.by_name("ml-network-private-2").id, 2)]
    )
