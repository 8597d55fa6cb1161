"""Every Helm release in every plan the tests make, rendered by real Helm 3 from its pinned chart.

Each Release is rendered with the plan's exact values, release name, namespace and the stack's Kubernetes
version. The rendered objects must pass strict schema validation (custom resources against the chart's own
CRDs), the facts the program relies on are read off the rendered objects, every value the program sets must
change what the chart renders, and the repository each Release names must serve that chart version.
"""

from __future__ import annotations

import copy
import functools
import io
import json
import tarfile
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gpu_k8s.tools import helm as helm_tool
from gpu_k8s.tools.charts import ChartRenderer, ReleaseRef, source_problem
from gpu_k8s.tools.engine import Recording
from tests.conftest import HELM_RELEASE, PLANS, RenderedRelease, some

# What each plan installs with Helm (written here, not read from the code).
AWS_K3S_CHARTS = {
    "gpu-operator",
    "cluster-autoscaler",
    "aws-ebs-csi-driver",
    "aws-node-termination-handler",
    "aws-cloud-controller-manager",
    "aws-efs-csi-driver",
    # `monitoring` is on unless a stack says `false`.
    "kube-prometheus-stack",
}
EXPECTED_CHARTS = {
    "aws_eks": {
        "gpu-operator",
        "cluster-autoscaler",
        "kueue",
        "jobset",
        "aws-efa-k8s-device-plugin",
        "kube-prometheus-stack",
        "keda",
    },
    "mixed_sharing": {
        "gpu-operator",
        "cluster-autoscaler",
        "kueue",
        "jobset",
        "kube-prometheus-stack",
        "keda",
    },
    "gcp_gke": {"gpu-operator", "kube-prometheus-stack"},
    "aws_k3s": AWS_K3S_CHARTS,
    "aws_k3s_efa": {*AWS_K3S_CHARTS, "aws-efa-k8s-device-plugin"},
    "gcp_k3s": {"gpu-operator", "cluster-autoscaler", "csi-driver-nfs", "kube-prometheus-stack", "keda"},
}


def the(items: list[Any]) -> Any:
    assert len(items) == 1, items
    return items[0]


def cluster_policy(rendered, plan: str) -> dict[str, Any]:
    return the(rendered[plan, "gpu-operator"].of_kind("ClusterPolicy"))["spec"]


# --- the Helm binary -------------------------------------------------------------------------------------


def fake_jsii_tarball(path: Path, helm: bytes) -> Path:
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as archive:
        archive.writestr("helm/helm", helm)
        archive.writestr("kubectl/kubectl", b"not helm")
    with tarfile.open(path, "w:gz") as tarball:
        info = tarfile.TarInfo(helm_tool.LAYER_IN_TARBALL)
        info.size = len(layer.getvalue())
        tarball.addfile(info, io.BytesIO(layer.getvalue()))
    return path


def test_helm_is_extracted_once_and_only_when_its_digest_matches(tmp_path: Path):
    import hashlib

    binary = b"#!/bin/sh\necho helm\n"
    tarball = fake_jsii_tarball(tmp_path / "layer.jsii.tgz", binary)
    target = tmp_path / "bin" / "helm"
    digest = hashlib.sha256(binary).hexdigest()
    assert helm_tool.extract_helm(tarball, target, digest) == target
    assert target.read_bytes() == binary and target.stat().st_mode & 0o777 == 0o755
    tarball.unlink()  # present and verified: not read again
    assert helm_tool.extract_helm(tarball, target, digest) == target
    with pytest.raises(helm_tool.HelmMissing, match="sha256"):
        helm_tool.extract_helm(fake_jsii_tarball(tmp_path / "evil.tgz", b"evil"), tmp_path / "h2", digest)
    assert not (tmp_path / "h2").exists()


def test_the_pinned_helm_is_helm_3(renderer: ChartRenderer):
    import subprocess

    version = subprocess.run(
        [renderer.helm, "version", "--template", "{{.Version}}"], capture_output=True, text=True, check=True
    ).stdout
    assert version == helm_tool.HELM_VERSION == "v3.19.0"


# --- every release renders, and what it renders is valid ------------------------------------------------


def test_every_release_of_every_plan_is_rendered(rendered):
    for plan, charts in EXPECTED_CHARTS.items():
        assert {chart for p, chart in rendered if p == plan} == charts, plan


