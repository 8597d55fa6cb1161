"""Hold every Kubernetes resource back until the cluster's API server answers.

pulumi-kubernetes decides at configure time whether a cluster is reachable; a provider configured from a
kubeconfig that resolves before any k3s server runs marks the cluster unreachable and refuses every Helm
release and object of the first `pulumi up` (pulumi/pulumi-kubernetes#1794). `ApiReadinessGate` passes the
kubeconfig through only once `GET /readyz` answers 200 to its client certificate, through the same endpoint
the provider will use. It is a Pulumi dynamic resource: it runs in the Pulumi CLI's own Python host, needs no
extra binary, and does nothing in a preview (the engine creates nothing then).
"""

from __future__ import annotations

import base64
import json
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pulumi
import pulumi.dynamic
import pulumi_kubernetes as k8s

from gpu_k8s.components.kubeconfig import kubernetes_provider

# k3s servers install and start within minutes; a cloud that is slow to hand out GPU-less VMs can take
# longer. Past this the `up` fails, naming the endpoint and the last answer.
READY_TIMEOUT_SECONDS = 20 * 60
POLL_SECONDS = 10


class ApiNotReady(Exception):
    """The API server did not answer /readyz in time."""


def _tls_context(cluster: dict[str, Any], user: dict[str, Any], workdir: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(
        cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
    )
    cert, key = workdir / "client.crt", workdir / "client.key"
    cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
    key.touch(mode=0o600)
    key.write_bytes(base64.b64decode(user["client-key-data"]))
    context.load_cert_chain(cert, key)
    return context


def wait_until_ready(
    kubeconfig: str,
    timeout: float = READY_TIMEOUT_SECONDS,
    poll: float = POLL_SECONDS,
    report: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once the kubeconfig's server answers GET /readyz with 200; ApiNotReady after `timeout`."""
    config = json.loads(kubeconfig)
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    url = f"{cluster['server'].rstrip('/')}/readyz"
    deadline = clock() + timeout
    with tempfile.TemporaryDirectory(prefix="gpu-k8s-readyz-") as workdir:
        context = _tls_context(cluster, user, Path(workdir))
        while True:
            try:
                with urllib.request.urlopen(url, timeout=poll, context=context) as response:
                    if response.status == 200:
                        report(f"gpu-k8s: {url} answers: the cluster is ready")
                        return
                    answer = f"HTTP {response.status}"
            except urllib.error.HTTPError as error:
                answer = f"HTTP {error.code}"
            except urllib.error.URLError as error:
                answer = str(error.reason)
            except OSError as error:
                answer = f"{type(error).__name__}: {error}"
            left = deadline - clock()
            if left <= 0:
                raise ApiNotReady(
                    f"{url} did not answer within {timeout / 60:g} minutes (last: {answer}); check that the "
                    "servers booted (their serial console logs gpu-k8s: lines) and that apiAccessCidrs "
                    "includes the address `pulumi up` runs from, then run `pulumi up` again"
                )
            report(f"gpu-k8s: waiting for {url} ({answer}); {left / 60:.0f} min left")
            sleep(min(poll, left))


class _ApiReadyProvider(pulumi.dynamic.ResourceProvider):
    """Creating (or changing the kubeconfig of) the gate waits for the API; nothing else does."""

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        wait_until_ready(props["kubeconfig"])
        return pulumi.dynamic.CreateResult(id_="api-ready", outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        return pulumi.dynamic.DiffResult(changes=olds.get("kubeconfig") != news.get("kubeconfig"))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        wait_until_ready(news["kubeconfig"])
        return pulumi.dynamic.UpdateResult(outs=news)


class ApiReadinessGate(pulumi.dynamic.Resource):
    """`kubeconfig` is the input kubeconfig, available only after the API server has answered."""

    kubeconfig: pulumi.Output[str]

    def __init__(self, name: str, kubeconfig: pulumi.Input[str], opts: pulumi.ResourceOptions | None = None):
        super().__init__(
            _ApiReadyProvider(),
            name,
            {"kubeconfig": pulumi.Output.secret(kubeconfig)},
            pulumi.ResourceOptions.merge(
                opts, pulumi.ResourceOptions(additional_secret_outputs=["kubeconfig"])
            ),
        )


def gated_kubernetes_provider(
    name: str,
    kubeconfig: pulumi.Input[str],
    root_cert_pem: pulumi.Input[str],
    after: Sequence[pulumi.Resource],
    parent: pulumi.Resource,
) -> k8s.Provider:
    """The cluster's Kubernetes provider, configured only once the API answers (after `after` exist); it is
    the same cluster for as long as the root CA is."""
    gate = ApiReadinessGate(
        f"{name}-api-ready", kubeconfig, opts=pulumi.ResourceOptions(parent=parent, depends_on=list(after))
    )
    return kubernetes_provider(
        f"{name}-k8s", gate.kubeconfig, root_cert_pem, pulumi.ResourceOptions(parent=parent)
    )
