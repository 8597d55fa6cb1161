"""Shared fixtures: the recorded example stacks, example configs and upstream contract files."""

from __future__ import annotations

import ast
import base64
import copy
import gzip
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf import struct_pb2
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

from gpu_k8s.components.configbase import ConfigError, ConfigIssue
from gpu_k8s.tools.charts import ChartRenderer, ReleaseRef, release_ref
from gpu_k8s.tools.engine import Recording, run_program, stack_config
from gpu_k8s.tools.upstream import UpstreamMissing, locate
from tests.paths import FIXTURE_STACKS, REPO_ROOT

STACKS = FIXTURE_STACKS


@pytest.fixture(scope="session")
def aws_eks_config() -> dict[str, Any]:
    return stack_config(STACKS / "Pulumi.aws-eks.yaml")


@pytest.fixture(scope="session")
def aws_eks(aws_eks_config: dict[str, Any]) -> Recording:
    """The aws-eks stack program, run once under the recording mock engine."""
    return run_program("aws-eks", aws_eks_config)


@pytest.fixture(scope="session")
def aws_k3s_config() -> dict[str, Any]:
    return stack_config(STACKS / "Pulumi.aws-k3s.yaml")


@pytest.fixture(scope="session")
def aws_k3s(aws_k3s_config: dict[str, Any]) -> Recording:
    """The aws-k3s stack program, run once under the recording mock engine."""
    return run_program("aws-k3s", aws_k3s_config)


# A multi-node training pool added to the aws-k3s stack: p5.48xlarge nodes with their 32 EFA interfaces.
AWS_K3S_EFA_POOL = {"name": "train", "instanceType": "p5.48xlarge", "maxNodes": 2, "interconnect": "efa"}


@pytest.fixture(scope="session")
def aws_k3s_efa(aws_k3s_config: dict[str, Any]) -> Recording:
    """The aws-k3s stack with `AWS_K3S_EFA_POOL` added (same stack name: URNs compare with `aws_k3s`)."""
    config = copy.deepcopy(aws_k3s_config)
    config["gpu-k8s:cluster"]["gpuPools"].append(AWS_K3S_EFA_POOL)
    return run_program("aws-k3s", config)


def without_monitoring(stack: str, config: dict[str, Any]) -> Recording:
    """The stack with `monitoring: false` (it is on unless a stack says so)."""
    config = copy.deepcopy(config)
    config["gpu-k8s:cluster"]["monitoring"] = False
    return run_program(stack, config)


@pytest.fixture(scope="session")
def aws_k3s_unmonitored(aws_k3s_config: dict[str, Any]) -> Recording:
    return without_monitoring("aws-k3s", aws_k3s_config)


@pytest.fixture(scope="session")
def gcp_gke_unmonitored(gcp_gke_config: dict[str, Any]) -> Recording:
    return without_monitoring("gcp-gke", gcp_gke_config)


@pytest.fixture(scope="session")
def gcp_gke_config() -> dict[str, Any]:
    return stack_config(STACKS / "Pulumi.gcp-gke.yaml")


@pytest.fixture(scope="session")
def gcp_gke(gcp_gke_config: dict[str, Any]) -> Recording:
    """The gcp-gke stack program, run once under the recording mock engine."""
    return run_program("gcp-gke", gcp_gke_config)


@pytest.fixture(scope="session")
def gcp_k3s_config() -> dict[str, Any]:
    return stack_config(STACKS / "Pulumi.gcp-k3s.yaml")


@pytest.fixture(scope="session")
def gcp_k3s(gcp_k3s_config: dict[str, Any]) -> Recording:
    """The gcp-k3s stack program, run once under the recording mock engine."""
    return run_program("gcp-k3s", gcp_k3s_config)


