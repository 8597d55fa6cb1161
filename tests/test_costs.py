"""What a stack costs: node prices per pool, the idle baseline read off the planned resources, what no table
prices named, and the price tables re-derived from their pinned sources.

The expected figures are worked out by hand from the sources: Karpenter's us-east-1 table (m7i.large 0.1008,
g6e.xlarge 1.861), cluster-autoscaler's GCE table (e2-standard-4 0.13402, n1-standard-8 0.38, T4 0.35, spot
g2-standard-8 0.27) and components/data/fees.json (EKS and GKE 0.10, NAT gateway 0.045, public IPv4 0.005,
network load balancer 0.0225, KMS key $1 and Secrets Manager secret $0.40 a month of 730 hours; Cloud NAT
0.0014 per VM and 0.005 per address, forwarding rules 0.025 for up to five, then 0.01 each).
"""

from __future__ import annotations

import copy
import json
import types

import pytest

from gpu_k8s.components.prices import (
    AWS_PRICES_FILE,
    AWS_REGIONAL_PRICES_FILE,
    GCP_PRICES_FILE,
    Price,
    aws_node_price,
    gcp_node_price,
)
from gpu_k8s.tools import reference_data
from gpu_k8s.tools.costs import HOURS_PER_MONTH, gcp_network_charges, idle_charges, node_price
from gpu_k8s.tools.engine import run_program
from gpu_k8s.tools.plan import render_text

FORWARDING_RULE = "gcp:compute/forwardingRule:ForwardingRule"


def idle_per_hour(recording) -> float:
    charges, _ = idle_charges(recording)
    return round(sum(charge.usd_per_hour for charge in charges), 6)


def test_the_idle_baseline_is_the_resources_that_bill_at_rest(aws_eks, aws_k3s, gcp_gke, gcp_k3s):
    # EKS: control plane + 3 NAT gateways and their 3 Elastic IPs + 2 m7i.large system nodes + two KMS keys
    # (secrets, control-plane logs); GPU pools are at zero.
    eks = 0.10 + 3 * 0.045 + 3 * 0.005 + 2 * 0.1008 + 2 / 730
    assert idle_per_hour(aws_eks) == round(eks, 6)
    # k3s on EC2: 3 m7i.large servers + 3 NAT gateways and their addresses + the API and registration
    # network balancers (the internet-facing one with an address in each of 3 zones) + 2 secrets.
    assert idle_per_hour(aws_k3s) == round(
        3 * 0.1008 + 3 * 0.045 + 3 * 0.005 + 2 * 0.0225 + 3 * 0.005 + 2 * 0.40 / 730, 6
    )
    # GKE (regional: the free tier's credit does not apply): fee + 2 e2-standard-4 system nodes + Cloud NAT
    # for those 2 VMs and its address.
    assert idle_per_hour(gcp_gke) == round(0.10 + 2 * 0.13402 + 2 * 0.0014 + 0.005, 6)
    # k3s on GCE: 3 servers, Cloud NAT for them, the API and registration forwarding rules (two rules: one
    # minimum charge, which covers up to five).
    assert idle_per_hour(gcp_k3s) == round(3 * 0.13402 + 3 * 0.0014 + 0.005 + 0.025, 6)
    assert f"${round(eks, 6) * HOURS_PER_MONTH:,.2f} a month" in render_text(aws_eks)


def test_cloud_nat_is_flat_above_32_vms_and_forwarding_rules_cheaper_after_five(gcp_gke_config):
    config = copy.deepcopy(gcp_gke_config)
    pool = config["gpu-k8s:cluster"]["gpuPools"][0]
    pool["minNodes"], pool["maxNodes"] = 31, 40
    charges, _ = idle_charges(run_program("busy", config))
    nat = [(c.what, c.count, c.usd_per_hour) for c in charges if c.what.startswith("Cloud NAT gateway")]
    assert nat == [("Cloud NAT gateway (more than 32 VMs)", 1, 0.044)]
    rules = [types.SimpleNamespace(type=FORWARDING_RULE)] * 7
    recording = types.SimpleNamespace(by_type=lambda kind: rules if kind == FORWARDING_RULE else [])
    assert [(c.what, c.count, c.usd_per_hour) for c in gcp_network_charges(recording, 0)] == [
        ("forwarding rules' minimum (up to 5)", 1, 0.025),
        ("forwarding rule beyond the fifth", 2, 2 * 0.01),
    ]


