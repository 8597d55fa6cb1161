"""`gpuPools[].interconnect: efa` on EKS and on k3s agents: the launch template's EFA interfaces, one zone and
a cluster placement group, what scale-from-zero and the pool's queue know about the interfaces, the EFA
device plugin, on k3s the EFA security group and the node's huge pages and locked-memory limit, and the
refusals where EFA cannot be had."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from gpu_k8s.components.availability import AWS_NETWORK_CARDS_FILE
from gpu_k8s.components.catalog import load_catalog
from gpu_k8s.providers.aws.efa import EfaInterface, efa_layout, network_cards
from gpu_k8s.tools.engine import Recording, run_program
from tests.conftest import (
    AWS_K3S_EFA_POOL,
    assert_refused_before_any_resource,
    ec2_cloud_config,
    set_path,
    some,
)
from tests.test_examples import plan_existing_eks

POOL = "ml-gpu-h100-train"
EFA = "vpc.amazonaws.com/efa"


def assert_efa_only_layout_of_a_p5(interfaces: list[dict[str, Any]]) -> None:
    """p5.48xlarge: 32 network cards, each taking EFA (components/data/aws-network-cards.json): an EFA with
    ENA as the primary, an EFA-only as device 0 of each other card, card 0's second interface left to the
    VPC CNI."""
    layout = [(i["networkCardIndex"], i["deviceIndex"], i["interfaceType"]) for i in interfaces]
    assert layout == [(0, 0, "efa")] + [(card, 0, "efa-only") for card in range(1, 32)]


def test_each_network_card_gets_an_efa_carrying_the_cluster_security_group(aws_eks):
    template = aws_eks.by_name(f"{POOL}-lt").inputs
    interfaces = template["networkInterfaces"]
    assert_efa_only_layout_of_a_p5(interfaces)
    (cluster,) = aws_eks.by_type("aws:eks/cluster:Cluster")
    security_group = cluster.outputs["vpcConfig"]["clusterSecurityGroupId"]
    assert all(i["securityGroups"] == [security_group] for i in interfaces)
    assert all("subnetId" not in i for i in interfaces)
    assert "vpcSecurityGroupIds" not in template


def test_destroy_removes_the_groups_and_template_before_the_placement_group(aws_eks):
    """Pulumi deletes dependents first: the node group (its instances) before the launch template, the
    template before the placement group, which EC2 refuses to delete while instances are in it."""
    placement = aws_eks.by_name(f"{POOL}-placement")
    template = aws_eks.by_name(f"{POOL}-lt")
    assert placement.urn in template.dependencies
    (group,) = [g for g in aws_eks.by_type("aws:eks/nodeGroup:NodeGroup") if g.name.startswith(f"{POOL}-ng-")]
    assert template.urn in group.dependencies


def test_an_efa_pool_lives_in_one_zone_and_one_cluster_placement_group(aws_eks):
    (group,) = [g for g in aws_eks.by_type("aws:eks/nodeGroup:NodeGroup") if g.name.startswith(f"{POOL}-ng-")]
    assert group.inputs["scalingConfig"]["maxSize"] == 2 and len(group.inputs["subnetIds"]) == 1
    placement = aws_eks.by_name(f"{POOL}-placement")
    assert placement.inputs["strategy"] == "cluster"
    assert aws_eks.by_name(f"{POOL}-lt").inputs["placement"] == {"groupName": placement.outputs["name"]}


def test_scale_from_zero_and_the_queue_know_the_interfaces(aws_eks):
    tags = {
        r.inputs["tag"]["key"].rsplit("/resources/", 1)[1]: r.inputs["tag"]["value"]
        for r in aws_eks.by_type("aws:autoscaling/tag:Tag")
        if r.name.startswith(f"{POOL}-0-tag-resources-")
    }
    assert tags == {
        "nvidia.com/gpu": "8",
        EFA: "32",
        # The 5120Mi EKS's NCCL test asks for (what an EKS EFA node reserves is unconfirmed: AN-D4), and
        # 85% of the 500 GiB volume, under the kubelet's allocatable (AN-D3).
        "hugepages-2Mi": "5120Mi",
        "ephemeral-storage": "425Gi",
    }
    (queue,) = [
        r
        for r in aws_eks.by_type("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue")
        if r.inputs["metadata"]["name"] == "h100-train"
    ]
    resources = queue.inputs["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    assert {r["name"]: int(r["nominalQuota"]) for r in resources} == {"nvidia.com/gpu": 16, EFA: 64}


def test_the_efa_device_plugin_tolerates_the_efa_pools(aws_eks, gcp_gke, aws_k3s):
    release = aws_eks.by_name("ml-efa-device-plugin-release").inputs
    assert (release["chart"], release["version"]) == ("aws-efa-k8s-device-plugin", "v0.5.30")
    assert release["values"]["tolerations"] == [
        {"key": "gpu-k8s.io/interconnect", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists"},
    ]
    for without_efa in (gcp_gke, aws_k3s):  # the aws-k3s example stack has no EFA pool
        assert not [r for r in without_efa.registrations if "efa-device-plugin" in r.name]
    for name in ("ml-gpu-l40s-lt", "ml-gpu-h100-lt"):
        assert "networkInterfaces" not in aws_eks.by_name(name).inputs


def test_a_pool_in_a_capacity_block_keeps_the_blocks_placement(aws_eks_config):
    config = copy.deepcopy(aws_eks_config)
    pools = config["gpu-k8s:cluster"]["gpuPools"]
    (train,) = [p for p in pools if p["name"] == "h100-train"]
    train["capacityReservationId"] = "cr-02168da1478b509e0"
    recording = run_program("block-efa", config)
    assert not recording.by_type("aws:ec2/placementGroup:PlacementGroup")
    assert_efa_only_layout_of_a_p5(recording.by_name(f"{POOL}-lt").inputs["networkInterfaces"])


def test_the_gpu_layer_on_an_existing_cluster_uses_its_security_group():
    from tests.test_examples import plan_existing_eks

    recording: Recording = plan_existing_eks(
        {"gpuPools": [{"name": "train", "instanceType": "p5.48xlarge", "maxNodes": 2, "interconnect": "efa"}]}
    )
    interfaces = recording.by_name("gpus-gpu-train-lt").inputs["networkInterfaces"]
    groups = {group for interface in some(interfaces, at_least=32) for group in interface["securityGroups"]}
    assert len(groups) == 1 and next(iter(groups)).startswith("sg-")
    assert recording.by_name("gpus-efa-device-plugin-release")


def _with_pool(**pool: Any):
    def mutate(cluster: dict[str, Any]) -> None:
        cluster["gpuPools"] = [{"name": "train", "maxNodes": 2, **pool}]

    return mutate


BAD_INTERCONNECTS = [
    (
        "no-efa-on-type",
        _with_pool(instanceType="g5.xlarge", interconnect="efa"),
        "gpu-k8s:cluster.gpuPools[0].interconnect",
        ("g5.xlarge has no EFA", "g5.12xlarge"),
    ),
    (
        "unknown-interconnect",
        _with_pool(instanceType="p5.48xlarge", interconnect="infiniband"),
        "gpu-k8s:cluster.gpuPools[0].interconnect",
        ("not an interconnect of aws", "use efa"),
    ),
    (
        "efa-with-extra-types",
        _with_pool(instanceType="p5.48xlarge", interconnect="efa", extraInstanceTypes=["p5e.48xlarge"]),
        "gpu-k8s:cluster.gpuPools[0].extraInstanceTypes",
        ("runs one instance type",),
    ),
]


@pytest.mark.parametrize(
    ("mutation", "path", "words"), [c[1:] for c in BAD_INTERCONNECTS], ids=[c[0] for c in BAD_INTERCONNECTS]
)
def test_efa_where_it_cannot_be_had_is_refused(aws_eks_config, mutation, path, words):
    assert_refused_before_any_resource(aws_eks_config, mutation, path, words)


def test_efa_is_refused_on_gcp_and_on_k3s_types_without_it(gcp_gke_config, aws_k3s_config):
    assert_refused_before_any_resource(
        gcp_gke_config,
        set_path("gpuPools.0.interconnect", "efa"),
        "gpu-k8s:cluster.gpuPools[0].interconnect",
        ("not an interconnect of gcp (GPUDirect", "multi-networking", "use compact"),
    )
    assert_refused_before_any_resource(
        aws_k3s_config,
        _with_pool(instanceType="g5.xlarge", interconnect="efa"),
        "gpu-k8s:cluster.gpuPools[0].interconnect",
        ("g5.xlarge has no EFA",),
    )


# --- k3s agents -------------------------------------------------------------------------------------------

K3S_POOL = "ml-gpu-train"


def k3s_groups(recording: Recording) -> dict[str, Any]:
    return {r.name: r for r in recording.by_type("aws:ec2/securityGroup:SecurityGroup")}


def test_k3s_efa_interfaces_carry_the_efa_group_and_the_primary_the_nodes_group_too(aws_k3s_efa):
    """Every EFA needs the group that admits EFA traffic; the node's own traffic (k3s ports, the cloud
    controller's balancers) uses the primary, which also carries the `nodes` group."""
    template = aws_k3s_efa.by_name(f"{K3S_POOL}-lt").inputs
    interfaces = template["networkInterfaces"]
    assert_efa_only_layout_of_a_p5(interfaces)
    groups = k3s_groups(aws_k3s_efa)
    nodes, efa = groups["ml-nodes-sg"].id, groups["ml-efa-sg"].id
    assert interfaces[0]["securityGroups"] == [nodes, efa]
    assert all(i["securityGroups"] == [efa] for i in interfaces[1:])
    assert "vpcSecurityGroupIds" not in template
    # One zone: the interfaces and the pool's one Auto Scaling group are in the same private subnet.
    (group,) = [g for g in aws_k3s_efa.by_type("aws:autoscaling/group:Group") if g.name.startswith(K3S_POOL)]
    assert group.inputs["maxSize"] == 2
    assert {i["subnetId"] for i in interfaces} == set(group.inputs["vpcZoneIdentifiers"])
    placement = aws_k3s_efa.by_name(f"{K3S_POOL}-placement")
    assert placement.inputs["strategy"] == "cluster"
    assert template["placement"] == {"groupName": placement.outputs["name"]}
    # Destroy order: the group (its instances and their interfaces) before the template, the template before
    # the placement group and the EFA security group, which EC2 refuses to delete while in use.
    template_urn = aws_k3s_efa.by_name(f"{K3S_POOL}-lt").urn
    assert template_urn in group.dependencies
    assert {placement.urn, groups["ml-efa-sg"].urn} <= set(aws_k3s_efa.by_name(f"{K3S_POOL}-lt").dependencies)


