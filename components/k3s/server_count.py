"""Refuse a change of a running k3s cluster's server count, in the preview, before anything changes.

The servers are the members of the cluster's embedded etcd. One `pulumi up` that removes servers deletes
them together: from three to one, the survivor is one member of three and never regains quorum, and the
cluster is gone. Servers added to a one-server cluster would register through an address its certificate
does not name. So the count stays what the stack was created with (stacks/README.md).

The stack file alone cannot tell: the count the cluster runs with is in the stack's state. `ServerCount`
is a dynamic resource the stack's cloud provider depends on; the engine hands its `check` the count of the
last update with the new one, and a failed check fails `pulumi preview` and `pulumi up` there. Every other
resource of the stack goes through that provider (and every Kubernetes one through the cluster's), so none
is created, changed or deleted first.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi.dynamic

from gpu_k8s.components.configbase import ConfigIssue, config_path
from gpu_k8s.components.k3s.settings import K3sClusterSpec


def server_count_issue(running: int | None, requested: int) -> ConfigIssue | None:
    """The problem with going from `running` servers (None: the cluster does not exist yet) to `requested`."""
    if running is None or running == requested:
        return None
    return ConfigIssue(
        config_path("systemPool", "nodes"),
        requested,
        f"the running cluster has {running} server(s) and k3s here cannot change that: removed servers "
        "go together and the rest lose etcd quorum, added ones register through an address the first "
        "server's certificate does not name",
        f"set it back to {running}; for another count, create a new stack and move the workloads",
    )


class _ServerCountProvider(pulumi.dynamic.ResourceProvider):
    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.CheckResult:
        running = olds.get("servers")
        issue = server_count_issue(None if running is None else int(running), int(news["servers"]))
        failures = [] if issue is None else [pulumi.dynamic.CheckFailure("servers", str(issue))]
        return pulumi.dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        return pulumi.dynamic.CreateResult(id_="server-count", outs=props)


class ServerCount(pulumi.dynamic.Resource):
    """The cluster's server count, fixed for the life of the stack."""

    def __init__(self, name: str, servers: int, opts: pulumi.ResourceOptions | None = None):
        super().__init__(_ServerCountProvider(), name, {"servers": servers}, opts)


def server_count(spec: K3sClusterSpec) -> ServerCount:
    """The stack's guard of its server count (for its cloud provider to depend on)."""
    return ServerCount(f"{spec.name}-server-count", spec.system_pool.nodes)
