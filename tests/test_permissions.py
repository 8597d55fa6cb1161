"""What each cloud identity may do, against expectations written out here (not the constants the code reads).

Sources: the cluster-autoscaler's AWS README ("IAM Policy", the recommended policy with writes limited by the
`k8s.io/cluster-autoscaler/<cluster>` tag), its GCE client (autoscaling_gce_client.go: the instance-group
manager, template, machine-type, zone and operation reads; resizes through instanceGroupManagers.update) and
the GCE PD CSI driver's custom role (deploy/gcp-compute-persistent-disk-csi-driver-custom-role.yaml at
v1.26.4).
"""

from __future__ import annotations

import json
from typing import Any

import parliament
import pytest

from gpu_k8s.tools.engine import Recording

AUTOSCALER_READS = {
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:DescribeAutoScalingInstances",
    "autoscaling:DescribeLaunchConfigurations",
    "autoscaling:DescribeScalingActivities",
    "ec2:DescribeImages",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeLaunchTemplateVersions",
    "ec2:GetInstanceTypesFromInstanceRequirements",
}
AUTOSCALER_WRITES = {"autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"}
OWNED_BY_ML = {"StringEquals": {"aws:ResourceTag/k8s.io/cluster-autoscaler/ml": "owned"}}


def statements(policy_json: str) -> list[tuple[str, frozenset[str], str, str]]:
    """(effect, actions, resources, condition) per statement, order and list/str spelling ignored."""

    def as_set(value: str | list[str]) -> frozenset[str]:
        return frozenset([value] if isinstance(value, str) else value)

    return sorted(
        (
            s["Effect"],
            as_set(s["Action"]),
            ",".join(sorted(as_set(s["Resource"]))),
            json.dumps(s.get("Condition"), sort_keys=True),
        )
        for s in json.loads(policy_json)["Statement"]
    )


def expected_autoscaler_policy() -> list[tuple[str, frozenset[str], str, str]]:
    return sorted(
        [
            ("Allow", frozenset(AUTOSCALER_READS), "*", "null"),
            ("Allow", frozenset({"eks:DescribeNodegroup"}), "arn:aws:eks:*:*:nodegroup/ml/*/*", "null"),
            ("Allow", frozenset(AUTOSCALER_WRITES), "*", json.dumps(OWNED_BY_ML, sort_keys=True)),
        ]
    )


def test_eks_autoscaler_reads_and_writes_only_groups_tagged_for_this_cluster(aws_eks: Recording):
    policy = aws_eks.by_name("ml-autoscaler-identity-policy")
    assert statements(policy.inputs["policy"]) == expected_autoscaler_policy()


def test_eks_cluster_role_may_use_only_its_secrets_key(aws_eks: Recording):
    key = aws_eks.by_name("ml-secrets-key")
    policy = aws_eks.by_name("ml-cluster-secrets-key")
    assert key.inputs["enableKeyRotation"] is True
    assert statements(policy.inputs["policy"]) == [
        (
            "Allow",
            frozenset({"kms:Encrypt", "kms:Decrypt", "kms:ListGrants", "kms:DescribeKey"}),
            f"arn:aws:kms:us-east-1:123456789012:key/{key.id}",
            "null",
        )
    ]
    assert policy.urn in aws_eks.by_name("ml-eks").dependencies


def test_eks_control_plane_logs_are_encrypted_with_a_key_only_their_log_group_may_use(aws_eks: Recording):
    key = aws_eks.by_name("ml-control-plane-logs-key")
    log_group = aws_eks.by_name("ml-control-plane-logs")
    assert key.inputs["enableKeyRotation"] is True
    assert log_group.inputs["kmsKeyId"] == f"arn:aws:kms:us-east-1:123456789012:key/{key.id}"
    assert key.urn in log_group.dependencies
    by_sid = {s["Sid"]: s for s in json.loads(key.inputs["policy"])["Statement"]}
    assert by_sid["AccountAdministersKeyThroughIam"]["Principal"] == {"AWS": "arn:aws:iam::123456789012:root"}
    logs = by_sid["LogsEncryptOneLogGroup"]
    assert logs["Principal"] == {"Service": "logs.us-east-1.amazonaws.com"}
    log_group_arn = "arn:aws:logs:us-east-1:123456789012:log-group:/aws/eks/ml/cluster"
    assert logs["Condition"] == {"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": log_group_arn}}
    assert log_group.inputs["name"] == "/aws/eks/ml/cluster"
    assert set(by_sid) == {"AccountAdministersKeyThroughIam", "LogsEncryptOneLogGroup"}
    # Each wildcard names real KMS actions (a typo would match none and leave the logs service without one).
    expanded = {a["action"] for pattern in logs["Action"] for a in parliament.expand_action(pattern)}
    needed = {"Encrypt", "Decrypt", "ReEncryptFrom", "ReEncryptTo", "GenerateDataKey", "DescribeKey"}
    assert needed <= expanded