def test_the_k3s_efa_group_is_open_to_itself_only_and_not_the_controllers(aws_k3s_efa):
    """All traffic in and out between EFA interfaces (EC2: OS bypass needs it), nothing from or to anywhere
    else; no cluster tag, so the AWS cloud controller never adds balancer rules to it."""
    efa = k3s_groups(aws_k3s_efa)["ml-efa-sg"]
    assert not any(key.startswith("kubernetes.io/cluster/") for key in efa.inputs["tags"])
    rules = [
        r
        for r in aws_k3s_efa.registrations
        if r.type.startswith("aws:vpc/securityGroup") and r.inputs["securityGroupId"] == efa.id
    ]
    assert sorted((r.type.rsplit(":", 1)[1], r.inputs["ipProtocol"]) for r in rules) == [
        ("SecurityGroupEgressRule", "-1"),
        ("SecurityGroupIngressRule", "-1"),
    ]
    assert all(r.inputs["referencedSecurityGroupId"] == efa.id and "cidrIpv4" not in r.inputs for r in rules)


def test_a_k3s_efa_node_reserves_the_huge_pages_its_template_advertises(aws_k3s_efa):
    """The agent's kernel reserves 5128 huge pages before k3s starts, the kubelet reports them, and a pool
    at zero shows the autoscaler exactly that much (`hugepages-2Mi` = 5128 x 2Mi) next to its 32 EFAs. k3s
    (and so containerd and every container) runs without a locked-memory cap."""

    from gpu_k8s.components.k3s.paths import AGENT_POOL_UNIT_DROP_IN, POOL_SYSCTL_FILE
    from tests.node_boot import file_content

    user_data = yaml.safe_load(ec2_cloud_config(aws_k3s_efa.by_name(f"{K3S_POOL}-lt").inputs))
    files = {f["path"]: file_content(f) for f in user_data["write_files"]}
    assert files[POOL_SYSCTL_FILE] == "vm.nr_hugepages=5128\n"
    assert files[AGENT_POOL_UNIT_DROP_IN] == "[Service]\nLimitMEMLOCK=infinity\n"
    (group,) = [g for g in aws_k3s_efa.by_type("aws:autoscaling/group:Group") if g.name.startswith(K3S_POOL)]
    tags = {
        t["key"].rsplit("/resources/", 1)[1]: t["value"]
        for t in group.inputs["tags"]
        if "/resources/" in t["key"]
    }
    assert tags[EFA] == "32"
    assert tags["hugepages-2Mi"] == f"{5128 * 2}Mi"
    # Pools without EFA get neither.
    other = yaml.safe_load(ec2_cloud_config(aws_k3s_efa.by_name("ml-gpu-l4-lt").inputs))
    assert not {POOL_SYSCTL_FILE, AGENT_POOL_UNIT_DROP_IN} & {f["path"] for f in other["write_files"]}


