"""What nodes and fixed fees cost per hour, from committed public price data (each table carries its source
and date): AWS on-demand prices from Karpenter's generated table (the pinned version lists us-east-1 only)
and, for other regions and for spot, SkyPilot's AWS catalog (on-demand per region; spot per zone when it
was fetched, the dearest zone of the region taken); GCP on-demand and spot prices from cluster-autoscaler's
GCE table (one figure per type: us-central1's), and the fees in `data/fees.json`. List prices: no
discounts, commitments, credits, taxes or data transfer; a region's own price may differ from the reference
region's, and the figure says which it is. Spot prices move by the hour: a spot figure is a reference.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from gpu_k8s.components.availability import DATA

if TYPE_CHECKING:
    from gpu_k8s.components.cluster import GpuPool

AWS_PRICES_FILE = DATA / "aws-prices.json"
AWS_REGIONAL_PRICES_FILE = DATA / "aws-regional-prices.json"
GCP_PRICES_FILE = DATA / "gcp-prices.json"
GCP_CPU_TYPES_FILE = DATA / "gcp-cpu-machine-types.json"
FEES_FILE = DATA / "fees.json"
# gce_price_info.go prices these above e2-medium on purpose (its comment: to make the autoscaler prefer
# e2-medium), so they are not list prices.
INFLATED_GCP_PRICES = frozenset({"e2-micro", "e2-small"})
# The basis of a fee's Price: this, then the fee's name in fees.json.
FEE = "fee "


@dataclass(frozen=True)
class Price:
    usd_per_hour: float
    # What the figure is, for the reader: "on-demand us-east-1", "spot us-central1-a", ...
    basis: str


@cache
def aws_prices() -> dict[str, Any]:
    return json.loads(AWS_PRICES_FILE.read_text())


@cache
def aws_regional_prices() -> dict[str, Any]:
    return json.loads(AWS_REGIONAL_PRICES_FILE.read_text())


@cache
def gcp_prices() -> dict[str, Any]:
    return json.loads(GCP_PRICES_FILE.read_text())


@cache
def gcp_cpu_types() -> dict[str, Any]:
    return json.loads(GCP_CPU_TYPES_FILE.read_text())


@cache
def fees() -> dict[str, Any]:
    return json.loads(FEES_FILE.read_text())["fees"]


def fee(name: str, region: str | None = None) -> Price:
    """A fee; one the data has for a single region says so where the stack runs elsewhere."""
    entry = fees()[name]
    elsewhere = entry.get("region") not in (None, region)
    return Price(entry["usdPerHour"], f"{FEE}{name}" + (f", {entry['region']}'s" if elsewhere else ""))


def price_sources(clouds: set[str], fees_charged: set[str]) -> str:
    """Where the node prices of these clouds ("aws", "gcp") come from, and which charged fees are not from the
    provider's own page."""
    parts = []
    if "aws" in clouds:
        generated = aws_prices()["source"]["generated"][:10]
        catalog = aws_regional_prices()["source"]["commit"][:8]
        parts.append(
            f"AWS instances: Karpenter's generated table of {generated} (us-east-1), SkyPilot's catalog at "
            f"{catalog} (other regions, spot)"
        )
    if "gcp" in clouds:
        parts.append(f"GCP machine types: {gcp_prices()['source']['tag']}'s GCE price table")
    secondary = sorted(name for name in fees_charged if fees()[name]["status"] != "published")
    from_pages = f" ({', '.join(secondary)} from third-party pages)" if secondary else ""
    parts.append(f"fees: components/data/fees.json{from_pages}")
    return "; ".join(parts)


def aws_node_price(instance_type: str, region: str, spot: bool = False) -> Price | None:
    """A spot node at the dearest spot price of the region's zones in SkyPilot's catalog; on demand (and a
    spot node the catalog has no spot price for, at that ceiling): Karpenter's price in `region`, else the
    catalog's, else a region either table has (said in the basis)."""
    regional = aws_regional_prices()
    spot_price = regional["spotMaxUsdPerHour"].get(region, {}).get(instance_type) if spot else None
    if spot_price is not None:
        return Price(spot_price, f"spot {region}, dearest zone in SkyPilot's catalog")
    tables = (aws_prices()["onDemandUsdPerHour"], regional["onDemandUsdPerHour"])
    found = next(((table, region) for table in tables if instance_type in table.get(region, {})), None)
    if found is None:
        found = next(
            ((table, r) for table in tables for r in sorted(table) if instance_type in table[r]), None
        )
        if found is None:
            return None
    table, where = found
    basis = f"on-demand {where}" + ("" if where == region else f", not {region}")
    return Price(table[where][instance_type], basis + (" (spot: no data)" if spot else ""))


def gcp_node_price(
    machine_type: str, region: str, spot: bool = False, accelerator: tuple[str, int] | None = None
) -> Price | None:
    """A GCP node on demand or spot, with an N1 node's attached GPUs; None when the table has no price for
    the machine type or its GPUs (A3, A4 and G4 are not in it)."""
    table = gcp_prices()
    if machine_type in INFLATED_GCP_PRICES:
        return None
    machine = table["spot" if spot else "onDemand"].get(machine_type)
    if machine is None:
        return None
    total = machine
    if accelerator is not None:
        gpu = table["gpuSpot" if spot else "gpuOnDemand"].get(accelerator[0])
        if gpu is None:
            return None
        total += gpu * accelerator[1]
    where = "us-central1" if region == "us-central1" else f"us-central1, not {region}"
    # The table's spot figures are its preemptible prices; Google changes spot prices up to once a month.
    return Price(round(total, 6), f"{'spot (preemptible table)' if spot else 'on-demand'} {where}")


def aws_pool_node_price(region: str) -> Callable[[GpuPool], Price | None]:
    """One node of a pool in `region` at list price, as the plan prices it."""
    return lambda pool: aws_node_price(pool.spec.instance_type, region, pool.spec.spot)


def gcp_machine_price(
    machine_type: str, region: str, spot: bool, accelerator: tuple[str, int] | None
) -> Price | None:
    """A VM's list price: only N1 types attach GPUs; the others' GPUs are in their machine's price."""
    return gcp_node_price(machine_type, region, spot, accelerator if machine_type.startswith("n1-") else None)


def gcp_pool_node_price(region: str) -> Callable[[GpuPool], Price | None]:
    """One node of a pool in `region` at list price, as the plan prices it."""

    def price(pool: GpuPool) -> Price | None:
        accelerator = pool.spec.accelerator
        attached = (accelerator.type, accelerator.count) if accelerator else None
        return gcp_machine_price(pool.spec.instance_type, region, pool.spec.spot, attached)

    return price
