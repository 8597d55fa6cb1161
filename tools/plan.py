"""The offline plan: what `pulumi up` would create for a stack, without credentials or the Pulumi CLI.

    gpu-k8s plan aws-eks            # components, GPU pools, how pods use them, what it costs, warnings
    gpu-k8s plan aws-eks --full     # and every resource's tree line, the dependency edges, counts by type
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
2 invalid stack config (the problems on stderr, nothing on stdout); 3 a crash (a bug: the traceback on
stderr).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import gzip
import json
import sys
import textwrap
import zlib
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from pulumi.output import Unknown

from gpu_k8s.components.availability import NOT_CHECKED_OFFLINE
from gpu_k8s.components.configbase import ConfigError
from gpu_k8s.components.prices import FEE, Price, price_sources
from gpu_k8s.tools.costs import HOURS_PER_MONTH, Charge, idle_charges, node_price
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

# The text plan fits a terminal of this many columns (wider values wrap or are cut; --json has them whole).
WIDTH = 110
# What bills at rest and no plan-level figure covers.
ALWAYS_UNCOUNTED = ("disks", "data transfer", "logs", "taxes and discounts")
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


# EC2 user data travels base64-encoded and gzipped (providers/aws/k3s_bootstrap.ec2_user_data); the plan
# shows the cloud-config it carries, so a change to a boot script reads as text in the snapshot's diff.
EC2_USER_DATA = {
    "aws:ec2/instance:Instance": "userDataBase64",
    "aws:ec2/launchTemplate:LaunchTemplate": "userData",
}
DECODED_MARK = "[base64 of gzip, shown decoded] "


def readable_inputs(resource: Registration) -> dict[str, Any]:
    inputs = redact(resource.inputs)
    key = EC2_USER_DATA.get(resource.type)
    value = inputs.get(key) if key else None
    if isinstance(value, str) and value not in (SECRET_MARK, UNKNOWN_MARK):
        # Anything not gzipped by this toolkit is shown as sent.
        with contextlib.suppress(binascii.Error, gzip.BadGzipFile, EOFError, zlib.error, UnicodeDecodeError):
            inputs[key] = DECODED_MARK + gzip.decompress(base64.b64decode(value, validate=True)).decode()
    return inputs


def plan_document(recording: Recording) -> dict[str, Any]:
    """The JSON plan: resources sorted by URN so diffs show real changes only."""
    resources = [
        {
            "urn": r.urn,
            "type": r.type,
            "name": r.name,
            "parent": r.parent,
            "inputs": readable_inputs(r),
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


def pool_table(pools: list[dict[str, Any]], prices: dict[str, Price | None] | None = None) -> list[str]:
    """One line per pool of the `gpuPools` output: its hardware, how far it scales, what a node costs and
    what the pool costs at its ceiling (`prices`, by pool name), and its interconnect where any pool has
    one."""
    prices = prices or {}
    interconnects = any("interconnect" in pool for pool in pools)
    header = ("pool", "instance type", "GPUs/node", "nodes", "$/node-h", "$/h at max")
    rows = [header + (("interconnect",) if interconnects else ())]
    for pool in pools:
        price = prices.get(pool["name"])
        rows.append(
            (
                pool["name"],
                pool["instanceType"],
                f"{pool['gpusPerNode']} x {pool['gpuModel']}",
                f"{pool['minNodes']}-{pool['maxNodes']} {'spot' if pool['spot'] else 'on-demand'}",
                "n/a" if price is None else f"{price.usd_per_hour:.2f}",
                "n/a" if price is None else f"{price.usd_per_hour * pool['maxNodes']:.2f}",
            )
            + ((pool.get("interconnect", "-"),) if interconnects else ())
        )
    return _columns(rows)


def slot_table(pools: list[dict[str, Any]]) -> list[str]:
    """One line per pool: how its GPUs are shared, how well slots are isolated, the slots a node offers."""
    header = ("pool", "sharing", "isolation", "slots/node")
    rows = [header] + [
        (pool["name"], pool["sharing"], pool["isolation"], f"{pool['slotsPerNode']}: {_slot_text(pool)}")
        for pool in pools
    ]
    return _columns(rows)


def usage_lines(pools: list[dict[str, Any]]) -> list[str]:
    """Per pool, what a pod's spec says to land there (the `usage` of the `gpuPools` output)."""
    lines = []
    for pool in pools:
        usage = pool["usage"]
        selector = ", ".join(f"{k}={v}" for k, v in usage["nodeSelector"].items())
        tolerations = ", ".join(
            f"{t['key']}={t['value']}:{t['effect']}"
            if t["operator"] == "Equal"
            else f"{t['key']}:{t['effect']}"
            for t in usage["tolerations"]
        )
        text = (
            f"{pool['name']}: nodeSelector {selector}; tolerate {tolerations}; "
            f"request {' or '.join(usage['resources'])}"
        )
        lines += textwrap.wrap(text, width=WIDTH - 2, subsequent_indent="    ")
    return lines


