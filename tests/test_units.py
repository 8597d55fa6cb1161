"""Pure functions: subnet planning, autoscaler tags, operator values per platform, kubeconfig."""

from __future__ import annotations

import ipaddress
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_k8s.components.autoscaler import cluster_scale_down_unneeded_time, go_duration, node_template
from gpu_k8s.components.catalog import load_catalog
from gpu_k8s.components.cluster import PlatformTraits, resolve_pools
from gpu_k8s.components.compat import DriverFacts, DriverVersion, operator_driver
from gpu_k8s.components.configbase import ConfigError
from gpu_k8s.components.gpu_operator import operator_values
from gpu_k8s.components.spec import PLATFORMS, load_spec
from gpu_k8s.providers.aws.autoscaling import scale_from_zero_tags
from gpu_k8s.providers.aws.eks import EKS_TRAITS, render_kubeconfig
from gpu_k8s.providers.aws.network import subnet_plan
from gpu_k8s.providers.aws.nodes import system_ami_type, tag_resource_suffixes
from gpu_k8s.tools.rent import rent_rows, rent_table
from tests.conftest import minimal_cluster
from tests.paths import REPO_ROOT


@given(prefix=st.integers(16, 20), zones=st.integers(2, 6), base=st.integers(0, 255))
def test_subnet_plan_is_disjoint_and_inside_the_vpc(prefix, zones, base):
    vpc = ipaddress.IPv4Network(f"10.{base}.0.0/{prefix}", strict=False)
    plan = subnet_plan(str(vpc), zones)
    subnets = [ipaddress.IPv4Network(c) for p in plan for c in (p.private_cidr, p.public_cidr)]
    assert len(plan) == zones
    assert all(s.subnet_of(vpc) for s in subnets)
    assert all(not a.overlaps(b) for i, a in enumerate(subnets) for b in subnets[i + 1 :])
    # AWS subnets can be no smaller than /28.
    assert all(s.prefixlen <= 28 for s in subnets)


def test_subnet_plan_of_the_example():
    plan = subnet_plan("10.40.0.0/16", 3)
    assert [(p.private_cidr, p.public_cidr) for p in plan] == [
        ("10.40.0.0/19", "10.40.128.0/21"),
        ("10.40.32.0/19", "10.40.136.0/21"),
        ("10.40.64.0/19", "10.40.144.0/21"),
    ]


@pytest.mark.parametrize(
    ("given_", "expected"), [("5m", "5m0s"), ("90s", "1m30s"), ("1h", "1h0m0s"), ("2h5m", "2h5m0s")]
)
def test_durations_are_normalised_like_go(given_, expected):
    assert go_duration(given_) == expected


def test_tag_suffixes_stay_unique_when_keys_read_alike():
    prefix = "k8s.io/cluster-autoscaler/node-template/label/"
    suffixes = tag_resource_suffixes({f"{prefix}a.b": "1", f"{prefix}a-b": "2"})
    assert len(set(suffixes.values())) == 2


def test_system_pool_ami_follows_the_architecture():
    assert system_ami_type("m7i.large") == "AL2023_x86_64_STANDARD"
    assert system_ami_type("m7g.large") == "AL2023_ARM_64_STANDARD"
    assert system_ami_type("c8gd.xlarge") == "AL2023_ARM_64_STANDARD"


@pytest.fixture
def pools(cluster_raw):
    return resolve_pools(load_spec(cluster_raw), load_catalog(), EKS_TRAITS)


def test_scale_from_zero_tags_cover_labels_taints_and_gpus(pools):
    h100 = next(pool for pool in pools if pool.spec.name == "h100")
    tags = scale_from_zero_tags(node_template(h100, "5m0s"))
    prefix = "k8s.io/cluster-autoscaler/node-template"
    # 8 GPUs x 7 MIG 1g.10gb slices.
    assert tags[f"{prefix}/resources/nvidia.com/gpu"] == "56"
    assert tags[f"{prefix}/taint/nvidia.com/gpu"] == "true:NoSchedule"
    assert tags[f"{prefix}/label/k8s.amazonaws.com/accelerator"] == "nvidia-h100-80gb"
    assert tags[f"{prefix}/label/nvidia.com/mig.config"] == "all-1g.10gb"
    assert not any("autoscaling-options" in key for key in tags)
    # A pool whose idle time differs from the cluster-wide flag carries its own.
    tags = scale_from_zero_tags(node_template(h100, "10m0s"))
    assert tags[f"{prefix}/autoscaling-options/scaledownunneededtime"] == "5m0s"


def test_cluster_idle_time_is_what_most_pools_ask_for(cluster_raw):
    def pools_with(times):
        cluster_raw["gpuPools"] = [
            {"name": f"p{i}", "instanceType": "g6.xlarge", "maxNodes": 1, "scaleDownUnneededTime": t}
            for i, t in enumerate(times)
        ]
        return resolve_pools(load_spec(cluster_raw), load_catalog(), EKS_TRAITS)

    assert cluster_scale_down_unneeded_time(pools_with(["5m", "10m", "10m"])) == "10m0s"
    assert cluster_scale_down_unneeded_time(pools_with(["15m", "300s"])) == "5m0s"