def test_k3s_servers_run_the_autoscaler_with_the_same_scoped_policy(aws_k3s: Recording):
    assert statements(aws_k3s.by_name("ml-server-policy").inputs["policy"]) == expected_autoscaler_policy()


def test_k3s_groups_carry_the_tag_the_autoscaler_policy_is_scoped_to(aws_k3s: Recording):
    groups = aws_k3s.by_type("aws:autoscaling/group:Group")
    assert len(groups) == 4  # l4 in three zones, h100 in one
    for group in groups:
        tags = {t["key"]: t["value"] for t in group.inputs["tags"]}
        assert tags["k8s.io/cluster-autoscaler/ml"] == "owned"
        assert tags["k8s.io/cluster-autoscaler/enabled"] == "true"


def gcp_role(recording: Recording, name: str) -> dict[str, Any]:
    return recording.by_name(name).inputs


def test_gce_autoscaler_reads_what_it_plans_with_and_may_only_resize(gcp_k3s: Recording):
    assert set(gcp_role(gcp_k3s, "ml-autoscaler-reader")["permissions"]) == {
        "compute.instanceGroupManagers.get",
        "compute.instanceGroupManagers.list",
        "compute.instanceTemplates.get",
        "compute.machineTypes.get",
        "compute.machineTypes.list",
        "compute.regions.get",
        "compute.zones.list",
        "compute.zoneOperations.get",
    }
    assert gcp_role(gcp_k3s, "ml-autoscaler-resizer")["permissions"] == [
        "compute.instanceGroupManagers.update"
    ]


def test_pd_csi_custom_role_is_upstreams_four_permissions(gcp_k3s: Recording):
    assert set(gcp_role(gcp_k3s, "ml-pd-csi-role")["permissions"]) == {
        "compute.instances.get",
        "compute.instances.attachDisk",
        "compute.instances.detachDisk",
        "compute.disks.get",
    }


def test_aws_nodes_require_imdsv2_with_the_intended_hop_limit(
    aws_eks: Recording, mixed_sharing: Recording, aws_k3s: Recording
):
    """Every launch template and instance: IMDSv2 only, hop limit 1, so no pod without host networking gets
    a token: EKS nodes, k3s GPU agents and k3s servers (whose add-ons that use the role run on the host)."""
    counts = {}
    for recording in (aws_eks, mixed_sharing, aws_k3s):
        nodes = [
            *recording.by_type("aws:ec2/launchTemplate:LaunchTemplate"),
            *recording.by_type("aws:ec2/instance:Instance"),
        ]
        counts[recording.stack] = len(nodes)
        for node in nodes:
            assert node.inputs["metadataOptions"] == {
                "httpEndpoint": "enabled",
                "httpTokens": "required",
                "httpPutResponseHopLimit": 1,
            }, node.name
    # EKS: a template per pool (five GPU pools, the system pool; the mixed-sharing variant has four GPU
    # pools); aws-k3s: two GPU pools, three servers.
    assert counts == {"aws-eks": 6, "mixed": 5, "aws-k3s": 5}


def test_k3s_agents_hold_no_storage_policy(aws_k3s: Recording):
    """The EBS and EFS CSI controllers run on the servers: only their role may attach volumes or make
    access points."""
    attached = {
        (r.inputs["role"].rsplit("-", 1)[0], r.inputs["policyArn"])
        for r in aws_k3s.by_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    }
    # Whole ARNs, paths included: V2 of the EBS policy is at the root, V1 and the EFS policy under
    # service-role/ (the paths are checked against AWS's list by tests/test_references.py).
    assert attached == {
        ("ml-server-role", "arn:aws:iam::aws:policy/AmazonEBSCSIDriverPolicyV2"),
        ("ml-server-role", "arn:aws:iam::aws:policy/service-role/AmazonEFSCSIDriverPolicy"),
    }


