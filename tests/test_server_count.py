"""The k3s servers are fixed for the life of a stack (count, machine type, boot disk, placement): a preview or
`up` that changes them fails at the `ServerCount` resource, which the stack's cloud provider depends on, in
the same dynamic-provider host the Pulumi CLI runs."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gpu_k8s.components.k3s.server_count import server_count_issue, server_shape_issues
from gpu_k8s.components.spec import load_spec
from gpu_k8s.providers.aws.k3s import server_placement
from gpu_k8s.tools.engine import Recording
from tests.conftest import DynamicCheck

Check = Callable[..., list[str]]


@pytest.fixture(scope="module")
def check(dynamic_check: DynamicCheck) -> Check:
    def run(provider: str, running: Any, requested: Any) -> list[str]:
        """`running`/`requested`: a server count, or the guard's whole inputs."""
        return dynamic_check(provider, None if running is None else _inputs(running), _inputs(requested))

    return run


@pytest.mark.parametrize("stack", ["aws_k3s", "gcp_k3s"])
def test_every_resource_of_the_stack_waits_for_the_server_count(request, stack):
    """The cloud provider depends on the guard; every cloud resource uses that provider, and every Kubernetes
    one the cluster's, which is configured from cloud resources. So a failed check stops all of them."""
    recording: Recording = request.getfixturevalue(stack)
    guard = recording.by_name("ml-server-count")
    assert guard.type == "pulumi-python:dynamic:Resource"
    assert guard.inputs["servers"] == 3
    cloud = recording.by_name(f"ml-{stack.split('_')[0]}")
    assert cloud.type.startswith("pulumi:providers:") and guard.urn in cloud.dependencies
    kubernetes = recording.by_name("ml-k8s")
    others = [
        r
        for r in recording.registrations
        if r.custom and r.urn not in (guard.urn, cloud.urn) and not r.type.startswith("pulumi:providers:")
    ]
    assert len(others) > 50
    # Besides: the cluster's keys, certificates and tokens, made offline (tls and random providers) from the
    # API's name, which no server count changes; the API readiness gate, a dynamic resource after the
    # servers; and the zone-placement guard, a dynamic resource that records and changes nothing else.
    offline = {r.name for r in others if r.type.startswith(("tls:", "random:"))}
    assert offline >= {"ml-control-plane-pki-root-key"}
    for resource in others:
        assert (
            resource.provider_urn in (cloud.urn, kubernetes.urn)
            or resource.name in offline
            or resource.name in ("ml-api-ready", "ml-zone-placement")
        ), resource.name


@pytest.mark.parametrize("stack", ["aws_k3s", "gcp_k3s"])
def test_changing_the_server_count_fails_the_check_naming_the_key(request, stack, check: Check):
    recording: Recording = request.getfixturevalue(stack)
    provider = recording.by_name("ml-server-count").inputs["__provider"]
    provider = getattr(provider, "value", provider)
    assert check(provider, None, 3) == []  # the first `up`
    assert check(provider, 3, 3) == []  # every later one
    (reason,) = check(provider, 3, 1)
    assert reason.startswith("gpu-k8s:cluster.systemPool.nodes: 1 - the running cluster has 3 server(s)")
    assert "Fix: set it back to 3" in reason
    (reason,) = check(provider, 1, 3)
    assert "Fix: set it back to 1" in reason


