"""How many GPUs do I rent?: slots per node and per dollar under each sharing mode.

    gpu-k8s rent                       # three AWS instance types under each sharing mode, us-east-1 prices
    gpu-k8s rent --region eu-central-1 # the same, priced where you run (the data says when it cannot)
    gpu-k8s rent --stack aws-eks       # the pools of a stack as it plans them
    gpu-k8s rent --markdown            # the Markdown table README.md carries (a test compares them)

Slots come from the same code the stack uses (`components.sharing.node_offer`), so the table cannot drift
from what the cluster-autoscaler templates advertise; prices from `components/prices.py`.
"""

from __future__ import annotations

import argparse
import re
import sys

from gpu_k8s.components.catalog import load_catalog
from gpu_k8s.components.prices import Price, aws_node_price, aws_prices, aws_regional_prices
from gpu_k8s.components.sharing import (
    PoolMig,
    SharingSpec,
    cluster_mig_strategy,
    mig_layout,
    node_offer,
    resolve_sharing,
)

INSTANCE_TYPES = ("g5.xlarge", "g6e.12xlarge", "p5.48xlarge")
README_REGION = "us-east-1"

EXAMPLES: list[tuple[str, SharingSpec]] = [
    (instance_type, sharing)
    for instance_type in INSTANCE_TYPES
    for sharing in (
        SharingSpec(),
        SharingSpec(mode="timeSlicing", replicas=4),
        SharingSpec(mode="mps", replicas=4),
        SharingSpec(mode="mig", profile="1g.10gb"),
        SharingSpec(mode="mig", profile="3g.40gb"),
        SharingSpec(mode="mig", layout="all-balanced"),
    )
]


def _describe(sharing: SharingSpec) -> str:
    if sharing.mode in ("timeSlicing", "mps"):
        return f"{sharing.mode} x{sharing.replicas}"
    if sharing.mode == "mig":
        return f"mig {sharing.profile or sharing.layout}"
    return "none (whole GPUs)"


def rent_rows(region: str = README_REGION) -> list[tuple[str, ...]]:
    """One row per instance type and sharing mode its GPU supports, priced in `region`."""
    catalog = load_catalog()
    rows: list[tuple[str, ...]] = []
    for instance_type, spec in EXAMPLES:
        machine = catalog.machine_type("aws", instance_type)
        assert machine is not None and machine.gpu_model is not None
        model = machine.gpu_model
        if spec.mode == "mig" and not model.mig_capable:
            continue
        # The pool alone in its cluster: the strategy it would get from the real rule.
        pools = (
            [PoolMig(0, "pool", mig_layout(spec, model, "pool"), spec.strategy)] if spec.mode == "mig" else []
        )
        strategy = cluster_mig_strategy(pools)
        offer = node_offer(resolve_sharing(spec, model, "pool", strategy), model, machine.gpu_count)
        price = _price(instance_type, region).usd_per_hour
        # Time-slicing enforces nothing: the figure is each slot's fair share of one GPU's memory.
        shared = " (not enforced)" if offer.isolation == "none" else ""
        memory = " + ".join(f"{kind.per_node} x {kind.memory_gib:g} GiB{shared}" for kind in offer.slots)
        rows.append(
            (
                f"`{instance_type}`",
                f"{machine.gpu_count} x {model.display_name}",
                _describe(spec),
                str(offer.slots_per_node),
                memory,
                offer.isolation,
                f"{price:.2f}",
                f"{price / offer.slots_per_node:.3f}",
            )
        )
    return rows


HEADER = (
    "instance",
    "GPUs",
    "sharing",
    "slots/node",
    "memory per slot",
    "isolation",
    "$/node-hour",
    "$/slot-hour",
)


def rent_table(region: str = README_REGION) -> str:
    """The README's Markdown form."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in rent_rows(region)]
    return "\n".join(lines) + f"\n\nPrices: {_price_note(region)}.\n"


def terminal_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    # Terminal cells drop the README's code marks and the GPU's form factor ("(SXM5/PCIe)").
    rows = [header, *[tuple(re.sub(r" \(\w+/\w+\)", "", cell.strip("`")) for cell in row) for row in rows]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in rows
    )


def stack_rows(stack: str) -> list[tuple[str, ...]]:
    """One row per pool of a planned stack: its slots and what a node and a slot cost where it runs."""
    from gpu_k8s.tools.costs import node_price
    from gpu_k8s.tools.plan import plan, redact

    recording = plan(stack)
    rows: list[tuple[str, ...]] = []
    for pool in redact(recording.outputs.get("gpuPools", [])):
        price = node_price(recording, pool)
        slots = " + ".join(
            f"{s['perNode']} x {s['resource']} ({s['memoryGiB']:g} GiB)" for s in pool["slots"]
        )
        rows.append(
            (
                pool["name"],
                pool["instanceType"],
                pool["sharing"],
                slots,
                pool["isolation"],
                "n/a" if price is None else f"{price.usd_per_hour:.2f}",
                "n/a" if price is None else f"{price.usd_per_hour / pool['slotsPerNode']:.3f}",
                "no price data" if price is None else price.basis,
            )
        )
    return rows


def _price(instance_type: str, region: str) -> Price:
    price = aws_node_price(instance_type, region)
    if price is None:
        raise ValueError(f"{instance_type}: not in the AWS price table")
    return price


def _price_note(region: str) -> str:
    table = aws_prices()
    generated = table["source"]["generated"][:10]
    if all(t in table["onDemandUsdPerHour"].get(region, {}) for t in INSTANCE_TYPES):
        return f"on-demand {region} prices of {generated} (Karpenter's generated price table)"
    catalog = aws_regional_prices()
    if all(t in catalog["onDemandUsdPerHour"].get(region, {}) for t in INSTANCE_TYPES):
        return f"on-demand {region} prices in SkyPilot's catalog at {catalog['source']['commit'][:8]}"
    elsewhere = {t: aws_node_price(t, region) for t in INSTANCE_TYPES}
    moved = ", ".join(
        f"{t} ({p.basis})"
        for t, p in elsewhere.items()
        if p is not None and not p.basis.startswith(f"on-demand {region}")
    )
    return (
        f"on-demand {region} prices where the data has them (SkyPilot's catalog at "
        f"{catalog['source']['commit'][:8]}); priced elsewhere: {moved}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-k8s rent", description=__doc__.split("\n")[0])
    parser.add_argument("--region", default=README_REGION, help="the AWS region to price in")
    parser.add_argument("--stack", help="a stack name or file: its pools as it plans them")
    parser.add_argument("--markdown", action="store_true", help="the README's Markdown table")
    args = parser.parse_args(argv)
    if args.stack:
        from gpu_k8s.components.configbase import ConfigError
        from gpu_k8s.tools.plan import StackNotFound

        try:
            rows = stack_rows(args.stack)
        except (ConfigError, StackNotFound) as exc:
            print(exc, file=sys.stderr)
            return 2
        header = ("pool", "instance", "sharing", "slots/node", "isolation", "$/node-h", "$/slot-h", "price")
        sys.stdout.write(terminal_table(header, rows))
        return 0
    if args.markdown:
        sys.stdout.write(rent_table(args.region))
        return 0
    sys.stdout.write(terminal_table(HEADER, rent_rows(args.region)))
    sys.stdout.write(f"\nPrices: {_price_note(args.region)}.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
