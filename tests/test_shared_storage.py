"""`storage.shared`: a file system pods on many nodes mount at once, as the StorageClass `shared-rwx` on
every platform (EFS on aws-eks and aws-k3s, Filestore on gcp-gke and gcp-k3s), refused with the reason for a
service the platform does not build."""

from __future__ import annotations

import copy

import pytest

from gpu_k8s.providers.aws.shared_storage import mount_zones
from gpu_k8s.providers.aws.zones import Zone
from gpu_k8s.tools.engine import Recording, run_program
from tests.conftest import assert_refused_before_any_resource, delete_key, set_path, some

STORAGE_CLASS = "kubernetes:storage.k8s.io/v1:StorageClass"


def shared_classes(recording: Recording) -> list:
    return [r for r in recording.by_type(STORAGE_CLASS) if r.inputs["metadata"]["name"] == "shared-rwx"]


def shared_class(recording: Recording):
    (found,) = shared_classes(recording)
    return found


def efs_addon(recording: Recording):
    (found,) = [
        a for a in recording.by_type("aws:eks/addon:Addon") if a.inputs["addonName"] == "aws-efs-csi-driver"
    ]
    return found


def test_efs_is_encrypted_and_elastic(aws_eks):
    (file_system,) = aws_eks.by_type("aws:efs/fileSystem:FileSystem")
    assert file_system.inputs["encrypted"] is True
    assert file_system.inputs["throughputMode"] == "elastic"
    assert file_system.inputs["performanceMode"] == "generalPurpose"


def test_efs_is_reachable_by_nfs_from_the_clusters_nodes_only(aws_eks):
    """The mount targets' group has one rule: TCP 2049 from the security group every EKS node carries. No
    CIDR, no other port, nothing outbound (replies to allowed traffic need no rule)."""
    group = aws_eks.by_name("ml-efs-mount-targets")
    assert "ingress" not in group.inputs and "egress" not in group.inputs
    rules = [
        r
        for r in aws_eks.registrations
        if r.type.startswith("aws:vpc/securityGroup") and r.inputs["securityGroupId"] == group.id
    ]
    (rule,) = rules
    cluster = aws_eks.by_name("ml-eks")
    assert rule.type == "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
    assert (rule.inputs["ipProtocol"], rule.inputs["fromPort"], rule.inputs["toPort"]) == ("tcp", 2049, 2049)
    assert rule.inputs["referencedSecurityGroupId"] == cluster.outputs["vpcConfig"]["clusterSecurityGroupId"]
    assert "cidrIpv4" not in rule.inputs


def test_efs_has_a_mount_target_in_every_zone_of_the_cluster(aws_eks):
    """System nodes and every GPU pool (each in some of the cluster's zones) mount in their own zone."""
    file_system = aws_eks.by_name("ml-efs-fs")
    group = aws_eks.by_name("ml-efs-mount-targets")
    rule = aws_eks.by_name("ml-efs-nfs-from-nodes")
    subnets = {s.name: s.id for s in aws_eks.by_type("aws:ec2/subnet:Subnet")}
    private = [subnets[name] for name in sorted(subnets) if "private" in name]
    targets = some(aws_eks.by_type("aws:efs/mountTarget:MountTarget"), at_least=2)
    assert sorted(t.inputs["subnetId"] for t in targets) == sorted(private)
    for target in targets:
        assert target.inputs["fileSystemId"] == file_system.id
        assert target.inputs["securityGroups"] == [group.id]
        # Created after the rule that lets nodes in, and deleted before the file system.
        assert {rule.urn, file_system.urn} <= set(target.dependencies)
        assert target.parent == file_system.urn


def test_efs_takes_one_mount_target_per_zone_even_with_two_subnets_in_it():
    zones = [Zone("us-east-1a", "use1-az1"), Zone("us-east-1b", "use1-az2"), Zone("us-east-1a", "use1-az1")]
    assert mount_zones(zones) == {"us-east-1a": 0, "us-east-1b": 1}


def test_efs_csi_add_on_gets_the_managed_policy_through_pod_identity_for_its_controller_only(aws_eks):
    addon = efs_addon(aws_eks)
    role = aws_eks.by_name("ml-efs-csi-role")
    attachment = aws_eks.by_name("ml-efs-csi-AmazonEFSCSIDriverPolicy")
    assert attachment.inputs["policyArn"] == "arn:aws:iam::aws:policy/service-role/AmazonEFSCSIDriverPolicy"
    assert attachment.inputs["role"] == role.outputs.get("name", role.id)
    assert addon.inputs["podIdentityAssociations"] == [
        {"roleArn": role.outputs["arn"], "serviceAccount": "efs-csi-controller-sa"},
    ]
    assert '"pods.eks.amazonaws.com"' in role.inputs["assumeRolePolicy"]
    # The controller schedules on the system nodes; the add-on waits for them and for its permissions.
    assert {aws_eks.by_name("ml-system").urn, attachment.urn} <= set(addon.dependencies)


