"""The k3s API readiness gate: against a real HTTPS server on 127.0.0.1 that demands a client certificate
and starts late, and in the plan, where every Kubernetes resource waits for it."""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_k8s.components.k3s.readiness import ApiNotReady, _ApiReadyProvider, wait_until_ready
from gpu_k8s.components.kubeconfig import client_certificate_kubeconfig, cluster_identity
from gpu_k8s.tools.engine import Recording, Secret
from tests.certs import certificate, new_key, pem


class FakeApiServer:
    """An HTTPS /readyz on 127.0.0.1 that requires a client certificate of `client_ca`, answering 500 until
    `healthy` and refusing connections until `start()`."""

    def __init__(self, workdir: Path):
        self.server_ca_key = new_key()
        self.server_ca = certificate("server-ca", self.server_ca_key, self.server_ca_key, "server-ca", True)
        self.client_ca_key = new_key()
        self.client_ca = certificate("client-ca", self.client_ca_key, self.client_ca_key, "client-ca", True)
        key = new_key()
        leaf = certificate("k3s", key, self.server_ca_key, "server-ca", False, ips=["127.0.0.1"])
        (workdir / "server.pem").write_bytes(pem(leaf))
        (workdir / "server.key").write_bytes(pem(key))
        (workdir / "client-ca.pem").write_bytes(pem(self.client_ca))
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(workdir / "server.pem", workdir / "server.key")
        self.context.load_verify_locations(workdir / "client-ca.pem")
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.healthy = False
        self.requests = 0
        probe = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
        self.port = probe.server_address[1]
        probe.server_close()
        self.httpd: http.server.ThreadingHTTPServer | None = None

    def kubeconfig(self, signed_by_client_ca: bool = True) -> str:
        key = new_key()
        issuer_key = self.client_ca_key if signed_by_client_ca else new_key()
        cert = certificate("gpu-k8s-admin", key, issuer_key, "client-ca", False)

        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        return client_certificate_kubeconfig(
            "ml", f"https://127.0.0.1:{self.port}", b64(pem(self.server_ca)), b64(pem(cert)), b64(pem(key))
        )

    def start(self) -> None:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                server.requests += 1
                ok = self.path == "/readyz" and server.healthy
                self.send_response(200 if ok else 500)
                self.end_headers()
                self.wfile.write(b"ok" if ok else b"[-]etcd failed")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.socket = self.context.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    server = FakeApiServer(tmp_path)
    yield server
    server.stop()


def test_waits_for_a_server_that_starts_late_then_becomes_ready(api: FakeApiServer):
    lines: list[str] = []

    def later() -> None:
        time.sleep(0.6)
        api.start()
        time.sleep(0.6)
        api.healthy = True

    threading.Thread(target=later, daemon=True).start()
    started = time.monotonic()
    wait_until_ready(api.kubeconfig(), timeout=30, poll=0.2, report=lines.append)
    assert 1.0 < time.monotonic() - started < 10
    waiting = [line for line in lines if "waiting for" in line]
    assert any("Connection refused" in line for line in waiting)  # before the server started
    assert any("HTTP 500" in line for line in waiting)  # started, not yet ready
    assert lines[-1] == f"gpu-k8s: https://127.0.0.1:{api.port}/readyz answers: the cluster is ready"
    assert api.requests >= 2


def test_gives_up_after_the_bound_naming_the_endpoint_and_the_last_answer(api: FakeApiServer):
    api.start()
    with pytest.raises(ApiNotReady) as caught:
        wait_until_ready(api.kubeconfig(), timeout=0.6, poll=0.2, report=lambda line: None)
    message = str(caught.value)
    assert f"https://127.0.0.1:{api.port}/readyz did not answer" in message and "HTTP 500" in message
    assert "apiAccessCidrs" in message


def test_a_certificate_the_cluster_does_not_trust_never_counts_as_ready(api: FakeApiServer):
    api.start()
    api.healthy = True
    with pytest.raises(ApiNotReady):
        wait_until_ready(
            api.kubeconfig(signed_by_client_ca=False), timeout=0.6, poll=0.2, report=lambda _: None
        )
    assert api.requests == 0  # the handshake failed before any request


def test_the_gate_waits_on_create_and_on_a_new_kubeconfig_only(monkeypatch):
    waited: list[str] = []
    monkeypatch.setattr("gpu_k8s.components.k3s.readiness.wait_until_ready", waited.append)
    provider = _ApiReadyProvider()
    created = provider.create({"kubeconfig": "a"})
    assert created.outs == {"kubeconfig": "a"} and waited == ["a"]
    assert provider.diff("api-ready", {"kubeconfig": "a"}, {"kubeconfig": "a"}).changes is False
    assert provider.diff("api-ready", {"kubeconfig": "a"}, {"kubeconfig": "b"}).changes is True
    provider.update("api-ready", {"kubeconfig": "a"}, {"kubeconfig": "b"})
    assert waited == ["a", "b"]


@pytest.mark.parametrize("stack", ["aws_k3s", "gcp_k3s"])
def test_every_kubernetes_resource_waits_for_the_api(request, stack):
    recording: Recording = request.getfixturevalue(stack)
    gate = recording.by_name("ml-api-ready")
    provider = recording.by_name("ml-k8s")
    assert gate.type == "pulumi-python:dynamic:Resource"
    assert gate.urn in provider.dependencies
    assert isinstance(gate.inputs["kubeconfig"], Secret) and isinstance(provider.inputs["kubeconfig"], Secret)
    assert json.loads(gate.inputs["kubeconfig"].value)["users"][0]["user"]["client-key-data"]
    # The gate opens only after the servers and the load balancer in front of them exist.
    servers = [r for r in recording.registrations if r.name in {"ml-server-0", "ml-server-1", "ml-server-2"}]
    assert len(servers) == 3 and {s.urn for s in servers} <= set(gate.dependencies)
    kubernetes = [r for r in recording.registrations if r.type.startswith("kubernetes:")]
    assert len(kubernetes) >= 3
    for resource in kubernetes:
        assert resource.provider_urn == provider.urn, resource.name


def cluster_ca(recording: Recording) -> str:
    """The certificate authority of the stack's cluster, as the cloud (or the k3s PKI) reports it."""
    if recording.stack == "aws-eks":
        return recording.by_name("ml-eks").outputs["certificateAuthority"]["data"]
    if recording.stack == "gcp-gke":
        (cluster,) = recording.by_type("gcp:container/cluster:Cluster")
        return cluster.outputs["masterAuth"]["clusterCaCertificate"]
    return recording.by_name("ml-control-plane-pki-root-ca").outputs["certPem"]


@pytest.mark.parametrize("stack", ["aws_eks", "gcp_gke", "aws_k3s", "gcp_k3s"])
def test_the_kubernetes_provider_is_replaced_only_with_its_cluster(request, stack):
    """clusterIdentifier: a renewed admin certificate or a new endpoint is an update of the provider, never a
    replacement of every Kubernetes resource; a new cluster (a new CA) is."""
    recording: Recording = request.getfixturevalue(stack)
    provider = recording.by_name("ml-k8s")
    assert provider.inputs["clusterIdentifier"] == cluster_identity(cluster_ca(recording))
    assert cluster_identity(cluster_ca(recording)) != cluster_identity(cluster_ca(recording) + "\n")
