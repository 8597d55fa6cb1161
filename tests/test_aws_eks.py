"""Graph tests of the aws-eks stack: what `pulumi up` would register, with inputs, parents and options."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpu_k8s.components.catalog import load_catalog
from gpu_k8s.providers.aws.autoscaling import TEMPLATE_PREFIX
from gpu_k8s.tools.engine import Recording, Registration, Secret, run_program
from tests.conftest import assert_refused_before_any_resource, some

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
# name: (instance type, spot, maxNodes, disk GiB) as the example stack file says.
GPU_POOLS = {
    "l40s": ("g6e.xlarge", True, 4, 200),
    "a10g-shared": ("g5.xlarge", True, 4, 200),
    "l4-mps": ("g6.12xlarge", False, 2, 200),
    "h100": ("p5.48xlarge", False, 2, 500),
    "h100-train": ("p5.48xlarge", False, 2, 500),
}
# Schedulable nvidia.com/gpu per node, worked out by hand: 1 L40S whole; 1 A10G x 4 time-slices;
# 4 L4 x 4 MPS clients; 8 H100 x 7 MIG 1g.10gb slices (single strategy: advertised as nvidia.com/gpu).
GPU_SLOTS_PER_NODE = {"l40s": 1, "a10g-shared": 4, "l4-mps": 16, "h100": 56, "h100-train": 8}
# Pools whose slot is not a whole GPU carry a second taint that only pods meant for them tolerate.
SHARING_TAINT = {"a10g-shared": "timeSlicing", "l4-mps": "mps", "h100": "mig"}


def zone_node_groups(rec: Recording) -> dict[str, list[Registration]]:
    """pool -> its node groups, one per zone, in zone order."""
    groups: dict[str, list[Registration]] = {}
    for r in sorted(rec.by_type(NODE_GROUP), key=lambda r: r.name):
        if r.inputs["labels"]["gpu-k8s.io/pool"] != "system":
            groups.setdefault(r.inputs["labels"]["gpu-k8s.io/pool"], []).append(r)
    return groups


def gpu_node_groups(rec: Recording) -> dict[str, Registration]:
    """pool -> its first zone's node group (the groups of a pool differ only in zone and limits)."""
    return {pool: groups[0] for pool, groups in zone_node_groups(rec).items()}