def test_what_bills_at_rest_but_has_no_price_is_named(gcp_k3s, aws_k3s):
    _, not_counted = idle_charges(gcp_k3s)
    # Basic HDD's 1 TiB minimum bills whether the share holds anything (Filestore pricing); the price for
    # us-central1 was not confirmed, so it is named with its size.
    assert "1 x Filestore BASIC_HDD instance (1024 GiB provisioned, billed used or not)" in not_counted
    assert not [item for item in not_counted if "forwarding rule" in item or "NAT" in item]
    _, not_counted = idle_charges(aws_k3s)
    assert not [item for item in not_counted if "balancer" in item or "IP" in item]


def test_a_gpu_pool_kept_warm_by_min_nodes_is_part_of_the_idle_baseline(aws_eks_config, aws_eks):
    config = copy.deepcopy(aws_eks_config)
    pool = config["gpu-k8s:cluster"]["gpuPools"][0]
    assert pool["instanceType"] == "g6e.xlarge" and pool["spot"]
    pool["minNodes"] = 1
    warm = run_program("warm", config)
    # A spot g6e.xlarge in us-east-1: the dearest of its zones' spot prices in SkyPilot's catalog (rows
    # use1-az1 1.1975, az2 0.9154, az4 0.9599, az6 1.0492).
    assert idle_per_hour(warm) == round(idle_per_hour(aws_eks) + 1.1975, 6)


def test_pool_prices_follow_the_data_and_say_what_they_are(aws_eks, gcp_gke):
    prices = {pool["name"]: node_price(aws_eks, pool) for pool in aws_eks.outputs["gpuPools"]}
    assert prices["l40s"] is not None and prices["l40s"].usd_per_hour == 1.1975
    assert prices["l40s"].basis == "spot us-east-1, dearest zone in SkyPilot's catalog"
    # An on-demand pool in us-east-1: Karpenter's table.
    assert (prices["h100-train"].usd_per_hour, prices["h100-train"].basis) == (55.04, "on-demand us-east-1")
    gke = {pool["name"]: node_price(gcp_gke, pool) for pool in gcp_gke.outputs["gpuPools"]}
    # Spot L4 (GPU included in G2's price); two T4s on an n1-standard-8; no A3 price in the table.
    assert (gke["l4"].usd_per_hour, gke["l4"].basis) == (0.27, "spot (preemptible table) us-central1")
    assert gke["t4"].usd_per_hour == round(0.38 + 2 * 0.35, 6)
    assert gke["h100-train"] is None
    text = render_text(gcp_gke)
    assert "plus pools h100-train, which have no price data" in text


def test_a_region_the_price_tables_lack_is_priced_at_the_reference_region_and_says_so():
    # Karpenter's table has us-east-1 only; SkyPilot's catalog has eu-central-1 (g6e.xlarge 2.327, spot
    # 1.4934 in euc1-az1, the dearest of its three zones) but not il-central-1.
    assert aws_node_price("g6e.xlarge", "eu-central-1") == Price(2.327, "on-demand eu-central-1")
    assert aws_node_price("g6e.xlarge", "eu-central-1", spot=True) == Price(
        1.4934, "spot eu-central-1, dearest zone in SkyPilot's catalog"
    )
    price = aws_node_price("g6e.xlarge", "il-central-1")
    assert price is not None and price.basis == "on-demand us-east-1, not il-central-1"
    # p5e.48xlarge: the catalog lists spot prices but no on-demand price (every row's Price is empty).
    assert aws_node_price("p5e.48xlarge", "us-east-2", spot=True) is not None
    assert aws_node_price("x9.nonexistent", "us-east-1") is None
    assert gcp_node_price("e2-standard-4", "europe-west4").basis == "on-demand us-central1, not europe-west4"
    assert gcp_node_price("n1-standard-8", "us-central1", accelerator=("nvidia-tesla-a100", 1)) is not None
    assert gcp_node_price("n1-standard-8", "us-central1", accelerator=("nvidia-h100-80gb", 1)) is None


@pytest.mark.parametrize(
    ("table", "derive", "source"),
    [
        (AWS_PRICES_FILE, reference_data.aws_prices, reference_data.KARPENTER_PRICING),
        (GCP_PRICES_FILE, reference_data.gcp_prices, reference_data.CA_GCE_PRICES),
        (AWS_REGIONAL_PRICES_FILE, reference_data.aws_regional_prices, reference_data.SKYPILOT_AWS_ROWS),
    ],
)
def test_the_price_tables_are_what_their_pinned_sources_say(table, derive, source):
    assert json.loads(table.read_text()) == json.loads(json.dumps(derive(source.read_text())))


