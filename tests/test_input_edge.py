"""Inputs at the edge: text and numbers no setting can mean, provider keys, plain-words messages, defaults
that follow what the user wrote. Found by fuzzing the example stacks (issue: every input gets a clean
answer); each class has a case here."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from botocore.loaders import Loader

from gpu_k8s.components.configbase import MAX_API_INTEGER, ConfigError
from gpu_k8s.components.k3s.settings import K3S_RELEASES
from gpu_k8s.components.spec import load_spec
from gpu_k8s.providers.aws.location import KNOWN_REGIONS, PARTITIONS, REGION_PATTERNS, region_issue
from gpu_k8s.providers.gcp.location import location_issues
from gpu_k8s.tools.engine import stack_config
from gpu_k8s.tools.plan import main
from tests.conftest import minimal_cluster, set_path
from tests.paths import FIXTURE_STACKS

PYDANTIC_WORDING = re.compile(r"Input should|Tuple should|valid string|greater than or equal|Value error")


def refusal(cluster: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as raised:
        load_spec(cluster)
    message = str(raised.value)
    assert not PYDANTIC_WORDING.search(message), message
    assert "None -" not in message and "Traceback" not in message
    return message


def mutated(path: str, value: Any) -> dict[str, Any]:
    cluster = minimal_cluster()
    set_path(path, value)(cluster)
    return cluster


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("name", "ml\n", 'cluster.name: "ml\\n" - contains a line break, tab or control character'),
        ("gpuPools.0.instanceType", "g6.xlarge\t", "contains a line break, tab or control character"),
        ("name", " ml", 'cluster.name: " ml" - starts or ends with spaces'),
        ("kubernetesVersion", "1.35 ", "starts or ends with spaces"),
        (
            "gpuPools.0.scaleDownUnneededTime",
            "\u0665m",
            'scaleDownUnneededTime: "\u0665m" - contains non-ASCII',
        ),
        ("addonVersions", {"nvidiaDriver": "\u0665\u0668\u0660.95.05"}, 'nvidiaDriver: "\u0665\u0668\u0660'),
        (
            "gpuPools.0.labels",
            {"t\u00e9am": "a"},
            'labels.t\u00e9am: "t\u00e9am" - the key contains non-ASCII',
        ),
        ("gpuPools.0.maxNodes", 2**63, f"maxNodes: {2**63} - is beyond what the cloud APIs take"),
        ("gpuPools.0.minNodes", -(2**31) - 1, "is beyond what the cloud APIs take (at most 2,147,483,647)"),
        ("systemPool.diskSizeGiB", 2**40, "diskSizeGiB"),
    ],
    ids=[
        "trailing-newline",
        "tab",
        "leading-space",
        "trailing-space",
        "arabic-digit-duration",
        "arabic-digit-driver",
        "non-ascii-label-key",
        "max-nodes-2-63",
        "min-nodes-below-int32",
        "disk-2-40",
    ],
)
def test_text_and_numbers_no_setting_can_mean_are_refused(path, value, expected):
    assert expected in refusal(mutated(path, value))


def test_a_key_with_a_control_character_is_named_on_one_line():
    message = refusal(mutated("gpuPools.0.labels", {"team\x1d": "a"}))
    assert "gpuPools[0].labels.team\\x1d: " in message and len(message.splitlines()) == 2


def test_the_largest_32_bit_size_passes_the_edge_and_meets_the_pool_rules():
    message = refusal(mutated("gpuPools.0.minNodes", MAX_API_INTEGER))
    assert "beyond what the cloud APIs take" not in message and "minNodes" in message


@pytest.mark.parametrize(
    ("cluster", "expected"),
    [
        (
            {k: v for k, v in minimal_cluster().items() if k != "systemPool"},
            "gpu-k8s:cluster.systemPool: is missing. Fix: add `systemPool:` under gpu-k8s:cluster",
        ),
        (
            mutated("gpuPools.0", {"name": "l4", "instanceType": "g6.xlarge"}),
            "gpuPools[0].maxNodes: is missing. Fix: add `maxNodes:` under gpu-k8s:cluster.gpuPools[0]",
        ),
        (mutated("name", 3), "cluster.name: 3 - is a number, not text. Fix: write text here"),
        (mutated("gpuPools.0.spot", "yes"), 'spot: "yes" - is text, not true or false'),
        (mutated("network", []), "network: [] - is a list, not a mapping (key: value lines)"),
        (mutated("eks", None), "eks: is empty, not a mapping"),
        (mutated("gpuPools", "l4"), 'gpuPools: "l4" - is text, not a list'),
        (mutated("gpuPools", []), "gpuPools: [] - must list at least 1 item(s)"),
        (mutated("gpuPools.0.maxNodes", 0), "maxNodes: 0 - must be at least 1. Fix: change the number"),
        (mutated("systemPool.diskSizeGiB", 99999), "diskSizeGiB: 99999 - must be at most 16384"),
        (mutated("cloud", "azure"), "cloud: \"azure\" - must be 'aws' or 'gcp'. Fix: pick one of those"),
    ],
    ids=[
        "missing-block",
        "missing-pool-key",
        "number-for-text",
        "text-for-boolean",
        "list-for-mapping",
        "empty-block",
        "text-for-list",
        "empty-list",
        "below-minimum",
        "above-maximum",
        "not-a-choice",
    ],
)
def test_structural_refusals_speak_plain_words_and_say_where_a_key_goes(cluster, expected):
    assert expected in refusal(cluster)


def test_an_item_that_fails_does_not_also_report_its_list_as_too_short():
    message = refusal(mutated("gpuPools.0.taints", [{"key": "a", "effect": "Sometimes"}]))
    assert message.count("\n") == 1 and "taints[0].effect" in message


def k3s_cluster(kubernetes_version: str, **k3s: str) -> dict[str, Any]:
    cluster = copy.deepcopy(stack_config(FIXTURE_STACKS / "Pulumi.aws-k3s.yaml")["gpu-k8s:cluster"])
    cluster["kubernetesVersion"] = kubernetes_version
    cluster["k3s"] = k3s
    return cluster


@pytest.mark.parametrize("minor", sorted(K3S_RELEASES))
def test_k3s_runs_the_release_pinned_for_the_kubernetes_version_the_user_wrote(minor):
    spec = load_spec(k3s_cluster(minor))
    assert spec.k3s.version == K3S_RELEASES[minor]
    assert spec.k3s.version.startswith(f"v{minor}.")


def test_a_kubernetes_version_without_a_pinned_k3s_release_asks_for_one():
    message = refusal(k3s_cluster("1.33"))
    assert "k3s.version: is not set, and no k3s release is pinned for kubernetesVersion 1.33" in message
    assert "kubernetesVersion to one of 1.34, 1.35, 1.36" in message


def test_only_an_explicit_k3s_release_of_another_minor_is_refused():
    assert load_spec(k3s_cluster("1.33", version="v1.33.4+k3s1")).k3s.version == "v1.33.4+k3s1"
    message = refusal(k3s_cluster("1.35", version="v1.36.3+k3s1"))
    assert "is Kubernetes 1.36 but kubernetesVersion says 1.35" in message


@pytest.mark.parametrize(
    ("region", "expected"),
    [
        (None, "aws:region: is not set"),
        ("", "aws:region: is not set"),
        (
            "us-central1",
            'aws:region: "us-central1" - is a GCP region name; AWS regions read like us-east-1. '
            "Fix: pick one",
        ),
        ("us-east1", "is a GCP region name; AWS regions read like us-east-1. Fix: did you mean us-east-1?"),
        ("mars-north-1", '"mars-north-1" - is not an AWS region name'),
        ("us-east-1\n", "is not an AWS region name"),
        ("us-east-\u0661", "is not an AWS region name"),
    ],
)
def test_aws_region_must_name_an_aws_region(region, expected):
    issue = region_issue(region)
    assert issue is not None and expected in str(issue)


@pytest.mark.parametrize("region", ["us-east-1", "eu-west-3", "ap-southeast-9", "mx-central-1"])
def test_aws_regions_of_the_aws_partition_pass_and_so_does_a_new_one(region):
    assert region_issue(region) is None


@pytest.mark.parametrize(
    ("region", "partition"),
    [
        ("us-gov-west-1", "AWS GovCloud (US) partition (aws-us-gov)"),
        ("cn-north-1", "AWS China partition (aws-cn)"),
        ("us-iso-east-1", "AWS ISO (US) partition (aws-iso)"),
        ("eu-isoe-west-1", "AWS ISOE (Europe) partition (aws-iso-e)"),
        ("eusc-de-east-1", "AWS EUSC partition (aws-eusc)"),
    ],
)
def test_regions_of_other_partitions_are_refused_naming_the_partition(region, partition):
    """Every ARN and endpoint the program writes is the aws partition's (review-aws.md AN-A4)."""
    issue = region_issue(region)
    assert issue is not None
    assert f'aws:region: "{region}" - is in the {partition}; gpu-k8s builds for the standard aws' in str(
        issue
    )
    assert "Fix: use a region of the aws partition, e.g. us-east-1" in str(issue)


