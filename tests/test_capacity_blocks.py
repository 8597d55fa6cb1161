"""GPU pools in EC2 Capacity Blocks for ML (gpuPools[].capacityReservationId), on aws-eks and aws-k3s.

A block is a targeted reservation of one instance type in one zone for a fixed time: the pool's template
names the block and its type with the capacity-block market, its groups live only in the block's zone, and
the pool cannot ask for more nodes than the block holds.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_k8s.components.configbase import ConfigError
from gpu_k8s.tools.engine import Recording, run_program
from tests.conftest import assert_refused_before_any_resource, set_path

BLOCK_ID = "cr-02168da1478b509e0"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"


class _Blocks:
    """The realistic mocks, with EC2's answer about the Capacity Block replaced field by field."""

    def __init__(self, **block: Any):
        from gpu_k8s.tools.engine import RealisticMocks

        self.inner = RealisticMocks()
        self.block = block

    def new_resource(self, args):
        return self.inner.new_resource(args)

    def call(self, args):
        answer, failures = self.inner.call(args)
        if args.token == "aws:ec2/getCapacityBlockReservation:getCapacityBlockReservation":
            assert args.args["id"] == BLOCK_ID
            answer = {**answer, **self.block}
        return answer, failures


def _in_block(config: dict[str, Any], pool: int, **keys: Any) -> dict[str, Any]:
    """The stack config with one pool launched into BLOCK_ID."""
    config = copy.deepcopy(config)
    config["gpu-k8s:cluster"]["gpuPools"][pool].update({"capacityReservationId": BLOCK_ID, **keys})
    return config


def _h100_template(rec: Recording) -> dict[str, Any]:
    (template,) = [t for t in rec.by_type(LAUNCH_TEMPLATE) if t.name == "ml-gpu-h100-lt"]
    return template.inputs


@pytest.fixture(scope="module")
def eks_in_block(aws_eks_config) -> Recording:
    return run_program("eks-block", _in_block(aws_eks_config, 3), mocks=_Blocks())


@pytest.fixture(scope="module")
def k3s_in_block(aws_k3s_config) -> Recording:
    return run_program("k3s-block", _in_block(aws_k3s_config, 1), mocks=_Blocks())


def test_an_eks_pool_in_a_block_launches_into_it_from_its_template(eks_in_block):
    template = _h100_template(eks_in_block)
    assert template["instanceType"] == "p5.48xlarge"
    assert template["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert template["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": BLOCK_ID}
    }
    groups = [
        g
        for g in eks_in_block.by_type("aws:eks/nodeGroup:NodeGroup")
        if g.inputs["labels"]["gpu-k8s.io/pool"] == "h100"
    ]
    # The block is in zone c (use1-az4 here), the cluster's second zone (EKS skips use1-az3): one group
    # there, the block's size.
    assert [(g.inputs["subnetIds"], g.inputs["scalingConfig"]) for g in groups] == [
        ([eks_in_block.by_name("ml-network-private-1").id], {"minSize": 0, "maxSize": 2, "desiredSize": 0})
    ]
    (group,) = groups
    assert group.inputs["capacityType"] == "CAPACITY_BLOCK"
    # EKS refuses an instance type in both the template and the group.
    assert "instanceTypes" not in group.inputs


def test_eks_pools_outside_blocks_keep_their_market(eks_in_block):
    templates = [t.inputs for t in eks_in_block.by_type(LAUNCH_TEMPLATE) if t.name != "ml-gpu-h100-lt"]
    assert len(templates) == 5
    for template in templates:
        assert not {"instanceType", "instanceMarketOptions", "capacityReservationSpecification"} & set(
            template
        )
    for group in eks_in_block.by_type("aws:eks/nodeGroup:NodeGroup"):
        if group.inputs["labels"]["gpu-k8s.io/pool"] != "h100":
            assert group.inputs["capacityType"] in ("SPOT", "ON_DEMAND")
            assert len(group.inputs["instanceTypes"]) == 1


def test_a_k3s_pool_in_a_block_launches_into_it_in_its_zone(k3s_in_block):
    template = _h100_template(k3s_in_block)
    assert template["instanceType"] == "p5.48xlarge"
    assert template["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert template["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": BLOCK_ID}
    }
    groups = [g for g in k3s_in_block.by_type("aws:autoscaling/group:Group") if "h100" in g.name]
    assert [(g.inputs["vpcZoneIdentifiers"], g.inputs["maxSize"]) for g in groups] == [
        ([k3s_in_block.by_name("ml-network-private-1").id], 1)
    ]
    tags = {t["key"]: t["value"] for t in groups[0].inputs["tags"]}
    # The label the termination handler selects spot nodes by, here truthful and not "spot".
    assert tags["k8s.io/cluster-autoscaler/node-template/label/gpu-k8s.io/capacity-type"] == "capacity-block"