def test_efs_storage_class_makes_access_points_once_the_driver_and_mount_targets_exist(aws_eks):
    shared = shared_class(aws_eks)
    file_system = aws_eks.by_name("ml-efs-fs")
    assert shared.inputs["provisioner"] == "efs.csi.aws.com"
    assert shared.inputs["parameters"] == {
        "provisioningMode": "efs-ap",
        "fileSystemId": file_system.id,
        "directoryPerms": "700",
    }
    # EFS is regional: nothing to wait for; it is not the default class (gp3 is).
    assert shared.inputs["volumeBindingMode"] == "Immediate"
    assert "annotations" not in shared.inputs["metadata"]
    addon = efs_addon(aws_eks)
    targets = aws_eks.by_type("aws:efs/mountTarget:MountTarget")
    assert {addon.urn, *(t.urn for t in targets)} <= set(shared.dependencies)


def test_filestore_storage_class_is_on_the_clusters_own_vpc(gcp_gke):
    """The driver's default network is `default`; instances there are unreachable from the cluster's VPC."""
    shared = shared_class(gcp_gke)
    vpc = gcp_gke.by_name("ml-network-vpc")
    assert shared.inputs["provisioner"] == "filestore.csi.storage.gke.io"
    assert shared.inputs["parameters"] == {"tier": "standard", "network": vpc.outputs["name"]}
    assert shared.inputs["volumeBindingMode"] == "WaitForFirstConsumer"
    api = next(
        s
        for s in gcp_gke.by_type("gcp:projects/service:Service")
        if s.inputs["service"] == "file.googleapis.com"
    )
    assert {api.urn, gcp_gke.by_name("ml-system").urn} <= set(shared.dependencies)


def test_filestore_on_an_existing_network_given_as_a_self_link_takes_its_name(gcp_gke_config):
    config = copy.deepcopy(gcp_gke_config)
    cluster = config["gpu-k8s:cluster"]
    cluster["network"] = {
        **{k: v for k, v in cluster["network"].items() if k in ("zones",)},
        "networkName": "projects/gpu-k8s-demo/global/networks/ml-vpc",
        "subnetworkName": "ml-nodes",
        "podsRangeName": "pods",
        "servicesRangeName": "services",
    }
    recording = run_program("existing-network", config)
    assert shared_class(recording).inputs["parameters"]["network"] == "ml-vpc"


def test_without_storage_nothing_of_it_is_planned(aws_eks_config, gcp_gke_config):
    for stack_config, file_system_types in (
        (aws_eks_config, ("aws:efs/", "aws-efs-csi-driver")),
        (gcp_gke_config, ("file.googleapis.com",)),
    ):
        config = copy.deepcopy(stack_config)
        delete_key("storage")(config["gpu-k8s:cluster"])
        recording = run_program("no-storage", config)
        assert shared_classes(recording) == []
        text = str([(r.type, r.inputs) for r in recording.registrations])
        for marker in file_system_types:
            assert marker not in text


def test_gcs_fuse_add_on_on_request(gcp_gke_config):
    config = copy.deepcopy(gcp_gke_config)
    set_path("gke.gcsFuseCsi", True)(config["gpu-k8s:cluster"])
    addons = run_program("gcs-fuse", config).by_name("ml-gke").inputs["addonsConfig"]
    assert addons["gcsFuseCsiDriverConfig"] == {"enabled": True}


BAD_STORAGE: list[tuple[str, str, tuple[str, ...]]] = [
    ("aws-eks", "filestore", ("use one of: efs",)),
    ("aws-eks", "nfs", ("not a shared file system of aws/eks",)),
    ("gcp-gke", "efs", ("use one of: filestore",)),
    ("aws-k3s", "filestore", ("use one of: efs",)),
    ("gcp-k3s", "efs", ("use one of: filestore",)),
]


@pytest.mark.parametrize(
    ("stack", "value", "words"), BAD_STORAGE, ids=[f"{c[0]}-{c[1]}" for c in BAD_STORAGE]
)
def test_a_file_system_the_platform_does_not_build_is_refused(request, stack, value, words):
    config = request.getfixturevalue(f"{stack.replace('-', '_')}_config")
    assert_refused_before_any_resource(
        config, set_path("storage", {"shared": value}), "gpu-k8s:cluster.storage.shared", words
    )


