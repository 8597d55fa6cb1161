"""The offline plan: committed snapshots, CLI behaviour, secrets redaction, import isolation."""

from __future__ import annotations

import base64
import dataclasses
import difflib
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpu_k8s.tools.engine import run_program
from gpu_k8s.tools.plan import DECODED_MARK, plan_document, readable_inputs, render_text
from tests.conftest import minimal_cluster
from tests.paths import FIXTURE_PLANS, FIXTURE_STACKS, REPO_ROOT

PLANS = FIXTURE_PLANS


def run_plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpu_k8s.tools.cli", "plan", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
    )


@pytest.mark.parametrize("stack", ["aws-eks", "aws-k3s", "gcp-gke", "gcp-k3s"])
def test_committed_plan_matches_the_program(request, stack):
    recording = request.getfixturevalue(stack.replace("-", "_"))
    committed = (PLANS / f"{stack}.json").read_text()
    current = json.dumps(plan_document(recording), indent=2, sort_keys=True) + "\n"
    if current != committed:
        diff = "".join(
            difflib.unified_diff(
                committed.splitlines(True),
                current.splitlines(True),
                f"tests/fixtures/stacks/plans/{stack}.json (committed)",
                "plan of the program now",
                n=2,
            )
        )
        pytest.fail(
            f"the {stack} plan changed; review the diff, then run `make snapshots` and commit:\n{diff}"
        )


def test_every_built_stack_has_a_snapshot():
    stacks = {
        p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in FIXTURE_STACKS.glob("Pulumi.*.yaml")
    }
    assert stacks == {p.stem for p in PLANS.glob("*.json")}


def test_plan_json_document_shape(aws_eks):
    document = plan_document(aws_eks)
    assert set(document) == {"stack", "resources", "outputs", "warnings"}
    for resource in document["resources"]:
        assert set(resource) == {"urn", "type", "name", "parent", "inputs", "dependencies", "options"}
    assert [r["urn"] for r in document["resources"]] == sorted(r["urn"] for r in document["resources"])


def test_secrets_never_reach_the_plan(aws_eks):
    text = render_text(aws_eks) + json.dumps(plan_document(aws_eks))
    assert "certificate-authority-data" not in text
    assert "get-token" not in text
    assert "[secret]" in text


def section(text: str, title: str) -> list[str]:
    """The lines of one section of the text plan, its title line left out."""
    return text.split(f"\n{title}", 1)[1].split("\n\n", 1)[0].splitlines()[1:]


def rows_of(lines: list[str]) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in lines]


def test_the_plan_shows_the_cloud_config_inside_ec2_user_data(aws_k3s):
    """EC2 user data is sent gzipped and base64-encoded; the snapshot shows the text, so a boot-script
    change reads as one in the pull request."""
    server = next(r for r in plan_document(aws_k3s)["resources"] if r["name"] == "ml-server-0")
    shown = server["inputs"]["userDataBase64"]
    assert shown.startswith(DECODED_MARK + "#cloud-config\n")
    assert "snapshot_store.py founded" in shown
    # A value this toolkit did not gzip is shown as sent.
    registration = aws_k3s.by_name("ml-server-0")
    plain = dataclasses.replace(registration, inputs={**registration.inputs, "userDataBase64": "I2Nsb3Vk"})
    assert readable_inputs(plain)["userDataBase64"] == "I2Nsb3Vk"
    # Nor is a truncated gzip stream decoded (it would not decompress).
    truncated = base64.b64encode(gzip.compress(b"#cloud-config\n")[:12]).decode()
    cut = dataclasses.replace(registration, inputs={**registration.inputs, "userDataBase64": truncated})
    assert readable_inputs(cut)["userDataBase64"] == truncated


def test_the_full_text_plan_shows_every_resource_and_the_dependencies(aws_eks):
    text = render_text(aws_eks, full=True)
    assert "gpu-k8s:aws:EksCluster  ml" in text
    assert "ml-gpu-h100-ng-0 -> " in text
    assert "ignoreChanges=scalingConfig.desiredSize" in text
    assert "Summary:" in text


def test_the_default_text_plan_counts_resources_per_component_and_fits_110_columns(request):
    for stack in ("aws_eks", "aws_k3s", "gcp_gke", "gcp_k3s"):
        recording = request.getfixturevalue(stack)
        text = render_text(recording)
        assert max(len(line) for line in text.splitlines()) <= 110, stack
        assert "ignoreChanges=" not in text and "Dependencies (" not in text
    components = rows_of(section(render_text(request.getfixturevalue("aws_eks")), "Components"))
    under = {row[1]: int(row[2]) for row in components if len(row) == 3}
    assert under["ml"] == 168 and under["ml-gpu-h100"] == 19