def crd_schemas(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(group/version, kind) -> the CRD's openAPIV3Schema, made strict: a field the schema does not declare
    is an error (the API server would prune it silently: a value that never arrives)."""
    schemas = {}
    for crd in (o for o in objects if o["kind"] == "CustomResourceDefinition"):
        for version in crd["spec"]["versions"]:
            api_version = f"{crd['spec']['group']}/{version['name']}"
            schemas[api_version, crd["spec"]["names"]["kind"], crd["metadata"]["name"]] = strict(
                version["schema"]["openAPIV3Schema"]
            )
    return schemas


def strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    made = {k: strict(v) for k, v in schema.items()}
    pattern = made.get("pattern")
    if isinstance(pattern, str) and pattern.startswith("^(?i)"):
        # The API server's RE2 takes a flag group anywhere (Kueue's AdmissionCheck `kind`); Python's `re`
        # only at the start, where it means the same.
        made["pattern"] = "(?i)^" + pattern[len("^(?i)") :]
    if "properties" in made and not made.get("x-kubernetes-preserve-unknown-fields"):
        made.setdefault("additionalProperties", False)
    return made


def validate_custom_resource(
    obj: dict[str, Any], schemas: dict[tuple[str, str, str], dict[str, Any]]
) -> None:
    (schema,) = [
        s for (api, kind, _), s in schemas.items() if (api, kind) == (obj["apiVersion"], obj["kind"])
    ]
    jsonschema.validate({k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}, schema)


def test_rendered_objects_pass_strict_schema_validation(rendered):
    custom_resources = 0
    # A custom resource against the CRD its plan installs: its own chart's, or another release's (the
    # ServiceMonitors of Kueue and the autoscaler against the Prometheus Operator's, with `monitoring`).
    plan_crds: dict[str, list[dict[str, Any]]] = {}
    for (plan, _), release in rendered.items():
        plan_crds.setdefault(plan, []).extend(
            o for o in release.objects if o["kind"] == "CustomResourceDefinition"
        )
    for release in rendered.values():
        schemas = crd_schemas(plan_crds[release.plan])
        custom = {(api, kind) for api, kind, _ in schemas}
        assert release.objects, release.ref
        for obj in release.objects:
            if (obj["apiVersion"], obj["kind"]) in custom:
                validate_custom_resource(obj, schemas)
                custom_resources += 1
            else:
                kubernetes_validate.validate(obj, release.kube_version, strict=True)
    # One ClusterPolicy per operator release at least: the CRD path ran.
    assert custom_resources >= sum(1 for _, chart in rendered if chart == "gpu-operator")


def test_the_crd_check_refuses_an_unknown_field_and_a_wrong_type(rendered):
    release = rendered["aws_eks", "gpu-operator"]
    schemas = crd_schemas(release.objects)
    policy = the(release.of_kind("ClusterPolicy"))
    validate_custom_resource(policy, schemas)
    for broken in (
        {**policy, "spec": {**policy["spec"], "drivr": {"enabled": False}}},
        {**policy, "spec": {**policy["spec"], "driver": {**policy["spec"]["driver"], "enabled": "no"}}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate_custom_resource(broken, schemas)


def test_strict_kubernetes_validation_sees_rendered_chart_objects(rendered):
    deployment = the(rendered["aws_eks", "cluster-autoscaler"].of_kind("Deployment"))
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["nodeSelectr"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.35.0", strict=True)


# --- chart sources ------------------------------------------------------------------------------------


def test_every_release_names_a_repository_that_serves_its_chart_version(rendered):
    assert {p: source_problem(r.ref) for (p, _), r in rendered.items() if source_problem(r.ref)} == {}


def test_termination_handler_comes_from_its_oci_registry(aws_k3s):
    inputs = the(
        [r for r in aws_k3s.by_type(HELM_RELEASE) if r.inputs["name"] == "aws-node-termination-handler"]
    )
    assert inputs.inputs["chart"] == "oci://public.ecr.aws/aws-ec2/helm/aws-node-termination-handler"
    assert "repositoryOpts" not in inputs.inputs
    assert inputs.inputs["version"] == "0.27.6"


def test_a_repository_that_does_not_serve_the_version_is_refused():
    def ref(chart: str, version: str, repository: str) -> ReleaseRef:
        return ReleaseRef(chart, chart, version, repository, "kube-system", {})

    stale = source_problem(ref("aws-node-termination-handler", "0.27.6", "https://aws.github.io/eks-charts"))
    assert stale is not None and "0.21.0" in stale
    unknown = source_problem(ref("cluster-autoscaler", "9.59.0", "https://charts.example.com"))
    assert unknown is not None and "not a known source" in unknown
    unpinned = source_problem(ref("cluster-autoscaler", "9.60.0", "https://kubernetes.github.io/autoscaler"))
    assert unpinned is not None and "not pinned" in unpinned


# --- what the program relies on, read off the rendered objects -----------------------------------------

# Operands the operator deploys on each platform (ClusterPolicy spec.<operand>.enabled).
EXPECTED_OPERANDS = {
    # AL2023 NVIDIA AMI: driver and toolkit preinstalled.
    "aws_eks": {
        "driver": False,
        "toolkit": False,
        "devicePlugin": True,
        "migManager": True,
        "dcgmExporter": True,
    },
    # GKE installs the driver and its own device plugin shares and partitions the GPUs; the operator adds the
    # toolkit its operands run with (NVIDIA AICR's gke-default profile), DCGM exporter, GFD and validation.
    "gcp_gke": {
        "driver": False,
        "toolkit": True,
        "devicePlugin": False,
        "migManager": False,
        "dcgmExporter": True,
        "gfd": True,
    },
    # Plain Ubuntu: the operator builds the driver and installs the toolkit.
    "aws_k3s": {
        "driver": True,
        "toolkit": True,
        "devicePlugin": True,
        "migManager": True,
        "dcgmExporter": True,
    },
    "gcp_k3s": {
        "driver": True,
        "toolkit": True,
        "devicePlugin": True,
        "migManager": True,
        "dcgmExporter": True,
    },
}


@pytest.mark.parametrize("plan", sorted(EXPECTED_OPERANDS))
def test_operands_per_platform(rendered, plan):
    spec = cluster_policy(rendered, plan)
    assert {operand: spec[operand]["enabled"] for operand in EXPECTED_OPERANDS[plan]} == EXPECTED_OPERANDS[
        plan
    ]


@pytest.mark.parametrize("plan", ["aws_k3s", "gcp_k3s"])
def test_k3s_operator_builds_the_pinned_driver_and_points_the_toolkit_at_k3s_containerd(rendered, plan):
    spec = cluster_policy(rendered, plan)
    assert spec["driver"]["version"] == "595.91.07"
    assert {"name": "CONTAINERD_SOCKET", "value": "/run/k3s/containerd/containerd.sock"} in spec["toolkit"][
        "env"
    ]


def test_gke_operator_uses_the_driver_gke_installs(rendered):
    spec = cluster_policy(rendered, "gcp_gke")
    assert spec["hostPaths"]["driverInstallDir"] == "/home/kubernetes/bin/nvidia"
    assert spec["toolkit"]["installDir"] == "/home/kubernetes/bin/nvidia"


@pytest.mark.parametrize("plan", sorted(set(PLANS) - {"gcp_gke"}))
def test_device_plugin_reads_the_sharing_configmap_the_plan_creates(rendered, plan):
    release = rendered[plan, "gpu-operator"]
    config = cluster_policy(rendered, plan)["devicePlugin"]["config"]
    (configmap,) = [
        r
        for r in release.recording.by_type("kubernetes:core/v1:ConfigMap")
        if r.name.endswith("-device-plugin-config")
    ]
    assert configmap.inputs["metadata"]["namespace"] == release.ref.namespace
    # Pulumi auto-names the ConfigMap: its resource name plus a random suffix.
    assert config["name"].startswith(f"{configmap.name}-")
    assert config["default"] in configmap.inputs["data"]


def test_each_sharing_mode_renders_its_own_device_plugin_section(aws_eks):
    (configmap,) = [r for r in aws_eks.by_type("kubernetes:core/v1:ConfigMap") if "device-plugin" in r.name]
    data = {key: yaml.safe_load(value) for key, value in configmap.inputs["data"].items()}
    assert set(data["a10g-shared"]["sharing"]) == {"timeSlicing"}
    assert data["a10g-shared"]["sharing"]["timeSlicing"]["resources"] == [
        {"name": "nvidia.com/gpu", "replicas": 4}
    ]
    assert set(data["l4-mps"]["sharing"]) == {"mps"}
    assert data["l4-mps"]["sharing"]["mps"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    assert "sharing" not in data["l40s"]


def test_mig_manager_reads_the_custom_layouts_the_plan_creates(rendered):
    release = rendered["mixed_sharing", "gpu-operator"]
    config = cluster_policy(rendered, "mixed_sharing")["migManager"]["config"]
    (configmap,) = [r for r in release.recording.by_type("kubernetes:core/v1:ConfigMap") if "mig" in r.name]
    assert configmap.inputs["metadata"]["namespace"] == release.ref.namespace
    assert config["name"].startswith(f"{configmap.name}-")
    assert "mig-configs" in yaml.safe_load(configmap.inputs["data"]["config.yaml"])


@pytest.mark.parametrize(("plan", "strategy"), [("aws_eks", "single"), ("mixed_sharing", "mixed")])
def test_mig_strategy(rendered, plan, strategy):
    assert cluster_policy(rendered, plan)["mig"]["strategy"] == strategy


def container_flags(release: RenderedRelease) -> dict[str, str]:
    container = the(the(release.of_kind("Deployment"))["spec"]["template"]["spec"]["containers"])
    flags: dict[str, str] = {}
    for arg in [*container.get("command", []), *container.get("args", [])]:
        if arg.startswith("--"):
            key, _, value = arg[2:].partition("=")
            flags[key] = f"{flags[key]} {value}" if key in flags else value
    return flags


AUTOSCALER_COMMON = {
    "expander": "least-waste",
    "scale-down-unneeded-time": "5m0s",
    "skip-nodes-with-local-storage": "false",
}


@pytest.mark.parametrize("plan", ["aws_eks", "aws_k3s"])
def test_aws_autoscaler_discovers_this_clusters_groups(rendered, plan):
    flags = container_flags(rendered[plan, "cluster-autoscaler"])
    assert flags["cloud-provider"] == "aws"
    assert flags["node-group-auto-discovery"] == (
        "asg:tag=k8s.io/cluster-autoscaler/enabled,k8s.io/cluster-autoscaler/ml"
    )
    assert AUTOSCALER_COMMON.items() <= flags.items()
    container = the(
        the(rendered[plan, "cluster-autoscaler"].of_kind("Deployment"))["spec"]["template"]["spec"][
            "containers"
        ]
    )
    assert {"name": "AWS_REGION", "value": "us-east-1"} in container["env"]


def test_with_batch_the_autoscaler_serves_provisioning_requests(rendered):
    """cluster-autoscaler FAQ, "Enabling ProvisioningRequest Support": the flag, and RBAC on
    ProvisioningRequests and PodTemplates, which the chart's ClusterRole (as rendered) grants for reading and
    updating; the FAQ's example also grants create and delete, which the chart from the same repository
    does not (whether the autoscaler ever needs them is UNCONFIRMED). Without batch, no flag."""
    release = rendered["aws_eks", "cluster-autoscaler"]
    assert container_flags(release)["enable-provisioning-requests"] == "true"
    rules = the(release.of_kind("ClusterRole"))["rules"]

    def verbs(group: str, resource: str) -> set[str]:
        return {
            verb
            for rule in rules
            if group in rule["apiGroups"] and resource in rule["resources"]
            for verb in rule["verbs"]
        }

    assert {"get", "list", "watch", "update", "patch"} <= verbs(
        "autoscaling.x-k8s.io", "provisioningrequests"
    )
    assert {"update", "patch"} <= verbs("autoscaling.x-k8s.io", "provisioningrequests/status")
    assert {"get", "list", "watch"} <= verbs("", "podtemplates")
    for plan in ("aws_k3s", "gcp_k3s"):
        assert "enable-provisioning-requests" not in container_flags(rendered[plan, "cluster-autoscaler"])


def test_gce_autoscaler_names_each_mig_with_the_pools_limits(rendered, gcp_k3s_config):
    flags = container_flags(rendered["gcp_k3s", "cluster-autoscaler"])
    assert flags["cloud-provider"] == "gce"
    assert AUTOSCALER_COMMON.items() <= flags.items()
    recording = rendered["gcp_k3s", "cluster-autoscaler"].recording
    groups = {
        r.inputs["baseInstanceName"]: r
        for r in recording.by_type("gcp:compute/instanceGroupManager:InstanceGroupManager")
    }
    expected = []
    for pool in gcp_k3s_config["gpu-k8s:cluster"]["gpuPools"]:
        (group,) = [g for base, g in groups.items() if f"-{pool['name']}" in base]
        group_path = group.id.replace("instanceGroupManagers", "instanceGroups")
        url = f"https://www.googleapis.com/compute/v1/{group_path}"
        expected.append(f"{pool.get('minNodes', 0)}:{pool['maxNodes']}:{url}")
    assert sorted(flags["nodes"].split(" ")) == sorted(expected)


def service_account_bindings(recording: Recording) -> list[tuple[str, str]]:
    """(namespace, name) of every Kubernetes ServiceAccount a cloud identity is bound to in the plan."""
    bound = [
        (r.inputs["namespace"], r.inputs["serviceAccount"])
        for r in recording.by_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    ]
    for r in recording.registrations:
        member = r.inputs.get("member") or ""
        if r.type.startswith("gcp:") and ".svc.id.goog[" in member:
            namespace, name = member.split("[", 1)[1].rstrip("]").split("/")
            bound.append((namespace, name))
    return bound


def unused_bindings(releases: list[RenderedRelease], bindings: list[tuple[str, str]]) -> list[str]:
    """Bound (namespace, name) pairs that no release creates and runs a Deployment or DaemonSet as."""

    def runs_pods_as(release: RenderedRelease, namespace: str, name: str) -> bool:
        return (
            release.ref.namespace == namespace
            and any(sa["metadata"]["name"] == name for sa in release.of_kind("ServiceAccount"))
            and any(
                workload["spec"]["template"]["spec"].get("serviceAccountName") == name
                for kind in ("Deployment", "DaemonSet")
                for workload in release.of_kind(kind)
            )
        )

    return [
        f"{namespace}/{name}"
        for namespace, name in bindings
        if not any(runs_pods_as(release, namespace, name) for release in releases)
    ]


def test_every_bound_service_account_is_the_one_a_chart_runs_its_pods_as(rendered):
    checked = 0
    for plan in PLANS:
        releases = [r for (p, _), r in rendered.items() if p == plan]
        bindings = service_account_bindings(releases[0].recording)
        assert unused_bindings(releases, bindings) == [], plan
        checked += len(bindings)
    assert checked >= 2  # aws-eks and mixed_sharing bind the autoscaler through Pod Identity


def test_a_binding_to_a_drifted_service_account_name_is_found(rendered):
    releases = [rendered["aws_eks", "cluster-autoscaler"], rendered["aws_eks", "gpu-operator"]]
    assert unused_bindings(releases, [("kube-system", "cluster-autoscaler")]) == []
    assert unused_bindings(releases, [("kube-system", "aws-cluster-autoscaler")]) == [
        "kube-system/aws-cluster-autoscaler"
    ]
    assert unused_bindings(releases, [("default", "cluster-autoscaler")]) == ["default/cluster-autoscaler"]


# --- every value the program sets is one the chart reads ----------------------------------------------


def leaves(values: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths to every scalar (and list of scalars) in a values tree."""
    if isinstance(values, dict) and values:
        for key, value in values.items():
            yield from leaves(value, (*path, key))
    elif isinstance(values, list) and values and all(isinstance(v, dict) for v in values):
        for index, value in enumerate(values):
            yield from leaves(value, (*path, index))
    else:
        yield path


def mutated(values: dict[str, Any], path: tuple[Any, ...], drop: bool = False) -> dict[str, Any]:
    """`values` with the leaf at `path` changed; a list gets an extra item, or with `drop` loses its last (an
    exclusion list such as kube-state-metrics' collectorsExclude ignores an unknown extra item)."""
    changed = copy.deepcopy(values)
    node: Any = changed
    for part in path[:-1]:
        node = node[part]
    value = node[path[-1]]
    if isinstance(value, bool):
        node[path[-1]] = not value
    elif isinstance(value, int | float):
        node[path[-1]] = value + 1
    elif isinstance(value, str):
        node[path[-1]] = value + "1"
    elif isinstance(value, list):
        node[path[-1]] = value[:-1] if drop else [*value, "gpu-k8s-probe"]
    else:
        node[path[-1]] = "gpu-k8s-probe"
    return changed


def ignored_values(renderer: ChartRenderer, release: RenderedRelease) -> list[str]:
    baseline = renderer.render(release.ref, release.kube_version)

    def unchanged(path: tuple[Any, ...], drop: bool) -> bool:
        try:
            return (
                renderer.render(release.ref, release.kube_version, mutated(release.ref.values, path, drop))
                == baseline
            )
        except Exception:  # a chart that refuses the changed value reads it
            return False

    def ignored(path: tuple[Any, ...]) -> bool:
        leaf = functools.reduce(lambda node, part: node[part], path, release.ref.values)
        return unchanged(path, drop=False) and not (
            isinstance(leaf, list) and leaf and not unchanged(path, True)
        )

    paths = list(leaves(release.ref.values))
    with ThreadPoolExecutor(max_workers=4) as pool:
        return [
            ".".join(map(str, p)) for p, same in zip(paths, pool.map(ignored, paths), strict=True) if same
        ]


def distinct_value_sets(rendered) -> dict[str, RenderedRelease]:
    """One release per distinct (chart, values shape): the plans share most values."""
    chosen: dict[str, RenderedRelease] = {}
    for release in rendered.values():
        key = json.dumps(
            [release.ref.chart, sorted(".".join(map(str, p)) for p in leaves(release.ref.values))]
        )
        chosen.setdefault(key, release)
    return chosen


def test_every_value_the_program_sets_changes_what_the_chart_renders(rendered, renderer):
    releases = distinct_value_sets(rendered)
    assert {r.ref.chart for r in releases.values()} == set().union(*EXPECTED_CHARTS.values())
    ignored = {f"{r.plan} {r.ref.chart}": ignored_values(renderer, r) for r in releases.values()}
    assert {release: paths for release, paths in ignored.items() if paths} == {}


def test_the_ignored_value_check_finds_a_value_the_chart_never_reads(rendered, renderer):
    release = rendered["aws_eks", "cluster-autoscaler"]
    probe = RenderedRelease(
        release.plan,
        ReleaseRef(
            **{
                **release.ref.__dict__,
                "values": {
                    **release.ref.values,
                    "extraArgs": {**release.ref.values["extraArgs"]},
                    "gpuK8sUnread": {"x": 1},
                },
            }
        ),
        release.kube_version,
        release.objects,
        release.recording,
    )
    assert ignored_values(renderer, probe) == ["gpuK8sUnread.x"]


# --- k3s servers take only the add-ons that must run there ---------------------------------------------


def tolerates(pod_spec: dict[str, Any], key: str, effect: str) -> bool:
    return any(
        t.get("operator") == "Exists" and t.get("key") in (None, key) and t.get("effect") in (None, effect)
        for t in pod_spec.get("tolerations") or []
    )


@pytest.mark.parametrize("plan", ["aws_k3s", "gcp_k3s"])
def test_every_add_on_that_runs_on_the_servers_tolerates_their_taint(rendered, plan):
    """k3s servers are tainted CriticalAddonsOnly=true:NoExecute and GPU agents nvidia.com/gpu: a Deployment
    or Job that tolerated neither could run nowhere."""
    pods = [
        (release.ref.chart, obj["metadata"]["name"], obj["spec"]["template"]["spec"])
        for (p, _), release in rendered.items()
        if p == plan
        for obj in release.objects
        if obj["kind"] in ("Deployment", "Job")
    ]
    assert len(pods) >= 4
    assert [
        (chart, name) for chart, name, spec in pods if not tolerates(spec, "CriticalAddonsOnly", "NoExecute")
    ] == []


def test_the_toleration_check_sees_a_pod_without_it():
    assert not tolerates(
        {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}, "CriticalAddonsOnly", "NoExecute"
    )
    assert tolerates({"tolerations": [{"operator": "Exists"}]}, "CriticalAddonsOnly", "NoExecute")


def env_of(release: RenderedRelease, kind: str) -> dict[str, str]:
    container = the(release.of_kind(kind))["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_spot_termination_handler_drains_on_interruption_and_rebalance(rendered):
    env = env_of(rendered["aws_k3s", "aws-node-termination-handler"], "DaemonSet")
    assert env["ENABLE_SPOT_INTERRUPTION_DRAINING"] == "true"
    assert env["ENABLE_REBALANCE_DRAINING"] == "true"


def test_ebs_node_plugin_reads_its_node_from_kubernetes_not_imds(rendered):
    release = rendered["aws_k3s", "aws-ebs-csi-driver"]
    (node,) = [o for o in release.of_kind("DaemonSet") if o["metadata"]["name"] == "ebs-csi-node"]
    args = node["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--metadata-sources=kubernetes" in args


@pytest.mark.parametrize("plan", ["aws_eks", "aws_k3s"])
def test_aws_autoscaler_balances_a_pools_zones(rendered, plan):
    """Every AWS pool is one group per zone: the autoscaler spreads scale-ups over the alike groups, and the
    per-node network topology labels of p4d/p5-class nodes do not make them unlike (review-aws.md AN-D2):
    the chart renders one --balancing-ignore-label per layer."""
    release = rendered[plan, "cluster-autoscaler"]
    assert container_flags(release)["balance-similar-node-groups"] == "true"
    # container_flags joins a repeated flag's values with spaces.
    ignored = container_flags(release)["balancing-ignore-label"].split()
    assert ignored == [f"topology.k8s.aws/network-node-layer-{layer}" for layer in (1, 2, 3, 4)]


def test_operator_runs_on_shared_pools_despite_their_sharing_taint(rendered):
    """GPU nodes of shared pools carry gpu-k8s.io/sharing; the operator's operands and NFD's worker must
    still run there (the rendered ClusterPolicy and NFD DaemonSet tolerate it)."""
    spec = cluster_policy(rendered, "aws_eks")
    assert tolerates({"tolerations": spec["daemonsets"]["tolerations"]}, "gpu-k8s.io/sharing", "NoSchedule")
    (worker,) = [
        o
        for o in rendered["aws_eks", "gpu-operator"].of_kind("DaemonSet")
        if "worker" in o["metadata"]["name"]
    ]
    assert tolerates(worker["spec"]["template"]["spec"], "gpu-k8s.io/sharing", "NoSchedule")


def test_the_aws_cloud_controller_runs_the_node_controllers_on_the_servers_and_their_network(rendered):
    """It initialises every node (each waits tainted until then) and deletes the Node of a terminated
    instance; it must run before cluster DNS does, and on the tainted servers."""
    spec = the(rendered["aws_k3s", "aws-cloud-controller-manager"].of_kind("DaemonSet"))["spec"]["template"][
        "spec"
    ]
    container = the(spec["containers"])
    # The stack's Kubernetes minor (1.36) picks the CCM build.
    # No 1.36 build is promoted: the 1.35 build, by digest (one minor older is within the skew policy).
    assert container["image"] == (
        "registry.k8s.io/provider-aws/cloud-controller-manager:v1.35.2"
        "@sha256:5a5d4e5942ad078a184c12bf5435f8226ccb157ee15e9e1f87c183a4bf4b8f1a"
    )
    assert "--cloud-provider=aws" in container["args"]
    assert (
        "--controllers=cloud-node-controller,cloud-node-lifecycle-controller,service-lb-controller"
        in container["args"]
    )
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "Default"
    # k3s labels its servers control-plane=true; the chart's default selector value is "".
    assert spec["nodeSelector"] == {
        "gpu-k8s.io/pool": "system",
        "node-role.kubernetes.io/control-plane": "true",
    }
    assert tolerates(spec, "CriticalAddonsOnly", "NoExecute")
    assert {
        "key": "node.cloudprovider.kubernetes.io/uninitialized",
        "value": "true",
        "effect": "NoSchedule",
    } in spec["tolerations"]


def test_on_eks_the_autoscaler_needs_no_instance_metadata(rendered):
    """EKS nodes answer instance metadata to host-networked pods only (hop limit 1): the autoscaler, which
    is not one, gets its region from the chart's AWS_REGION and its credentials from Pod Identity."""
    spec = the(rendered["aws_eks", "cluster-autoscaler"].of_kind("Deployment"))["spec"]["template"]["spec"]
    assert not spec.get("hostNetwork")
    env = {e["name"]: e.get("value") for c in spec["containers"] for e in c.get("env", [])}
    assert env["AWS_REGION"] == "us-east-1"


KUEUE_KINDS = ("ResourceFlavor", "ClusterQueue", "LocalQueue", "AdmissionCheck", "ProvisioningRequestConfig")


def test_the_plans_kueue_objects_pass_the_installed_crds_strictly(rendered):
    release = rendered["aws_eks", "kueue"]
    schemas = crd_schemas(release.objects)
    recording = release.recording
    objects = [
        {
            "apiVersion": r.inputs["apiVersion"],
            "kind": r.inputs["kind"],
            "metadata": r.inputs["metadata"],
            "spec": r.inputs["spec"],
        }
        for r in recording.registrations
        if r.type.startswith("kubernetes:kueue.x-k8s.io/")
    ]
    assert {o["kind"] for o in some(objects, at_least=6)} == set(KUEUE_KINDS)
    for obj in objects:
        validate_custom_resource(obj, schemas)
    queue = copy.deepcopy(next(o for o in objects if o["kind"] == "ClusterQueue"))
    queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuta"] = 1
    with pytest.raises(jsonschema.ValidationError):
        validate_custom_resource(queue, schemas)


def test_kueue_reads_all_or_nothing_admission_and_gpu_only_quotas_from_its_config(rendered):
    release = rendered["aws_eks", "kueue"]
    (config_map,) = [
        o for o in release.of_kind("ConfigMap") if "controller_manager_config.yaml" in o.get("data", {})
    ]
    configuration = yaml.safe_load(config_map["data"]["controller_manager_config.yaml"])
    assert configuration["waitForPodsReady"] == {
        "timeout": "30m",
        "recoveryTimeout": "5m",
        "blockAdmission": False,
        # Bounded retries (tests/test_batch.py), as the chart renders them into Kueue's configuration.
        "requeuingStrategy": {
            "timestamp": "Creation",
            "backoffLimitCount": 6,
            "backoffBaseSeconds": 60,
            "backoffMaxSeconds": 1800,
        },
    }
    assert configuration["resources"]["excludeResourcePrefixes"] == [
        "cpu",
        "memory",
        "ephemeral-storage",
        "hugepages-",
    ]
    assert configuration["managedJobsNamespaceSelector"]["matchExpressions"][0]["values"] == ["research"]
    (manager,) = [
        d for d in release.of_kind("Deployment") if d["metadata"]["name"].endswith("controller-manager")
    ]
    images = {c["image"] for c in manager["spec"]["template"]["spec"]["containers"]}
    assert images == {"registry.k8s.io/kueue/kueue:v0.19.2"}


@pytest.mark.parametrize("plan", ["aws_eks", "aws_k3s_efa"])
def test_the_efa_device_plugin_runs_on_tainted_gpu_nodes_with_efa(rendered, plan):
    """The chart keeps itself to instance types with EFA by `node.kubernetes.io/instance-type`, which EKS
    nodes carry and k3s agents set themselves (and the AWS cloud controller confirms)."""
    release = rendered[plan, "aws-efa-k8s-device-plugin"]
    (daemonset,) = release.of_kind("DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in pod["tolerations"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    instance_types = {
        value
        for term in terms
        for expression in term["matchExpressions"]
        if expression["key"] == "node.kubernetes.io/instance-type"
        for value in expression["values"]
    }
    assert "p5.48xlarge" in instance_types


def test_the_efs_controller_runs_on_the_k3s_servers_and_its_node_plugin_everywhere(rendered):
    """The controller needs the servers' instance role, which only the host network reaches; the node
    plugin mounts on every node, GPU agents with their taints included, on the host network."""
    release = rendered["aws_k3s", "aws-efs-csi-driver"]
    (controller,) = release.of_kind("Deployment")
    pod = controller["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux", "gpu-k8s.io/pool": "system"}
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in pod["tolerations"]
    assert pod["hostNetwork"] is True
    (node,) = release.of_kind("DaemonSet")
    node_pod = node["spec"]["template"]["spec"]
    assert {"operator": "Exists"} in node_pod["tolerations"]
    assert node_pod["hostNetwork"] is True
    (driver,) = release.of_kind("CSIDriver")
    assert driver["metadata"]["name"] == "efs.csi.aws.com"
    # The StorageClass is the stack's (with its file system), not the chart's.
    assert release.of_kind("StorageClass") == []


def test_the_nfs_controller_runs_on_the_gcp_k3s_servers_and_its_node_plugin_everywhere(rendered):
    """The controller mounts the Filestore share to make and delete claim directories, from a server (in the
    node subnet the share is exported to); the node plugin mounts on every node, GPU agents included. Pods
    running as another user than root get their claim through `fsGroup`, which the driver declares."""
    release = rendered["gcp_k3s", "csi-driver-nfs"]
    (controller,) = release.of_kind("Deployment")
    pod = controller["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux", "gpu-k8s.io/pool": "system"}
    # The servers' taint is CriticalAddonsOnly=true:NoExecute; the chart's own toleration covers NoSchedule.
    assert {"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoExecute"} in pod["tolerations"]
    assert pod["hostNetwork"] is True
    assert "csi-snapshotter" not in [c["name"] for c in pod["containers"]]
    (node,) = release.of_kind("DaemonSet")
    node_pod = node["spec"]["template"]["spec"]
    assert {"operator": "Exists"} in node_pod["tolerations"]
    (driver,) = release.of_kind("CSIDriver")
    assert driver["metadata"]["name"] == "nfs.csi.k8s.io"
    assert driver["spec"]["fsGroupPolicy"] == "File"
    # The StorageClass is the stack's (with the instance's address), not the chart's; no snapshot CRDs.
    assert release.of_kind("StorageClass") == []
    assert release.of_kind("CustomResourceDefinition") == []