def cost_lines(recording: Recording, prices: dict[str, Price | None]) -> list[str]:
    """The idle baseline a month, what it is made of, what is not counted, and the GPU pools at ceiling."""
    charges, not_counted = idle_charges(recording)
    idle = sum(charge.usd_per_hour for charge in charges)
    parts = " + ".join(_charge_text(charge) for charge in charges)
    ceiling = sum(
        price.usd_per_hour * pool["maxNodes"]
        for pool in recording.outputs.get("gpuPools", [])
        if (price := prices.get(pool["name"])) is not None
    )
    unpriced = [name for name, price in prices.items() if price is None]
    clouds = {r.type.split(":")[2] for r in recording.registrations if r.type.startswith("pulumi:providers:")}
    fees_charged = {
        c.price.basis.removeprefix(FEE).split(",")[0]
        for c in charges
        if c.price and c.price.basis.startswith(FEE)
    }
    month = f"${idle * HOURS_PER_MONTH:,.2f} a month (${idle:.2f}/h)"
    text = [
        f"Idle, every GPU pool at its floor: {month}: {parts}.",
        f"Not counted: {', '.join([*not_counted, *ALWAYS_UNCOUNTED])}.",
        f"Every GPU pool at its ceiling adds ${ceiling:,.2f}/h"
        + (f", plus pools {', '.join(unpriced)}, which have no price data." if unpriced else "."),
        f"List prices in USD per hour; {price_sources(clouds, fees_charged)}.",
    ]
    return [line for para in text for line in textwrap.wrap(para, WIDTH - 2, subsequent_indent="  ")]


def _charge_text(charge: Charge) -> str:
    assert charge.price is not None
    basis = charge.price.basis
    if basis.startswith(FEE):
        basis = basis.partition(",")[2].strip()
    basis = f" ({basis})" if basis else ""
    return f"{charge.count} x {charge.what} at {charge.price.usd_per_hour:g}{basis}"


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


CLUSTER_QUEUE_TYPE = "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue"


def queue_quotas(recording: Recording) -> dict[str, str]:
    """The nominal quota of each Kueue ClusterQueue the plan creates, by queue name (a pool's, or with
    `batch.teams` <pool>-<team>)."""
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