def test_an_unknown_storage_key_is_refused(aws_eks_config):
    assert_refused_before_any_resource(
        aws_eks_config, set_path("storage", {"sharde": "efs"}), "gpu-k8s:cluster.storage.sharde", ("shared",)
    )


def test_efs_on_k3s_lets_in_nfs_from_the_nodes_group_and_gives_the_servers_the_driver_policy(aws_k3s):
    """Every k3s node (server or agent) carries the `nodes` group; the driver's controller runs on the
    servers with their instance role, so that role, and only it, holds the EFS driver policy."""
    rule = aws_k3s.by_name("ml-efs-nfs-from-nodes")
    assert rule.inputs["referencedSecurityGroupId"] == aws_k3s.by_name("ml-nodes-sg").id
    assert (rule.inputs["fromPort"], rule.inputs["toPort"]) == (2049, 2049)
    holders = {
        r.inputs["role"].rsplit("-", 1)[0]
        for r in aws_k3s.by_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if r.inputs["policyArn"].endswith("/AmazonEFSCSIDriverPolicy")
    }
    assert holders == {"ml-server-role"}
    shared = shared_class(aws_k3s)
    assert shared.inputs["parameters"]["fileSystemId"] == aws_k3s.by_name("ml-efs-fs").id
    release = aws_k3s.by_name("ml-efs-csi")
    assert release.urn in shared.dependencies
    assert len(some(aws_k3s.by_type("aws:efs/mountTarget:MountTarget"), at_least=2)) == len(
        {s.inputs["availabilityZone"] for s in aws_k3s.by_type("aws:ec2/subnet:Subnet")}
    )


def test_the_stack_outputs_name_the_class_the_service_and_the_one_file_system(
    aws_eks, gcp_gke, aws_k3s, gcp_k3s
):
    for recording in (aws_eks, aws_k3s):
        assert recording.outputs["sharedStorage"] == {
            "storageClass": "shared-rwx",
            "retainedStorageClass": "shared-rwx-retain",
            "service": "efs",
            "fileSystemId": recording.by_name("ml-efs-fs").id,
        }
    assert gcp_k3s.outputs["sharedStorage"] == {
        "storageClass": "shared-rwx",
        "retainedStorageClass": "shared-rwx-retain",
        "service": "filestore",
        "fileSystemId": gcp_k3s.by_name("ml-filestore-instance").outputs["name"],
    }
    # On GKE each claim is its own instance: there is no one file system to name.
    assert gcp_gke.outputs["sharedStorage"] == {
        "storageClass": "shared-rwx",
        "retainedStorageClass": "shared-rwx-retain",
        "service": "filestore",
    }


def test_no_shared_storage_output_without_storage(gcp_k3s_config):
    config = copy.deepcopy(gcp_k3s_config)
    delete_key("storage")(config["gpu-k8s:cluster"])
    assert "sharedStorage" not in run_program("gcp-k3s", config).outputs


# --- Filestore on gcp-k3s: one instance, served by the NFS CSI driver ----------------------------------


def test_filestore_on_k3s_is_one_basic_instance_that_only_the_node_subnet_mounts(gcp_k3s, gcp_k3s_config):
    """Peered into the cluster's VPC from the configured /29 (Filestore cannot see k3s's overlay ranges),
    in the network's first zone, exporting its share read-write to the node subnet only."""
    (instance,) = gcp_k3s.by_type("gcp:filestore/instance:Instance")
    network = gcp_k3s_config["gpu-k8s:cluster"]["network"]
    assert instance.inputs["tier"] == "BASIC_HDD"
    assert instance.inputs["location"] == network["zones"][0]
    assert instance.inputs["fileShares"] == {
        "name": "shared",
        "capacityGb": 1024,
        "nfsExportOptions": [
            {"ipRanges": [network["cidr"]], "accessMode": "READ_WRITE", "squashMode": "NO_ROOT_SQUASH"}
        ],
    }
    assert instance.inputs["networks"] == [
        {
            "network": gcp_k3s.by_name("ml-network-vpc").outputs["name"],
            "modes": ["MODE_IPV4"],
            "connectMode": "DIRECT_PEERING",
            "reservedIpRange": "10.44.0.0/29",
        }
    ]
    api = next(
        s
        for s in gcp_k3s.by_type("gcp:projects/service:Service")
        if s.inputs["service"] == "file.googleapis.com"
    )
    assert api.urn in instance.dependencies


