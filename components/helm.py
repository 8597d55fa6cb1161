"""Helm releases from pinned charts, installed through the cluster's Kubernetes provider."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

OCI_SCHEME = "oci://"


def helm_release(
    resource_name: str,
    chart: str,
    version: str,
    repository: str,
    namespace: pulumi.Input[str],
    values: Mapping[str, Any],
    parent: pulumi.Resource,
    provider: k8s.Provider,
    depends_on: Sequence[pulumi.Resource],
) -> k8s.helm.v3.Release:
    """A release named after its chart (so `helm list` reads naturally) at an exact chart version.

    `repository` is an HTTP chart repository or an OCI registry path (`oci://host/path`); Helm takes an OCI
    chart as one reference, `oci://host/path/chart`, with no repository options.
    """
    oci = repository.startswith(OCI_SCHEME)
    return k8s.helm.v3.Release(
        resource_name,
        k8s.helm.v3.ReleaseArgs(
            name=chart,
            chart=f"{repository}/{chart}" if oci else chart,
            version=version,
            repository_opts=None if oci else k8s.helm.v3.RepositoryOptsArgs(repo=repository),
            namespace=namespace,
            values=dict(values),
        ),
        opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=list(depends_on)),
    )
