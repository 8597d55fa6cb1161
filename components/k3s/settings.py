"""What every k3s platform configures and checks the same way, whatever the cloud: the `k3s` section
(release, Pod Security level), the server count, the pod and service ranges k3s brings, and the release
pinned per Kubernetes minor. A cloud's k3s platform combines `K3sClusterSpec` with its own network
(`providers/<cloud>/settings.py`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from gpu_k8s.components.compat import GPU_OPERATOR_CHART_VERSION
from gpu_k8s.components.configbase import ConfigIssue, StrictModel, config_path
from gpu_k8s.components.spec import SUPPORTED_KUBERNETES_MINORS, ClusterSpec, cidr_issue

# The k3s release a stack runs when `k3s.version` is not set, per `kubernetesVersion`. 1.36: the stable
# channel when k3s v1.37.0 came out ("Update stable channel to v1.36.3+k3s1", k3s-io/docs
# release-notes/v1.37.X.md); 1.35 and 1.34: the releases of the 2026-06 backports (github.com/k3s-io/k3s
# releases v1.35.6+k3s1 and v1.34.9+k3s1). None for 1.33: Kubernetes 1.33 reached end of life on 2026-06-28
# (kubernetes.io/releases/1.33).
K3S_RELEASES = {"1.34": "v1.34.9+k3s1", "1.35": "v1.35.6+k3s1", "1.36": "v1.36.3+k3s1"}
DEFAULT_K3S_VERSION = K3S_RELEASES["1.36"]
K3S_VERSION = re.compile(r"^v1\.(\d+)\.(\d+)\+k3s(\d+)$")
# One server, or three with embedded etcd (etcd needs a majority; two servers tolerate no failure).
K3S_SERVER_COUNTS = (1, 3)
# On k3s, flannel gives pods and services addresses of its own (k3s defaults, docs/cli/server.md): the VPC
# needs no ranges for them, and its own must not overlap them.
K3S_CLUSTER_CIDR = "10.42.0.0/16"
K3S_SERVICE_CIDR = "10.43.0.0/16"
# Network keys of VPC-native clusters (GKE) that give pods and services their ranges.
POD_AND_SERVICE_RANGE_KEYS = ("podsCidr", "servicesCidr", "podsRangeName", "servicesRangeName")


class K3sSpec(StrictModel):
    """Settings only k3s clusters have."""

    version: str = DEFAULT_K3S_VERSION
    # Pod Security level enforced outside the exempt namespaces; warnings and audit are always `restricted`.
    # `baseline` by default: many ML images run as root, which `restricted` refuses.
    pod_security: Literal["baseline", "restricted"] = "baseline"


class K3sClusterSpec(ClusterSpec):
    """k3s on bare VMs: the system pool is the servers, GPU pools are agents."""

    # to_camel would spell it "k3S".
    k3s: Annotated[K3sSpec, Field(alias="k3s")] = K3sSpec()

    refused_network_keys: ClassVar[Mapping[str, str]] = {
        key: f"k3s gives pods and services addresses itself ({K3S_CLUSTER_CIDR}, {K3S_SERVICE_CIDR})"
        for key in POD_AND_SERVICE_RANGE_KEYS
    }

    @classmethod
    def with_defaults(cls, raw: Mapping[str, Any]) -> Mapping[str, Any]:
        """One server unless asked for three, and the k3s release pinned for `kubernetesVersion`."""
        defaulted = dict(super().with_defaults(raw))
        pool = raw.get("systemPool")
        if isinstance(pool, Mapping) and "nodes" not in pool:
            defaulted["systemPool"] = {**pool, "nodes": 1}
        k3s = raw.get("k3s", {})
        minor = raw.get("kubernetesVersion")
        release = K3S_RELEASES.get(minor) if isinstance(minor, str) else None
        if isinstance(k3s, Mapping) and "version" not in k3s and release is not None:
            defaulted["k3s"] = {**k3s, "version": release}
        return defaulted

    def platform_issues(self) -> Iterable[ConfigIssue]:
        yield from super().platform_issues()
        yield from _release_issues(self)
        if self.system_pool.nodes not in K3S_SERVER_COUNTS:
            yield ConfigIssue(
                config_path("systemPool", "nodes"),
                self.system_pool.nodes,
                "k3s runs 1 server, or 3 with embedded etcd (an even count tolerates no more failures than "
                "one server fewer)",
                "set systemPool.nodes to 1 or 3",
            )


def overlay_issues(cidr: str | None) -> Iterable[ConfigIssue]:
    """A VPC range that overlaps k3s's pod or service range makes those addresses unreachable."""
    if cidr is None or cidr_issue("", cidr) is not None:
        return
    vpc = ipaddress.IPv4Network(cidr)
    for overlay, what in ((K3S_CLUSTER_CIDR, "pod"), (K3S_SERVICE_CIDR, "service")):
        if vpc.overlaps(ipaddress.IPv4Network(overlay)):
            yield ConfigIssue(
                config_path("network", "cidr"),
                cidr,
                f"overlaps k3s's {what} range {overlay}",
                "pick a VPC range outside 10.42.0.0/15, e.g. 10.40.0.0/16",
            )


def _release_issues(spec: K3sClusterSpec) -> Iterable[ConfigIssue]:
    version = spec.k3s.version
    match = K3S_VERSION.match(version)
    if "version" not in spec.k3s.model_fields_set:
        yield ConfigIssue(
            config_path("k3s", "version"),
            None,
            f"is not set, and no k3s release is pinned for kubernetesVersion {spec.kubernetes_version}",
            f"set k3s.version to a k3s {spec.kubernetes_version} release (github.com/k3s-io/k3s/releases), "
            f"or kubernetesVersion to one of {', '.join(K3S_RELEASES)}",
        )
    elif match is None:
        yield ConfigIssue(
            config_path("k3s", "version"),
            version,
            "not a k3s release name",
            f'write it like "{DEFAULT_K3S_VERSION}" (see github.com/k3s-io/k3s/releases)',
        )
    elif (minor := f"1.{match.group(1)}") not in SUPPORTED_KUBERNETES_MINORS:
        yield ConfigIssue(
            config_path("k3s", "version"),
            version,
            f"Kubernetes {minor}; the pinned GPU Operator {GPU_OPERATOR_CHART_VERSION} supports "
            f"{SUPPORTED_KUBERNETES_MINORS[0]}-{SUPPORTED_KUBERNETES_MINORS[-1]} only",
            f'use a k3s release of one of those minors, e.g. "{DEFAULT_K3S_VERSION}"',
        )
    elif minor != spec.kubernetes_version:
        yield ConfigIssue(
            config_path("k3s", "version"),
            version,
            f"is Kubernetes {minor} but kubernetesVersion says {spec.kubernetes_version}",
            f'set kubernetesVersion: "{minor}" or pick a k3s {spec.kubernetes_version} release',
        )