def test_the_pool_table_gives_hardware_scale_and_price(aws_eks):
    rows = rows_of(section(render_text(aws_eks), "GPU pools"))
    assert rows[0] == [
        "pool",
        "instance type",
        "GPUs/node",
        "nodes",
        "$/node-h",
        "$/h at max",
        "interconnect",
    ]
    by_pool = {row[0]: row[1:] for row in rows[1:]}
    # Karpenter's us-east-1 table: p5.48xlarge 55.04 on demand (the stack's region). SkyPilot's catalog:
    # g6e.xlarge spot in us-east-1's zones 1.1975, 0.9154, 0.9599, 1.0492: the dearest.
    assert by_pool["l40s"] == ["g6e.xlarge", "1 x nvidia-l40s", "0-4 spot", "1.20", "4.79", "-"]
    assert by_pool["h100-train"] == [
        "p5.48xlarge",
        "8 x nvidia-h100-80gb",
        "0-2 on-demand",
        "55.04",
        "110.08",
        "efa",
    ]


def test_the_slot_table_and_the_batch_queues(aws_eks, gcp_gke):
    text = render_text(aws_eks)
    slots = {row[0]: row[1:] for row in rows_of(section(text, "Slots"))[1:]}
    assert slots["l40s"] == ["none", "hardware", "1: 1 x nvidia.com/gpu (48 GiB)"]
    assert slots["a10g-shared"] == ["timeSlicing", "none", "4: 4 x nvidia.com/gpu (6 GiB)"]
    assert slots["l4-mps"] == ["mps", "memory+compute limits", "16: 16 x nvidia.com/gpu (6 GiB)"]
    assert slots["h100"] == ["mig", "hardware", "56: 56 x nvidia.com/gpu (10 GiB)"]
    queues = section(text, "Batch queues")
    assert "  h100-train: 16 x nvidia.com/gpu + 64 x vpc.amazonaws.com/efa" in queues
    assert "Batch queues" not in render_text(gcp_gke)


def test_the_pool_table_has_an_interconnect_column_only_where_a_pool_has_one(gcp_gke, gcp_k3s):
    rows = rows_of(section(render_text(gcp_gke), "GPU pools"))
    assert rows[0][-1] == "interconnect"
    assert {row[0]: row[-1] for row in rows[1:]}["h100-train"] == "compact"
    assert "interconnect" not in section(render_text(gcp_k3s), "GPU pools")[0]


def test_each_pool_says_what_a_pod_needs_to_land_there(aws_eks, gcp_gke):
    pools = {p["name"]: p for p in gcp_gke.outputs["gpuPools"]}
    # GKE taints GPU nodes nvidia.com/gpu=present itself; time-sharing adds the sharing taint.
    assert pools["l4"]["usage"] == {
        "nodeSelector": {"gpu-k8s.io/pool": "l4"},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
            {
                "key": "gpu-k8s.io/sharing",
                "operator": "Equal",
                "value": "timeSlicing",
                "effect": "NoSchedule",
            },
        ],
        "resources": ["nvidia.com/gpu"],
    }
    eks = {p["name"]: p for p in aws_eks.outputs["gpuPools"]}
    assert eks["h100-train"]["usage"]["resources"] == ["nvidia.com/gpu", "vpc.amazonaws.com/efa"]
    assert eks["l40s"]["usage"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    ]
    lines = section(render_text(gcp_gke), "How a pod lands on a pool")
    assert lines[0] == ("  l4: nodeSelector gpu-k8s.io/pool=l4; tolerate nvidia.com/gpu=present:NoSchedule,")
    assert lines[1] == "      gpu-k8s.io/sharing=timeSlicing:NoSchedule; request nvidia.com/gpu"


def test_text_plan_lists_warnings(aws_eks_config):
    config = json.loads(json.dumps(aws_eks_config))
    config["gpu-k8s:cluster"]["cuda"] = "13.1"
    text = render_text(run_program("warned", config))
    assert "Warnings:" in text
    assert "CUDA 13.1 wants driver >= 590.44.01" in text.split("Warnings:")[1]


def test_cli_prints_the_plan():
    result = run_plan(str(FIXTURE_STACKS / "Pulumi.aws-eks.yaml"))
    assert result.returncode == 0, result.stderr
    committed = json.loads((PLANS / "aws-eks.json").read_text())
    assert result.stdout.startswith(f"Offline plan of stack aws-eks: {len(committed['resources'])} resources")