def test_aws_region_names_are_botocores():
    partitions = Loader().load_data("endpoints")["partitions"]
    assert [(name, title, pattern) for name, title, pattern in PARTITIONS] == [
        (p["partition"], p["partitionName"], p["regionRegex"]) for p in partitions
    ]
    assert [p.pattern for p in REGION_PATTERNS] == [pattern for _, _, pattern in PARTITIONS]
    assert {region for p in partitions for region in p["regions"]} == KNOWN_REGIONS


@pytest.mark.parametrize(
    ("project", "region", "expected"),
    [
        (None, None, ["gcp:project: is not set", "gcp:region: is not set"]),
        ("2147483648", "us-central1", ['gcp:project: "2147483648" - is not a project ID']),
        ("My Project", "us-central1", ["is not a project ID"]),
        ("abc", "us-central1", ["is not a project ID"]),
        ("ml-prod-", "us-central1", ["is not a project ID"]),
        ("ml-prod", "us-east-1", ['gcp:region: "us-east-1" - is an AWS region name']),
        ("ml-prod", "central", ['gcp:region: "central" - is not a GCP region name']),
        ("ml-prod", "us-central1\n", ["is not a GCP region name"]),
    ],
)
def test_gcp_project_and_region_have_their_shapes(project, region, expected):
    messages = [str(issue) for issue in location_issues(project, region)]
    assert len(messages) == len(expected)
    assert all(part in message for part, message in zip(expected, messages, strict=True)), messages


