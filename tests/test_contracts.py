"""Contract tests: every rendered artifact against the published schema of what consumes it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import botocore.session
import kubernetes_validate
import parliament
import pytest
import yaml

from components.autoscaler import COMMON_FLAGS
from components.spec import (
    CLUSTER_AUTOSCALER_CHART_VERSION,
    GPU_OPERATOR_CHART_VERSION,
    SUPPORTED_KUBERNETES_MINORS,
)
from providers.aws.addons import default_storage_class_manifest
from tests.conftest import upstream, upstream_yaml
from tools.engine import PROJECT_ROOT

# Maps whose keys are free-form in the chart (empty or example-only defaults).
OPEN_MAPS = {("extraArgs",), ("nodeSelector",)}
# Cluster-autoscaler flags documented in its FAQ ("What are the parameters to CA?"), REFERENCE.md 5.2.
AUTOSCALER_FLAGS = {
    "cloud-provider",
    "nodes",
    "node-group-auto-discovery",
    "scale-down-unneeded-time",
    "scale-down-delay-after-add",
    "scale-down-utilization-threshold",
    "scale-down-gpu-utilization-threshold",
    "scale-down-unready-time",
    "max-node-provision-time",
    "expander",
    "balance-similar-node-groups",
    "skip-nodes-with-local-storage",
    "skip-nodes-with-system-pods",
    "scan-interval",
    "logtostderr",
    "stderrthreshold",
    "v",
}


def unknown_values(ours: Any, theirs: Any, path: tuple[str, ...] = ()) -> list[str]:
    """Paths of keys we set that the chart's values.yaml does not declare (or declares as another type)."""
    if path in OPEN_MAPS:
        return []
    if isinstance(ours, dict):
        if not isinstance(theirs, dict):
            return [".".join(path) + f" (chart has {type(theirs).__name__})"]
        problems = []
        for key, value in ours.items():
            if key not in theirs:
                problems.append(".".join((*path, key)))
            else:
                problems += unknown_values(value, theirs[key], (*path, key))
        return problems
    if theirs is not None and not isinstance(ours, type(theirs)) and not isinstance(theirs, str):
        return [".".join(path) + f" ({type(ours).__name__} where the chart has {type(theirs).__name__})"]
    return []


def test_unknown_values_catches_typos():
    chart = {"driver": {"enabled": True}, "extraArgs": {}}
    assert unknown_values({"driver": {"enabeld": False}}, chart) == ["driver.enabeld"]
    assert unknown_values({"driver": {"enabled": "no"}}, chart) == [
        "driver.enabled (str where the chart has bool)"
    ]
    assert unknown_values({"driver": {"enabled": False}, "extraArgs": {"x": 1}}, chart) == []


def release_values(aws_eks, name: str) -> dict[str, Any]:
    return aws_eks.by_name(name).inputs["values"]


def test_gpu_operator_values_exist_in_the_pinned_chart(aws_eks):
    chart = upstream_yaml(f"gpu-operator/{GPU_OPERATOR_CHART_VERSION}/values.yaml")
    assert unknown_values(release_values(aws_eks, "ml-gpu-operator-release"), chart) == []


def test_gpu_operator_nfd_values_exist_in_the_vendored_subchart(aws_eks):
    subchart = upstream_yaml(
        f"gpu-operator/{GPU_OPERATOR_CHART_VERSION}/charts/node-feature-discovery/values.yaml"
    )
    ours = release_values(aws_eks, "ml-gpu-operator-release")["node-feature-discovery"]
    assert unknown_values(ours, subchart) == []


def test_autoscaler_values_exist_in_the_pinned_chart(aws_eks):
    chart = upstream_yaml(f"cluster-autoscaler/{CLUSTER_AUTOSCALER_CHART_VERSION}/values.yaml")
    assert (
        yaml.safe_load(
            upstream(f"cluster-autoscaler/{CLUSTER_AUTOSCALER_CHART_VERSION}/Chart.yaml").read_text()
        )["version"]
        == CLUSTER_AUTOSCALER_CHART_VERSION
    )
    values = release_values(aws_eks, "ml-autoscaler-release")
    assert unknown_values(values, chart) == []
    assert set(values["extraArgs"]) <= AUTOSCALER_FLAGS
    assert set(COMMON_FLAGS) <= AUTOSCALER_FLAGS


