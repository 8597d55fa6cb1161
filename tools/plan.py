"""The offline plan: what `pulumi up` would create for a stack, without credentials or the Pulumi CLI.

    gpu-k8s plan aws-eks            # resource tree, dependency edges, summary
    gpu-k8s plan aws-eks --json     # one JSON document (format: README.md "The offline plan")
    gpu-k8s plan aws-eks --up       # as `pulumi up` runs the program (not a dry run)
    gpu-k8s plan path/to/Pulumi.x.yaml
    gpu-k8s plan aws-eks --diff     # what changed per resource against stacks/plans/aws-eks.json

A stack name is looked up in the Pulumi project of the working directory (its `stackConfigDir`); a stack
file is planned with the project it belongs to (the nearest Pulumi.yaml above it), or, kept outside any
project, with the working directory's. Either way the project's own program runs, as `pulumi preview`
would run it.

By default the program runs as `pulumi preview` does; `--up` runs it as `pulumi up` does, so checks that
only apply when resources are really created (refusals of configs that would lock the deployer out, waits
for a cluster to answer) are planned and tested offline too.

Exit codes: 0 plan printed (with --diff: no change); 1 with --diff: the plan differs from the snapshot;
2 invalid stack config (the problems on stderr, nothing on stdout).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import textwrap
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from pulumi.output import Unknown

from gpu_k8s.components.availability import NOT_CHECKED_OFFLINE
from gpu_k8s.components.configbase import ConfigError
from gpu_k8s.tools.engine import (
    Project,
    ProjectNotFound,
    Recording,
    Registration,
    Secret,
    find_project,
    project_of,
    run_program,
    stack_config,
)
from gpu_k8s.tools.plan_diff import plan_diff, summary

SECRET_MARK = "[secret]"
# A value known only once the resource exists (what `pulumi preview` shows as output<T>).
UNKNOWN_MARK = "[computed]"

# Inputs worth a glance in the tree, per resource type; the JSON form has them all.
KEY_INPUTS: dict[str, tuple[str, ...]] = {
    "pulumi:providers:aws": ("region",),
    "aws:ec2/vpc:Vpc": ("cidrBlock",),
    "aws:ec2/subnet:Subnet": ("cidrBlock", "availabilityZone", "mapPublicIpOnLaunch"),
    "aws:eks/cluster:Cluster": ("name", "version", "enabledClusterLogTypes"),
    "aws:eks/nodeGroup:NodeGroup": (
        "instanceTypes",
        "amiType",
        "capacityType",
        "scalingConfig",
        "labels",
        "taints",
    ),
    "aws:ec2/launchTemplate:LaunchTemplate": ("blockDeviceMappings", "metadataOptions"),
    "aws:eks/addon:Addon": ("addonName",),
    "aws:autoscaling/tag:Tag": ("tag",),
    "aws:kms/key:Key": ("enableKeyRotation",),
    "aws:eks/accessPolicyAssociation:AccessPolicyAssociation": ("policyArn",),
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": ("namespace", "serviceAccount"),
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": ("policyArn",),
    "kubernetes:helm.sh/v3:Release": ("chart", "version", "namespace"),
    "kubernetes:core/v1:Namespace": ("metadata",),
    "kubernetes:core/v1:ConfigMap": ("data",),
    "kubernetes:storage.k8s.io/v1:StorageClass": ("provisioner", "parameters", "volumeBindingMode"),
}


def redact(value: Any) -> Any:
    """Secrets become [secret], values known only after creation [computed]; whole-number floats (the wire
    format of ints) become ints."""
    if isinstance(value, Secret):
        return SECRET_MARK
    if isinstance(value, Unknown):
        return UNKNOWN_MARK
    if isinstance(value, dict):
        return {k: redact(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def plan_document(recording: Recording) -> dict[str, Any]:
    """The JSON plan: resources sorted by URN so diffs show real changes only."""
    resources = [
        {
            "urn": r.urn,
            "type": r.type,
            "name": r.name,
            "parent": r.parent,
            "inputs": redact(r.inputs),
            "dependencies": r.dependencies,
            "options": {**({"provider": r.provider_urn} if r.provider else {}), **redact(r.options)},
        }
        for r in sorted(recording.registrations, key=lambda r: r.urn)
    ]
    return {
        "stack": recording.stack,
        "resources": resources,
        "outputs": redact(recording.outputs),
        "warnings": recording.warnings,
    }


def _compact(value: Any) -> str:
    return json.dumps(redact(value), separators=(",", ":"), sort_keys=True)


def _line(resource: Registration) -> str:
    shown = [
        f"{key}={_compact(resource.inputs[key])}"
        for key in KEY_INPUTS.get(resource.type, ())
        if key in resource.inputs
    ]
    flags = (
        [f"ignoreChanges={','.join(resource.options['ignoreChanges'])}"]
        if "ignoreChanges" in resource.options
        else []
    )
    return "  ".join([resource.type, resource.name, *shown, *flags])


def _slot_text(pool: dict[str, Any]) -> str:
    return " + ".join(f"{s['perNode']} x {s['resource']} ({s['memoryGiB']:g} GiB)" for s in pool["slots"])


def pool_table(pools: list[dict[str, Any]], queue_quotas: dict[str, str] | None = None) -> list[str]:
    """One line per pool of the `gpuPools` output: hardware, sharing, slots, isolation, scaling, its
    interconnect where any pool has one, and the quota of its batch queue where the plan makes one
    (`queue_quotas`, by pool name)."""
    header = (
        "name",
        "instance type",
        "GPU model",
        "GPUs",
        "sharing",
        "slots/node",
        "isolation",
        "nodes",
        "capacity",
    )
    interconnects = any("interconnect" in pool for pool in pools)
    rows = [
        header + (("interconnect",) if interconnects else ()) + (("queue quota",) if queue_quotas else ())
    ]
    rows += [
        (
            pool["name"],
            pool["instanceType"],
            pool["gpuModel"],
            str(pool["gpusPerNode"]),
            pool["sharing"],
            f"{pool['slotsPerNode']}: {_slot_text(pool)}",
            pool["isolation"],
            f"{pool['minNodes']}-{pool['maxNodes']}",
            "spot" if pool["spot"] else "on-demand",
        )
        + ((pool.get("interconnect", "-"),) if interconnects else ())
        + ((queue_quotas.get(pool["name"], "none"),) if queue_quotas else ())
        for pool in pools
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


CLUSTER_QUEUE_TYPE = "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue"


def queue_quotas(recording: Recording) -> dict[str, str]:
    """The nominal quota of each Kueue ClusterQueue the plan creates, by queue (= pool) name."""
    quotas = {}
    for queue in recording.registrations:
        if queue.type == CLUSTER_QUEUE_TYPE:
            resources = [
                f"{resource['nominalQuota']:g} x {resource['name']}"
                for group in queue.inputs["spec"]["resourceGroups"]
                for flavor in group["flavors"]
                for resource in flavor["resources"]
            ]
            quotas[queue.inputs["metadata"]["name"]] = " + ".join(resources)
    return quotas


def render_text(recording: Recording) -> str:
    """Tree of resources by parent, dependency edges, then a summary of counts and GPU pools."""
    by_urn = {r.urn: r for r in recording.registrations}
    children: dict[str, list[Registration]] = defaultdict(list)
    for r in recording.registrations:
        children[r.parent if r.parent in by_urn else ""].append(r)
    lines = [
        f"Offline plan of stack {recording.stack}: {len(recording.registrations)} resources",
        "",
        f"pulumi:pulumi:Stack  {recording.project}-{recording.stack}",
    ]

    def walk(parent: str, prefix: str) -> None:
        kids = sorted(children.get(parent, []), key=lambda r: (r.name, r.type))
        for index, resource in enumerate(kids):
            last = index == len(kids) - 1
            lines.append(f"{prefix}{'└─ ' if last else '├─ '}{_line(resource)}")
            walk(resource.urn, prefix + ("   " if last else "│  "))

    walk("", "")
    lines += ["", "Dependencies (resource -> what it waits for, besides its parent):"]
    for r in sorted(recording.registrations, key=lambda r: r.name):
        deps = sorted(by_urn[d].name for d in r.dependencies if d in by_urn and d != r.parent)
        if deps:
            lines.append(f"  {r.name} -> {', '.join(deps)}")
    lines += ["", "Summary:"]
    for type_, count in sorted(Counter(r.type for r in recording.registrations).items()):
        lines.append(f"  {count:4d}  {type_}")
    pools = redact(recording.outputs.get("gpuPools", []))
    if pools:
        lines += ["", "GPU pools (slots: schedulable GPU resources per node once the GPUs are set up):"]
        lines += [f"  {line}" for line in pool_table(pools, queue_quotas(recording))]
    if recording.warnings:
        lines += ["", "Warnings:"] + [f"  {warning}" for warning in recording.warnings]
    checked = (
        f"Checked offline: GPU types offered where each pool is placed. Not checked: {NOT_CHECKED_OFFLINE}."
    )
    lines += ["", *textwrap.wrap(checked, width=110, subsequent_indent="  ")]
    lines += ["", "Outputs:"]
    for key, value in sorted(redact(recording.outputs).items()):
        lines.append(f"  {key}: {_compact(value)}")
    return "\n".join(lines) + "\n"


class StackNotFound(Exception):
    """The argument names no stack file."""


def stack_file(stack: str) -> Path:
    """`aws-eks` -> <project>/stacks/Pulumi.aws-eks.yaml; anything that looks like a path is taken as one."""
    candidate = Path(stack)
    if candidate.suffix not in {".yaml", ".yml"} and "/" not in stack and not candidate.exists():
        project = _named_project(stack)
        candidate = project.stack_dir / f"Pulumi.{stack}.yaml"
        if not candidate.is_file():
            raise StackNotFound(
                f"{stack}: no stack of that name (no file {candidate}); stacks: {_known_stacks(project)}"
            )
        return candidate
    hint = "a Pulumi.<stack>.yaml file"
    with contextlib.suppress(ProjectNotFound):
        hint = f"a stack ({_known_stacks(find_project())}) or {hint}"
    if candidate.is_dir():
        raise StackNotFound(f"{stack}: a directory; name {hint}")
    if not candidate.is_file():
        raise StackNotFound(f"{stack}: no such file; name {hint}")
    if candidate.suffix not in {".yaml", ".yml"}:
        raise StackNotFound(f"{stack}: not a stack file; stack files are named Pulumi.<stack>.yaml")
    return candidate


def _named_project(stack: str) -> Project:
    try:
        return find_project()
    except ProjectNotFound as exc:
        raise StackNotFound(f"{stack}: {exc}") from None


def _known_stacks(project: Project) -> str:
    return ", ".join(stack_name(p) for p in project.stack_files()) or "none"


def stack_name(path: Path) -> str:
    return path.name.removeprefix("Pulumi.").rsplit(".", 1)[0]


def plan(stack: str, up: bool = False) -> Recording:
    path = stack_file(stack)
    try:
        project = project_of(path)
    except ProjectNotFound as exc:
        raise StackNotFound(f"{stack}: {exc}") from None
    return run_program(stack_name(path), stack_config(path, project), preview=not up, project=project)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-k8s plan", description=__doc__.split("\n")[0])
    parser.add_argument("stack", help="stack name (aws-eks) or path to a stack file")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON document")
    parser.add_argument("--up", action="store_true", help="run as `pulumi up` does instead of a preview")
    parser.add_argument(
        "--diff",
        nargs="?",
        const="",
        metavar="SNAPSHOT",
        help="print what changed per resource against a saved --json plan (default: the stack's snapshot, "
        "plans/<stack>.json beside its stack file); exit 1 when something changed",
    )
    args = parser.parse_args(argv)
    try:
        recording = plan(args.stack, up=args.up)
    except (ConfigError, StackNotFound) as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.diff is not None:
        return _print_diff(args.stack, args.diff, plan_document(recording))
    if args.json:
        sys.stdout.write(json.dumps(plan_document(recording), indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(render_text(recording))
    return 0


def _print_diff(stack: str, snapshot: str, document: dict[str, Any]) -> int:
    path = Path(snapshot) if snapshot else snapshot_file(stack_file(stack))
    if not path.is_file():
        print(f"{path}: no snapshot to compare with; make one with `gpu-k8s plan {stack} --json > {path}`")
        before: dict[str, Any] = {"resources": []}
    else:
        before = json.loads(path.read_text())
    # Compare as the snapshot holds it: JSON, with the plan's own redactions.
    lines = plan_diff(before, json.loads(json.dumps(document, sort_keys=True)))
    sys.stdout.write(f"Plan of {stack} against {path}: {summary(lines)}\n")
    sys.stdout.writelines(f"{line}\n" for line in lines)
    return 1 if lines else 0


def snapshot_file(stack_path: Path) -> Path:
    """stacks/Pulumi.aws-eks.yaml -> stacks/plans/aws-eks.json (what `make snapshots` writes)."""
    return stack_path.parent / "plans" / f"{stack_name(stack_path)}.json"


if __name__ == "__main__":
    sys.exit(main())