def test_two_independent_sources_agree_on_every_us_east_1_on_demand_price():
    """Karpenter's table (from the AWS pricing API) and SkyPilot's catalog (an excerpt transcribed page by
    page) list the same on-demand price for every type both have in us-east-1."""
    karpenter = json.loads(AWS_PRICES_FILE.read_text())["onDemandUsdPerHour"]["us-east-1"]
    catalog = json.loads(AWS_REGIONAL_PRICES_FILE.read_text())["onDemandUsdPerHour"]["us-east-1"]
    shared = set(karpenter) & set(catalog)
    assert len(shared) >= 60
    assert {
        name: (karpenter[name], catalog[name]) for name in shared if karpenter[name] != catalog[name]
    } == {}


def test_the_catalog_derivation_takes_a_regions_dearest_zone_and_skips_local_zones():
    header = (
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,"
        "AvailabilityZone,Arch"
    )
    rows = [
        "g6.xlarge,L4,1.0,4.0,16.0,,0.8048,0.40,us-east-1,use1-az1,x86_64",
        "g6.xlarge,L4,1.0,4.0,16.0,,0.8048,0.30,us-east-1,use1-az2,x86_64",
        "g6.xlarge,L4,1.0,4.0,16.0,,0.8048,0.90,us-east-1,use1-atl2-az1,x86_64",
        "p5e.48xlarge,H200,8.0,192.0,2048.0,,,18.7,us-east-2,use2-az3,x86_64",
    ]
    prices = reference_data.aws_regional_prices("\n".join([header, *rows]) + "\n")
    assert prices["onDemandUsdPerHour"] == {"us-east-1": {"g6.xlarge": 0.8048}}
    assert prices["spotMaxUsdPerHour"] == {
        "us-east-1": {"g6.xlarge": 0.40},
        "us-east-2": {"p5e.48xlarge": 18.7},
    }
    clash = "\n".join([header, rows[0], rows[1].replace("0.8048", "0.9")])
    with pytest.raises(ValueError, match="two on-demand prices"):
        reference_data.aws_regional_prices(clash)


def test_the_derivations_read_the_go_tables_they_are_given():
    go = '// generated at 2026-01-01T00:00:00Z for x\n\t"xx-1": {\n\t\t"a.b": 1.5, "c.d": 0.25,\n\t},\n'
    aws = reference_data.aws_prices(go)
    assert aws["onDemandUsdPerHour"] == {"xx-1": {"a.b": 1.5, "c.d": 0.25}}
    gce = "\n".join(
        f'\t{name} = map[string]float64{{\n\t\t"t-1":  {value},\n\t}}'
        for name, value in (
            ("instancePrices", 2),
            ("preemptiblePrices", 1),
            ("gpuPrices", 3),
            ("preemptibleGpuPrices", 0.5),
        )
    )
    prices = reference_data.gcp_prices(gce)
    assert (prices["onDemand"], prices["spot"], prices["gpuOnDemand"], prices["gpuSpot"]) == (
        {"t-1": 2.0},
        {"t-1": 1.0},
        {"t-1": 3.0},
        {"t-1": 0.5},
    )
    with pytest.raises(ValueError, match="no map instancePrices"):
        reference_data.gcp_prices("")


def test_a_warm_k3s_pool_is_priced_from_its_launch_template_or_mixed_policy(aws_k3s_config, aws_k3s):
    config = copy.deepcopy(aws_k3s_config)
    pools = {pool["name"]: pool for pool in config["gpu-k8s:cluster"]["gpuPools"]}
    pools["l4"]["minNodes"] = 1
    warm = run_program("warm-k3s", config)
    # A spot g6.xlarge in us-east-1: its zones' spot prices 0.4011, 0.3653, 0.3490, 0.3988; the dearest.
    assert idle_per_hour(warm) == round(idle_per_hour(aws_k3s) + 0.4011, 6)
    charges, not_counted = idle_charges(warm)
    assert ("g6.xlarge node", "spot us-east-1, dearest zone in SkyPilot's catalog") in [
        (c.what, c.price.basis) for c in charges if c.price
    ]
    assert not any("?" in item for item in not_counted)
    pools["l4"]["extraInstanceTypes"] = ["g6.2xlarge"]
    mixed = run_program("warm-mixed", config)
    assert idle_per_hour(mixed) == round(idle_per_hour(aws_k3s) + 0.4011, 6)


def test_internal_addresses_cost_nothing_and_region_bound_fees_say_whose_price(gcp_k3s, aws_eks_config):
    _, not_counted = idle_charges(gcp_k3s)
    # gcp-k3s reserves one external address (the API) and internal ones for the servers.
    assert "1 x external static IP address" in not_counted
    config = copy.deepcopy(aws_eks_config)
    config["aws:region"] = "eu-north-1"
    charges, _ = idle_charges(run_program("stockholm", config))
    (nat,) = [c for c in charges if c.what == "NAT gateway"]
    assert nat.price is not None and nat.price.basis.endswith("us-east-1's")
