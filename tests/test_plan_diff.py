"""The per-resource diff a reviewer reads: what a stack edit creates, deletes and changes, by resource name
and attribute, and the exit code CI fails on."""

from __future__ import annotations

import json
import os
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


def test_named_items_are_compared_by_name():
    before = {"resources": [resource("a", pools=[{"name": "x", "max": 1}, {"name": "y", "max": 2}])]}
    after = {"resources": [resource("a", pools=[{"name": "y", "max": 3}, {"name": "z", "max": 1}])]}
    assert plan_diff(before, after)[1:] == [
        '    inputs.pools[x]: {"max": 1, "name": "x"} -> (absent)',
        "    inputs.pools[y].max: 2 -> 3",
        '    inputs.pools[z]: (absent) -> {"max": 1, "name": "z"}',
    ]


def test_a_reorder_shows_even_when_items_also_joined():
    before = {"resources": [resource("a", zones=["a", "b", "c"])]}
    after = {"resources": [resource("a", zones=["c", "b", "a", "d"])]}
    assert plan_diff(before, after)[1:] == [
        '    inputs.zones[+]: (absent) -> "d"',
        '    inputs.zones[~order]: ["a", "b", "c"] -> ["c", "b", "a"]',
    ]


def test_a_warning_that_appears_or_goes_is_a_change():
    before = {"resources": [resource("a")], "warnings": ["old news", "kept"]}
    after = {"resources": [resource("a")], "warnings": ["kept", "driver unknown"]}
    lines = plan_diff(before, after)
    assert lines == ["- warning  old news", "+ warning  driver unknown"]
    assert summary(lines) == "2 warning(s) changed"


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


def test_the_workflow_summary_shows_what_a_pull_request_changes_against_the_base_branch(tmp_path: Path):
    """The offline job's step, run as GitHub runs it, in a clone whose base branch holds the old snapshot."""
    workflow = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "preview.yml").read_text())
    (step,) = [
        s for s in workflow["jobs"]["offline"]["steps"] if "against the base branch" in s.get("name", "")
    ]
    origin, work = tmp_path / "origin", tmp_path / "work"
    (origin / "stacks" / "plans").mkdir(parents=True)
    for name in ("Pulumi.yaml", "__main__.py"):
        (origin / name).write_text((REPO_ROOT / name).read_text())
    (origin / "stacks" / "Pulumi.aws-eks.yaml").write_text(
        (FIXTURE_STACKS / "Pulumi.aws-eks.yaml").read_text()
    )
    (origin / "stacks" / "plans" / "aws-eks.json").write_text((FIXTURE_PLANS / "aws-eks.json").read_text())

    def git(*args: str, cwd: Path) -> None:
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=cwd,
            check=True,
            capture_output=True,
        )

    git("init", "-q", "-b", "main", cwd=origin)
    git("add", ".", cwd=origin)
    git("commit", "-q", "-m", "base", cwd=origin)
    git("clone", "-q", str(origin), str(work), cwd=tmp_path)
    stack = yaml.safe_load((work / "stacks" / "Pulumi.aws-eks.yaml").read_text())
    stack["config"]["gpu-k8s:cluster"]["gpuPools"][0]["maxNodes"] += 1
    (work / "stacks" / "Pulumi.aws-eks.yaml").write_text(yaml.safe_dump(stack))
    (work / ".venv").symlink_to(REPO_ROOT / ".venv")
    summary_file, runner_temp = tmp_path / "summary.md", tmp_path / "runner"
    runner_temp.mkdir()
    result = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
        cwd=work,
        env={
            **os.environ,
            "BASE_REF": "main",
            "GITHUB_STEP_SUMMARY": str(summary_file),
            "RUNNER_TEMP": str(runner_temp),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    summary_text = summary_file.read_text()
    assert "Plan changes against main" in summary_text
    assert "Plan of aws-eks against " in summary_text and ": 2 to update" in summary_text, summary_text
    assert "    inputs.scalingConfig.maxSize: 1 -> 2" in summary_text
    # Named list items (here the pools output) are compared by name, field by field.
    assert "~ output  outputs.gpuPools[l40s].maxNodes: 4 -> 5" in summary_text
