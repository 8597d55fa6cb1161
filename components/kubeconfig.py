"""Kubeconfigs that name a cluster and how to authenticate to it, as JSON text, and the Kubernetes provider
configured from one."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_kubernetes as k8s


def cluster_identity(ca_certificate: str) -> str:
    """What stays the same for as long as the cluster does: its certificate authority (a new cluster, or a
    replaced one, has a new CA; new endpoints and credentials keep it)."""
    return "ca-sha256:" + hashlib.sha256(ca_certificate.encode()).hexdigest()


def kubernetes_provider(
    name: str,
    kubeconfig: pulumi.Input[str],
    ca_certificate: pulumi.Input[str],
    opts: pulumi.ResourceOptions,
) -> k8s.Provider:
    """The provider is replaced only when its cluster is (`clusterIdentifier`): without it, a kubeconfig a
    preview cannot know yet (a renewed admin certificate, a new endpoint) shows every Kubernetes resource of
    the stack as replaced (pulumi/pulumi-kubernetes#2294). pulumi-kubernetes' DiffConfig replaces on a
    changed identifier only, and adding one to an existing provider replaces nothing (provider.go)."""
    identity = pulumi.Output.from_input(ca_certificate).apply(cluster_identity)
    return k8s.Provider(name, kubeconfig=kubeconfig, cluster_identifier=identity, opts=opts)


def _kubeconfig(cluster_name: str, server: str, ca_data: str | None, user: Mapping[str, Any]) -> str:
    cluster = (
        {"server": server} if ca_data is None else {"server": server, "certificate-authority-data": ca_data}
    )
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": cluster_name, "cluster": cluster}],
            "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
            "current-context": cluster_name,
            "users": [{"name": cluster_name, "user": dict(user)}],
        },
        indent=2,
    )


def exec_kubeconfig(
    cluster_name: str, server: str, ca_data: str | None, exec_config: Mapping[str, Any]
) -> str:
    """A one-cluster kubeconfig whose user runs a credential plugin (`exec_config`), so the file never
    holds a credential itself and does not change when tokens rotate. Without `ca_data` the server's
    certificate is checked against the system's trust store."""
    return _kubeconfig(
        cluster_name,
        server,
        ca_data,
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", **exec_config}},
    )


def client_certificate_kubeconfig(
    cluster_name: str, server: str, ca_data: str, cert_data: str, key_data: str
) -> str:
    """A one-cluster kubeconfig that authenticates with a client certificate (base64 PEM fields); it holds
    a private key, so it must stay a secret."""
    return _kubeconfig(
        cluster_name, server, ca_data, {"client-certificate-data": cert_data, "client-key-data": key_data}
    )
