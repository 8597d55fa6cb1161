"""The README table "How many GPUs do I rent?": slots per node and per dollar under each sharing mode.

    gpu-k8s rent      # prints the Markdown table that README.md carries (a test compares them)

Slots come from the same code the stack uses (`components.sharing.node_offer`), so the table cannot drift
from what the cluster-autoscaler templates advertise.
"""

from __future__ import annotations

import argparse
import sys

from gpu_k8s.components.catalog import load_catalog
from gpu_k8s.components.sharing import (
    PoolMig,
    SharingSpec,
    cluster_mig_strategy,
    mig_layout,
    node_offer,
    resolve_sharing,
)

# On-demand Linux prices in us-east-1, USD per hour: Karpenter's generated table
# (aws/karpenter-provider-aws pkg/providers/pricing/zz_generated.pricing_aws.go at commit 265ee0ba,
# generated 2026-02-09). Prices change; the slot counts do not.
ON_DEMAND_USD_PER_HOUR = {"g5.xlarge": 1.006, "g6e.12xlarge": 10.49264, "p5.48xlarge": 55.04}
PRICE_NOTE = "on-demand us-east-1 prices of 2026-02-09 (Karpenter's generated price table)"

EXAMPLES: list[tuple[str, SharingSpec]] = [
    (instance_type, sharing)
    for instance_type in ON_DEMAND_USD_PER_HOUR
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


def rent_rows() -> list[tuple[str, ...]]:
    """One row per instance type and sharing mode its GPU supports."""
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
        price = ON_DEMAND_USD_PER_HOUR[instance_type]
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


def rent_table() -> str:
    header = (
        "instance",
        "GPUs",
        "sharing",
        "slots/node",
        "memory per slot",
        "isolation",
        "$/node-hour",
        "$/slot-hour",
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rent_rows()]
    return "\n".join(lines) + f"\n\nPrices: {PRICE_NOTE}.\n"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="gpu-k8s rent", description=__doc__.split("\n")[0]).parse_args(argv)
    sys.stdout.write(rent_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
