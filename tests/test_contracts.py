"""Contract tests: every rendered artifact against the published schema of what consumes it."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import botocore.session
import jsonschema
import kubernetes_validate
import parliament
import pytest
import yaml

from gpu_k8s.components.autoscaler import COMMON_FLAGS
from gpu_k8s.components.batch import JOBSET_CHART_VERSION, KUEUE_CHART_VERSION
from gpu_k8s.components.catalog import load_catalog
from gpu_k8s.components.compat import CLUSTER_AUTOSCALER_CHART_VERSION, GPU_OPERATOR_CHART_VERSION
from gpu_k8s.components.monitoring import CHART_VERSION as MONITORING_CHART_VERSION
from gpu_k8s.components.sharing import (
    BALANCED_LAYOUTS,
    MIG_PROFILE,
    NOT_IN_OPERATOR_CONFIG,
    MigGeometry,
    SharingSpec,
    builtin_layouts,
    mig_layout,
)
from gpu_k8s.components.spec import SUPPORTED_KUBERNETES_MINORS
from gpu_k8s.providers.aws.addons import default_storage_class_manifest
from gpu_k8s.tools.charts import CHARTS_ROOT
from tests.conftest import some, upstream, upstream_yaml, venv_tool
from tests.paths import REPO_ROOT
from tests.test_charts import crd_schemas

# Maps whose keys are free-form in the chart (empty or example-only defaults).
# Values the charts pass through whole (toYaml): any key of the Kubernetes field they become.
OPEN_MAPS = {
    ("extraArgs",),
    ("nodeSelector",),
    ("controller", "nodeSelector"),
    ("daemonsetNodeSelector",),
    # cluster-autoscaler: a Deployment's `strategy` (templates/deployment.yaml); the EBS and EFS CSI
    # controllers' strategy and its rollingUpdate (templates/controller.yaml, controller-deployment.yaml).
    ("updateStrategy",),
    ("controller", "updateStrategy"),
    ("controller", "rollingUpdate"),
}
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
    # FAQ "How can I use ProvisioningRequest to run batch workloads" (cluster-autoscaler-1.36.1).
    "enable-provisioning-requests",
    # FAQ parameter table: "One label per flag occurrence" (a multi-string flag in config/flags/flags.go).
    "balancing-ignore-label",
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
    # Pulumi sends every number as a double: a whole one is the chart's int.
    if isinstance(ours, float) and ours.is_integer() and type(theirs) is int:
        return []
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
    counted = {"replicaCount": 2}
    assert unknown_values({"replicaCount": 1.0}, counted) == []
    assert unknown_values({"replicaCount": 1.5}, counted) == ["replicaCount (float where the chart has int)"]


def release_values(aws_eks, name: str) -> dict[str, Any]:
    return aws_eks.by_name(name).inputs["values"]


def _merged(base: Any, override: Any) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        return {**base, **{k: _merged(base.get(k), v) for k, v in override.items()}}
    return override


def operator_chart_values() -> dict[str, Any]:
    """The operator chart's values as Helm sees them: its own values.yaml over the vendored NFD sub-chart's
    defaults under `node-feature-discovery`."""
    chart = upstream_yaml(f"gpu-operator/{GPU_OPERATOR_CHART_VERSION}/values.yaml")
    subchart = upstream_yaml(
        f"gpu-operator/{GPU_OPERATOR_CHART_VERSION}/charts/node-feature-discovery/values.yaml"
    )
    return {**chart, "node-feature-discovery": _merged(subchart, chart["node-feature-discovery"])}


@pytest.mark.parametrize("stack", ["aws_eks", "mixed_sharing", "gcp_gke", "aws_k3s", "gcp_k3s"])
def test_gpu_operator_values_exist_in_the_pinned_chart(request, stack):
    chart = operator_chart_values()
    assert (
        unknown_values(release_values(request.getfixturevalue(stack), "ml-gpu-operator-release"), chart) == []
    )


def test_gpu_operator_nfd_values_exist_in_the_vendored_subchart(aws_eks):
    subchart = upstream_yaml(
        f"gpu-operator/{GPU_OPERATOR_CHART_VERSION}/charts/node-feature-discovery/values.yaml"
    )
    ours = release_values(aws_eks, "ml-gpu-operator-release")["node-feature-discovery"]
    assert unknown_values(ours, subchart) == []


def test_kueue_values_exist_in_the_pinned_chart(aws_eks):
    chart = upstream_yaml(f"kueue/{KUEUE_CHART_VERSION}/values.yaml")
    assert unknown_values(release_values(aws_eks, "ml-batch-kueue"), chart) == []


def test_jobset_values_exist_in_the_pinned_chart(aws_eks):
    chart = yaml.safe_load(
        (REPO_ROOT / "upstream" / "charts" / f"jobset-{JOBSET_CHART_VERSION}" / "values.yaml").read_text()
    )
    assert unknown_values(release_values(aws_eks, "ml-batch-jobset"), chart) == []


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
    # The chart renders a key as the flag before its first "_" (templates/deployment.yaml), so one flag can
    # be given several times.
    assert {key.split("_", 1)[0] for key in values["extraArgs"]} <= AUTOSCALER_FLAGS
    assert set(COMMON_FLAGS) <= AUTOSCALER_FLAGS


def test_operator_defaults_we_extend_are_still_the_charts(aws_eks):
    """Our toleration lists replace the chart's; they must still contain the chart's own entries."""
    chart = upstream_yaml(f"gpu-operator/{GPU_OPERATOR_CHART_VERSION}/values.yaml")
    ours = release_values(aws_eks, "ml-gpu-operator-release")
    for toleration in chart["daemonsets"]["tolerations"]:
        assert toleration in ours["daemonsets"]["tolerations"]
    for toleration in chart["node-feature-discovery"]["worker"]["tolerations"]:
        assert toleration in ours["node-feature-discovery"]["worker"]["tolerations"]


KUEUE_CRDS = sorted((REPO_ROOT / "upstream" / "kueue" / KUEUE_CHART_VERSION / "crds").glob("*.yaml"))
PROMETHEUS_RULE_CRD = (
    CHARTS_ROOT
    / f"kube-prometheus-stack-{MONITORING_CHART_VERSION}"
    / "charts/crds/crds/crd-prometheusrules.yaml"
)


def kubernetes_objects(*recordings) -> list[dict[str, Any]]:
    """Every Kubernetes object the stacks register directly (Helm releases are checked by their values, and
    patches merged into what they patch: tests/test_server_admission.py)."""
    objects = [
        r.inputs
        for recording in recordings
        for r in recording.registrations
        if r.type.startswith("kubernetes:")
        and r.type != "kubernetes:helm.sh/v3:Release"
        and not r.type.endswith("Patch")
    ]
    return [*objects, default_storage_class_manifest()]


@pytest.mark.parametrize("minor", SUPPORTED_KUBERNETES_MINORS)
def test_kubernetes_objects_pass_strict_schema_validation(
    aws_eks, mixed_sharing, gcp_gke, aws_k3s, gcp_k3s, minor
):
    objects = kubernetes_objects(aws_eks, mixed_sharing, gcp_gke, aws_k3s, gcp_k3s)
    # Custom resources against the schema of the CRD the stack installs with them (k3s upgrade Plans) or
    # its chart installs (Kueue's, pinned under upstream/kueue; the Prometheus Operator's, in the pinned
    # kube-prometheus-stack).
    kueue_crds = [upstream_yaml(f"kueue/{KUEUE_CHART_VERSION}/crds/{path.name}") for path in KUEUE_CRDS]
    prometheus_crds = [yaml.safe_load(PROMETHEUS_RULE_CRD.read_text())]
    schemas = {
        (api, kind): schema
        for (api, kind, _), schema in crd_schemas([*objects, *kueue_crds, *prometheus_crds]).items()
    }
    custom = [o for o in objects if (o["apiVersion"], o["kind"]) in schemas]
    assert {o["kind"] for o in custom} == {
        "Plan",
        "ResourceFlavor",
        "ClusterQueue",
        "LocalQueue",
        "AdmissionCheck",
        "ProvisioningRequestConfig",
        "PrometheusRule",
    }
    for obj in custom:
        jsonschema.validate(obj, schemas[obj["apiVersion"], obj["kind"]])
    objects = [o for o in objects if o not in custom]
    assert {o["kind"] for o in objects} == {
        "Namespace",
        "StorageClass",
        "ConfigMap",
        "ResourceQuota",
        # The GCE PD CSI driver's objects (gcp-k3s), as the stack registers them.
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "PriorityClass",
        "Deployment",
        "DaemonSet",
        "CSIDriver",
        # system-upgrade-controller's Plan CRD (k3s), the autoscaler's ProvisioningRequest CRD (batch).
        "CustomResourceDefinition",
        # k3s: no workload pod on a server (components/k3s/admission.py).
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
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
        assert group.inputs["updateConfig"]["updateStrategy"] in enum(eks_model, "NodegroupUpdateStrategies")
        assert set(group.inputs["nodeRepairConfig"]) <= set(eks_model.shape_for("NodeRepairConfig").members)
        for taint in group.inputs.get("taints", []):
            assert taint["effect"] in enum(eks_model, "TaintEffect")
    cluster = aws_eks.by_type("aws:eks/cluster:Cluster")[0].inputs
    assert cluster["upgradePolicy"]["supportType"] in enum(eks_model, "SupportType")
    assert set(cluster["enabledClusterLogTypes"]) == enum(eks_model, "LogType")
    assert cluster["accessConfig"]["authenticationMode"] in enum(eks_model, "AuthenticationMode")
    for addon in aws_eks.by_type("aws:eks/addon:Addon"):
        assert addon.inputs["resolveConflictsOnCreate"] in enum(eks_model, "ResolveConflicts")
    (entry,) = aws_eks.by_type("aws:eks/accessEntry:AccessEntry")
    assert entry.inputs["type"] == "STANDARD"


def test_ec2_values_are_members_of_botocore_enums(aws_eks, ec2_model):
    instance_types = enum(ec2_model, "InstanceType")
    for group in some(aws_eks.by_type("aws:eks/nodeGroup:NodeGroup"), at_least=5):
        assert set(group.inputs["instanceTypes"]) <= instance_types
    for template in some(aws_eks.by_type("aws:ec2/launchTemplate:LaunchTemplate"), at_least=5):
        assert template.inputs["blockDeviceMappings"][0]["ebs"]["volumeType"] in enum(ec2_model, "VolumeType")
        assert template.inputs["metadataOptions"]["httpTokens"] in enum(
            ec2_model, "LaunchTemplateHttpTokensState"
        )
        for spec in template.inputs["tagSpecifications"]:
            assert spec["resourceType"] in enum(ec2_model, "ResourceType")


# Pulumi's launch-template network interface keys and the EC2 API members they become (security groups are
# `Groups` in the API).
INTERFACE_MEMBERS = {"securityGroups": "Groups"}


def test_efa_launch_templates_and_placement_groups_are_what_ec2_takes(aws_eks, aws_k3s_efa, ec2_model):
    """Every EFA interface key is a member of EC2's launch-template interface request, and the placement
    strategy one of EC2's, on EKS and on k3s agents."""
    members = set(ec2_model.shape_for("LaunchTemplateInstanceNetworkInterfaceSpecificationRequest").members)
    templates = [
        t
        for recording in (aws_eks, aws_k3s_efa)
        for t in recording.by_type("aws:ec2/launchTemplate:LaunchTemplate")
        if "networkInterfaces" in t.inputs
    ]
    for template in some(templates, at_least=2):
        for interface in template.inputs["networkInterfaces"]:
            keys = {INTERFACE_MEMBERS.get(key, key[0].upper() + key[1:]) for key in interface}
            assert keys <= members, keys - members
            assert interface["interfaceType"] in {"interface", "efa", "efa-only"} & enum(
                ec2_model, "NetworkInterfaceType"
            )
            if interface["interfaceType"] == "efa-only":
                # An EFA-only interface holds no address: EC2 refuses one asked for it.
                assert not {k for k in keys if "Ip" in k or "Prefix" in k}, keys
    placements = [*aws_eks.by_type("aws:ec2/placementGroup:PlacementGroup")]
    placements += aws_k3s_efa.by_type("aws:ec2/placementGroup:PlacementGroup")
    for placement in some(placements, at_least=2):
        assert placement.inputs["strategy"] in enum(ec2_model, "PlacementStrategy")


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