def test_operator_defaults_we_extend_are_still_the_charts(aws_eks):
    """Our toleration lists replace the chart's; they must still contain the chart's own entries."""
    chart = upstream_yaml(f"gpu-operator/{GPU_OPERATOR_CHART_VERSION}/values.yaml")
    ours = release_values(aws_eks, "ml-gpu-operator-release")
    for toleration in chart["daemonsets"]["tolerations"]:
        assert toleration in ours["daemonsets"]["tolerations"]
    for toleration in chart["node-feature-discovery"]["worker"]["tolerations"]:
        assert toleration in ours["node-feature-discovery"]["worker"]["tolerations"]


def kubernetes_objects(aws_eks) -> list[dict[str, Any]]:
    """Every Kubernetes object the stack registers directly (Helm releases are checked by their values)."""
    objects = [
        r.inputs
        for r in aws_eks.registrations
        if r.type.startswith("kubernetes:") and r.type != "kubernetes:helm.sh/v3:Release"
    ]
    return [*objects, default_storage_class_manifest()]


@pytest.mark.parametrize("minor", SUPPORTED_KUBERNETES_MINORS)
def test_kubernetes_objects_pass_strict_schema_validation(aws_eks, minor):
    objects = kubernetes_objects(aws_eks)
    assert {o["kind"] for o in objects} == {"Namespace", "StorageClass"}
    for obj in objects:
        kubernetes_validate.validate(obj, f"{minor}.0", strict=True)


def test_strict_schema_validation_rejects_a_typo():
    manifest = default_storage_class_manifest() | {"volumeBindingMod": "Immediate"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(manifest, "1.35.0", strict=True)


@pytest.fixture(scope="module")
def eks_model():
    return botocore.session.get_session().get_service_model("eks")


@pytest.fixture(scope="module")
def ec2_model():
    return botocore.session.get_session().get_service_model("ec2")


def enum(model, shape: str) -> set[str]:
    return set(model.shape_for(shape).enum)


def test_eks_values_are_members_of_botocore_enums(aws_eks, eks_model):
    for group in aws_eks.by_type("aws:eks/nodeGroup:NodeGroup"):
        assert group.inputs["amiType"] in enum(eks_model, "AMITypes")
        assert group.inputs["capacityType"] in enum(eks_model, "CapacityTypes")
        for taint in group.inputs.get("taints", []):
            assert taint["effect"] in enum(eks_model, "TaintEffect")
    cluster = aws_eks.by_type("aws:eks/cluster:Cluster")[0].inputs
    assert set(cluster["enabledClusterLogTypes"]) == enum(eks_model, "LogType")
    assert cluster["accessConfig"]["authenticationMode"] in enum(eks_model, "AuthenticationMode")
    for addon in aws_eks.by_type("aws:eks/addon:Addon"):
        assert addon.inputs["resolveConflictsOnCreate"] in enum(eks_model, "ResolveConflicts")
    (entry,) = aws_eks.by_type("aws:eks/accessEntry:AccessEntry")
    assert entry.inputs["type"] == "STANDARD"


def test_ec2_values_are_members_of_botocore_enums(aws_eks, ec2_model):
    instance_types = enum(ec2_model, "InstanceType")
    for group in aws_eks.by_type("aws:eks/nodeGroup:NodeGroup"):
        assert set(group.inputs["instanceTypes"]) <= instance_types
    for template in aws_eks.by_type("aws:ec2/launchTemplate:LaunchTemplate"):
        assert template.inputs["blockDeviceMappings"][0]["ebs"]["volumeType"] in enum(ec2_model, "VolumeType")
        assert template.inputs["metadataOptions"]["httpTokens"] in enum(
            ec2_model, "LaunchTemplateHttpTokensState"
        )


def serious_findings(document: str, trust_policy: bool) -> list[tuple[str, str, Any]]:
    """Parliament findings of any severity, stricter than the medium-or-above bar: parliament rates an
    unknown action LOW, and a typo in an action is exactly what this must catch. Two findings are
    expected by design and dropped:
    - a role trust policy has no Resource (parliament reads every document as an identity policy);
    - RESOURCE_STAR on actions whose statement is scoped by an `aws:ResourceTag` condition.
    """
    statements = json.loads(document)["Statement"]
    tag_scoped = {
        action
        for statement in statements
        if any(
            key.startswith("aws:ResourceTag/") for c in statement.get("Condition", {}).values() for key in c
        )
        for action in (
            statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        )
    }
    findings = [parliament.enhance_finding(f) for f in parliament.analyze_policy_string(document).findings]
    problems = [
        (f.severity, f.issue, f.detail)
        for f in findings
        if not (
            trust_policy and f.issue == "MALFORMED" and "neither Resource nor NotResource" in str(f.detail)
        )
        and not (f.issue == "RESOURCE_STAR" and set(f.detail) <= tag_scoped)
    ]
    if trust_policy:
        # Parliament stops at the missing Resource, so check what it would have: actions and principals.
        for statement in statements:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            for action in actions:
                try:
                    parliament.expand_action(action)
                except (parliament.UnknownActionException, parliament.UnknownPrefixException) as exc:
                    problems.append(("MEDIUM", "UNKNOWN_ACTION", str(exc)))
            services = statement["Principal"].get("Service", "")
            if not str(services).endswith(".amazonaws.com"):
                problems.append(("HIGH", "TRUST_NOT_A_SERVICE", statement["Principal"]))
    return problems


def test_iam_documents_pass_parliament_without_medium_findings(aws_eks):
    trust = [(r.name, r.inputs["assumeRolePolicy"]) for r in aws_eks.by_type("aws:iam/role:Role")]
    identity = [(r.name, r.inputs["policy"]) for r in aws_eks.by_type("aws:iam/rolePolicy:RolePolicy")]
    assert len(trust) >= 4 and identity
    for name, document in trust:
        assert serious_findings(document, trust_policy=True) == [], (name, json.loads(document))
    for name, document in identity:
        assert serious_findings(document, trust_policy=False) == [], (name, json.loads(document))


def test_trust_policy_linting_still_catches_a_bad_action():
    document = json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": "pods.eks.amazonaws.com"},
                    "Action": "sts:AssumeRol",
                }
            ],
        }
    )
    assert serious_findings(document, trust_policy=True)


