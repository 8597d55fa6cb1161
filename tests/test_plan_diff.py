"""The per-resource diff a reviewer reads: what a stack edit creates, deletes and changes, by resource name
and attribute, and the exit code CI fails on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from gpu_k8s.tools.plan_diff import plan_diff, summary
from tests.paths import FIXTURE_PLANS, FIXTURE_STACKS, REPO_ROOT


def resource(name: str, **inputs) -> dict:
    return {
        "urn": f"urn:pulumi:s::p::t::{name}",
        "type": "aws:ec2/subnet:Subnet",
        "name": name,
        "parent": None,
        "inputs": inputs,
        "dependencies": [],
        "options": {},
    }


def test_each_change_is_named_by_resource_and_attribute():
    before = {
        "resources": [resource("a", cidr="10.0.0.0/24", tags={"x": "1"}), resource("gone")],
        "outputs": {"k": 1},
    }
    after = {
        "resources": [resource("a", cidr="10.0.1.0/24", tags={"x": "1", "y": "2"}), resource("new")],
        "outputs": {"k": 2},
    }
    assert plan_diff(before, after) == [
        "~ update  aws:ec2/subnet:Subnet  a",
        '    inputs.cidr: "10.0.0.0/24" -> "10.0.1.0/24"',
        '    inputs.tags.y: (absent) -> "2"',
        "- delete  aws:ec2/subnet:Subnet  gone",
        "+ create  aws:ec2/subnet:Subnet  new",
        "~ output  outputs.k: 1 -> 2",
    ]
    assert summary(plan_diff(before, after)) == (
        "1 to create, 1 to update, 1 to delete, 1 output value(s) changed"
    )


def test_a_list_shows_what_left_and_what_joined():
    before = {"resources": [resource("a", zones=["a", "b"])]}
    after = {"resources": [resource("a", zones=["b", "c"])]}
    assert plan_diff(before, after)[1:] == [
        '    inputs.zones[-]: "a" -> (absent)',
        '    inputs.zones[+]: (absent) -> "c"',
    ]
    assert plan_diff(before, before) == [] and summary([]) == "no changes"


def test_the_cli_diffs_an_edited_stack_against_its_snapshot_and_fails(tmp_path: Path):
    stack = yaml.safe_load((FIXTURE_STACKS / "Pulumi.aws-eks.yaml").read_text())
    stack["config"]["gpu-k8s:cluster"]["gpuPools"][0]["maxNodes"] += 1
    edited = tmp_path / "Pulumi.aws-eks.yaml"
    edited.write_text(yaml.safe_dump(stack))
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "aws-eks.json").write_text((FIXTURE_PLANS / "aws-eks.json").read_text())

    def diff(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "gpu_k8s.tools.cli", "plan", str(path), "--diff"],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            timeout=300,
        )

    changed = diff(edited)
    assert changed.returncode == 1, changed.stderr
    assert changed.stdout.startswith(f"Plan of {edited} against {tmp_path / 'plans' / 'aws-eks.json'}: ")
    assert "~ update  aws:eks/nodeGroup:NodeGroup  ml-gpu-" in changed.stdout
    assert "    inputs.scalingConfig.maxSize: " in changed.stdout
    unchanged = diff(FIXTURE_STACKS / "Pulumi.aws-eks.yaml")
    assert unchanged.returncode == 0 and "no changes" in unchanged.stdout
    assert json.loads((FIXTURE_PLANS / "aws-eks.json").read_text())["resources"]