def test_operator_values_follow_platform_traits(pools):
    # A platform where the operator owns the driver and containerd lives elsewhere (k3s-like).
    traits = PlatformTraits(
        driver=DriverFacts("gpu-operator", DriverVersion.parse("580.126.20")),
        toolkit_preinstalled=False,
        accelerator_label="k8s.amazonaws.com/accelerator",
        containerd_socket="/run/k3s/containerd/containerd.sock",
    )
    values = operator_values(traits, pools, "dp-config")
    # The driver version on the handle is the one the operator is told to install.
    assert values["driver"] == {"enabled": True, "version": "580.126.20"}
    assert values["devicePlugin"]["config"] == {"name": "dp-config", "default": "default"}
    assert values["toolkit"]["enabled"] is True
    assert values["toolkit"]["env"] == [
        {"name": "CONTAINERD_SOCKET", "value": "/run/k3s/containerd/containerd.sock"}
    ]
    gke_like = PlatformTraits(
        driver=DriverFacts("cloud-installer", DriverVersion.parse("580")),
        toolkit_preinstalled=False,
        accelerator_label="cloud.google.com/gke-accelerator",
        driver_install_dir="/home/kubernetes/bin/nvidia",
        toolkit_install_dir="/home/kubernetes/bin/nvidia",
        gpu_sharing_owner="platform",
    )
    values = operator_values(gke_like, pools, None)
    assert values["driver"] == {"enabled": False}
    assert values["hostPaths"] == {"driverInstallDir": "/home/kubernetes/bin/nvidia"}
    assert values["toolkit"]["installDir"] == "/home/kubernetes/bin/nvidia"
    # The platform shares and partitions the GPUs: no device plugin, no MIG manager, no MIG strategy.
    assert values["devicePlugin"] == {"enabled": False}
    assert values["migManager"] == {"enabled": False}
    assert "mig" not in values


def test_kubeconfig_structure():
    config = json.loads(render_kubeconfig("ml", "https://x.eks.amazonaws.com", "Q0E=", "eu-west-1"))
    assert config["current-context"] == "ml"
    assert config["clusters"][0]["cluster"] == {
        "server": "https://x.eks.amazonaws.com",
        "certificate-authority-data": "Q0E=",
    }
    assert config["users"][0]["user"]["exec"]["args"] == [
        "eks",
        "get-token",
        "--cluster-name",
        "ml",
        "--region",
        "eu-west-1",
        "--output",
        "json",
    ]


def test_readme_rent_table_is_what_the_code_computes():
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("<!-- rent-table:start -->\n")[1].split("<!-- rent-table:end -->")[0]
    assert section == rent_table(), "README is stale: paste the output of `gpu-k8s rent --markdown`"


def test_rent_prices_in_the_region_asked_or_says_it_cannot(capsys):
    from gpu_k8s.tools import rent

    assert rent.main(["--region", "us-east-1"]) == 0
    out = capsys.readouterr().out
    # Karpenter's us-east-1 table: p5.48xlarge 55.04, 56 MIG 1g.10gb slices per node.
    assert re.search(r"^p5\.48xlarge +8 x NVIDIA H100 80GB +mig 1g\.10gb +56 .* 55\.04 +0\.983$", out, re.M)
    assert rent.main(["--region", "us-west-2"]) == 0
    assert "on-demand us-west-2 prices in SkyPilot's catalog at 00148f2a" in capsys.readouterr().out
    # SkyPilot's catalog has no p5.48xlarge in eu-central-1: that row is us-east-1's, and says so.
    assert rent.main(["--region", "eu-central-1"]) == 0
    out = capsys.readouterr().out
    assert "priced elsewhere: p5.48xlarge (on-demand us-east-1, not eu-central-1)" in out


def test_rent_of_a_stack_prices_its_pools_where_it_runs(capsys):
    from gpu_k8s.tools import rent
    from tests.paths import FIXTURE_STACKS

    assert rent.main(["--stack", str(FIXTURE_STACKS / "Pulumi.gcp-gke.yaml")]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    # Spot g2-standard-8 at 0.27 (cluster-autoscaler's GCE table), 4 time-sliced slots: 0.0675 a slot.
    slots = r"timeSlicing +4 x nvidia\.com/gpu \(6 GiB\) +none"
    assert re.search(rf"{slots} +0\.27 +0\.068 +spot \(preemptible table\) us-central1$", rows["l4"])
    assert rows["h100-train"].endswith("n/a       n/a       no price data")
    assert rent.main(["--stack", "no-such-stack"]) == 2


def test_rent_table_rows_follow_the_hardware():
    rows = {(row[0], row[2]): row for row in rent_rows()}
    # No MIG on the A10G or the L40S; three MIG choices on the H100.
    assert [key for key in rows if key[1].startswith("mig")] == [
        ("`p5.48xlarge`", "mig 1g.10gb"),
        ("`p5.48xlarge`", "mig 3g.40gb"),
        ("`p5.48xlarge`", "mig all-balanced"),
    ]
    assert rows[("`g6e.12xlarge`", "mps x4")][3:6] == ("16", "16 x 12 GiB", "memory+compute limits")
    assert rows[("`p5.48xlarge`", "mig all-balanced")][3] == "32"


def test_the_operator_installs_the_charts_driver_unless_one_is_configured(cluster_raw):
    assert str(operator_driver(load_spec(cluster_raw).addon_versions)) == "595.91.07"
    cluster_raw["addonVersions"] = {"gpuOperator": "v26.3.3"}
    assert str(operator_driver(load_spec(cluster_raw).addon_versions)) == "580.126.20"
    cluster_raw["addonVersions"]["nvidiaDriver"] = "580.105.08"
    assert str(operator_driver(load_spec(cluster_raw).addon_versions)) == "580.105.08"


def test_a_platform_missing_from_the_registry_is_named_with_the_registered_ones(monkeypatch):
    monkeypatch.delitem(PLATFORMS, ("aws", "k3s"))
    with pytest.raises(ConfigError) as caught:
        load_spec(minimal_cluster(kind="k3s", kubernetesVersion="1.36"))
    (issue,) = caught.value.issues
    assert (issue.path, issue.problem, issue.fix) == (
        "gpu-k8s:cluster.kind",
        "does not exist on aws",
        "use one of: eks",
    )
