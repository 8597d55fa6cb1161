"""The installed package: the wheel carries every module and data file the four platforms need, and a user's
own project plans the same stacks from it, outside the checkout."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.paths import FIXTURE_PLANS, FIXTURE_STACKS, REPO_ROOT

STACKS = ["aws-eks", "aws-k3s", "gcp-gke", "gcp-k3s"]
PACKAGE_DIRS = {
    "gpu_k8s.components": "components",
    "gpu_k8s.providers": "providers",
    "gpu_k8s.tools": "tools",
}


def _setuptools_config() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_code_directory_is_a_listed_package():
    """A directory with an __init__.py that the list leaves out would be missing from the wheel."""
    listed = set(_setuptools_config()["packages"])
    on_disk = {"gpu_k8s", "gpu_k8s.upstream"}
    for package, directory in PACKAGE_DIRS.items():
        for init in (REPO_ROOT / directory).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO_ROOT / directory)
            on_disk.add(".".join([package, *relative.parts]))
    assert listed == on_disk


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            out,
            REPO_ROOT,
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("gpu_k8s-*.whl")
    return built


def test_the_wheel_holds_every_module_and_runtime_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for package, directory in PACKAGE_DIRS.items():
        for source in (REPO_ROOT / directory).rglob("*.py"):
            inside = Path(*package.split("."), source.relative_to(REPO_ROOT / directory)).as_posix()
            assert inside in names, f"{source.relative_to(REPO_ROOT)} is not in the wheel"
    assert "gpu_k8s/components/data/gpu-catalog.yaml" in names
    assert "gpu_k8s/py.typed" in names
    dist_info = wheel.name.split("-py3")[0] + ".dist-info"
    # Only the library's import root: no generic top-level names (components, providers, tools) leak out.
    assert {name.split("/")[0] for name in names} == {"gpu_k8s", dist_info}
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt")
    assert "gpu-k8s = gpu_k8s.tools.cli:main" in entry_points.decode()


def runtime_closure(extras: tuple[str, ...] = ("aws", "gcp")) -> dict[str, metadata.Distribution]:
    """The distributions gpu-k8s declares with `extras`, transitively (other extras left out, markers
    evaluated here)."""
    found: dict[str, metadata.Distribution] = {}
    pending: list[tuple[str, tuple[str, ...]]] = [("gpu-k8s", extras)]
    while pending:
        name, wanted = pending.pop()
        dist = metadata.distribution(name)
        key = canonicalize_name(dist.metadata["Name"])
        if key in found:
            continue
        found[key] = dist
        for line in dist.requires or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": extra}) for extra in ("", *wanted)):
                pending.append((requirement.name, ()))
    return found


def fresh_environment(wheel: Path, root: Path, extras: tuple[str, ...]) -> Path:
    """A fresh venv at `root` with the wheel and, file by file, exactly the distributions it declares with
    `extras` (taken from the test environment: tests make no downloads). A module the library imports but
    does not declare (a dev tool) is missing here as it would be for a user."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", root], check=True, timeout=120)
    python = root / "bin" / "python"
    fresh_site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    here = Path(sysconfig.get_paths()["purelib"])
    for key, dist in runtime_closure(extras).items():
        if key == "gpu-k8s":
            continue
        for file in dist.files or ():
            source = Path(str(dist.locate_file(file)))
            if source.is_file() and source.is_relative_to(here):
                target = fresh_site / source.relative_to(here)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(source)
    # pip runs from the test environment, installing into the fresh one (which has no pip of its own).
    pip = [sys.executable, "-m", "pip", "--python", python]
    subprocess.run(
        [*pip, "install", "--quiet", "--no-deps", "--no-index", wheel],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return root


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """gpu-k8s[aws,gcp] from the wheel, in an environment with nothing else."""
    return fresh_environment(wheel, tmp_path_factory.mktemp("venv"), ("aws", "gcp"))


def test_the_fresh_environment_lacks_the_dev_tools(installed):
    """The environment the package tests plan in holds no test dependency (else they would prove nothing)."""
    missing = subprocess.run(
        [installed / "bin" / "python", "-c", "import moto"], capture_output=True, text=True
    )
    assert "No module named 'moto'" in missing.stderr


@pytest.fixture(scope="module")
def user_project(tmp_path_factory) -> Path:
    """What a user's own project holds: Pulumi.yaml, the program and stack files, nothing else."""
    project = tmp_path_factory.mktemp("my-gpu-project")
    shutil.copy(REPO_ROOT / "Pulumi.yaml", project)
    shutil.copy(REPO_ROOT / "__main__.py", project)
    (project / "stacks").mkdir()
    for stack in STACKS:
        shutil.copy(FIXTURE_STACKS / f"Pulumi.{stack}.yaml", project / "stacks")
    return project


def test_the_library_is_imported_from_the_install_not_the_checkout(installed, user_project):
    where = subprocess.run(
        [installed / "bin" / "python", "-c", "import gpu_k8s.providers.gcp.pd_csi as m; print(m.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=user_project,
    ).stdout.strip()
    assert Path(where).is_relative_to(installed)


@pytest.mark.parametrize("stack", STACKS)
def test_an_installed_package_plans_each_stack_as_the_checkout_does(installed, user_project, stack):
    result = subprocess.run(
        [installed / "bin" / "gpu-k8s", "plan", stack, "--json"],
        capture_output=True,
        text=True,
        cwd=user_project,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == (FIXTURE_PLANS / f"{stack}.json").read_text()


def test_a_stack_name_outside_any_project_is_refused_with_the_way_out(installed, tmp_path):
    result = subprocess.run(
        [installed / "bin" / "gpu-k8s", "plan", "aws-eks"], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stderr.startswith("aws-eks: no Pulumi.yaml in ")
    assert "run from your Pulumi project, or name a stack file inside one" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_stack_file_is_planned_with_the_project_it_belongs_to(installed, user_project, tmp_path):
    stack_file = user_project / "stacks" / "Pulumi.aws-k3s.yaml"
    result = subprocess.run(
        [installed / "bin" / "gpu-k8s", "plan", str(stack_file), "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == (FIXTURE_PLANS / "aws-k3s.json").read_text()


def test_the_command_lists_its_tools_and_refuses_an_unknown_one(installed):
    command = installed / "bin" / "gpu-k8s"
    usage = subprocess.run([command, "--help"], capture_output=True, text=True)
    assert usage.returncode == 0
    assert all(
        f"gpu-k8s {tool}" in usage.stdout for tool in ("plan", "rent", "bench", "upstream", "references")
    )
    version = subprocess.run([command, "--version"], capture_output=True, text=True)
    assert (
        version.stdout
        == f"gpu-k8s {tomllib.loads((REPO_ROOT / 'pyproject.toml').read_text())['project']['version']}\n"
    )
    unknown = subprocess.run([command, "deploy"], capture_output=True, text=True)
    assert unknown.returncode == 2
    assert "no command 'deploy'; commands: plan, rent, bench, upstream, references" in unknown.stderr


def test_the_contract_data_tool_points_an_installed_user_to_a_checkout(installed, tmp_path):
    result = subprocess.run(
        [installed / "bin" / "gpu-k8s", "upstream", "verify"], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 2
    assert "manifest.json: not here; the contract data ships with a checkout of gpu-k8s" in result.stderr


def _plan_example(installed: Path, tmp_path: Path, example: str) -> list[dict]:
    project = tmp_path / example
    shutil.copytree(REPO_ROOT / "examples" / example, project)
    result = subprocess.run(
        [installed / "bin" / "gpu-k8s", "plan", "dev", "--json"],
        capture_output=True,
        text=True,
        cwd=project,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    resources: list[dict] = json.loads(result.stdout)["resources"]
    return resources


def test_the_example_user_program_plans_from_the_installed_package(installed, tmp_path):
    resources = _plan_example(installed, tmp_path, "team-quota")
    quota = next(r for r in resources if r["name"] == "ml-team-gpus")
    assert quota["inputs"]["spec"] == {"hard": {"requests.nvidia.com/gpu": "7"}}


def test_the_gpu_layer_example_plans_from_the_installed_package(installed, tmp_path):
    resources = _plan_example(installed, tmp_path, "existing-eks")
    groups = [r for r in resources if r["type"] == "aws:eks/nodeGroup:NodeGroup"]
    assert groups and {group["inputs"]["clusterName"] for group in groups} == {"prod"}


def test_one_cloud_installs_alone_and_the_other_is_refused_with_the_extra_to_add(wheel, tmp_path_factory):
    """gpu-k8s[aws]: no Google SDK installed; an AWS stack plans, a GCP stack is refused naming the extra."""
    aws_only = fresh_environment(wheel, tmp_path_factory.mktemp("aws-only"), ("aws",))
    python = aws_only / "bin" / "python"
    assert subprocess.run([python, "-c", "import pulumi_gcp"], capture_output=True).returncode != 0
    project = tmp_path_factory.mktemp("one-cloud")
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(REPO_ROOT / name, project)
    (project / "stacks").mkdir()
    for stack in ("aws-eks", "gcp-gke"):
        shutil.copy(FIXTURE_STACKS / f"Pulumi.{stack}.yaml", project / "stacks")

    def plan(stack: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [aws_only / "bin" / "gpu-k8s", "plan", stack, "--json"],
            capture_output=True,
            text=True,
            cwd=project,
            timeout=300,
        )

    assert plan("aws-eks").stdout == (FIXTURE_PLANS / "aws-eks.json").read_text()
    refused = plan("gcp-gke")
    assert refused.returncode == 2 and refused.stdout == ""
    assert 'gpu-k8s:cluster.cloud: "gcp" - needs the Pulumi GCP SDK (pulumi_gcp)' in refused.stderr
    assert "Fix: pip install 'gpu-k8s[gcp]'" in refused.stderr and "Traceback" not in refused.stderr