# Every MIG flavour in one cluster: a custom layout on H100s, the built-in balanced layout on H200s, one
# profile on A100-40GBs, plus renamed time-slicing; multi-profile layouts make the cluster's strategy mixed.
MIXED_SHARING_POOLS = [
    {
        "name": "h100",
        "instanceType": "p5.48xlarge",
        "maxNodes": 1,
        "sharing": {"mode": "mig", "layout": {"1g.10gb": 3, "4g.40gb": 1}},
    },
    {
        "name": "h200",
        "instanceType": "p5en.48xlarge",
        "maxNodes": 1,
        "sharing": {"mode": "mig", "layout": "all-balanced"},
    },
    {
        "name": "a100",
        "instanceType": "p4d.24xlarge",
        "maxNodes": 1,
        "sharing": {"mode": "mig", "profile": "3g.20gb"},
    },
    {
        "name": "ts",
        "instanceType": "g6.xlarge",
        "maxNodes": 1,
        "sharing": {"mode": "timeSlicing", "replicas": 3, "renameByDefault": True},
    },
]


@pytest.fixture(scope="session")
def mixed_sharing(aws_eks_config: dict[str, Any]) -> Recording:
    """The aws-eks stack with MIXED_SHARING_POOLS instead of the example's pools."""
    config = copy.deepcopy(aws_eks_config)
    config["gpu-k8s:cluster"]["gpuPools"] = MIXED_SHARING_POOLS
    return run_program("mixed", config)