def test_filestore_on_k3s_serves_claims_through_the_nfs_driver_on_the_instances_address(gcp_k3s):
    shared = shared_class(gcp_k3s)
    instance = gcp_k3s.by_name("ml-filestore-instance")
    address = instance.outputs["networks"][0]["ipAddresses"][0]
    assert shared.inputs["provisioner"] == "nfs.csi.k8s.io"
    assert shared.inputs["parameters"] == {"server": address, "share": "/shared"}
    # One instance reachable from every zone: claims bind at once; the share's size is fixed.
    assert shared.inputs["volumeBindingMode"] == "Immediate"
    assert shared.inputs["allowVolumeExpansion"] is False
    # Destroy removes the class before the instance whose address it names.
    assert instance.urn in shared.dependencies
    release = gcp_k3s.by_name("ml-filestore-nfs-csi")
    assert release.inputs["chart"] == "csi-driver-nfs"
    assert release.inputs["version"] == "4.13.4"
    assert release.urn in shared.dependencies
    # The driver waits for the servers to be reachable and initialised by the cloud controller.
    ccm_objects = [r.urn for r in gcp_k3s.registrations if r.parent and "cloud-controller" in r.parent]
    assert set(some(ccm_objects)) <= set(release.dependencies)


def test_filestore_controller_runs_on_the_servers_without_a_snapshot_sidecar(gcp_k3s):
    controller = gcp_k3s.by_name("ml-filestore-nfs-csi").inputs["values"]["controller"]
    assert controller["nodeSelector"] == {"gpu-k8s.io/pool": "system"}
    server_taints = gcp_k3s.by_name("ml-filestore-nfs-csi").inputs["values"]["controller"]["tolerations"]
    assert {"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoSchedule"} in server_taints
    assert controller["enableSnapshotter"] is False


@pytest.mark.parametrize(
    "subnetwork", ["ml-nodes", "projects/gpu-k8s-demo/regions/us-central1/subnetworks/ml-nodes"]
)
def test_filestore_on_an_existing_k3s_subnet_exports_to_that_subnets_range(gcp_k3s_config, subnetwork):
    """The range is read from Compute Engine (the mock answers 10.128.0.0/20), by name in the stack's
    region or by self link."""
    config = copy.deepcopy(gcp_k3s_config)
    cluster = config["gpu-k8s:cluster"]
    cluster["network"] = {
        "zones": cluster["network"]["zones"],
        "networkName": "ml-vpc",
        "subnetworkName": subnetwork,
    }
    (instance,) = run_program("existing-network", config).by_type("gcp:filestore/instance:Instance")
    assert instance.inputs["fileShares"]["nfsExportOptions"][0]["ipRanges"] == ["10.128.0.0/20"]
    assert instance.inputs["networks"][0]["network"] == "ml-vpc"


def test_filestore_range_is_configurable(gcp_k3s_config):
    config = copy.deepcopy(gcp_k3s_config)
    set_path("storage.filestoreRange", "192.168.7.0/29")(config["gpu-k8s:cluster"])
    (instance,) = run_program("gcp-k3s", config).by_type("gcp:filestore/instance:Instance")
    assert instance.inputs["networks"][0]["reservedIpRange"] == "192.168.7.0/29"


BAD_FILESTORE_RANGES = [
    ("10.44.0.0/28", ("private /29",)),
    ("34.1.2.0/29", ("private /29",)),
    ("10.44.0.0", ("no prefix length",)),
    ("10.42.8.0/29", ("k3s's pod range 10.42.0.0/16",)),
    ("10.43.0.0/29", ("k3s's service range 10.43.0.0/16",)),
    ("10.40.1.0/29", ("network.cidr 10.40.0.0/20",)),
    # Python counts the documentation ranges as private; no host has addresses there.
    ("192.0.2.8/29", ("RFC 5737 documentation range",)),
]


@pytest.mark.parametrize(("value", "words"), BAD_FILESTORE_RANGES, ids=[c[0] for c in BAD_FILESTORE_RANGES])
def test_a_filestore_range_filestore_or_the_nodes_cannot_use_is_refused(gcp_k3s_config, value, words):
    assert_refused_before_any_resource(
        gcp_k3s_config,
        set_path("storage.filestoreRange", value),
        "gpu-k8s:cluster.storage.filestoreRange",
        words,
    )


@pytest.mark.parametrize(
    ("key", "value"), [("filestoreRange", "10.44.0.0/29"), ("filestoreCapacityGiB", 2048)]
)
def test_a_filestore_key_without_filestore_is_refused(gcp_k3s_config, key, value):
    def without_shared(cluster):
        cluster["storage"] = {key: value}

    assert_refused_before_any_resource(
        gcp_k3s_config, without_shared, f"gpu-k8s:cluster.storage.{key}", ("storage.shared: filestore",)
    )


