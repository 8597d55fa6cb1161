"""A platform added from its own folder (tests/toy_platform, DEVELOPERS.md "Add a platform"): registered, its
keys and rules take part in validation with the same messages as the built-in platforms', and a stack of it
plans. Nothing outside the folder names it."""

from __future__ import annotations

import graphlib
import re
from pathlib import Path
from typing import Any

import pytest

from gpu_k8s import ConfigError, load_spec
from gpu_k8s.components.spec import PLATFORMS, register_platform
from tests.conftest import minimal_cluster, some
from tests.paths import REPO_ROOT
from tests.toy_platform.platforms import TOY
from tests.toy_platform.settings import ToyClusterSpec
from tools.engine import run_program

TOY_FOLDER = Path(__file__).parent / "toy_platform"


def toy_cluster(**overrides: Any) -> dict[str, Any]:
    return minimal_cluster(
        **{"kind": "toy", "network": {"racks": ["rack-1", "rack-2"]}, "toy": {"context": "lab"}, **overrides}
    )


@pytest.fixture
def toy_registered(monkeypatch):
    """The toy platform registered for one test, as a program registers it."""
    # setitem makes monkeypatch remove the entry again after the test.
    monkeypatch.setitem(PLATFORMS, (TOY.cloud, TOY.kind), TOY)
    register_platform(TOY)


def refusal(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_spec(raw)
    return [str(issue) for issue in caught.value.issues]


def test_a_registered_platform_loads_into_its_own_spec(toy_registered):
    spec = load_spec(toy_cluster())
    assert isinstance(spec, ToyClusterSpec)
    assert (spec.toy.context, spec.network.racks) == ("lab", ("rack-1", "rack-2"))


def test_its_own_rules_run_at_their_place(toy_registered):
    assert refusal(toy_cluster(network={"racks": ["r1"]}, toy={})) == [
        'gpu-k8s:cluster.network.racks[0]: "r1" - not a rack. Fix: write rack-<n>',
        "gpu-k8s:cluster.toy.context: is missing. Fix: name a kubeconfig context",
    ]


def test_keys_of_other_platforms_are_refused_with_the_generic_messages(toy_registered):
    raw = toy_cluster(network={"racks": [], "vpcId": "vpc-0a1b2c3d"}, gke={"regional": False})
    assert refusal(raw) == [
        'gpu-k8s:cluster.network.vpcId: "vpc-0a1b2c3d" - not a network setting on aws. '
        "Fix: aws/toy network keys: racks",
        'gpu-k8s:cluster.gke: {"regional": false} - gke settings only apply to kind gke, not aws/toy. '
        "Fix: remove the gke section",
    ]
    eks = minimal_cluster(toy={"context": "lab"}, network={"cidr": "10.40.0.0/16", "racks": ["rack-1"]})
    assert refusal(eks) == [
        'gpu-k8s:cluster.network.racks: ["rack-1"] - not a network setting on aws. '
        "Fix: aws/eks network keys: availabilityZones, cidr, privateSubnetIds, publicSubnetIds, "
        "singleNatGateway, vpcId",
        'gpu-k8s:cluster.toy: {"context": "lab"} - toy settings only apply to kind toy, not aws/eks. '
        "Fix: remove the toy section",
    ]


def test_its_section_lists_its_own_keys_when_one_is_unknown(toy_registered):
    (issue,) = refusal(toy_cluster(toy={"contxt": "lab"}))
    assert (
        issue
        == 'gpu-k8s:cluster.toy.contxt: "lab" - unknown key. Fix: did you mean context? allowed keys: context'
    )


def test_unregistered_the_kind_and_its_keys_are_unknown():
    assert (TOY.cloud, TOY.kind) not in PLATFORMS
    kind, racks, toy = refusal(toy_cluster())
    assert kind.startswith("gpu-k8s:cluster.kind: \"toy\" - must be 'eks', 'gke' or 'k3s'")
    assert racks.startswith('gpu-k8s:cluster.network.racks: ["rack-1", "rack-2"] - unknown key')
    assert toy.startswith('gpu-k8s:cluster.toy: {"context": "lab"} - unknown key')


def test_a_toy_stack_plans_the_gpu_layer_on_its_cluster(toy_registered):
    recording = run_program("toy", {"gpu-k8s:cluster": toy_cluster(), "aws:region": "us-east-1"})
    provider = recording.by_name("ml-k8s")
    assert provider.inputs["context"] == "lab"
    operator = recording.by_type("kubernetes:helm.sh/v3:Release")
    assert [release.name for release in operator] == ["ml-gpu-operator-release"]
    assert operator[0].provider.startswith(provider.urn)
    assert recording.outputs["gpuPools"]


def test_nothing_outside_the_toy_folder_names_it():
    """Adding a platform is adding a folder: only the folder and the test that registers it know it."""
    mentions = {
        path.relative_to(REPO_ROOT).as_posix()
        for root in ("components", "providers", "tools", "gpu_k8s", "stacks", "tests")
        for path in (REPO_ROOT / root).rglob("*.py")
        if "toy_platform" in path.read_text() and TOY_FOLDER not in path.parents
    }
    assert mentions == {"tests/test_add_platform.py"}


def test_components_never_ask_which_platform_they_serve():
    asks = re.compile(
        r"\b(cloud|kind)\s*[!=]=|[!=]=\s*\w*\.(cloud|kind)\b|\bin\s*\(\s*\"(aws|gcp|eks|gke|k3s)\""
    )
    found = [
        f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
        for path in some((REPO_ROOT / "components").rglob("*.py"), at_least=10)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if asks.search(line) and not line.lstrip().startswith("#")
    ]
    assert found == []


def test_the_library_modules_import_each_other_without_a_cycle():
    """Also counting imports made only for type checking: a cycle there is still two modules that cannot be
    understood apart."""
    imports = re.compile(r"^\s*from (gpu_k8s\.[\w.]+) import|^\s*import (gpu_k8s\.[\w.]+)", re.M)
    graph: dict[str, set[str]] = {}
    for root in ("components", "providers"):
        for path in (REPO_ROOT / root).rglob("*.py"):
            module = ".".join(("gpu_k8s", *path.relative_to(REPO_ROOT).with_suffix("").parts))
            graph[module.removesuffix(".__init__")] = {a or b for a, b in imports.findall(path.read_text())}
    some(graph, at_least=30)
    graph = {module: {d for d in deps if d in graph and d != module} for module, deps in graph.items()}
    sorter = graphlib.TopologicalSorter(graph)
    sorter.prepare()  # raises CycleError naming the cycle


def test_a_platform_refuses_what_it_does_not_build_with_the_base_rules(toy_registered):
    """PoolRules' defaults: no interconnect, no pool zones; the spec's: no shared file system."""
    pools = [
        {"name": "l4", "instanceType": "p5.48xlarge", "maxNodes": 1, "interconnect": "efa", "zones": ["z1"]}
    ]
    problems = refusal(toy_cluster(gpuPools=pools, storage={"shared": "efs"}))
    assert problems == [
        'gpu-k8s:cluster.storage.shared: "efs" - not a shared file system of aws/toy: no shared file system '
        "is built for this platform. Fix: remove it",
        'gpu-k8s:cluster.gpuPools[0].zones: ["z1"] - not a setting on aws. Fix: remove it; the network '
        "decides the zones",
        'gpu-k8s:cluster.gpuPools[0].interconnect: "efa" - no interconnect is built for aws yet. '
        "Fix: remove it",
    ]