def render_text(recording: Recording, full: bool = False) -> str:
    """The components and their resource counts (with `full`, every resource's tree line, the dependency
    edges and counts by type), then the GPU pools, how a pod uses each, what the stack costs, the warnings,
    what was not checked offline, and the outputs."""
    count = len(recording.registrations)
    lines = [f"Offline plan of stack {recording.stack}: {count} resources", ""]
    lines += _full_tree(recording) if full else _component_tree(recording)
    pools = redact(recording.outputs.get("gpuPools", []))
    prices = {pool["name"]: node_price(recording, pool) for pool in pools}
    if pools:
        lines += ["", "GPU pools (USD, list prices):"]
        lines += [f"  {line}" for line in pool_table(pools, prices)]
        lines += ["", "Slots (schedulable GPU resources per node once the GPUs are set up):"]
        lines += [f"  {line}" for line in slot_table(pools)]
        quotas = queue_quotas(recording)
        if quotas:
            lines += ["", "Batch queues (Kueue ClusterQueues, nominal quota):"]
            lines += [_cut(f"  {name}: {quota}") for name, quota in sorted(quotas.items())]
        lines += ["", "How a pod lands on a pool (nodeSelector, tolerations, one of the resources):"]
        lines += [f"  {line}" for line in usage_lines(pools)]
    lines += ["", "Cost:"] + [f"  {line}" for line in cost_lines(recording, prices)]
    if recording.warnings:
        lines += ["", "Warnings:"]
        for warning in recording.warnings:
            lines += textwrap.wrap(warning, WIDTH, initial_indent="  ", subsequent_indent="    ")
    checked = (
        f"Checked offline: GPU types offered where each pool is placed. Not checked: {NOT_CHECKED_OFFLINE}."
    )
    lines += ["", *textwrap.wrap(checked, width=WIDTH, subsequent_indent="  ")]
    lines += ["", "Outputs:"]
    for key, value in sorted(redact(recording.outputs).items()):
        if key != "gpuPools":
            lines.append(_cut(f"  {key}: {_compact(value)}"))
    lines.append("  gpuPools: (the tables above; --json has the whole value)")
    return "\n".join(lines) + "\n"


def _component_tree(recording: Recording) -> list[str]:
    """Each component (down to its child components) with the number of resources under it."""
    by_urn = {r.urn: r for r in recording.registrations}
    children: dict[str, list[Registration]] = defaultdict(list)
    for r in recording.registrations:
        children[r.parent if r.parent in by_urn else ""].append(r)

    def under(urn: str) -> int:
        return sum(1 + under(child.urn) for child in children.get(urn, []))

    lines = ["Components (resources under each; every resource: --full):"]

    def walk(parent: str, depth: int) -> None:
        for resource in sorted(children.get(parent, []), key=lambda r: (r.name, r.type)):
            if not resource.custom:
                lines.append(_cut(f"{'  ' * depth}{resource.type}  {resource.name}  {under(resource.urn)}"))
                walk(resource.urn, depth + 1)

    walk("", 1)
    providers = sorted(r.name for r in children.get("", []) if r.type.startswith("pulumi:providers:"))
    lines.append(_cut(f"  providers: {', '.join(providers)}"))
    return lines


def _full_tree(recording: Recording) -> list[str]:
    """Every resource under its parent, the dependency edges, and counts by type."""
    by_urn = {r.urn: r for r in recording.registrations}
    children: dict[str, list[Registration]] = defaultdict(list)
    for r in recording.registrations:
        children[r.parent if r.parent in by_urn else ""].append(r)
    lines = [f"pulumi:pulumi:Stack  {recording.project}-{recording.stack}"]

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
    return lines


def _cut(line: str) -> str:
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."


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
    if not project.program.is_file():
        raise StackNotFound(
            f"{stack}: the project's program {project.program} does not exist (Pulumi.yaml's `main` names "
            "its directory, by default Pulumi.yaml's own). Fix: write it; the whole program can be "
            "`from gpu_k8s import deploy_stack; deploy_stack()`"
        )
    return run_program(stack_name(path), stack_config(path, project), preview=not up, project=project)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-k8s plan", description=__doc__.split("\n")[0])
    parser.add_argument("stack", help="stack name (aws-eks) or path to a stack file")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON document")
    parser.add_argument(
        "--full", action="store_true", help="print every resource, the dependency edges and counts by type"
    )
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
        sys.stdout.write(render_text(recording, full=args.full))
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