def test_k3s_runs_the_efa_device_plugin_tolerating_the_efa_pool(aws_k3s_efa):
    release = aws_k3s_efa.by_name("ml-efa-device-plugin-release").inputs
    assert (release["chart"], release["version"]) == ("aws-efa-k8s-device-plugin", "v0.5.30")
    assert release["values"]["tolerations"] == [
        {"key": "gpu-k8s.io/interconnect", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists"},
    ]


def test_adding_an_efa_pool_to_a_running_k3s_cluster_changes_nothing_it_has(aws_k3s, aws_k3s_efa):
    """Day 2: the servers, the other pools' templates and groups and the `nodes` group keep their inputs;
    the EFA group, its rules, the pool and the device plugin are new."""
    before = {r.urn: r for r in aws_k3s.registrations}
    after = {r.urn: r for r in aws_k3s_efa.registrations}
    assert set(before) <= set(after)
    changed = {before[urn].name: urn for urn, r in before.items() if after[urn].inputs != r.inputs}
    # Only the device plugin's configs, which gain the new pool's (as for any new pool), the zone placement
    # guard, which records where the new pool is placed, the GPU Operator, whose pods tolerate the new
    # pool's interconnect taint, and monitoring's rules, whose price rules gain the pool; the autoscaler
    # finds the new group by its tags.
    assert sorted(changed) == [
        "ml-gpu-operator-device-plugin-config",
        "ml-gpu-operator-release",
        "ml-monitoring-gpu-alerts",
        "ml-zone-placement",
    ]
    rules = changed.pop("ml-monitoring-gpu-alerts")
    priced = [
        {
            rule["labels"]["label_gpu_k8s_io_pool"]
            for group in r.inputs["spec"]["groups"]
            for rule in group["rules"]
            if rule.get("record") == "gpu_k8s:pool_node_price_usd_per_hour"
        }
        for r in (before[rules], after[rules])
    ]
    assert priced[1] - priced[0] == {"train"}
    operator = changed.pop("ml-gpu-operator-release")
    values_before, values_after = before[operator].inputs["values"], after[operator].inputs["values"]
    toleration = {"key": "gpu-k8s.io/interconnect", "operator": "Exists", "effect": "NoSchedule"}
    tolerations_after = values_after["daemonsets"]["tolerations"]
    assert [t for t in tolerations_after if t not in values_before["daemonsets"]["tolerations"]] == [
        toleration
    ]
    placement = changed.pop("ml-zone-placement")
    pools_before, pools_after = before[placement].inputs["pools"], after[placement].inputs["pools"]
    assert set(pools_after) - set(pools_before) == {"train"}
    assert {key: pools_after[key] for key in pools_before} == pools_before
    (urn,) = changed.values()
    configs_before, configs_after = before[urn].inputs["data"], after[urn].inputs["data"]
    assert set(configs_after) - set(configs_before) == {"train"}
    assert {key: configs_after[key] for key in configs_before} == configs_before
    added = {after[urn].name for urn in set(after) - set(before)}
    assert {"ml-efa-sg", "ml-efa-in", "ml-efa-out", f"{K3S_POOL}-lt", f"{K3S_POOL}-placement"} <= added
    assert "ml-efa-device-plugin-release" in added


def test_a_k3s_efa_pool_in_a_capacity_block_keeps_the_blocks_placement(aws_k3s_config):
    config = copy.deepcopy(aws_k3s_config)
    config["gpu-k8s:cluster"]["gpuPools"].append(
        {**AWS_K3S_EFA_POOL, "capacityReservationId": "cr-02168da1478b509e0"}
    )
    recording = run_program("aws-k3s", config)
    assert not recording.by_type("aws:ec2/placementGroup:PlacementGroup")
    template = recording.by_name(f"{K3S_POOL}-lt").inputs
    assert_efa_only_layout_of_a_p5(template["networkInterfaces"])
    assert "placement" not in template


INTERCONNECT_TAINT = {"key": "gpu-k8s.io/interconnect", "value": "efa", "effect": "NoSchedule"}


def test_an_efa_pool_takes_only_work_that_asks_for_it(aws_eks, gcp_gke):
    """review-aws.md AN-D1: with only the GPU taint, any GPU pod that fits could start a p5.48xlarge. The
    EFA pool's nodes carry gpu-k8s.io/interconnect=efa:NoSchedule, which a group at zero shows the
    autoscaler, the pool's Kueue flavor adds to the jobs it admits, the pod usage output names, and the GPU
    Operator's and NFD's pods tolerate. Pools without an interconnect device (GKE compact) carry none."""
    (group,) = [
        g for g in aws_eks.by_type("aws:eks/nodeGroup:NodeGroup") if g.name.startswith("ml-gpu-h100-train")
    ]
    assert {"key": "gpu-k8s.io/interconnect", "value": "efa", "effect": "NO_SCHEDULE"} in group.inputs[
        "taints"
    ]
    tags = {
        t.inputs["tag"]["key"]: t.inputs["tag"]["value"]
        for t in aws_eks.by_type("aws:autoscaling/tag:Tag")
        if t.name.startswith("ml-gpu-h100-train-")
    }
    assert tags["k8s.io/cluster-autoscaler/node-template/taint/gpu-k8s.io/interconnect"] == "efa:NoSchedule"
    flavor = aws_eks.by_name("ml-batch-h100-train-flavor").inputs["spec"]
    assert {**INTERCONNECT_TAINT, "operator": "Equal"} in flavor["tolerations"]
    (usage,) = [p["usage"] for p in aws_eks.outputs["gpuPools"] if p["name"] == "h100-train"]
    assert {**INTERCONNECT_TAINT, "operator": "Equal"} in usage["tolerations"]
    operator = aws_eks.by_name("ml-gpu-operator-release").inputs["values"]
    expected = {"key": "gpu-k8s.io/interconnect", "operator": "Exists", "effect": "NoSchedule"}
    assert expected in operator["daemonsets"]["tolerations"]
    assert expected in operator["node-feature-discovery"]["worker"]["tolerations"]
    # Pools without an interconnect, and GKE's compact placement (no device to ask for), carry none.
    others = [
        g
        for g in aws_eks.by_type("aws:eks/nodeGroup:NodeGroup")
        if not g.name.startswith("ml-gpu-h100-train")
    ]
    assert some(others, at_least=4)
    assert not [
        g.name
        for g in others
        if any(t["key"] == "gpu-k8s.io/interconnect" for t in g.inputs.get("taints") or [])
    ]
    for pool in gcp_gke.by_type("gcp:container/nodePool:NodePool"):
        taints = (pool.inputs.get("nodeConfig") or {}).get("taints") or []
        assert not [t for t in taints if t["key"] == "gpu-k8s.io/interconnect"], pool.name


def test_a_k3s_efa_node_registers_with_the_interconnect_taint(aws_k3s_efa):

    from gpu_k8s.components.k3s import paths
    from tests.conftest import node_drop_in, user_data_files

    data = ec2_cloud_config(aws_k3s_efa.by_name("ml-gpu-train-lt").inputs)
    node = node_drop_in(user_data_files(data)[paths.BOOTSTRAP_FILE])
    assert "gpu-k8s.io/interconnect=efa:NoSchedule" in node["node-taint"]


P6_B300 = "p6-b300.48xlarge"


def efa_count(layout: list[EfaInterface]) -> int:
    return sum(i.interface_type in ("efa", "efa-only") for i in layout)


@pytest.mark.parametrize("efa_only", [True, False])
def test_every_efa_type_gets_as_many_efas_as_ec2_allows_on_cards_that_take_them(efa_only):
    catalog = load_catalog()
    efa_types = [m for m in catalog.machine_types["aws"].values() if m.efa_max_interfaces]
    assert len(efa_types) >= 10
    table = json.loads(AWS_NETWORK_CARDS_FILE.read_text())["types"]
    for machine in efa_types:
        cards = network_cards(machine.name)
        layout = efa_layout(cards, efa_only)
        assert efa_count(layout) == machine.efa_max_interfaces == table[machine.name]["maximumEfaInterfaces"]
        assert all(i.interface_type in cards[i.network_card] for i in layout), machine.name
        # One primary, and no card given two interfaces of one device index.
        assert [(i.network_card, i.device) for i in layout].count((0, 0)) == 1
        assert len({(i.network_card, i.device) for i in layout}) == len(layout)


def test_a_card_without_efa_gets_none_and_the_primary_is_plain_ena():
    """p6-b300.48xlarge: 17 cards, card 0 takes only `interface`, 16 EFAs on cards 1-16 (the layout that
    put EFA on cards 0-15 would have failed at launch)."""
    cards = network_cards(P6_B300)
    assert cards[0] == ("interface",) and len(cards) == 17
    for efa_only, kind, device in ((True, "efa-only", 0), (False, "efa", 1)):
        layout = efa_layout(cards, efa_only)
        assert layout[0] == EfaInterface(0, 0, "interface")
        assert layout[1:] == [EfaInterface(card, device, kind) for card in range(1, 17)]


def test_a_card_that_takes_efa_but_not_efa_only_gets_an_efa_with_ena():
    """No catalog type has such a card today; a new type's would still get its EFA."""
    cards = {0: ("interface", "efa"), 1: ("interface", "efa"), 2: ("interface",)}
    assert efa_layout(cards, efa_only=True) == [EfaInterface(0, 0, "efa"), EfaInterface(1, 1, "efa")]


def test_a_one_card_type_gets_its_efa_on_the_primary():
    for efa_only in (True, False):
        assert efa_layout(network_cards("g5.48xlarge"), efa_only) == [EfaInterface(0, 0, "efa")]


def test_an_existing_cluster_gets_efa_with_ena_on_every_card():
    """Its VPC CNI is the user's and may predate EFA-only interfaces (1.18.5)."""
    pool = {"name": "train", "instanceType": "p5.48xlarge", "maxNodes": 2, "interconnect": "efa"}
    recording = plan_existing_eks({"gpuPools": [pool]})
    (template,) = [
        t
        for t in recording.by_type("aws:ec2/launchTemplate:LaunchTemplate")
        if "networkInterfaces" in t.inputs
    ]
    interfaces = template.inputs["networkInterfaces"]
    layout = [(i["networkCardIndex"], i["deviceIndex"], i["interfaceType"]) for i in interfaces]
    assert layout == [(0, 0, "efa")] + [(card, 1, "efa") for card in range(1, 32)]