# --- refused -------------------------------------------------------------------------------------------

SPEC_REFUSALS = [
    ("not-a-reservation-id", "cb-0123456789abcdef0", {}, ("not a capacity reservation ID", "cr-")),
    ("spot-in-a-block", BLOCK_ID, {"spot": True}, ("not spot", "spot: false")),
]


@pytest.mark.parametrize(
    ("block", "keys", "words"), [c[1:] for c in SPEC_REFUSALS], ids=[c[0] for c in SPEC_REFUSALS]
)
def test_a_malformed_block_is_refused_before_any_resource(aws_eks_config, block, keys, words):
    mutation = set_path("gpuPools.3", {**aws_eks_config["gpu-k8s:cluster"]["gpuPools"][3], **keys})

    def mutate(cluster: dict[str, Any]) -> None:
        mutation(cluster)
        cluster["gpuPools"][3]["capacityReservationId"] = block

    assert_refused_before_any_resource(aws_eks_config, mutate, "gpuPools[3].capacityReservationId", words)


def test_a_block_on_gcp_is_refused(gcp_gke_config):
    assert_refused_before_any_resource(
        gcp_gke_config,
        set_path("gpuPools.0.capacityReservationId", BLOCK_ID),
        "gpuPools[0].capacityReservationId",
        ("an AWS offer", "remove it"),
    )


EC2_REFUSALS = [
    (
        "block-of-another-type",
        {"instanceType": "p4d.24xlarge"},
        {},
        "gpuPools[3].capacityReservationId",
        ("reserves p4d.24xlarge, not the pool's p5.48xlarge", "instanceType to p4d.24xlarge"),
    ),
    (
        "block-outside-the-clusters-zones",
        {"availabilityZoneId": "use1-az6", "availabilityZone": "us-east-1f"},
        {},
        "gpuPools[3].capacityReservationId",
        ("is in zone use1-az6, none of the cluster's", "use1-az2"),
    ),
    (
        "more-nodes-than-the-block-holds",
        {"instanceCount": 1},
        {},
        "gpuPools[3].maxNodes",
        ("holds 1 instances", "at most 1"),
    ),
    (
        "block-expired",
        {"state": "expired"},
        {},
        "gpuPools[3].capacityReservationId",
        ("is expired", "name a current block"),
    ),
    (
        "minimum-before-the-block-starts",
        {"state": "scheduled"},
        {"minNodes": 1},
        "gpuPools[3].minNodes",
        ("is scheduled, not active yet", "minNodes to 0"),
    ),
]


@pytest.mark.parametrize(
    ("block", "keys", "path", "words"), [c[1:] for c in EC2_REFUSALS], ids=[c[0] for c in EC2_REFUSALS]
)
def test_a_block_that_does_not_fit_the_pool_is_refused(aws_eks_config, block, keys, path, words):
    with pytest.raises(ConfigError) as caught:
        run_program("misfit", _in_block(aws_eks_config, 3, **keys), mocks=_Blocks(**block))
    (issue,) = caught.value.issues
    message = str(caught.value)
    assert issue.path.endswith(path), message
    for word in words:
        assert word in message, message


def test_a_scheduled_block_with_no_minimum_plans(aws_k3s_config):
    """Before the block starts, a pool starting empty is fine: its nodes launch once pods ask and the block
    is active."""
    rec = run_program("scheduled", _in_block(aws_k3s_config, 1), mocks=_Blocks(state="scheduled"))
    assert _h100_template(rec)["capacityReservationSpecification"]


def test_what_a_block_pool_sends_is_what_ec2_and_eks_accept(eks_in_block, k3s_in_block):
    """The values against botocore's models of the EC2 and EKS APIs."""
    import botocore.session

    session = botocore.session.get_session()
    ec2, eks = session.get_service_model("ec2"), session.get_service_model("eks")
    for rec in (eks_in_block, k3s_in_block):
        template = _h100_template(rec)
        assert template["instanceMarketOptions"]["marketType"] in ec2.shape_for("MarketType").enum
        assert template["instanceType"] in ec2.shape_for("InstanceType").enum
        target = template["capacityReservationSpecification"]["capacityReservationTarget"]
        members = ec2.shape_for("CapacityReservationTarget").members
        assert {key[0].upper() + key[1:] for key in target} <= set(members)
    for group in eks_in_block.by_type("aws:eks/nodeGroup:NodeGroup"):
        assert group.inputs["capacityType"] in eks.shape_for("CapacityTypes").enum
