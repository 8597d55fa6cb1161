"""Where each GPU machine type is offered, from committed public data: AWS instance types per region (and
the zone IDs that offer them), GCP machine types and N1 accelerators per zone.

The tables (`data/aws-gpu-offerings.json`, `data/gcp-gpu-zones.json`) carry their source, version or commit
and sha256; `gpu-k8s references refresh` derives them again (tools/reference_data.py). A pool placed where
its GPU is not offered is refused before any resource exists, naming where it is offered. A region or zone
the data does not know is not judged here: the cloud answers at preview (AWS's offering invoke, GCP's
machine-type invoke) or at `up`. Offerings say nothing of quota or free capacity.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
AWS_OFFERINGS_FILE = DATA / "aws-gpu-offerings.json"
AWS_NETWORK_CARDS_FILE = DATA / "aws-network-cards.json"
GCP_ZONES_FILE = DATA / "gcp-gpu-zones.json"
# SkyPilot's names for the GPUs that attach to N1 VMs -> Compute Engine's accelerator types (the catalog's
# gcp_n1_attachable_accelerators).
N1_ACCELERATOR_NAMES = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4",
}
# What no offline table can say; the plan says so.
NOT_CHECKED_OFFLINE = (
    "quotas, free capacity (a GPU type offered in a zone may have none to give), Capacity Block and "
    "reservation contents beyond their type and zone, types and zones newer than the data (on GCP: A4, "
    "A4X and G4, and CPU machine types; Compute Engine is asked at preview)"
)


@dataclass(frozen=True)
class Offerings:
    """One cloud's table: where each type is offered, and what the data covers."""

    # type -> the places offering it (AWS: regions, each with its zone IDs; GCP: zones)
    by_type: dict[str, Any]
    # The places the data knows at all (a place outside them is not judged).
    known_places: frozenset[str]
    source: dict[str, Any]

    def places(self, type_name: str) -> list[str]:
        return sorted(self.by_type.get(type_name, {}))

    def offered(self, type_name: str, place: str) -> bool | None:
        """True/False where the data knows the place and the type, None where it knows either not at all."""
        if place not in self.known_places or type_name not in self.by_type:
            return None
        return place in self.by_type.get(type_name, {})


@cache
def aws_offerings() -> Offerings:
    document = json.loads(AWS_OFFERINGS_FILE.read_text())
    by_type: dict[str, dict[str, Any]] = {}
    for region, types in document["regions"].items():
        for type_name, zone_ids in types.items():
            by_type.setdefault(type_name, {})[region] = zone_ids
    return Offerings(by_type, frozenset(document["regions"]), document["source"])


@cache
def gcp_offerings() -> Offerings:
    """Machine types and N1 accelerators (Compute Engine names) per zone."""
    document = json.loads(GCP_ZONES_FILE.read_text())
    return Offerings(
        {**document["machineTypes"], **document["accelerators"]},
        frozenset(document["zones"]),
        document["source"],
    )


def zone_region(zone: str) -> str:
    """us-central1-a -> us-central1."""
    return zone.rsplit("-", 1)[0]


def where_offered(places: list[str], near: str | None = None, limit: int = 8) -> str:
    """A short list for a message: the places in `near` (a region) first, then others, at most `limit`."""
    if not places:
        return "nowhere in the data"
    if near is not None:
        places = sorted(places, key=lambda p: (not p.startswith(near), p))
    shown = ", ".join(places[:limit])
    return shown + (f" (and {len(places) - limit} more)" if len(places) > limit else "")