def _inputs(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {"servers": value}


@pytest.mark.parametrize(
    ("stack", "key", "changed", "path"),
    [
        ("gcp_k3s", "instanceType", "e2-standard-8", "gpu-k8s:cluster.systemPool.instanceType"),
        ("aws_k3s", "instanceType", "m7i.xlarge", "gpu-k8s:cluster.systemPool.instanceType"),
        ("gcp_k3s", "diskSizeGiB", 100, "gpu-k8s:cluster.systemPool.diskSizeGiB"),
        (
            "gcp_k3s",
            "placement",
            ["us-central1-b", "us-central1-a", "us-central1-c"],
            "gpu-k8s:cluster.network.zones",
        ),
        ("aws_k3s", "placement", ["2"], "gpu-k8s:cluster.network.availabilityZones"),
    ],
)
def test_changing_what_every_server_is_fails_the_check_naming_the_key(
    request, stack, key, changed, path, check
):
    """A new machine type, disk or placement would stop or replace every server in one update."""
    recording: Recording = request.getfixturevalue(stack)
    guard = recording.by_name("ml-server-count").inputs
    provider = getattr(guard["__provider"], "value", guard["__provider"])
    running = {k: v for k, v in guard.items() if not k.startswith("__")}
    assert set(running) == {"servers", "instanceType", "diskSizeGiB", "placement", "placementKey"}
    assert check(provider, None, running) == [] and check(provider, running, running) == []
    (reason,) = check(provider, running, {**running, key: changed})
    assert reason.startswith(f"{path}: "), reason
    was = int(running[key]) if isinstance(running[key], float) else running[key]
    assert f"Fix: set it back to {was!r}" in reason


def test_a_stack_made_before_the_shape_was_guarded_records_it_without_a_failure(aws_k3s, check):
    guard = aws_k3s.by_name("ml-server-count").inputs
    provider = getattr(guard["__provider"], "value", guard["__provider"])
    news = {k: v for k, v in guard.items() if not k.startswith("__")}
    assert check(provider, 3, news) == []


def test_the_servers_placement_is_what_places_them(gcp_k3s, aws_k3s):
    gcp = gcp_k3s.by_name("ml-server-count").inputs
    assert gcp["placement"] == ["us-central1-a", "us-central1-b", "us-central1-c"]
    assert [gcp_k3s.by_name(f"ml-server-{i}").inputs["zone"] for i in range(3)] == gcp["placement"]
    assert aws_k3s.by_name("ml-server-count").inputs["placement"] == ["3"]


def test_the_issue_is_none_when_nothing_runs_or_nothing_changes():
    assert server_count_issue(None, 1) is None
    assert server_count_issue(3, 3) is None
    assert server_count_issue(1, 3) is not None


def test_the_shape_issues_name_each_changed_key():
    running = {"servers": 3, "instanceType": "m7i.large", "diskSizeGiB": 50, "placement": ["3"]}
    running["placementKey"] = "gpu-k8s:cluster.network.availabilityZones"
    changed = {**running, "instanceType": "m7i.xlarge", "diskSizeGiB": 80.0, "placement": ["2"]}
    issues = server_shape_issues(running, changed)
    assert [issue.path for issue in issues] == [
        "gpu-k8s:cluster.systemPool.instanceType",
        "gpu-k8s:cluster.systemPool.diskSizeGiB",
        "gpu-k8s:cluster.network.availabilityZones",
    ]
    assert server_shape_issues({}, changed) == [] and server_shape_issues({"servers": 3}, changed) == []


def test_given_subnets_guard_only_the_servers_own(aws_k3s_config):
    """Server i sits in private subnet i modulo their count: a subnet added for GPU pools moves no server."""
    cluster = copy.deepcopy(aws_k3s_config["gpu-k8s:cluster"])
    subnets = [f"subnet-0{i}aaaaaaaaaaaaaaa" for i in range(4)]
    cluster["network"] = {
        "vpcId": "vpc-0aaaaaaaaaaaaaaaa",
        "privateSubnetIds": subnets[:3],
        "publicSubnetIds": [f"subnet-0{i}bbbbbbbbbbbbbbb" for i in range(3)],
    }
    key, three = server_placement(load_spec(cluster))
    assert key == "gpu-k8s:cluster.network.privateSubnetIds" and three == subnets[:3]
    cluster["network"]["privateSubnetIds"] = subnets
    assert server_placement(load_spec(cluster))[1] == three
