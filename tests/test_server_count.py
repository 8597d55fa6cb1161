"""The k3s server count is fixed for the life of a stack: a preview or `up` that changes it fails at the
`ServerCount` resource, which the stack's cloud provider depends on, in the same dynamic-provider host the
Pulumi CLI runs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import grpc
import pytest
from google.protobuf import struct_pb2
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

from gpu_k8s.components.k3s.server_count import server_count_issue
from gpu_k8s.tools.engine import Recording

Check = Callable[[str, "int | None", int], list[str]]


@pytest.fixture(scope="module")
def check() -> Iterator[Check]:
    """The engine's Check, answered by the Python dynamic-provider host the Pulumi CLI starts
    (`python -m pulumi.dynamic`, a gRPC server on 127.0.0.1), after the Configure the engine sends first."""
    host = subprocess.Popen([sys.executable, "-m", "pulumi.dynamic"], stdout=subprocess.PIPE)
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = provider_pb2_grpc.ResourceProviderStub(channel)
            stub.Configure(provider_pb2.ConfigureRequest(args=struct_pb2.Struct()), timeout=30)

            def run(provider: str, running: int | None, requested: int) -> list[str]:
                olds, news = struct_pb2.Struct(), struct_pb2.Struct()
                if running is not None:
                    olds.update({"__provider": provider, "servers": running})
                news.update({"__provider": provider, "servers": requested})
                response = stub.Check(provider_pb2.CheckRequest(olds=olds, news=news), timeout=30)
                return [failure.reason for failure in response.failures]

            yield run
    finally:
        host.kill()
        host.wait()


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
    # API's name, which no server count changes; and the API readiness gate, a dynamic resource after the
    # servers.
    offline = {r.name for r in others if r.type.startswith(("tls:", "random:"))}
    assert offline >= {"ml-control-plane-pki-root-key"}
    for resource in others:
        assert (
            resource.provider_urn in (cloud.urn, kubernetes.urn)
            or resource.name in offline
            or resource.name == "ml-api-ready"
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


def test_the_issue_is_none_when_nothing_runs_or_nothing_changes():
    assert server_count_issue(None, 1) is None
    assert server_count_issue(3, 3) is None
    assert server_count_issue(1, 3) is not None