@pytest.mark.parametrize("project", ["ml-prod", "example.com:ml-prod", "a2345678901234567890123456789z"])
def test_gcp_project_ids_pass(project):
    assert list(location_issues(project, "europe-west4")) == []


@pytest.mark.parametrize("value", ['"abc"', '"name: ml\\n"'])
def test_the_cluster_key_written_as_text_is_refused_under_the_program(tmp_path: Path, capsys, value):
    stack = tmp_path / "Pulumi.x.yaml"
    stack.write_text(f"config:\n  aws:region: us-east-1\n  gpu-k8s:cluster: {value}\n")
    assert main([str(stack)]) == 2
    error = capsys.readouterr().err
    assert (
        f"gpu-k8s:cluster: {value} - is text, not a mapping. Fix: write the cluster's keys indented" in error
    )


@pytest.mark.parametrize(
    ("written", "required"),
    [("maxNode", "maxNodes"), ("InstanceType", "instanceType"), ("instancetype", "instanceType")],
)
def test_a_misspelt_required_key_is_one_problem_with_its_name(written, required):
    cluster = minimal_cluster()
    pool = cluster["gpuPools"][0]
    pool[written] = pool.pop(required)
    with pytest.raises(ConfigError) as caught:
        load_spec(cluster)
    (issue,) = caught.value.issues
    assert issue.path == f"gpu-k8s:cluster.gpuPools[0].{written}"
    assert (issue.problem, issue.fix) == (
        f"unknown key, and {required} is missing",
        f"rename it to {required}",
    )


def test_another_clouds_gpu_type_suggests_this_clouds_types_with_the_same_gpu():
    message = refusal(mutated("gpuPools.0.instanceType", "a3-highgpu-8g"))
    assert (
        "Fix: a3-highgpu-8g is a GCP type (8 x NVIDIA H100 80GB (SXM5/PCIe)); on AWS the same GPU: "
        in message
    )
    assert "p5.48xlarge (8 GPUs)" in message and "g4dn" not in message