def test_one_gpu_node_group_per_pool_with_nvidia_ami_taint_labels_and_min_zero(aws_eks):
    groups = gpu_node_groups(aws_eks)
    assert set(groups) == set(GPU_POOLS)
    catalog = load_catalog()
    for pool, (instance_type, spot, _, _) in GPU_POOLS.items():
        group = groups[pool].inputs
        model = catalog.machine_type("aws", instance_type).gpu_model.id
        assert group["amiType"] == "AL2023_x86_64_NVIDIA"
        assert group["instanceTypes"] == [instance_type]
        assert group["capacityType"] == ("SPOT" if spot else "ON_DEMAND")
        assert group["scalingConfig"]["minSize"] == 0 and group["scalingConfig"]["desiredSize"] == 0
        sharing = (
            [{"key": "gpu-k8s.io/sharing", "value": SHARING_TAINT[pool], "effect": "NO_SCHEDULE"}]
            if pool in SHARING_TAINT
            else []
        )
        # The EFA pool takes only jobs that ask for its fabric (tests/test_efa.py).
        interconnect = (
            [{"key": "gpu-k8s.io/interconnect", "value": "efa", "effect": "NO_SCHEDULE"}]
            if pool == "h100-train"
            else []
        )
        assert group["taints"] == [
            {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"},
            *sharing,
            *interconnect,
        ]
        assert group["labels"]["k8s.amazonaws.com/accelerator"] == model


def test_each_pool_has_one_node_group_per_zone_with_its_limits_split_over_them(aws_eks):
    """One zone per group (the autoscaler models a group in its first zone; a pod bound to a zonal volume
    elsewhere would never scale a multi-zone group up); the zones' maxima add up to the pool's."""
    subnets = [aws_eks.by_name(f"ml-network-private-{i}").id for i in range(3)]
    layout = {
        pool: [(g.inputs["subnetIds"], g.inputs["scalingConfig"]["maxSize"]) for g in groups]
        for pool, groups in zone_node_groups(aws_eks).items()
    }
    assert layout == {
        "l40s": [([subnets[0]], 2), ([subnets[1]], 1), ([subnets[2]], 1)],
        "a10g-shared": [([subnets[0]], 2), ([subnets[1]], 1), ([subnets[2]], 1)],
        "l4-mps": [([subnets[0]], 1), ([subnets[1]], 1)],
        "h100": [([subnets[0]], 1), ([subnets[1]], 1)],
        # EFA: one zone, one cluster placement group.
        "h100-train": [([subnets[0]], 2)],
    }
    for pool, groups in zone_node_groups(aws_eks).items():
        assert sum(g.inputs["scalingConfig"]["maxSize"] for g in groups) == GPU_POOLS[pool][2]
        # One launch template per pool, shared by its zones' groups.
        assert len({g.inputs["launchTemplate"]["id"] for g in groups}) == 1
        # Every zone's group carries the pool's scale-from-zero tags.
        for group in groups:
            assert [t for t in aws_eks.by_type("aws:autoscaling/tag:Tag") if group.urn in t.dependencies]


def test_gpu_node_groups_replace_nodes_one_at_a_time_without_a_surge_node(aws_eks):
    """MINIMAL: terminate, then launch (EKS API reference: meant for GPUs); DEFAULT would first need a
    second GPU instance of quota and capacity for every node it replaces."""
    groups = [g for zones in zone_node_groups(aws_eks).values() for g in zones]
    assert len(groups) == 11
    for group in groups:
        assert group.inputs["updateConfig"] == {"maxUnavailable": 1, "updateStrategy": "MINIMAL"}
    system = aws_eks.by_name("ml-system").inputs["updateConfig"]
    assert system == {"maxUnavailable": 1, "updateStrategy": "DEFAULT"}


def test_gpu_node_groups_ignore_the_autoscaled_desired_size(aws_eks):
    groups = gpu_node_groups(aws_eks)
    assert set(groups) == set(GPU_POOLS)
    for group in groups.values():
        assert group.options["ignoreChanges"] == ["scalingConfig.desiredSize"]


def test_gpu_launch_templates_encrypt_gp3_root_of_pool_size_and_require_imdsv2(aws_eks):
    for pool, (_, _, _, disk) in GPU_POOLS.items():
        template = aws_eks.by_name(f"ml-gpu-{pool}-lt").inputs
        (root,) = template["blockDeviceMappings"]
        assert root["deviceName"] == "/dev/xvda"
        assert root["ebs"] == {
            "volumeSize": disk,
            "volumeType": "gp3",
            "encrypted": "true",
            "deleteOnTermination": "true",
        }
        assert template["metadataOptions"]["httpTokens"] == "required"
        group = gpu_node_groups(aws_eks)[pool]
        assert aws_eks.by_name(f"ml-gpu-{pool}-lt").urn in group.dependencies


def test_system_pool_is_on_demand_cpu_with_at_least_one_node(aws_eks):
    system = aws_eks.by_name("ml-system").inputs
    assert system["capacityType"] == "ON_DEMAND"
    assert system["amiType"] == "AL2023_x86_64_STANDARD"
    assert system["scalingConfig"]["minSize"] >= 1
    assert "taints" not in system


def scale_from_zero_tags(rec: Recording, pool: str) -> dict[str, str]:
    group = gpu_node_groups(rec)[pool]
    tags = [r for r in rec.by_type("aws:autoscaling/tag:Tag") if group.urn in r.dependencies]
    return {t.inputs["tag"]["key"]: t.inputs["tag"]["value"] for t in tags}


@pytest.mark.parametrize("pool", sorted(GPU_POOLS))
def test_asg_template_tags_match_the_pool_spec(aws_eks, pool):
    group = gpu_node_groups(aws_eks)[pool].inputs
    tags = scale_from_zero_tags(aws_eks, pool)
    labels = {k.removeprefix(f"{TEMPLATE_PREFIX}/label/"): v for k, v in tags.items() if "/label/" in k}
    assert labels == group["labels"]
    taints = {k.removeprefix(f"{TEMPLATE_PREFIX}/taint/"): v for k, v in tags.items() if "/taint/" in k}
    sharing = {"gpu-k8s.io/sharing": f"{SHARING_TAINT[pool]}:NoSchedule"} if pool in SHARING_TAINT else {}
    interconnect = {"gpu-k8s.io/interconnect": "efa:NoSchedule"} if pool == "h100-train" else {}
    assert taints == {"nvidia.com/gpu": "true:NoSchedule", **sharing, **interconnect}
    resources = {
        k.removeprefix(f"{TEMPLATE_PREFIX}/resources/"): v for k, v in tags.items() if "/resources/" in k
    }
    # 85% of the root volume a node brings, under what the kubelet leaves allocatable (10% eviction threshold,
    # filesystem overhead, reserve): a pod asking for ephemeral storage scales a group up from zero, and fits.
    disk = GPU_POOLS[pool][3]
    # An EFA pool's nodes also bring their interfaces and the huge pages EKS's NCCL test asks for.
    efa = {"vpc.amazonaws.com/efa": "32", "hugepages-2Mi": "5120Mi"} if pool == "h100-train" else {}
    assert resources == {
        "nvidia.com/gpu": str(GPU_SLOTS_PER_NODE[pool]),
        "ephemeral-storage": f"{int(disk * 0.85)}Gi",
        **efa,
    }
    # Every pool uses the default idle time, which the autoscaler gets as its cluster-wide flag.
    assert not [key for key in tags if "autoscaling-options" in key]


def test_asg_tags_target_the_node_groups_own_asg_and_do_not_propagate(aws_eks):
    for pool in GPU_POOLS:
        group = gpu_node_groups(aws_eks)[pool]
        tags = some(r for r in aws_eks.by_type("aws:autoscaling/tag:Tag") if group.urn in r.dependencies)
        for tag in tags:
            assert tag.inputs["autoscalingGroupName"].startswith(f"eks-ml-gpu-{pool}-")
            assert tag.inputs["tag"]["propagateAtLaunch"] is False


def test_cluster_security_settings(aws_eks):
    cluster = aws_eks.by_type("aws:eks/cluster:Cluster")[0].inputs
    assert cluster["accessConfig"] == {
        "authenticationMode": "API",
        "bootstrapClusterCreatorAdminPermissions": False,
    }
    assert cluster["enabledClusterLogTypes"] == [
        "api",
        "audit",
        "authenticator",
        "controllerManager",
        "scheduler",
    ]
    assert cluster["encryptionConfig"]["resources"] == ["secrets"]
    assert cluster["vpcConfig"]["endpointPrivateAccess"] is True
    assert cluster["vpcConfig"]["publicAccessCidrs"] == ["203.0.113.0/24"]
    key = aws_eks.by_type("aws:kms/key:Key")[0]
    assert key.inputs["enableKeyRotation"] is True
    key = aws_eks.by_name("ml-secrets-key")
    assert (
        cluster["encryptionConfig"]["provider"]["keyArn"]
        == f"arn:aws:kms:us-east-1:123456789012:key/{key.id}"
    )


def test_deployer_gets_cluster_admin_through_an_access_entry(aws_eks):
    (entry,) = aws_eks.by_type("aws:eks/accessEntry:AccessEntry")
    (policy,) = aws_eks.by_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    # The IAM role behind the assumed-role session, not the session ARN EKS would reject.
    assert entry.inputs["principalArn"] == "arn:aws:iam::123456789012:role/deployer"
    assert policy.inputs["policyArn"].endswith("cluster-access-policy/AmazonEKSClusterAdminPolicy")
    assert policy.inputs["accessScope"] == {"type": "cluster"}


def test_addons_and_their_order(aws_eks):
    addons = {r.inputs["addonName"]: r for r in aws_eks.by_type("aws:eks/addon:Addon")}
    assert set(addons) == {
        "vpc-cni",
        "kube-proxy",
        "coredns",
        "eks-pod-identity-agent",
        "aws-ebs-csi-driver",
        "aws-efs-csi-driver",
        # review-aws.md F16: node auto-repair acts on GPU faults (Xid) only where this agent reports them.
        "eks-node-monitoring-agent",
    }
    assert "podIdentityAssociations" not in addons["eks-node-monitoring-agent"].inputs
    system = aws_eks.by_name("ml-system")
    for name in ("vpc-cni", "kube-proxy", "eks-pod-identity-agent"):
        assert addons[name].urn in system.dependencies
        for group in gpu_node_groups(aws_eks).values():
            assert addons[name].urn in group.dependencies
    assert system.urn in addons["coredns"].dependencies
    (association,) = addons["aws-ebs-csi-driver"].inputs["podIdentityAssociations"]
    assert association["serviceAccount"] == "ebs-csi-controller-sa"


def test_default_storage_class_is_encrypted_gp3_wait_for_first_consumer(aws_eks):
    storage = aws_eks.by_name("ml-storage-class")
    assert storage.inputs["metadata"]["annotations"] == {
        "storageclass.kubernetes.io/is-default-class": "true"
    }
    assert storage.inputs["parameters"] == {"type": "gp3", "encrypted": "true"}
    assert storage.inputs["volumeBindingMode"] == "WaitForFirstConsumer"


def test_kubeconfig_is_secret_and_uses_exec_auth(aws_eks):
    kubeconfig = aws_eks.outputs["kubeconfig"]
    assert isinstance(kubeconfig, Secret)
    user = json.loads(kubeconfig.value)["users"][0]["user"]
    assert user["exec"]["command"] == "aws"
    assert user["exec"]["args"][:2] == ["eks", "get-token"]
    provider = aws_eks.by_type("pulumi:providers:kubernetes")[0]
    assert isinstance(provider.inputs["kubeconfig"], Secret)


def test_kubernetes_provider_is_a_child_of_the_cluster_component(aws_eks):
    provider = aws_eks.by_type("pulumi:providers:kubernetes")[0]
    assert aws_eks.by_urn(provider.parent).type == "gpu-k8s:aws:EksCluster"


def test_every_custom_resource_has_an_explicit_provider(aws_eks):
    """Except the zone-placement guard, a dynamic resource: the Python language host serves it, as the only
    default provider the project allows (Pulumi.yaml)."""
    providers = {r.urn for r in aws_eks.registrations if r.type.startswith("pulumi:providers:")}
    dynamic = [r.name for r in aws_eks.registrations if r.type == "pulumi-python:dynamic:Resource"]
    assert dynamic == ["ml-zone-placement"]
    for resource in aws_eks.registrations:
        if resource.custom and resource.urn not in providers and resource.name not in dynamic:
            assert resource.provider_urn in providers, resource.name
            package = resource.type.split(":")[0]
            assert resource.provider_urn.split("::")[2].split("$")[-1] == f"pulumi:providers:{package}", (
                resource.name
            )


def test_every_resource_chains_to_the_stack(aws_eks):
    by_urn = {r.urn: r for r in aws_eks.registrations}
    for resource in aws_eks.registrations:
        node, hops = resource, 0
        while node.parent in by_urn:
            node, hops = by_urn[node.parent], hops + 1
            assert hops < 20
        assert "::pulumi:pulumi:Stack::" in node.parent, resource.name


def test_children_are_named_after_their_component(aws_eks):
    by_urn = {r.urn: r for r in aws_eks.registrations}
    for resource in aws_eks.registrations:
        parent = by_urn.get(resource.parent)
        if parent is not None and not parent.custom:
            assert resource.name.startswith(parent.name), (resource.name, parent.name)


def test_gpu_operator_release(aws_eks):
    release = aws_eks.by_name("ml-gpu-operator-release").inputs
    assert (release["chart"], release["version"]) == ("gpu-operator", "v26.7.0")
    assert release["repositoryOpts"]["repo"] == "https://helm.ngc.nvidia.com/nvidia"
    values = release["values"]
    assert values["driver"] == {"enabled": False}
    assert values["toolkit"] == {"enabled": False}
    assert values["mig"] == {"strategy": "single"}
    assert values["migManager"] == {"env": [{"name": "WITH_REBOOT", "value": "true"}]}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values["daemonsets"][
        "tolerations"
    ]
    namespace = aws_eks.by_name("ml-gpu-operator-namespace").inputs["metadata"]
    assert namespace["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert release["namespace"] == namespace["name"] == "gpu-operator"


def test_cluster_addons_wait_for_system_nodes_and_admin_access(aws_eks):
    namespace = aws_eks.by_name("ml-gpu-operator-namespace")
    autoscaler = aws_eks.by_name("ml-autoscaler-release")
    for waiter in (namespace, autoscaler):
        assert aws_eks.by_name("ml-system").urn in waiter.dependencies
        assert aws_eks.by_name("ml-deployer-admin").urn in waiter.dependencies
    assert aws_eks.by_name("ml-autoscaler-identity-association").urn in autoscaler.dependencies


def test_cluster_autoscaler_release(aws_eks):
    release = aws_eks.by_name("ml-autoscaler-release").inputs
    assert (release["chart"], release["version"], release["namespace"]) == (
        "cluster-autoscaler",
        "9.59.0",
        "kube-system",
    )
    values = release["values"]
    assert values["cloudProvider"] == "aws"
    assert values["autoDiscovery"] == {"clusterName": "ml"}
    assert values["awsRegion"] == "us-east-1"
    assert values["image"]["tag"].startswith("v1.35.")
    assert values["extraArgs"]["scale-down-unneeded-time"] == "5m0s"
    association = aws_eks.by_name("ml-autoscaler-identity-association").inputs
    assert (association["namespace"], association["serviceAccount"]) == (
        "kube-system",
        values["rbac"]["serviceAccount"]["name"],
    )


def test_autoscaler_can_write_only_to_this_clusters_groups(aws_eks):
    policy = json.loads(aws_eks.by_name("ml-autoscaler-identity-policy").inputs["policy"])
    writes = [s for s in policy["Statement"] if "autoscaling:SetDesiredCapacity" in s["Action"]]
    assert len(writes) == 1
    assert writes[0]["Condition"] == {
        "StringEquals": {"aws:ResourceTag/k8s.io/cluster-autoscaler/ml": "owned"}
    }


def test_stack_outputs_summarise_pools(aws_eks):
    pools = {p["name"]: p for p in aws_eks.outputs["gpuPools"]}
    assert {
        name: (p["gpuModel"], p["sharing"], p["slotsPerNode"], p["isolation"]) for name, p in pools.items()
    } == {
        "l40s": ("nvidia-l40s", "none", 1, "hardware"),
        "a10g-shared": ("nvidia-a10g", "timeSlicing", 4, "none"),
        "l4-mps": ("nvidia-l4", "mps", 16, "memory+compute limits"),
        "h100": ("nvidia-h100-80gb", "mig", 56, "hardware"),
        "h100-train": ("nvidia-h100-80gb", "none", 8, "hardware"),
    }
    # A quarter of a 24 GiB GPU per MPS client; one 1g.10gb slice is an eighth of an H100's 80 GiB.
    assert pools["l4-mps"]["slots"] == [{"resource": "nvidia.com/gpu", "perNode": 16, "memoryGiB": 6}]
    assert pools["h100"]["slots"] == [{"resource": "nvidia.com/gpu", "perNode": 56, "memoryGiB": 10}]
    assert aws_eks.outputs["gpuDriver"] == {"owner": "node-image", "version": "580.x"}


def test_existing_vpc_creates_no_network_resources(aws_eks_config):
    from gpu_k8s.tools.engine import run_program

    config = json.loads(json.dumps(aws_eks_config))
    config["gpu-k8s:cluster"]["network"] = {
        "vpcId": "vpc-0123456789abcdef0",
        "privateSubnetIds": ["subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb"],
        "publicSubnetIds": ["subnet-0cccccccccccccccc", "subnet-0dddddddddddddddd"],
    }
    rec = run_program("existing-vpc", config)
    # Launch templates and the EFA pool's placement group are the node groups', not the network's; the
    # EFS mount targets' security group is the file system's.
    node_parts = ("aws:ec2/launchTemplate:LaunchTemplate", "aws:ec2/placementGroup:PlacementGroup")
    file_system = rec.by_name("ml-efs")
    assert not [
        r
        for r in rec.registrations
        if r.type.startswith("aws:ec2/") and r.type not in node_parts and r.parent != file_system.urn
    ]
    # One mount target in each given subnet's zone.
    assert sorted(m.inputs["subnetId"] for m in rec.by_type("aws:efs/mountTarget:MountTarget")) == [
        "subnet-0aaaaaaaaaaaaaaaa",
        "subnet-0bbbbbbbbbbbbbbbb",
    ]
    cluster = rec.by_type("aws:eks/cluster:Cluster")[0].inputs
    assert cluster["vpcConfig"]["subnetIds"] == ["subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb"]


def test_user_labels_and_taints_reach_nodes_templates_and_operator_tolerations(aws_eks_config):
    from gpu_k8s.tools.engine import run_program

    config = json.loads(json.dumps(aws_eks_config))
    config["gpu-k8s:cluster"]["gpuPools"][0]["labels"] = {"team.example.com/owner": "vision"}
    config["gpu-k8s:cluster"]["gpuPools"][0]["taints"] = [
        {"key": "team.example.com/dedicated", "value": "vision", "effect": "NoExecute"}
    ]
    rec = run_program("labels", config)
    group = gpu_node_groups(rec)["l40s"].inputs
    assert group["labels"]["team.example.com/owner"] == "vision"
    assert {"key": "team.example.com/dedicated", "value": "vision", "effect": "NO_EXECUTE"} in group["taints"]
    tags = scale_from_zero_tags(rec, "l40s")
    assert tags[f"{TEMPLATE_PREFIX}/label/team.example.com/owner"] == "vision"
    assert tags[f"{TEMPLATE_PREFIX}/taint/team.example.com/dedicated"] == "vision:NoExecute"
    tolerations = rec.by_name("ml-gpu-operator-release").inputs["values"]["daemonsets"]["tolerations"]
    assert {"key": "team.example.com/dedicated", "operator": "Exists", "effect": "NoExecute"} in tolerations


def test_arm64_gpu_pool_gets_the_arm_nvidia_ami(aws_eks_config):
    from gpu_k8s.tools.engine import run_program

    config = json.loads(json.dumps(aws_eks_config))
    config["gpu-k8s:cluster"]["gpuPools"] = [{"name": "t4g", "instanceType": "g5g.xlarge", "maxNodes": 2}]
    rec = run_program("arm", config)
    assert gpu_node_groups(rec)["t4g"].inputs["amiType"] == "AL2023_ARM_64_NVIDIA"


@pytest.mark.parametrize(("single", "expected"), [(False, 3), (True, 1)])
def test_nat_gateways_per_zone_or_shared(aws_eks_config, single, expected):
    from gpu_k8s.tools.engine import run_program

    config = json.loads(json.dumps(aws_eks_config))
    config["gpu-k8s:cluster"]["network"]["singleNatGateway"] = single
    rec = run_program("nat", config)
    nats = rec.by_type("aws:ec2/natGateway:NatGateway")
    assert len(nats) == expected
    private_tables = [r for r in rec.by_type("aws:ec2/routeTable:RouteTable") if "private" in r.name]
    assert len(private_tables) == 3
    for table in private_tables:
        assert {d for d in table.dependencies} & {n.urn for n in nats}
    # Subnet tiers never hand out public IPs.
    assert all(s.inputs["mapPublicIpOnLaunch"] is False for s in rec.by_type("aws:ec2/subnet:Subnet"))


def test_addons_follow_the_clusters_version(aws_eks):
    """Each add-on is pinned to the newest version EKS offers for kubernetesVersion (an upgrade moves it)."""
    import re

    addons = aws_eks.by_type("aws:eks/addon:Addon")
    assert {a.inputs["addonName"] for a in addons} == {
        "vpc-cni",
        "kube-proxy",
        "eks-pod-identity-agent",
        "coredns",
        "aws-ebs-csi-driver",
        "aws-efs-csi-driver",
        "eks-node-monitoring-agent",
    }
    for addon in addons:
        assert re.fullmatch(r"v\d+\.\d+\.\d+-eksbuild\.\d+", addon.inputs["addonVersion"]), addon.name


def test_cluster_stays_on_standard_support_and_is_protected_from_deletion(aws_eks, aws_eks_config):
    cluster = aws_eks.by_name("ml-eks").inputs
    assert cluster["upgradePolicy"] == {"supportType": "STANDARD"}
    assert cluster["deletionProtection"] is True
    config = json.loads(json.dumps(aws_eks_config))
    config["gpu-k8s:cluster"]["eks"] = {"deletionProtection": False}
    from gpu_k8s.tools.engine import run_program

    assert run_program("unprotected", config).by_name("ml-eks").inputs["deletionProtection"] is False


def test_every_node_group_is_repaired_by_eks(aws_eks):
    groups = aws_eks.by_type("aws:eks/nodeGroup:NodeGroup")
    assert len(groups) == 1 + 3 + 3 + 2 + 2 + 1  # the system group, then each GPU pool's zones
    for group in groups:
        assert group.inputs["nodeRepairConfig"] == {"enabled": True}, group.name


def test_new_vpc_sends_s3_traffic_through_a_gateway_endpoint(aws_eks):
    (endpoint,) = aws_eks.by_type("aws:ec2/vpcEndpoint:VpcEndpoint")
    assert endpoint.inputs["serviceName"] == "com.amazonaws.us-east-1.s3"
    assert endpoint.inputs["vpcEndpointType"] == "Gateway"
    private_tables = {r.id for r in aws_eks.by_type("aws:ec2/routeTable:RouteTable") if "private" in r.name}
    assert len(private_tables) == 3 and set(endpoint.inputs["routeTableIds"]) == private_tables


def test_admins_from_config_replace_the_deployer_and_keep_their_names(aws_eks_config):
    """A fixed admin list does not change with whoever runs `pulumi up` (CI and people taking turns)."""
    from gpu_k8s.tools.engine import run_program

    config = json.loads(json.dumps(aws_eks_config))
    admins = ["arn:aws:iam::123456789012:role/platform/GpuAdmins", "arn:aws:iam::123456789012:user/alice"]
    config["gpu-k8s:cluster"]["eks"] = {"admins": admins}
    first = run_program("admins", config)
    entries = {r.name: r.inputs["principalArn"] for r in first.by_type("aws:eks/accessEntry:AccessEntry")}
    assert sorted(entries.values()) == sorted(admins)
    assert not [name for name in entries if "deployer" in name]
    for association in first.by_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation"):
        assert association.inputs["policyArn"].endswith("/AmazonEKSClusterAdminPolicy")
    # Reordering the list renames nothing; the add-ons wait for every admin entry.
    config["gpu-k8s:cluster"]["eks"] = {"admins": admins[::-1]}
    second = run_program("admins", config)
    assert {r.urn for r in second.by_type("aws:eks/accessEntry:AccessEntry")} == {
        r.urn for r in first.by_type("aws:eks/accessEntry:AccessEntry")
    }
    namespace = first.by_name("ml-gpu-operator-namespace")
    for association in first.by_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation"):
        assert association.urn in namespace.dependencies


def test_zones_are_chosen_by_id_and_skip_those_eks_refuses(aws_eks):
    """In the mock account us-east-1b is use1-az3, where EKS refuses cluster subnets: the VPC uses a, c, d."""
    zones = [aws_eks.by_name(f"ml-network-private-{i}").inputs["availabilityZone"] for i in range(3)]
    assert zones == ["us-east-1a", "us-east-1c", "us-east-1d"]


class _ScarceGpus:
    """Mocks in which p5.48xlarge is offered in one zone ID only, and g6e.xlarge nowhere when asked."""

    def __init__(self, nowhere: set[str] = frozenset()):  # type: ignore[assignment]
        from gpu_k8s.tools.engine import RealisticMocks

        self.inner = RealisticMocks()
        self.nowhere = nowhere

    def new_resource(self, args):
        return self.inner.new_resource(args)

    def call(self, args):
        if (
            args.token == "aws:index/getAvailabilityZones:getAvailabilityZones"
            and "two-zones" in self.nowhere
        ):
            answer, _ = self.inner.call(args)
            return {**answer, "names": answer["names"][:2], "zoneIds": answer["zoneIds"][:2]}, []
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            instance_type = args.args["filters"][0]["values"][0]
            if instance_type in self.nowhere:
                return {"locations": [], "id": "x"}, []
            if instance_type == "p5.48xlarge":
                return {"locations": ["use1-az4"], "id": "x"}, []
        return self.inner.call(args)


def test_a_gpu_pool_gets_groups_only_in_zones_that_offer_its_type(aws_eks_config):
    from gpu_k8s.tools.engine import run_program

    rec = run_program("scarce", aws_eks_config, mocks=_ScarceGpus())
    h100 = zone_node_groups(rec)["h100"]
    # use1-az4 is us-east-1c here, the second private subnet; the pool's whole maximum goes there.
    assert [(g.inputs["subnetIds"], g.inputs["scalingConfig"]["maxSize"]) for g in h100] == [
        ([rec.by_name("ml-network-private-1").id], 2)
    ]
    assert len(zone_node_groups(rec)["l40s"]) == 3


def test_a_gpu_type_no_zone_offers_is_refused_naming_the_pool(aws_eks_config):
    from gpu_k8s.components.configbase import ConfigError
    from gpu_k8s.tools.engine import run_program

    with pytest.raises(ConfigError) as caught:
        run_program("nowhere", aws_eks_config, mocks=_ScarceGpus(nowhere={"g6e.xlarge"}))
    (issue,) = caught.value.issues
    assert issue.path == "gpu-k8s:cluster.gpuPools[0].instanceType"
    assert "offered in none of the cluster's zones" in issue.problem and "use1-az2" in issue.problem


def test_a_region_with_fewer_zones_than_asked_is_refused(aws_eks_config):
    from gpu_k8s.components.configbase import ConfigError
    from gpu_k8s.tools.engine import run_program

    with pytest.raises(ConfigError) as caught:
        run_program("two-zones", aws_eks_config, mocks=_ScarceGpus(nowhere={"two-zones"}))
    (issue,) = caught.value.issues
    assert issue.path == "gpu-k8s:cluster.network.availabilityZones"
    assert "only 2 default zones EKS supports" in issue.problem and issue.fix == "set it to at most 2"


def test_what_groups_launch_carries_the_clusters_tag(aws_eks, aws_k3s):
    """The provider's default tags reach launch templates, not the instances, volumes and interfaces an Auto
    Scaling group makes from them: those are tagged through the template."""
    templates = [
        *aws_eks.by_type("aws:ec2/launchTemplate:LaunchTemplate"),
        *aws_k3s.by_type("aws:ec2/launchTemplate:LaunchTemplate"),
    ]
    assert len(templates) == 8
    for template in templates:
        specs = {s["resourceType"]: s["tags"] for s in template.inputs["tagSpecifications"]}
        assert set(specs) == {"instance", "volume", "network-interface"}, template.name
        for tags in specs.values():
            assert tags["gpu-k8s.io/cluster"] == "ml" and tags["Name"].startswith("ml-")


def test_node_groups_roll_to_a_new_ami_release_only_when_asked(aws_eks, aws_eks_config):
    """review-aws.md AN-B4: a new AMI release reached every node group on any `up`, draining GPU jobs. By
    default each group keeps the release EKS gave it at creation (no releaseVersion sent); `latest` reads the
    recommended release at every `up` (a new one rolls the groups, except a Capacity Block's, which EKS says
    to upgrade at size 0); a written release pins every group to it."""
    from gpu_k8s.providers.aws.nodes import release_version_parameter

    assert release_version_parameter("1.35", "AL2023_x86_64_NVIDIA") == (
        "/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/nvidia/recommended/release_version"
    )
    assert release_version_parameter("1.36", "AL2023_ARM_64_STANDARD") == (
        "/aws/service/eks/optimized-ami/1.36/amazon-linux-2023/arm64/standard/recommended/release_version"
    )
    groups = aws_eks.by_type("aws:eks/nodeGroup:NodeGroup")
    assert len(groups) == 12
    for group in groups:
        assert group.inputs["version"] == "1.35"
        assert "releaseVersion" not in group.inputs, group.name
    assert not [i for i in aws_eks.invokes if i.token == "aws:ssm/getParameter:getParameter"]

    def releases(value: str, pools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        config = copy.deepcopy(aws_eks_config)
        config["gpu-k8s:cluster"]["eks"] = {"nodeImageRelease": value}
        if pools is not None:
            config["gpu-k8s:cluster"]["gpuPools"] = pools
        rec = run_program("release", config)
        return {g.name: g.inputs.get("releaseVersion") for g in rec.by_type("aws:eks/nodeGroup:NodeGroup")}

    assert set(releases("1.35.2-20261110").values()) == {"1.35.2-20261110"}
    latest = releases("latest")
    assert all(str(value).startswith("1.35.") for value in latest.values()), latest
    block = {
        "name": "blk",
        "instanceType": "p5.48xlarge",
        "maxNodes": 2,
        "capacityReservationId": "cr-02168da1478b509e0",
    }
    in_block = releases("latest", [block])
    assert [value for name, value in in_block.items() if name.startswith("ml-gpu-blk")] == [None]


@pytest.mark.parametrize(
    ("release", "words"),
    [
        ("1.35.2", "is not an EKS AMI release"),
        ("1.34.5-20261110", "is a release for Kubernetes 1.34, and kubernetesVersion is 1.35"),
    ],
)
def test_a_node_image_release_that_cannot_be_is_refused(aws_eks_config, release, words):
    def write(cluster: dict[str, Any]) -> None:
        cluster["eks"] = {"nodeImageRelease": release}

    assert_refused_before_any_resource(
        aws_eks_config, write, "gpu-k8s:cluster.eks.nodeImageRelease", (words,)
    )


def test_the_ebs_csi_driver_reaches_only_the_volumes_it_made(aws_eks):
    """security.md S12: the V1 policy reaches every volume of the account; V2 only volumes and snapshots
    tagged ebs.csi.aws.com/cluster=true, which the driver puts on every volume it creates."""
    attached = {
        r.name: r.inputs["policyArn"]
        for r in aws_eks.by_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if "ebs-csi" in r.name
    }
    assert list(attached.values()) == ["arn:aws:iam::aws:policy/AmazonEBSCSIDriverPolicyV2"], attached


def test_pod_identity_roles_trust_only_their_service_accounts_in_this_cluster(aws_eks):
    """A Pod Identity role's trust names the cluster, namespace and service accounts of its associations
    (the session tags Pod Identity adds to its AssumeRole request, EKS user guide pod-id-abac; conditions as
    in pod-id-role): an association made for the role elsewhere gets no credentials."""
    associations: dict[str, set[tuple[str, str]]] = {}
    for link in aws_eks.by_type("aws:eks/podIdentityAssociation:PodIdentityAssociation"):
        inputs = link.inputs
        associations.setdefault(inputs["roleArn"], set()).add((inputs["namespace"], inputs["serviceAccount"]))
    for addon in aws_eks.by_type("aws:eks/addon:Addon"):
        for link in addon.inputs.get("podIdentityAssociations") or []:
            associations.setdefault(link["roleArn"], set()).add(("kube-system", link["serviceAccount"]))
    trusted = {}
    for role in aws_eks.by_type("aws:iam/role:Role"):
        (statement,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
        if statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}:
            trusted[role.outputs["arn"]] = statement["Condition"]["StringEquals"]
    assert set(trusted) == set(associations) and len(trusted) == 3  # autoscaler, EBS CSI, EFS CSI
    (cluster,) = aws_eks.by_type("aws:eks/cluster:Cluster")
    linked = aws_eks.by_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    assert {link.inputs["clusterName"] for link in linked} == {cluster.inputs["name"]}
    for arn, condition in trusted.items():
        assert condition["aws:RequestTag/eks-cluster-name"] == cluster.inputs["name"]
        linked = associations[arn]
        assert {condition["aws:RequestTag/kubernetes-namespace"]} == {namespace for namespace, _ in linked}
        assert set(condition["aws:RequestTag/kubernetes-service-account"]) == {
            account for _, account in linked
        }


class _RunningCluster:
    """The realistic mocks, with the stack's EKS cluster already running at `version`."""

    def __init__(self, version: str):
        from gpu_k8s.tools.engine import RealisticMocks

        self.inner = RealisticMocks()
        self.version = version

    def new_resource(self, args):
        return self.inner.new_resource(args)

    def call(self, args):
        answer, failures = self.inner.call(args)
        if args.token == "aws:eks/getClusters:getClusters":
            answer = {**answer, "names": ["other", "ml"]}
        if args.token == "aws:eks/getCluster:getCluster":
            answer = {**answer, "version": self.version}
        return answer, failures


@pytest.mark.parametrize(
    ("running", "fix"),
    [("1.36", 'set kubernetesVersion: "1.36"'), ("1.37", "supports 1.36 at most")],
)
def test_a_cluster_aws_upgraded_past_the_stack_is_refused_at_preview(aws_eks_config, running, fix):
    """review-aws.md AN-B7: with standard support only, AWS upgrades the control plane at the end of
    support; EKS cannot downgrade, so the next `up` would fail on the cluster after changing other things."""
    from gpu_k8s.components.configbase import ConfigError

    with pytest.raises(ConfigError) as caught:
        run_program("upgraded", aws_eks_config, mocks=_RunningCluster(running))
    message = str(caught.value)
    assert (
        'gpu-k8s:cluster.kubernetesVersion: "1.35"' in message
        and f"already runs Kubernetes {running}" in message
    )
    assert fix in message


def test_a_running_cluster_on_the_stacks_minor_plans_as_before(aws_eks_config, aws_eks):
    same = run_program("same", aws_eks_config, mocks=_RunningCluster("1.35"))
    assert len(same.registrations) == len(aws_eks.registrations)