NODE_ROLES = {"aws_eks": {"ml-node"}, "aws_k3s": {"ml-server", "ml-agent"}}
SESSION_MANAGER_ACTIONS = [
    "ssm:UpdateInstanceInformation",
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
]


@pytest.mark.parametrize("plan", sorted(NODE_ROLES))
def test_nodes_get_session_manager_and_never_read_every_ssm_parameter(request, plan):
    """S8: AmazonSSMManagedInstanceCore would let every node read every SSM parameter and document of the
    account; nodes get only what Session Manager needs."""
    recording: Recording = request.getfixturevalue(plan)
    attachments = recording.by_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    assert "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore" not in {
        r.inputs["policyArn"] for r in attachments
    }
    inline = recording.by_type("aws:iam/rolePolicy:RolePolicy")
    sessions = [r for r in inline if r.name.endswith("-session-manager")]
    assert {r.name.removesuffix("-session-manager") for r in sessions} == NODE_ROLES[plan]
    for session in sessions:
        (statement,) = json.loads(session.inputs["policy"])["Statement"]
        assert sorted(statement["Action"]) == SESSION_MANAGER_ACTIONS
    for policy in inline:
        if isinstance(policy.inputs["policy"], str):
            for statement in json.loads(policy.inputs["policy"])["Statement"]:
                actions = statement["Action"]
                actions = actions if isinstance(actions, list) else [actions]
                reads_parameters = any(action.startswith("ssm:GetParameter") for action in actions)
                assert not (reads_parameters and statement["Resource"] == "*"), policy.name


def grants_by_role_arn(recording: Recording) -> dict[str, set[str]]:
    """Role ARN (as the mock engine writes it) -> URNs of the attachments and inline policies of that role."""
    roles = {r.urn: r for r in recording.by_type("aws:iam/role:Role")}
    grants: dict[str, set[str]] = {}
    for r in recording.registrations:
        if r.parent in roles and r.type in (
            "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
            "aws:iam/rolePolicy:RolePolicy",
        ):
            arn = f"arn:aws:iam::123456789012:role/{roles[r.parent].id}"
            grants.setdefault(arn, set()).add(r.urn)
    return grants


def role_arns_used(inputs: dict) -> list[str]:
    found = [inputs[k] for k in ("roleArn", "nodeRoleArn") if k in inputs]
    found += [a["roleArn"] for a in inputs.get("podIdentityAssociations", [])]
    return found


def test_what_uses_an_eks_role_waits_for_its_permissions_and_goes_before_them(aws_eks: Recording):
    """Created after the role's policies, destroyed before them: a cluster or node group whose policies go
    first cannot remove its network interfaces, and the VPC then cannot be deleted."""
    grants = grants_by_role_arn(aws_eks)
    users = [r for r in aws_eks.registrations if role_arns_used(r.inputs)]
    assert {r.type for r in users} == {
        "aws:eks/cluster:Cluster",
        "aws:eks/nodeGroup:NodeGroup",
        "aws:eks/addon:Addon",
        "aws:eks/podIdentityAssociation:PodIdentityAssociation",
    }
    for user in users:
        for arn in role_arns_used(user.inputs):
            assert grants[arn] and grants[arn] <= set(user.dependencies), user.name


def test_k3s_nodes_wait_for_their_roles_permissions(aws_k3s: Recording):
    server_grants = {
        r.urn for r in aws_k3s.registrations if r.parent == aws_k3s.by_name("ml-server-role").urn
    }
    agent_grants = {r.urn for r in aws_k3s.registrations if r.parent == aws_k3s.by_name("ml-agent-role").urn}
    # Servers: three attachments (EFS with storage.shared), autoscaler, secrets, snapshots, cloud controller;
    # agents: one, secrets.
    assert len(server_grants) == 7 and len(agent_grants) == 2
    for server in (aws_k3s.by_name(f"ml-server-{i}") for i in range(3)):
        assert server_grants <= set(server.dependencies)
    for group in aws_k3s.by_type("aws:autoscaling/group:Group"):
        assert agent_grants <= set(group.dependencies)