def test_a_stack_file_with_its_settings_outside_config_is_told_so(tmp_path, capsys):
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text("aws:region: us-east-1\ngpu-k8s:cluster: {name: ml}\n")
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "has aws:region, gpu-k8s:cluster at its top level and no `config:` key" in err
    assert "Fix: put `config:` on the first line and indent the settings under it" in err


@pytest.mark.parametrize(
    ("namespace", "why"),
    [
        ("system-upgrade", "belongs to an add-on"),
        ("gke-managed-system", "kept by Kubernetes or GKE"),
        ("gmp-public", "kept by"),
        ("jobset-system", "belongs to an add-on"),
    ],
)
def test_batch_refuses_namespaces_the_cluster_or_its_platform_keeps(namespace, why):
    cluster = minimal_cluster()
    cluster["batch"] = {"namespaces": [namespace]}
    assert why in refusal(cluster)


def test_an_empty_batch_section_is_refused_not_read_as_no_batch():
    cluster = minimal_cluster()
    cluster["batch"] = None
    message = refusal(cluster)
    assert "gpu-k8s:cluster.batch: is empty, so no queue would be made" in message


def test_a_pods_ready_timeout_beyond_a_go_duration_is_refused():
    cluster = minimal_cluster()
    cluster["batch"] = {"namespaces": ["research"], "podsReadyTimeout": "2562048h"}
    assert "is longer than a Go duration holds" in refusal(cluster)
    cluster["batch"]["podsReadyTimeout"] = "2562047h"
    load_spec(cluster)


def test_keys_of_the_gpu_k8s_namespace_the_library_does_not_read_are_refused(tmp_path, capsys):
    from gpu_k8s.components.configbase import namespace_key_issues

    issues = namespace_key_issues(["gpu-k8s:clustr", "gpu-k8s:fooBar", "gpu-k8s:cluster", "team:share"])
    assert [(i.path, i.fix) for i in issues] == [
        ("gpu-k8s:clustr", "did you mean gpu-k8s:cluster?"),
        ("gpu-k8s:fooBar", "gpu-k8s: holds only cluster, gpuLayer; your keys go under your project"),
    ]
    stack = yaml_stack(tmp_path, {"gpu-k8s:clustr": minimal_cluster(), "aws:region": "us-east-1"})
    assert main([str(stack)]) == 2
    assert (
        "gpu-k8s:clustr: is not a key of gpu-k8s. Fix: did you mean gpu-k8s:cluster?"
        in capsys.readouterr().err
    )


def yaml_stack(directory: Path, config: dict[str, Any]) -> Path:
    import yaml

    path = directory / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return path


def test_a_refusal_prints_a_screenful_and_counts_the_rest():
    from gpu_k8s.components.configbase import SHOWN_ISSUES, ConfigIssue

    error = ConfigError(ConfigIssue(f"k{i}", i, "bad", "fix it") for i in range(SHOWN_ISSUES + 30))
    lines = str(error).splitlines()
    assert lines[0] == f"invalid stack config ({SHOWN_ISSUES + 30} problem(s)):"
    assert len(lines) == SHOWN_ISSUES + 2 and lines[-1] == "  ... and 30 more of the same kind or others"
    assert len(error.issues) == SHOWN_ISSUES + 30


def test_a_snake_case_spelling_of_a_key_is_refused_with_its_camel_case_name():
    """The models take field names from code; a stack file takes the camelCase keys only."""
    cluster = minimal_cluster()
    cluster["gpuPools"][0]["max_nodes"] = cluster["gpuPools"][0].pop("maxNodes")
    cluster["system_pool"] = cluster.pop("systemPool")
    with pytest.raises(ConfigError) as caught:
        load_spec(cluster)
    assert sorted((issue.path, issue.fix) for issue in caught.value.issues) == [
        ("gpu-k8s:cluster.gpuPools[0].max_nodes", "rename it to maxNodes"),
        ("gpu-k8s:cluster.system_pool", "rename it to systemPool"),
    ]