def test_unscoped_writes_are_still_findings():
    document = json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "autoscaling:SetDesiredCapacity", "Resource": "*"}],
        }
    )
    assert [issue for _, issue, _ in serious_findings(document, trust_policy=False)] == ["RESOURCE_STAR"]


def test_identity_policy_linting_catches_a_bad_action():
    document = json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "autoscaling:SetDesiredCapacty", "Resource": "*"}],
        }
    )
    assert any(issue == "UNKNOWN_ACTION" for _, issue, _ in serious_findings(document, trust_policy=False))


def test_managed_policy_arns_are_well_formed(aws_eks):
    for attachment in aws_eks.by_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment"):
        assert attachment.inputs["policyArn"].startswith("arn:aws:iam::aws:policy/")


def venv_tool(name: str) -> str:
    """A linter installed by a dev dependency: beside this interpreter even when the venv is not activated."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    assert found, f"{name} is not installed; run `make test` (it installs the dev dependencies)"
    return found


def test_ci_script_passes_shellcheck():
    result = subprocess.run(
        [venv_tool("shellcheck"), str(PROJECT_ROOT / ".ci" / "run")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout


def test_preview_workflow_passes_actionlint():
    workflow = PROJECT_ROOT / ".github" / "workflows" / "preview.yml"
    # actionlint runs shellcheck on `run:` steps when it finds it on PATH.
    env = {
        **os.environ,
        "PATH": f"{Path(venv_tool('shellcheck')).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    result = subprocess.run([venv_tool("actionlint"), str(workflow)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_project_file_uses_only_schema_fields():
    """Pulumi's project schema (sdk/go/common/workspace/project.json): config declarations take only these
    keys, and `type` is one of string/integer/boolean/array."""
    project = yaml.safe_load((PROJECT_ROOT / "Pulumi.yaml").read_text())
    assert project["name"] == "gpu-k8s" and project["stackConfigDir"] == "stacks"
    for key, declaration in project["config"].items():
        assert set(declaration) <= {"type", "items", "description", "secret", "default", "value"}, key
        assert declaration.get("type", "string") in {"string", "integer", "boolean", "array"}, key
    assert project["config"]["pulumi:disable-default-providers"]["value"] == ["*"]
    assert Path(PROJECT_ROOT / "stacks" / "README.md").is_file()