@pytest.fixture
def cluster_raw(aws_eks_config: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of the aws-eks `gpu-k8s:cluster` value for tests to break."""
    return copy.deepcopy(aws_eks_config["gpu-k8s:cluster"])


# --- the plans the tests make, and their Helm releases rendered by real Helm --------------------------------

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
# The plans the tests make, with the stack config each was made from.
PLANS = {
    "aws_eks": "aws_eks_config",
    "mixed_sharing": "aws_eks_config",
    "gcp_gke": "gcp_gke_config",
    "aws_k3s": "aws_k3s_config",
    "aws_k3s_efa": "aws_k3s_config",
    "gcp_k3s": "gcp_k3s_config",
}


@dataclass(frozen=True)
class RenderedRelease:
    plan: str
    ref: ReleaseRef
    kube_version: str
    objects: list[dict[str, Any]]
    recording: Recording

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]


@pytest.fixture(scope="session")
def renderer() -> Iterator[ChartRenderer]:
    """Renders kept across runs in .cache/renders (keyed by chart files, Helm, release and values; a render
    is pure), or where $GPU_K8S_RENDER_CACHE points; GPU_K8S_RENDER_CACHE=off renders everything anew."""
    setting = os.environ.get("GPU_K8S_RENDER_CACHE", str(REPO_ROOT / ".cache" / "renders"))
    made = ChartRenderer(cache_dir=None if setting == "off" else Path(setting))
    yield made
    made.close()


@pytest.fixture(scope="session")
def rendered(request, renderer: ChartRenderer) -> dict[tuple[str, str], RenderedRelease]:
    """(plan, chart) -> the release rendered by Helm."""
    releases = {}
    for plan, config_fixture in PLANS.items():
        recording = request.getfixturevalue(plan)
        minor = request.getfixturevalue(config_fixture)["gpu-k8s:cluster"]["kubernetesVersion"]
        for release in recording.by_type(HELM_RELEASE):
            ref = release_ref(release.inputs)
            kube_version = f"{minor}.0"
            releases[plan, ref.chart] = RenderedRelease(
                plan, ref, kube_version, renderer.objects(ref, kube_version), recording
            )
    return releases


def minimal_cluster(**overrides: Any) -> dict[str, Any]:
    """The smallest valid aws/eks `gpu-k8s:cluster` value, with top-level keys replaced by `overrides`."""
    return {
        "name": "ml",
        "cloud": "aws",
        "kind": "eks",
        "kubernetesVersion": "1.35",
        "network": {"cidr": "10.40.0.0/16"},
        "apiAccessCidrs": ["203.0.113.0/24"],
        "systemPool": {"instanceType": "m7i.large"},
        "gpuPools": [{"name": "l4", "instanceType": "g6.xlarge", "maxNodes": 1}],
        **overrides,
    }


Mutation = Callable[[dict[str, Any]], None]


def set_path(path: str, value: Any) -> Mutation:
    """A mutation that sets a dotted path (list indexes as numbers) in the cluster config."""

    def mutate(cluster: dict[str, Any]) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node: Any = cluster
        for part in parents:
            node = node[part]
        node[last] = value

    return mutate


def delete_key(path: str) -> Mutation:
    """A mutation that removes a dotted path (list indexes as numbers) from the cluster config."""

    def mutate(cluster: dict[str, Any]) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node: Any = cluster
        for part in parents:
            node = node[part]
        node.pop(last)

    return mutate


def assert_refused_before_any_resource(
    stack_config_: dict[str, Any], mutation: Mutation, path: str, words: Iterable[str]
) -> None:
    """Run the program on a broken copy of a stack config: a ConfigError naming `path` and `words`, and
    nothing registered."""
    config = copy.deepcopy(stack_config_)
    mutation(config["gpu-k8s:cluster"])
    registered: list = []
    with pytest.raises(ConfigError) as caught:
        registered = run_program("bad", config).registrations
    message = str(caught.value)
    assert path in message, message
    for word in words:
        assert word in message, message
    assert registered == []


def some(items: Iterable[Any], at_least: int = 1) -> list[Any]:
    """The items as a list, asserting there are at least `at_least`: a loop over them checks something."""
    listed = list(items)
    assert len(listed) >= at_least, f"expected at least {at_least} item(s) to check, found {len(listed)}"
    return listed


def upstream(relative_path: str) -> Path:
    """A verified upstream contract file; skips with the fetch hint, or fails when CI=true."""
    try:
        return locate(relative_path)
    except UpstreamMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def upstream_yaml(relative_path: str) -> Any:
    return yaml.safe_load(upstream(relative_path).read_text())


def venv_tool(name: str) -> str:
    """A linter installed by a dev dependency: beside this interpreter even when the venv is not activated."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    assert found, f"{name} is not installed; run `make test` (it installs the dev dependencies)"
    return found


def ec2_cloud_config(inputs: dict[str, Any]) -> str:
    """The cloud-config an EC2 instance (userDataBase64) or launch template (userData) hands cloud-init:
    base64 of gzip, which cloud-init uncompresses (fails here if the data is not gzipped)."""
    return gzip.decompress(base64.b64decode(inputs.get("userDataBase64") or inputs["userData"])).decode()


def user_data_files(user_data: str) -> dict[str, str]:
    """The files a #cloud-config writes, by path, as cloud-init writes them."""
    from tests.node_boot import file_content

    return {entry["path"]: file_content(entry) for entry in yaml.safe_load(user_data)["write_files"]}


def node_drop_in(bootstrap_script: str) -> dict[str, Any]:
    """The k3s node settings the first-boot script writes (its NODE_CONFIG here-document)."""
    return yaml.safe_load(bootstrap_script.split("<<NODE_CONFIG\n", 1)[1].split("\nNODE_CONFIG\n", 1)[0])


# --- refusal rules reached by the bad-input cases ---------------------------------------------------------

REFUSAL_SITES_REACHED: set[tuple[str, int]] = set()


def _record_refusal_sites() -> None:
    """Remember where every ConfigIssue of the session is made (file and line of the rule that made it)."""
    made = ConfigIssue.__init__

    def recording_init(self: ConfigIssue, *args: Any, **kwargs: Any) -> None:
        caller = sys._getframe(1)
        # Modules load through the gpu_k8s/ symlinks; the rules are read from the real files.
        REFUSAL_SITES_REACHED.add((str(Path(caller.f_code.co_filename).resolve()), caller.f_lineno))
        made(self, *args, **kwargs)

    ConfigIssue.__init__ = recording_init  # type: ignore[method-assign]


def refusal_rules() -> dict[tuple[str, int, int], str]:
    """Every place the program phrases a refusal: (file, first line, last line) of each ConfigIssue(...) call
    in components/ and providers/, with the rule's text for the report."""
    rules = {}
    for package in ("components", "providers"):
        for source in sorted((REPO_ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(source.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ConfigIssue":
                    rules[str(source), node.lineno, node.end_lineno or node.lineno] = ast.unparse(node)[:160]
    return rules


def unreached_refusal_rules(reached: set[tuple[str, int]]) -> list[str]:
    return [
        f"{Path(path).relative_to(REPO_ROOT)}:{first}: {text}"
        for (path, first, last), text in refusal_rules().items()
        if not any(file == path and first <= line <= last for file, line in reached)
    ]


FULL_RUN = pytest.StashKey[bool]()
REFUSAL_COVERAGE_TEST = "test_every_refusal_rule_is_reached_by_a_bad_input_case"


def pytest_configure(config: pytest.Config) -> None:
    _record_refusal_sites()


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        items[0].config.stash[FULL_RUN] = False


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The refusal-coverage test runs last, and only judges when the whole suite was collected."""
    collected = {Path(str(item.path)).name for item in items}
    every_module = {p.name for p in (REPO_ROOT / "tests").glob("test_*.py")}
    config.stash[FULL_RUN] = (
        config.stash.get(FULL_RUN, True)
        and collected == every_module
        and not (config.option.keyword or config.option.markexpr)
    )
    items.sort(key=lambda item: item.name == REFUSAL_COVERAGE_TEST)


def pytest_sessionfinish(session: pytest.Session) -> None:
    dump = os.environ.get("GPU_K8S_DUMP_REFUSALS")
    if dump:
        Path(dump).write_text("\n".join(unreached_refusal_rules(REFUSAL_SITES_REACHED)) + "\n")


# The engine's Check on a dynamic resource: (its serialized provider, the last update's inputs or None on
# the first `up`, the new inputs) -> the failures' reasons.
DynamicCheck = Callable[[str, "dict[str, Any] | None", "dict[str, Any]"], list[str]]


@pytest.fixture(scope="session")
def dynamic_check() -> Iterator[DynamicCheck]:
    """The engine's Check, answered by the Python dynamic-provider host the Pulumi CLI starts
    (`python -m pulumi.dynamic`, a gRPC server on 127.0.0.1), after the Configure the engine sends first."""
    host = subprocess.Popen([sys.executable, "-m", "pulumi.dynamic"], stdout=subprocess.PIPE)
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = provider_pb2_grpc.ResourceProviderStub(channel)
            stub.Configure(provider_pb2.ConfigureRequest(args=struct_pb2.Struct()), timeout=30)

            def run(provider: str, olds: dict[str, Any] | None, news: dict[str, Any]) -> list[str]:
                old_struct, new_struct = struct_pb2.Struct(), struct_pb2.Struct()
                if olds is not None:
                    old_struct.update({"__provider": provider, **olds})
                new_struct.update({"__provider": provider, **news})
                response = stub.Check(provider_pb2.CheckRequest(olds=old_struct, news=new_struct), timeout=30)
                return [failure.reason for failure in response.failures]

            yield run
    finally:
        host.kill()
        host.wait()


# --- admission policies -------------------------------------------------------------------------------------

ADMISSION_POLICY = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
ADMISSION_BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"


def planned_admission_policy(recording: Recording, name: str) -> dict[str, Any]:
    """The plan's ValidatingAdmissionPolicy `name`, after checking that its binding denies and follows it."""
    (policy,) = [p for p in recording.by_type(ADMISSION_POLICY) if p.inputs["metadata"]["name"] == name]
    (binding,) = [b for b in recording.by_type(ADMISSION_BINDING) if b.inputs["metadata"]["name"] == name]
    assert binding.inputs["spec"] == {"policyName": name, "validationActions": ["Deny"]}
    assert policy.urn in binding.dependencies
    return policy.inputs