def test_cli_bad_config_exits_2_with_message_on_stderr_only(tmp_path: Path):
    stack = yaml.safe_load((FIXTURE_STACKS / "Pulumi.aws-eks.yaml").read_text())
    stack["config"]["gpu-k8s:cluster"]["gpuPools"][0]["maxNodes"] = 0
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(yaml.safe_dump(stack))
    result = run_plan(str(bad), "--json")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "gpu-k8s:cluster.gpuPools[0].maxNodes" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_unknown_stack_exits_2_and_lists_stacks():
    result = run_plan("aws-ekz")
    assert result.returncode == 2 and result.stdout == ""
    users_stacks = sorted(
        p.name[len("Pulumi.") : -len(".yaml")] for p in (REPO_ROOT / "stacks").glob("Pulumi.*")
    )
    assert all(stack in result.stderr for stack in users_stacks), result.stderr


@pytest.mark.parametrize(
    ("stack", "other_cloud_sdk"),
    [
        ("aws-eks", "pulumi_gcp"),
        ("aws-k3s", "pulumi_gcp"),
        ("gcp-gke", "pulumi_aws"),
        ("gcp-k3s", "pulumi_aws"),
    ],
)
def test_a_plan_never_imports_the_other_clouds_sdk(stack, other_cloud_sdk):
    probe = (
        f"import sys, gpu_k8s.tools.plan as p; p.plan({str(FIXTURE_STACKS / f'Pulumi.{stack}.yaml')!r}); "
        f"print(sorted(m for m in sys.modules if m.startswith({other_cloud_sdk!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("stack_text", "message"),
    [
        ("config:\n  aws:region: us-east-1\n", "gpu-k8s:cluster: is not set"),
        ("config: [\n", "not valid YAML"),
        (
            yaml.safe_dump(
                {
                    "config": {
                        "gcp:project": "p",
                        "gpu-k8s:cluster": minimal_cluster(
                            cloud="gcp",
                            kind="k3s",
                            network={
                                "cidr": "10.40.0.0/20",
                                "podsCidr": "10.64.0.0/14",
                                "servicesCidr": "10.68.0.0/20",
                                "zones": ["us-central1-a"],
                            },
                            kubernetesVersion="1.36",
                            systemPool={"instanceType": "e2-standard-4", "nodes": 1},
                            gpuPools=[{"name": "l4", "instanceType": "g2-standard-8", "maxNodes": 2}],
                        ),
                    }
                }
            ),
            "k3s gives pods and services addresses itself",
        ),
    ],
    ids=["cluster-key-missing", "broken-yaml", "platform-rule-broken"],
)
def test_cli_refuses_unusable_stack_files_with_exit_2(tmp_path: Path, stack_text: str, message: str):
    stack = tmp_path / "Pulumi.x.yaml"
    stack.write_text(stack_text)
    result = run_plan(str(stack))
    assert (result.returncode, result.stdout) == (2, "")
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_plan_runs_as_a_preview_and_up_runs_as_pulumi_up(aws_eks_config):
    import pulumi

    def program() -> None:
        pulumi.export("dryRun", pulumi.runtime.is_dry_run())

    assert run_program("preview", aws_eks_config, program).outputs == {"dryRun": True}
    assert run_program("up", aws_eks_config, program, preview=False).outputs == {"dryRun": False}


def test_up_flag_plans_the_stack_as_a_real_run(tmp_path):
    """The example's placeholder apiAccessCidrs lock the deployer out: a preview warns, `up` refuses."""
    refused = run_plan("aws-k3s", "--up", "--json")
    assert refused.returncode == 2 and refused.stdout == ""
    assert 'apiAccessCidrs[0]: "203.0.113.0/24" - is an RFC 5737 documentation range' in refused.stderr
    stack = yaml.safe_load((FIXTURE_STACKS / "Pulumi.aws-k3s.yaml").read_text())
    stack["config"]["gpu-k8s:cluster"]["apiAccessCidrs"] = ["198.18.7.0/24"]
    real = tmp_path / "Pulumi.aws-k3s.yaml"
    real.write_text(yaml.safe_dump(stack))
    result = run_plan(str(real), "--up", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["stack"] == "aws-k3s"


def test_values_known_only_after_creation_print_as_computed():
    from pulumi.output import Unknown

    from gpu_k8s.tools.plan import UNKNOWN_MARK, redact

    assert redact({"a": Unknown(), "b": [Unknown(), 1.0]}) == {"a": UNKNOWN_MARK, "b": [UNKNOWN_MARK, 1]}