def test_the_filestore_instance_grows_in_place_to_the_configured_size(gcp_k3s, gcp_k3s_config):
    """Day 2: a larger `filestoreCapacityGiB` changes only the instance's capacity (mutable in the Google
    provider's schema: magic-modules Instance.yaml marks `networks` and the share's `name` immutable, not
    `capacityGb`), so Filestore grows the running instance and its data stays."""
    config = copy.deepcopy(gcp_k3s_config)
    set_path("storage.filestoreCapacityGiB", 4096)(config["gpu-k8s:cluster"])
    grown = {r.urn: r for r in run_program("gcp-k3s", config).registrations}
    before = {r.urn: r for r in gcp_k3s.registrations}
    assert set(grown) == set(before)
    changed = [urn for urn, r in before.items() if grown[urn].inputs != r.inputs]
    assert [before[urn].name for urn in changed] == ["ml-filestore-instance"]
    (urn,) = changed
    shares_before, shares_after = before[urn].inputs["fileShares"], grown[urn].inputs["fileShares"]
    assert (shares_before["capacityGb"], shares_after["capacityGb"]) == (1024, 4096)
    assert {**shares_after, "capacityGb": 1024} == shares_before


@pytest.mark.parametrize("value", [1023, 65434])
def test_a_filestore_size_the_basic_tier_does_not_take_is_refused(gcp_k3s_config, value):
    assert_refused_before_any_resource(
        gcp_k3s_config,
        set_path("storage.filestoreCapacityGiB", value),
        "gpu-k8s:cluster.storage.filestoreCapacityGiB",
        (str(value),),
    )


@pytest.mark.parametrize(("stack", "platform"), [("aws-k3s", "aws/k3s"), ("gcp-gke", "gcp/gke")])
def test_a_filestore_range_on_another_platform_is_refused(request, stack, platform):
    """A key of gcp-k3s's storage is not "unknown": the message says it is not one of this platform's."""
    config = request.getfixturevalue(f"{stack.replace('-', '_')}_config")
    assert_refused_before_any_resource(
        config,
        set_path("storage.filestoreRange", "10.44.0.0/29"),
        "gpu-k8s:cluster.storage.filestoreRange",
        (f"not a storage setting on {platform}", f"{platform} storage keys: shared"),
    )


def test_adding_filestore_to_a_running_gcp_k3s_cluster_changes_nothing_it_has(gcp_k3s, gcp_k3s_config):
    """Day 2: every resource the cluster already has keeps its URN and inputs (no server or agent template
    is touched, so no node restarts); the API, instance, driver and class are new."""
    config = copy.deepcopy(gcp_k3s_config)
    delete_key("storage")(config["gpu-k8s:cluster"])
    before = {r.urn: r for r in run_program("gcp-k3s", config).registrations}
    after = {r.urn: r for r in gcp_k3s.registrations}
    assert set(before) <= set(after)
    assert [before[urn].name for urn, r in before.items() if after[urn].inputs != r.inputs] == []
    added = sorted(after[urn].type for urn in set(after) - set(before))
    assert added == [
        "gcp:filestore/instance:Instance",
        "gcp:projects/service:Service",
        "gpu-k8s:gcp:FilestoreSharedStorage",
        "kubernetes:helm.sh/v3:Release",
        "kubernetes:storage.k8s.io/v1:StorageClass",
        "kubernetes:storage.k8s.io/v1:StorageClass",
    ]


@pytest.mark.parametrize("stack", ["aws_eks", "aws_k3s", "gcp_gke", "gcp_k3s"])
def test_checkpoints_get_a_class_that_keeps_their_volumes(request, stack):
    """`shared-rwx-retain` is `shared-rwx` but for its reclaim policy: deleting a claim leaves its volume
    and data (review-training.md T13)."""
    recording = request.getfixturevalue(stack)
    shared = shared_class(recording)
    (retained,) = [
        r for r in recording.by_type(STORAGE_CLASS) if r.inputs["metadata"]["name"] == "shared-rwx-retain"
    ]
    assert shared.inputs["reclaimPolicy"] == "Delete" and retained.inputs["reclaimPolicy"] == "Retain"
    differing = {
        key
        for key in shared.inputs.keys() | retained.inputs.keys()
        if shared.inputs.get(key) != retained.inputs.get(key)
    }
    assert differing == {"metadata", "reclaimPolicy"}
    assert set(retained.dependencies) == set(shared.dependencies)
