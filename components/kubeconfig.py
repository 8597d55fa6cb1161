"""Kubeconfigs that name a cluster and how to authenticate to it, as JSON text."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


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
