"""Refuse, in the preview and before anything changes, a change to a running k3s cluster's servers that
would take them all down at once: their count, their machine type, their boot disk, where they are placed.

The servers are the members of the cluster's embedded etcd. One `pulumi up` changes all of them together:
removing servers (from three to one) leaves the survivor one member of three, which never regains quorum;
servers added to a one-server cluster would register through an address its certificate does not name; a
new machine type stops every server at once (AWS stops and starts an instance to change its type, Compute
Engine needs it stopped), and a new boot disk or zone replaces every server. So these stay what the stack
was created with (stacks/K3S.md says how to change them: a new stack, or one server at a time by hand).

The stack file alone cannot tell: the values the cluster runs with are in the stack's state. `ServerCount`
is a dynamic resource the stack's cloud provider depends on; the engine hands its `check` the values of the
last update with the new ones, and a failed check fails `pulumi preview` and `pulumi up` there. Every other
resource of the stack goes through that provider (and every Kubernetes one through the cluster's), so none
is created, changed or deleted first. A value a stack recorded before this guard knew it is taken as
running and compared from the next update on.
"""

from __future__ import annotations

from collections.abc import Sequence
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


# What else `check` guards: the input, its config key (placement: the provider's), why it cannot change.
GUARDED = {
    "instanceType": (
        config_path("systemPool", "instanceType"),
        "a new machine type stops every server at once (EC2 and Compute Engine change it only on a stopped "
        "instance), and etcd with them",
    ),
    "diskSizeGiB": (
        config_path("systemPool", "diskSizeGiB"),
        "a new boot disk size replaces or resizes every server's disk in the same update",
    ),
    "placement": (
        "",
        "moving servers replaces every one whose place changes, in the same update: the cluster loses "
        "etcd quorum",
    ),
}


def server_shape_issues(olds: dict[str, Any], news: dict[str, Any]) -> list[ConfigIssue]:
    """What `news` changes of the running servers `olds` (empty: none run yet). A value the state does not
    hold yet (a stack made before it was guarded) is not compared."""
    running = olds.get("servers")
    issues = [server_count_issue(None if running is None else int(running), int(news["servers"]))]
    for key, (path, why) in GUARDED.items():
        if key in olds and key in news and _plain(olds[key]) != _plain(news[key]):
            issues.append(
                ConfigIssue(
                    path or str(news.get("placementKey", "network")),
                    _plain(news[key]),
                    f"the running servers have {_plain(olds[key])!r} and {why}",
                    f"set it back to {_plain(olds[key])!r}; to change it, create a new stack and move the "
                    "workloads, or replace the servers one at a time by hand (stacks/K3S.md)",
                )
            )
    return [issue for issue in issues if issue is not None]


def _plain(value: Any) -> Any:
    """Numbers arrive as floats and lists as sequences over the wire."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class _ServerCountProvider(pulumi.dynamic.ResourceProvider):
    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.CheckResult:
        failures = [
            pulumi.dynamic.CheckFailure(issue.path.split(".")[-1], str(issue))
            for issue in server_shape_issues(olds, news)
        ]
        return pulumi.dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> pulumi.dynamic.CreateResult:
        return pulumi.dynamic.CreateResult(id_="server-count", outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.DiffResult:
        # Recording a newly guarded value is an in-place update, never a replacement of the guard.
        changes = any(olds.get(key) != value for key, value in news.items() if not key.startswith("__"))
        return pulumi.dynamic.DiffResult(changes=changes, replaces=[], delete_before_replace=False)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> pulumi.dynamic.UpdateResult:
        return pulumi.dynamic.UpdateResult(outs=news)


class ServerCount(pulumi.dynamic.Resource):
    """The cluster's servers as they were created (count, machine type, disk, placement), fixed for the life
    of the stack. (Named for what it first guarded; its name is part of every stack's state.)"""

    def __init__(self, name: str, shape: dict[str, Any], opts: pulumi.ResourceOptions | None = None):
        super().__init__(_ServerCountProvider(), name, shape, opts)


def server_count(spec: K3sClusterSpec, placement_key: str, placement: Sequence[str]) -> ServerCount:
    """The stack's guard of its servers (for its cloud provider to depend on); `placement` is what decides
    where the servers run (zones, or subnets) and `placement_key` the config key that sets it."""
    return ServerCount(
        f"{spec.name}-server-count",
        {
            "servers": spec.system_pool.nodes,
            "instanceType": spec.system_pool.instance_type,
            "diskSizeGiB": spec.system_pool.disk_size_gib,
            "placement": list(placement),
            "placementKey": placement_key,
        },
    )