# Documents whose parliament findings are checked elsewhere, with the reason.
FINDINGS_CHECKED_ELSEWHERE = {
    # parliament's action data is older than the Service Authorization Reference for a few of the k3s cloud
    # controller's actions: tests/test_aws_k3s.py checks each finding against the pinned reference table.
    "ml-server-cloud-controller",
}


@pytest.mark.parametrize("stack", ["aws_eks", "aws_k3s"])
def test_iam_documents_pass_parliament_without_medium_findings(request, stack):
    recording = request.getfixturevalue(stack)
    trust = [(r.name, r.inputs["assumeRolePolicy"]) for r in recording.by_type("aws:iam/role:Role")]
    identity = [(r.name, r.inputs["policy"]) for r in recording.by_type("aws:iam/rolePolicy:RolePolicy")]
    assert len(trust) >= 2 and identity
    for name, document in trust:
        assert serious_findings(document, trust_policy=True) == [], (name, json.loads(document))
    for name, document in identity:
        if name not in FINDINGS_CHECKED_ELSEWHERE:
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
    for attachment in some(aws_eks.by_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")):
        assert attachment.inputs["policyArn"].startswith("arn:aws:iam::aws:policy/")


def test_ci_script_passes_shellcheck():
    result = subprocess.run(
        [venv_tool("shellcheck"), str(REPO_ROOT / ".ci" / "run")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout


def test_preview_workflow_passes_actionlint():
    workflow = REPO_ROOT / ".github" / "workflows" / "preview.yml"
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
    project = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    assert project["name"] == "gpu-k8s" and project["stackConfigDir"] == "stacks"
    # Project option (ProjectOptions.refresh: "always" runs a refresh as part of every update, preview and
    # destroy): sizes the autoscaler changed are read back before an update sends them.
    assert project["options"] == {"refresh": "always"}
    for key, declaration in project["config"].items():
        assert set(declaration) <= {"type", "items", "description", "secret", "default", "value"}, key
        assert declaration.get("type", "string") in {"string", "integer", "boolean", "array"}, key
    assert project["config"]["pulumi:disable-default-providers"]["value"] == [
        "aws",
        "gcp",
        "kubernetes",
        "tls",
        "random",
    ]
    assert Path(REPO_ROOT / "stacks" / "README.md").is_file()


def test_every_package_but_the_dynamic_host_must_name_its_provider(aws_eks, gcp_gke, aws_k3s, gcp_k3s):
    """The deny list names every package the program registers resources of; only the Python language host's
    dynamic provider (the readiness gate), which has no explicit form, runs as a default provider."""
    project = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    denied = set(project["config"]["pulumi:disable-default-providers"]["value"])
    used = {
        r.type.split(":", 1)[0]
        for rec in (aws_eks, gcp_gke, aws_k3s, gcp_k3s)
        for r in rec.registrations
        if r.custom and not r.type.startswith("pulumi:providers:")
    }
    assert used - denied == {"pulumi-python"}
    assert denied <= used


# --- GPU sharing: the device-plugin and mig-parted configs, parsed back and checked against upstream ---
# kubernetes-validate only sees ConfigMap strings; these checks read what the device plugin and the MIG
# manager will read.

DEVICE_PLUGIN_EXAMPLES = (
    "k8s-device-plugin/0.20.0/readme-examples/time-slicing-config.yaml",
    "k8s-device-plugin/0.20.0/readme-examples/mps-config.yaml",
    "k8s-device-plugin/0.20.0/readme-examples/config-file.yaml",
)
OPERATOR_SHARING_EXAMPLES = (
    f"gpu-operator/{GPU_OPERATOR_CHART_VERSION}/docs-examples/time-slicing-config-all.yaml",
    f"gpu-operator/{GPU_OPERATOR_CHART_VERSION}/docs-examples/time-slicing-config-fine.yaml",
    f"gpu-operator/{GPU_OPERATOR_CHART_VERSION}/docs-examples/time-slicing-config-sample.yaml",
)
OPERATOR_MIG_CONFIG = (
    f"gpu-operator/{GPU_OPERATOR_CHART_VERSION}/assets/state-mig-manager/0400_configmap.yaml"
)
MIG_PARTED_EXAMPLES = (
    "mig-parted/v0.15.0/examples/config.yaml",
    "mig-parted/v0.15.0/examples/dgx-station-80gb-config.yaml",
)
# k8s-device-plugin api/config/v1 (REFERENCE.md 1.2): Config, ReplicatedResources, ReplicatedResource.
CONFIG_KEYS = {"version", "flags", "resources", "sharing", "imex"}
REPLICATED_KEYS = {"renameByDefault", "failRequestsGreaterThanOne", "resources"}
REPLICATED_RESOURCE_KEYS = {"name", "rename", "devices", "replicas"}
SHARABLE_RESOURCE = re.compile(r"^nvidia\.com/(gpu|mig-\d+g\.\d+gb)$")
MIG_DEVICE_SPEC_KEYS = {"device-filter", "devices", "mig-enabled", "mig-devices"}


def device_plugin_problems(config: Any) -> list[str]:
    """Why the device plugin would reject (or silently ignore) this config; [] when it is sound."""
    if not isinstance(config, dict) or config.get("version") != "v1":
        return ["version must be v1"]
    problems = [f"unknown key {key}" for key in set(config) - CONFIG_KEYS]
    sharing = config.get("sharing") or {}
    if len(set(sharing) & {"timeSlicing", "mps"}) > 1 or set(sharing) - {"timeSlicing", "mps"}:
        problems.append(f"sharing must be exactly one of timeSlicing, mps: {sorted(sharing)}")
    for mode, replicated in sharing.items():
        problems += [f"{mode}: unknown key {key}" for key in set(replicated) - REPLICATED_KEYS]
        problems += [
            f"{mode}.{key} must be a bool"
            for key in ("renameByDefault", "failRequestsGreaterThanOne")
            if key in replicated and not isinstance(replicated[key], bool)
        ]
        resources = replicated.get("resources") or []
        if not resources:
            problems.append(f"{mode}: no resources")
        for resource in resources:
            problems += [
                f"{mode}: unknown resource key {key}" for key in set(resource) - REPLICATED_RESOURCE_KEYS
            ]
            if not SHARABLE_RESOURCE.match(str(resource.get("name"))):
                problems.append(f"{mode}: {resource.get('name')} cannot be shared")
            replicas = resource.get("replicas")
            # A strategy is active only with replicas > 1 (api/config/v1/replicas.go).
            if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 2:
                problems.append(f"{mode}: replicas {replicas!r} shares nothing")
    return problems


def mig_parted_problems(config: Any) -> list[str]:
    """Why mig-parted would reject this config (its `version: v1` format); [] when it is sound."""
    if (
        not isinstance(config, dict)
        or config.get("version") != "v1"
        or set(config) != {"version", "mig-configs"}
    ):
        return ["must be {version: v1, mig-configs: ...}"]
    problems = []
    for name, specs in config["mig-configs"].items():
        for spec in specs:
            problems += [f"{name}: unknown key {key}" for key in set(spec) - MIG_DEVICE_SPEC_KEYS]
            devices = spec.get("devices")
            if devices != "all" and not (
                isinstance(devices, list) and all(isinstance(d, int) for d in devices)
            ):
                problems.append(f"{name}: devices must be 'all' or a list of indexes")
            if not isinstance(spec.get("mig-enabled"), bool):
                problems.append(f"{name}: mig-enabled must be a bool")
            for profile, count in (spec.get("mig-devices") or {}).items():
                if not MIG_PROFILE.match(profile.split("+")[0].split("-")[0]) or not isinstance(count, int):
                    problems.append(f"{name}: {profile}: {count!r} is not a MIG profile count")
            if spec.get("mig-devices") and not spec["mig-enabled"]:
                problems.append(f"{name}: MIG devices on a GPU with MIG disabled")
    return problems


def config_map_documents(recording, name: str) -> dict[str, Any]:
    return {key: yaml.safe_load(text) for key, text in recording.by_name(name).inputs["data"].items()}


def upstream_device_plugin_configs() -> list[Any]:
    documents = [upstream_yaml(path) for path in DEVICE_PLUGIN_EXAMPLES]
    for path in OPERATOR_SHARING_EXAMPLES:
        documents += [yaml.safe_load(text) for text in upstream_yaml(path)["data"].values()]
    return documents


def test_upstream_device_plugin_examples_pass_our_checker():
    documents = upstream_device_plugin_configs()
    assert len(documents) == 7
    for document in documents:
        assert device_plugin_problems(document) == [], document


@pytest.mark.parametrize(
    ("broken", "problem"),
    [
        (
            {
                "version": "v1",
                "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 0}]}},
            },
            "replicas 0",
        ),
        (
            {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replica": 4}]}}},
            "unknown resource key",
        ),
        ({"version": "v2"}, "version"),
        (
            {"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": "yes", "resources": []}}},
            "must be a bool",
        ),
    ],
)
def test_device_plugin_checker_catches_what_kubernetes_validate_cannot(broken, problem):
    assert any(problem in p for p in device_plugin_problems(broken))


@pytest.mark.parametrize("stack", ["aws_eks", "mixed_sharing"])
def test_rendered_device_plugin_configs_are_sound_and_shaped_like_upstream(request, stack):
    recording = request.getfixturevalue(stack)
    documents = config_map_documents(recording, "ml-gpu-operator-device-plugin-config")
    upstream_keys = {key for doc in upstream_device_plugin_configs() for key in doc}
    upstream_replicated = {
        key
        for doc in upstream_device_plugin_configs()
        for mode in (doc.get("sharing") or {}).values()
        for key in mode
    }
    for key, document in some(documents.items(), at_least=2):
        assert device_plugin_problems(document) == [], (key, document)
        assert set(document) <= upstream_keys
        for replicated in (document.get("sharing") or {}).values():
            assert set(replicated) <= upstream_replicated


def test_upstream_mig_configs_pass_our_checker():
    documents = [yaml.safe_load(upstream_yaml(OPERATOR_MIG_CONFIG)["data"]["config.yaml"])]
    documents += [upstream_yaml(path) for path in MIG_PARTED_EXAMPLES]
    documents += [
        yaml.safe_load(
            upstream_yaml(f"gpu-operator/{GPU_OPERATOR_CHART_VERSION}/docs-examples/custom-mig-config.yaml")[
                "data"
            ]["config.yaml"]
        )
    ]
    for document in documents:
        assert mig_parted_problems(document) == []


def test_rendered_mig_config_is_sound_and_every_layout_fits_its_gpu(mixed_sharing):
    (document,) = config_map_documents(mixed_sharing, "ml-gpu-operator-mig-config").values()
    assert mig_parted_problems(document) == []
    assert mig_parted_problems({**document, "version": "v2"}) != []
    catalog = load_catalog()
    pools = {p["name"]: p for p in mixed_sharing.outputs["gpuPools"]}
    groups = {
        r.inputs["labels"].get("nvidia.com/mig.config"): r
        for r in mixed_sharing.by_type("aws:eks/nodeGroup:NodeGroup")
    }
    for layout, (spec,) in document["mig-configs"].items():
        if layout == "all-disabled":
            continue
        pool = pools[groups[layout].inputs["labels"]["gpu-k8s.io/pool"]]
        model = catalog.gpu_models[pool["gpuModel"]]
        assert MigGeometry.of(model).misfit(spec["mig-devices"]) is None, layout


def operator_mig_layouts() -> dict[str, list[dict[str, int]]]:
    """The operator's built-in layouts: name -> the mig-devices of each of its device entries."""
    configs = yaml.safe_load(upstream_yaml(OPERATOR_MIG_CONFIG)["data"]["config.yaml"])["mig-configs"]
    return {name: [spec.get("mig-devices") or {} for spec in specs] for name, specs in configs.items()}


def test_every_builtin_layout_we_name_is_the_operators_for_that_gpu():
    """`profile: X` and `layout: all-...` pick a layout by name; the operator must define it identically."""
    upstream_layouts = operator_mig_layouts()
    for model in load_catalog().gpu_models.values():
        if not model.mig_capable:
            continue
        assert builtin_layouts(model) or model.id in NOT_IN_OPERATOR_CONFIG
        for name, devices in builtin_layouts(model).items():
            assert devices in upstream_layouts.get(name, []), (model.id, name, devices)


def test_balanced_layouts_table_is_the_operators():
    upstream_balanced = operator_mig_layouts()["all-balanced"]
    assert all(layout in upstream_balanced for layout in BALANCED_LAYOUTS.values())
    # A GPU without an all-balanced entry upstream must not claim one.
    profile_sets = [set(layout) for layout in upstream_balanced]
    for model in load_catalog().gpu_models.values():
        if model.mig_capable and model.id not in BALANCED_LAYOUTS:
            assert not any(s <= set(MigGeometry.of(model).profiles) for s in profile_sets), model.id


def test_a_gpu_missing_from_the_operator_config_gets_its_profile_as_a_custom_layout():
    model = load_catalog().gpu_models["nvidia-rtx-pro-4500-blackwell"]
    layout = mig_layout(SharingSpec(mode="mig", profile="1g.16gb"), model, "g7")
    assert (layout.name, dict(layout.devices), layout.builtin) == ("custom-g7", {"1g.16gb": 2}, False)
    assert "all-1g.16gb" not in operator_mig_layouts()


def test_mig_geometry_accepts_every_layout_nvidia_ships():
    """Our slice budget must not refuse a layout NVIDIA builds: each upstream layout fits at least one catalog
    GPU that has all of its profiles."""
    layouts = [devices for entries in operator_mig_layouts().values() for devices in entries]
    layouts += [
        spec.get("mig-devices") or {}
        for path in MIG_PARTED_EXAMPLES
        for specs in upstream_yaml(path)["mig-configs"].values()
        for spec in specs
    ]
    models = [m for m in load_catalog().gpu_models.values() if m.mig_capable]
    checked = 0
    for devices in layouts:
        # GB300's all-1g.35gb (7 per GPU); GB300 is not in the catalog, and on the H200 1g.35gb fits 4 times.
        if not devices or any(not MIG_PROFILE.match(p) for p in devices) or devices == {"1g.35gb": 7}:
            continue
        owners = [m for m in models if set(devices) <= set(MigGeometry.of(m).profiles)]
        if owners:
            checked += 1
            assert any(MigGeometry.of(m).misfit(devices) is None for m in owners), devices
    assert checked > 40


# --- GKE: every field and enum value we send, against Google's discovery document of the GKE API ---

GKE_API = "gke-api/v1-rev20261027/container.v1.json"
# pulumi-gcp (Terraform-shaped) names that the API spells differently: (schema, our key) -> API path.
GKE_RENAMED = {
    ("Cluster", "minMasterVersion"): ("initialClusterVersion",),
    ("Cluster", "nodeLocations"): ("locations",),
    ("Cluster", "enableShieldedNodes"): ("shieldedNodes", "enabled"),
    ("Cluster", "enableLegacyAbac"): ("legacyAbac", "enabled"),
    ("Cluster", "clusterAutoscaling"): ("autoscaling",),
    ("Cluster", "datapathProvider"): ("networkConfig", "datapathProvider"),
    ("LoggingConfig", "enableComponents"): ("componentConfig", "enableComponents"),
    ("MonitoringConfig", "enableComponents"): ("componentConfig", "enableComponents"),
    ("NodePool", "nodeConfig"): ("config",),
    ("NodePool", "nodeLocations"): ("locations",),
    ("NodeConfig", "guestAccelerators"): ("accelerators",),
    ("AcceleratorConfig", "type"): ("acceleratorType",),
    ("AcceleratorConfig", "count"): ("acceleratorCount",),
    ("MaintenancePolicy", "dailyMaintenanceWindow"): ("window", "dailyMaintenanceWindow"),
    ("MaintenancePolicy", "maintenanceExclusions"): ("window", "maintenanceExclusions"),
    ("TimeWindow", "exclusionOptions"): ("maintenanceExclusionOptions",),
}
# Provider-side fields with no API counterpart: where the object lives, and Terraform-only behaviour
# (networkingMode VPC_NATIVE becomes ipAllocationPolicy.useIpAliases).
GKE_PROVIDER_ONLY = {
    ("Cluster", "project"),
    ("Cluster", "removeDefaultNodePool"),
    ("Cluster", "deletionProtection"),
    ("Cluster", "networkingMode"),
    ("NodePool", "cluster"),
    ("NodePool", "location"),
    ("NodePool", "project"),
    # A fixed size: the provider creates the pool with it and resizes through nodePools.setSize.
    ("NodePool", "nodeCount"),
    # The provider lists exclusions with their name; the API keys its map of TimeWindows by it.
    ("TimeWindow", "exclusionName"),
}


@dataclass(frozen=True)
class GoogleApi:
    """A Google API's discovery schemas, and how pulumi-gcp's (Terraform-shaped) inputs map onto them:
    (schema, our key) -> API path for renamed fields, and (schema, key) pairs the API has no field for."""

    schemas: dict[str, Any]
    renamed: dict[tuple[str, str], tuple[str, ...]]
    provider_only: set[tuple[str, str]]

    def problems(self, schema: str, value: Any, path: str = "") -> list[str]:
        """Fields we set that the API does not have, enum values it does not list, wrong scalar types."""
        schemas, problems = self.schemas, []
        properties = schemas[schema]["properties"]
        for key, item in value.items():
            if (schema, key) in self.provider_only:
                continue
            *parents, field = self.renamed.get((schema, key), (key,))
            owner = schema
            for parent in parents:
                owner = schemas[owner]["properties"][parent]["$ref"]
            declared = schemas[owner]["properties"].get(field) if owner != schema else properties.get(field)
            where = f"{path}{key}"
            if declared is None:
                problems.append(f"{where}: no field {field!r} in {owner}")
                continue
            problems += self._value_problems(declared, item, where)
        return problems

    def _value_problems(self, declared: dict[str, Any], item: Any, where: str) -> list[str]:
        if "$ref" in declared:
            return self.problems(declared["$ref"], item, f"{where}.")
        additional = declared.get("additionalProperties")
        if declared.get("type") == "object" and additional is not None and isinstance(item, list):
            # A map in the API that the provider writes as a list of named entries.
            return [
                problem
                for index, element in enumerate(item)
                for problem in self._value_problems(additional, element, f"{where}[{index}]")
            ]
        if declared.get("type") == "array":
            # A list of one in the API that the provider writes as one object (Filestore's fileShares).
            elements = [item] if isinstance(item, dict) else item
            return [
                problem
                for index, element in enumerate(elements)
                for problem in self._value_problems(declared["items"], element, f"{where}[{index}]")
            ]
        if "enum" in declared and item not in declared["enum"]:
            return [f"{where}: {item!r} is not one of {declared['enum']}"]
        if declared.get("type") == "boolean" and not isinstance(item, bool):
            return [f"{where}: {item!r} is not a boolean"]
        # Numbers reach the engine as protobuf doubles, so a whole float is an integer here.
        whole = isinstance(item, int | float) and not isinstance(item, bool) and float(item).is_integer()
        if declared.get("type") == "integer" and not whole:
            return [f"{where}: {item!r} is not an integer"]
        return []


@pytest.fixture(scope="module")
def gke_schemas() -> dict[str, Any]:
    return json.loads(upstream(GKE_API).read_text())["schemas"]


@pytest.fixture(scope="module")
def gke_api(gke_schemas) -> GoogleApi:
    return GoogleApi(gke_schemas, GKE_RENAMED, GKE_PROVIDER_ONLY)


GKE_RESOURCES = {"gcp:container/cluster:Cluster": "Cluster", "gcp:container/nodePool:NodePool": "NodePool"}


def gke_variant_with_every_option(gcp_gke_config: dict[str, Any]) -> Any:
    """The example with the DNS endpoint, a maintenance exclusion, KMS, Filestore and an MPS pool."""
    import copy

    from gpu_k8s.tools.engine import run_program

    config = copy.deepcopy(gcp_gke_config)
    cluster = config["gpu-k8s:cluster"]
    cluster["gke"] = {
        "controlPlaneDnsEndpoint": True,
        "filestoreCsi": True,
        "secretsKmsKey": "projects/gpu-k8s-demo/locations/us-central1/keyRings/gke/cryptoKeys/secrets",
        "maintenanceExclusions": [
            {"name": "freeze", "startTime": "2027-01-04T00:00:00Z", "endTime": "2027-02-01T00:00:00Z"}
        ],
    }
    cluster["gpuPools"][0]["sharing"] = {"mode": "mps", "replicas": 2}
    return run_program("gke-options", config)


def test_gke_resources_use_only_fields_and_enum_values_of_the_gke_api(gcp_gke, gcp_gke_config, gke_api):
    variant = gke_variant_with_every_option(gcp_gke_config)
    checked = [r for rec in (gcp_gke, variant) for r in rec.registrations if r.type in GKE_RESOURCES]
    assert len(checked) == 12  # per plan: the cluster, the system pool and four GPU pools
    # The compact pool's placement policy and gVNIC are among the fields checked against the API.
    assert any("placementPolicy" in r.inputs and "gvnic" in r.inputs["nodeConfig"] for r in checked)
    for registration in checked:
        problems = gke_api.problems(GKE_RESOURCES[registration.type], registration.inputs)
        assert problems == [], registration.name


def test_gke_api_check_catches_unknown_fields_and_values(gke_api):
    assert gke_api.problems("Cluster", {"releaseChannel": {"channel": "REGULR"}}) == [
        "releaseChannel.channel: 'REGULR' is not one of "
        "['UNSPECIFIED', 'RAPID', 'REGULAR', 'STABLE', 'EXTENDED']"
    ]
    assert gke_api.problems("NodePool", {"nodeConfg": {}}) == ["nodeConfg: no field 'nodeConfg' in NodePool"]
    taint = {"nodeConfig": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}}
    assert gke_api.problems("NodePool", taint) == [
        "nodeConfig.taints[0].effect: 'NoSchedule' is not one of "
        "['EFFECT_UNSPECIFIED', 'NO_SCHEDULE', 'PREFER_NO_SCHEDULE', 'NO_EXECUTE']"
    ]
    assert gke_api.problems("Cluster", {"enableLegacyAbac": "no"}) == [
        "enableLegacyAbac: 'no' is not a boolean"
    ]


# --- Filestore: the gcp-k3s instance against Google's discovery document of the Filestore API ---

FILESTORE_API_DOCUMENT = "filestore-api/v1-rev20260819/file.v1.json"
# Where the instance lives is in the API's URL, not its body; the provider's own deletion setting.
FILESTORE_PROVIDER_ONLY = {("Instance", "location"), ("Instance", "project"), ("Instance", "deletionPolicy")}


def test_the_filestore_instance_uses_only_fields_and_enum_values_of_the_filestore_api(gcp_k3s):
    api = GoogleApi(
        json.loads(upstream(FILESTORE_API_DOCUMENT).read_text())["schemas"], {}, FILESTORE_PROVIDER_ONLY
    )
    (instance,) = gcp_k3s.by_type("gcp:filestore/instance:Instance")
    assert api.problems("Instance", instance.inputs) == []
    # The check reads the share's and network's own fields: a wrong enum in either is found.
    bad = {
        **instance.inputs,
        "tier": "BASIC",
        "networks": [{**instance.inputs["networks"][0], "connectMode": "PEERING"}],
    }
    assert sorted(p.split(":")[0] for p in api.problems("Instance", bad)) == [
        "networks[0].connectMode",
        "tier",
    ]


def test_gke_enums_we_offer_in_the_config_are_the_apis(gke_schemas):
    """The config's own choices map onto the API's enums (all of them, not only the example's)."""
    from gpu_k8s.components.spec import TAINT_EFFECT_API_NAMES
    from gpu_k8s.providers.gcp.gke import DRIVER_CHANNEL
    from gpu_k8s.providers.gcp.settings import GkeSpec

    channels = GkeSpec.model_fields["release_channel"].annotation.__args__  # type: ignore[union-attr]
    assert set(channels) <= set(gke_schemas["ReleaseChannel"]["properties"]["channel"]["enum"])
    driver_enum = gke_schemas["GPUDriverInstallationConfig"]["properties"]["gpuDriverVersion"]["enum"]
    assert set(DRIVER_CHANNEL.values()) <= set(driver_enum)
    assert set(TAINT_EFFECT_API_NAMES.values()) <= set(
        gke_schemas["NodeTaint"]["properties"]["effect"]["enum"]
    )


def test_gke_shares_gpus_with_its_own_api_fields(gcp_gke, gke_schemas):
    """GKE shares GPUs itself (time-sharing, MPS, MIG partitions), so its autoscaler knows a new node's
    slots; the strategies the config maps to are the API's."""
    from gpu_k8s.providers.gcp.gke import GKE_SHARING_STRATEGY

    sharing_enum = gke_schemas["GPUSharingConfig"]["properties"]["gpuSharingStrategy"]["enum"]
    assert set(GKE_SHARING_STRATEGY.values()) <= set(sharing_enum)
    accelerators = [
        accelerator
        for pool in gcp_gke.by_type("gcp:container/nodePool:NodePool")
        for accelerator in pool.inputs["nodeConfig"].get("guestAccelerators", [])
    ]
    assert len(accelerators) == 4
    assert sum("gpuSharingConfig" in a for a in accelerators) == 1
    assert sum("gpuPartitionSize" in a for a in accelerators) == 1
