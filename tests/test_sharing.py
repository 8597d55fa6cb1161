"""GPU sharing and driver/CUDA alignment: every rule refuses bad input at preview; good input reaches the
node labels, the device-plugin and MIG ConfigMaps, the operator values and the scale-from-zero templates."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpu_k8s.components.catalog import load_catalog
from gpu_k8s.components.compat import (
    CUDA_RELEASE_MINIMUM_DRIVER,
    DriverFacts,
    DriverVersion,
    PoolDriverCheck,
    driver_issues,
    newest_cuda_fully_supported,
)
from gpu_k8s.components.configbase import ConfigError
from gpu_k8s.components.sharing import MigGeometry, builtin_layouts
from gpu_k8s.components.spec import load_spec
from gpu_k8s.providers.aws.autoscaling import TEMPLATE_PREFIX
from gpu_k8s.tools.engine import Recording, run_program
from tests.conftest import Mutation, assert_refused_before_any_resource, minimal_cluster, set_path, some

# The example stack's pools by index: 0 l40s (g6e.xlarge, none), 1 a10g-shared (g5.xlarge, timeSlicing),
# 2 l4-mps (g6.12xlarge, mps), 3 h100 (p5.48xlarge, mig 1g.10gb).


def _mig(instance_type: str, **sharing: Any) -> Mutation:
    return set_path(
        "gpuPools.3",
        {"name": "mig", "instanceType": instance_type, "maxNodes": 1, "sharing": {"mode": "mig", **sharing}},
    )


def _extra_pools(*pools: dict[str, Any]) -> Mutation:
    return lambda cluster: cluster["gpuPools"].extend(pools)


# (id, mutation, key path the message must name, words the message must contain)
BAD_SHARING: list[tuple[str, Mutation, str, tuple[str, ...]]] = [
    *(
        (
            f"mig-on-{gpu}",
            _mig(instance_type, profile="1g.10gb"),
            "gpuPools[3].sharing.mode",
            ("has no MIG support", "none, timeSlicing, mps"),
        )
        for gpu, instance_type in (
            ("t4", "g4dn.xlarge"),
            ("a10g", "g5.xlarge"),
            ("l4", "g6.xlarge"),
            ("l40s", "g6e.xlarge"),
        )
    ),
    (
        "profile-of-another-gpu",
        _mig("p5e.48xlarge", profile="1g.10gb"),
        "gpuPools[3].sharing.profile",
        ("not a MIG profile of NVIDIA H200", "1g.18gb"),
    ),
    (
        "profile-variant-not-supported",
        set_path("gpuPools.3.sharing.profile", "1g.10gb+me"),
        "gpuPools[3].sharing.profile",
        ("not a MIG profile",),
    ),
    (
        "unknown-layout-name",
        _mig("p5.48xlarge", layout="all-fancy"),
        "sharing.layout",
        ("not a built-in", "all-balanced"),
    ),
    (
        "layout-over-compute",
        _mig("p5.48xlarge", layout={"3g.40gb": 2, "2g.20gb": 1}),
        "gpuPools[3].sharing.layout",
        ("uses 8 compute slices; the GPU has 7",),
    ),
    (
        "layout-over-memory",
        _mig("p5.48xlarge", layout={"3g.40gb": 2, "1g.10gb": 1}),
        "gpuPools[3].sharing.layout",
        ("uses 9 memory slices", "has 8"),
    ),
    (
        "layout-over-profile-maximum",
        _mig("p5.48xlarge", layout={"4g.40gb": 2}),
        "gpuPools[3].sharing.layout",
        ("4g.40gb fits at most 1 times",),
    ),
    ("layout-zero-count", _mig("p5.48xlarge", layout={"1g.10gb": 0}), "sharing.layout", ("at least 1",)),
    ("layout-not-a-mapping", _mig("p5.48xlarge", layout=5), "sharing.layout", ("built-in layout name",)),
    (
        "profile-and-layout",
        _mig("p5.48xlarge", profile="1g.10gb", layout="all-balanced"),
        "gpuPools[3].sharing.profile",
        ("exactly one of profile or layout",),
    ),
    ("neither-profile-nor-layout", _mig("p5.48xlarge"), "gpuPools[3].sharing.profile", ("exactly one",)),
    (
        "single-strategy-with-two-profiles",
        _mig("p5.48xlarge", layout="all-balanced", strategy="single"),
        "gpuPools[3].sharing.strategy",
        ("one profile on every GPU", "mixed"),
    ),
    (
        "single-pool-in-a-mixed-cluster",
        lambda c: (
            set_path("gpuPools.3.sharing.strategy", "single")(c),
            _extra_pools(
                {
                    "name": "h200",
                    "instanceType": "p5e.48xlarge",
                    "maxNodes": 1,
                    "sharing": {"mode": "mig", "layout": "all-balanced"},
                }
            )(c),
        ),
        "gpuPools[3].sharing.strategy",
        ("one MIG strategy per cluster", "['h200']"),
    ),
    (
        "builtin-name-means-two-layouts-with-a-custom-config",
        _extra_pools(
            {
                "name": "a100",
                "instanceType": "p4d.24xlarge",
                "maxNodes": 1,
                "sharing": {"mode": "mig", "profile": "1g.10gb"},
            },
            {
                "name": "custom",
                "instanceType": "p5.48xlarge",
                "maxNodes": 1,
                "sharing": {"mode": "mig", "layout": {"3g.40gb": 2}},
            },
        ),
        "gpuPools[5].sharing.layout",
        ("all-1g.10gb", '"h100"', "custom layout"),
    ),
    (
        "mps-on-mig-profile",
        set_path("gpuPools.2.sharing", {"mode": "mps", "replicas": 4, "profile": "1g.10gb"}),
        "gpuPools[2].sharing.profile",
        ("MPS does not run on MIG devices",),
    ),
    (
        "replicas-with-mig",
        set_path("gpuPools.3.sharing.replicas", 2),
        "gpuPools[3].sharing.replicas",
        ("belong to time-slicing and MPS, not to MIG",),
    ),
    (
        "replicas-one",
        set_path("gpuPools.1.sharing.replicas", 1),
        "gpuPools[1].sharing.replicas",
        ("must be 2-48",),
    ),
    (
        "replicas-zero",
        set_path("gpuPools.2.sharing.replicas", 0),
        "gpuPools[2].sharing.replicas",
        ("must be 2-48",),
    ),
    (
        "replicas-huge",
        set_path("gpuPools.1.sharing.replicas", 400),
        "gpuPools[1].sharing.replicas",
        ("must be 2-48",),
    ),
    (
        "replicas-missing",
        set_path("gpuPools.1.sharing", {"mode": "timeSlicing"}),
        "sharing.replicas",
        ("needs replicas",),
    ),
    (
        "mps-must-fail-requests-over-one",
        set_path("gpuPools.2.sharing.failRequestsGreaterThanOne", False),
        "gpuPools[2].sharing.failRequestsGreaterThanOne",
        ("always refuses MPS requests",),
    ),
    (
        "unknown-mode",
        set_path("gpuPools.1.sharing.mode", "timeslicing"),
        "gpuPools[1].sharing.mode",
        ("'timeSlicing'",),
    ),
    (
        "sharing-key-typo",
        set_path("gpuPools.1.sharing.replica", 4),
        "sharing.replica",
        ("did you mean replicas?",),
    ),
    ("pool-named-default", set_path("gpuPools.0.name", "default"), "gpuPools[0].name", ("outside any pool",)),
    ("cuda-unquoted", set_path("cuda", 12.8), "gpu-k8s:cluster.cuda", ("quote it",)),
    (
        "cuda-unknown-release",
        set_path("cuda", "12.7"),
        "gpu-k8s:cluster.cuda",
        ("not a CUDA release", "12.8"),
    ),
    ("pool-cuda-unknown", set_path("gpuPools.0.cuda", "14.0"), "gpuPools[0].cuda", ("not a CUDA release",)),
    (
        "cuda-13-on-volta",
        lambda c: (set_path("cuda", "13.0")(c), set_path("gpuPools.0.instanceType", "p3.2xlarge")(c)),
        "gpu-k8s:cluster.cuda",
        ('pool "l40s"', "CUDA 13 dropped", "V100", "set the pool's cuda"),
    ),
    (
        "driver-configured-on-a-node-image-platform",
        set_path("addonVersions", {"nvidiaDriver": "580.126.20"}),
        "addonVersions.nvidiaDriver",
        ("node image", "remove"),
    ),
    (
        "driver-malformed",
        set_path("addonVersions", {"nvidiaDriver": "latest"}),
        "nvidiaDriver",
        ("not an NVIDIA driver",),
    ),
    (
        "operator-below-toolkit-floor",
        set_path("addonVersions", {"gpuOperator": "v25.3.0"}),
        "addonVersions.gpuOperator",
        ("1.17.5", "1.17.8 floor", "CVE-2025-23266"),
    ),
    (
        "operator-unknown-release",
        set_path("addonVersions", {"gpuOperator": "v99.1.0"}),
        "addonVersions.gpuOperator",
        ("not a GPU Operator release", "v26.7.0"),
    ),
]


@pytest.mark.parametrize(
    ("mutation", "path", "words"), [c[1:] for c in BAD_SHARING], ids=[c[0] for c in BAD_SHARING]
)
def test_bad_sharing_or_compatibility_is_refused_before_any_resource(aws_eks_config, mutation, path, words):
    assert_refused_before_any_resource(aws_eks_config, mutation, path, words)


def test_a_pool_cuda_override_keeps_an_old_gpu_on_cuda_12(aws_eks_config):
    config = copy.deepcopy(aws_eks_config)
    config["gpu-k8s:cluster"]["cuda"] = "13.0"
    config["gpu-k8s:cluster"]["gpuPools"][0] |= {"instanceType": "p3.2xlarge", "cuda": "12.8"}
    # The platform check runs in the provider, so the override is proven by the whole program.
    recording = run_program("cuda-override", config)
    assert recording.by_name("ml-gpu-l40s-ng-0").inputs["instanceTypes"] == ["p3.2xlarge"]


def test_cuda_newer_than_the_eks_driver_runs_with_a_warning(aws_eks_config):
    config = copy.deepcopy(aws_eks_config)
    config["gpu-k8s:cluster"]["cuda"] = "13.2"
    recording = run_program("cuda-warning", config)
    cuda = [w for w in recording.warnings if w.startswith("gpu-k8s:cluster.cuda")]
    assert len(cuda) == len(config["gpu-k8s:cluster"]["gpuPools"])
    for warning in cuda:
        assert "CUDA 13.2 wants driver >= 595.45.04" in warning
        assert "driver 580.x installed by the node image" in warning
        assert "minor-version compatibility" in warning


def test_the_example_stack_warns_only_about_its_placeholder_api_cidr(aws_eks):
    (warning,) = aws_eks.warnings
    assert warning.startswith('gpu-k8s:cluster.apiAccessCidrs[0]: "203.0.113.0/24" - is an RFC 5737')


# --- driver/CUDA rules on a driver the GPU Operator installs (not reachable on EKS, whose driver is 580) ---

H100 = load_catalog().gpu_models["nvidia-h100-80gb"]
B300 = load_catalog().gpu_models["nvidia-b300"]


def _check(model=H100, cuda: str | None = "12.8", uses_mig: bool = False) -> PoolDriverCheck:
    return PoolDriverCheck(0, "p", model, uses_mig, cuda, cuda_is_pool_override=False)


@pytest.mark.parametrize(
    ("driver", "check", "errors", "warnings"),
    [
        ("595.91.07", _check(cuda="13.2"), [], []),
        ("580.126.20", _check(cuda="13.0"), [], []),
        ("580.126.20", _check(cuda="13.2"), [], ["minor-version compatibility"]),
        ("570.124.06", _check(cuda="13.0"), ["CUDA 13.x needs driver >= 580.x", "CUDA 12.8 or older"], []),
        ("550.54.15", _check(cuda="12.8"), [], ["wants driver >= 570.26"]),
        ("520.61.05", _check(cuda="12.0"), ["CUDA 12.x needs driver >= 525.60.13", "CUDA 11.8 or older"], []),
        (
            "570.124.06",
            _check(model=B300, cuda=None, uses_mig=True),
            ["MIG on NVIDIA B300", ">= 580.82.07"],
            [],
        ),
        ("580.126.20", _check(model=B300, cuda=None, uses_mig=True), [], []),
    ],
)
def test_operator_installed_driver_rules(minimal_spec, driver, check, errors, warnings):
    found_errors, found_warnings = driver_issues(
        minimal_spec.addon_versions, DriverFacts("gpu-operator", DriverVersion.parse(driver)), [check]
    )
    assert len(found_errors) == (1 if errors else 0), found_errors
    assert len(found_warnings) == (1 if warnings else 0), found_warnings
    for word in errors:
        assert word in str(found_errors[0])
    for word in warnings:
        assert word in str(found_warnings[0])
    if errors:
        assert "addonVersions.nvidiaDriver" in str(found_errors[0])


@pytest.mark.parametrize(
    ("check", "warned"),
    [
        (
            _check(model=B300, cuda=None, uses_mig=True),
            "MIG on NVIDIA B300 (Blackwell Ultra) needs driver >= 580.82.07",
        ),
        (_check(cuda="13.0"), "CUDA 13.0 wants driver >= 580.65.06"),
        (_check(cuda="12.8"), None),
    ],
)
def test_a_driver_known_only_by_branch_warns_on_same_branch_minimums(minimal_spec, check, warned):
    errors, warnings = driver_issues(
        minimal_spec.addon_versions, DriverFacts("node-image", DriverVersion.parse("580")), [check]
    )
    assert errors == []
    if warned is None:
        assert warnings == []
    else:
        (warning,) = warnings
        assert warned in str(warning) and "patch level is unconfirmed" in str(warning)
        assert "release notes" in warning.fix


@pytest.fixture
def minimal_spec():
    return load_spec(minimal_cluster())


def test_driver_versions_compare_by_branch_when_only_the_branch_is_known():
    assert DriverVersion.parse("580") >= DriverVersion.parse("580.65.06")
    assert DriverVersion.parse("580") < DriverVersion.parse("590.44.01")
    assert DriverVersion.parse("580.65.06") < DriverVersion.parse("580.95.05")
    assert DriverVersion.parse("570.26") < DriverVersion.parse("570.124.06")
    assert str(DriverVersion.parse("580")) == "580.x"


@given(st.tuples(*[st.integers(0, 999)] * 3), st.tuples(*[st.integers(0, 999)] * 3))
def test_exact_driver_versions_order_like_their_numbers(a, b):
    first, second = DriverVersion(a), DriverVersion(b)
    assert (first < second) == (a < b) and (first == second) == (a == b)


def test_newest_fully_supported_cuda_follows_the_table():
    assert newest_cuda_fully_supported(DriverVersion.parse("595.91.07")) == "13.2"
    assert newest_cuda_fully_supported(DriverVersion.parse("580")) == "13.0"
    assert newest_cuda_fully_supported(DriverVersion.parse("570.124.06")) == "12.8"
    assert newest_cuda_fully_supported(DriverVersion.parse("450.80.02")) is None
    assert set(CUDA_RELEASE_MINIMUM_DRIVER) >= {"12.8", "13.0"}


# --- MIG geometry ---


@pytest.mark.parametrize(
    ("model_id", "compute", "memory"),
    [
        ("nvidia-a100-40gb", 7, 8),
        ("nvidia-h100-80gb", 7, 8),
        ("nvidia-h200-141gb", 7, 8),
        ("nvidia-b300", 7, 8),
        ("nvidia-a30", 4, 4),
        ("nvidia-rtx-pro-6000-blackwell-server", 4, 4),
        ("nvidia-rtx-pro-4500-blackwell", 2, 2),
    ],
)
def test_mig_geometry_matches_nvidia_slice_counts(model_id, compute, memory):
    geometry = MigGeometry.of(load_catalog().gpu_models[model_id])
    assert (geometry.compute_slices, geometry.memory_slices) == (compute, memory)


def test_every_builtin_single_profile_layout_fills_at_most_one_gpu():
    for model in load_catalog().gpu_models.values():
        if model.mig_capable:
            geometry = MigGeometry.of(model)
            for name, devices in builtin_layouts(model).items():
                assert geometry.misfit(devices) is None, (model.id, name)


# --- what good input renders (graph tests) ---


def _node_group(rec: Recording, pool: str) -> dict[str, Any]:
    return rec.by_name(f"ml-gpu-{pool}-ng-0").inputs


def _template(rec: Recording, pool: str) -> dict[str, str]:
    group = rec.by_name(f"ml-gpu-{pool}-ng-0")
    tags = [r for r in rec.by_type("aws:autoscaling/tag:Tag") if group.urn in r.dependencies]
    return {
        t.inputs["tag"]["key"].removeprefix(f"{TEMPLATE_PREFIX}/"): t.inputs["tag"]["value"] for t in tags
    }


def test_nodes_carry_their_device_plugin_and_mig_config_labels(mixed_sharing):
    expected = {"h100": "custom-h100", "h200": "all-balanced", "a100": "all-3g.20gb", "ts": None}
    for pool, layout in expected.items():
        labels = _node_group(mixed_sharing, pool)["labels"]
        assert labels["nvidia.com/device-plugin.config"] == pool
        assert labels.get("nvidia.com/mig.config") == layout
        template = _template(mixed_sharing, pool)
        assert template["label/nvidia.com/device-plugin.config"] == pool
        assert template.get("label/nvidia.com/mig.config") == layout


def test_scale_from_zero_templates_advertise_what_a_new_node_offers(mixed_sharing):
    def resources(pool: str) -> dict[str, str]:
        found = {
            k.removeprefix("resources/"): v
            for k, v in _template(mixed_sharing, pool).items()
            if k.startswith("resources/")
        }
        assert found.pop("ephemeral-storage") == "170Gi"  # 85% of the pools' default 200 GiB root volume
        return found

    # 8 GPUs per node each; mixed strategy (the cluster has multi-profile layouts): one resource per profile.
    assert resources("h100") == {"nvidia.com/mig-1g.10gb": "24", "nvidia.com/mig-4g.40gb": "8"}
    assert resources("h200") == {
        "nvidia.com/mig-1g.18gb": "16",
        "nvidia.com/mig-2g.35gb": "8",
        "nvidia.com/mig-3g.71gb": "8",
    }
    assert resources("a100") == {"nvidia.com/mig-3g.20gb": "16"}
    # renameByDefault advertises the time-sliced replicas as nvidia.com/gpu.shared.
    assert resources("ts") == {"nvidia.com/gpu.shared": "3"}


def test_pools_without_a_whole_gpu_resource_go_without_the_autoscaler_gpu_label(mixed_sharing, aws_eks):
    for pool in ("h100", "h200", "a100", "ts"):
        assert "k8s.amazonaws.com/accelerator" not in _node_group(mixed_sharing, pool)["labels"]
    gpu_groups = [g for g in aws_eks.by_type("aws:eks/nodeGroup:NodeGroup") if g.name != "ml-system"]
    for group in some(gpu_groups, at_least=4):
        assert "k8s.amazonaws.com/accelerator" in group.inputs["labels"]


def _config_maps(rec: Recording) -> dict[str, dict[str, Any]]:
    return {r.name: r.inputs for r in rec.by_type("kubernetes:core/v1:ConfigMap")}


def test_operator_gets_device_plugin_and_custom_mig_configs(mixed_sharing):
    maps = _config_maps(mixed_sharing)
    device_plugin = maps["ml-gpu-operator-device-plugin-config"]
    mig = maps["ml-gpu-operator-mig-config"]
    assert device_plugin["metadata"]["namespace"] == mig["metadata"]["namespace"] == "gpu-operator"
    configs = {key: yaml.safe_load(text) for key, text in device_plugin["data"].items()}
    assert set(configs) == {"default", "h100", "h200", "a100", "ts"}
    assert configs["default"] == configs["h100"] == {"version": "v1"}
    assert configs["ts"]["sharing"]["timeSlicing"] == {
        "renameByDefault": True,
        "resources": [{"name": "nvidia.com/gpu", "replicas": 3}],
    }
    parted = yaml.safe_load(mig["data"]["config.yaml"])
    assert parted["mig-configs"] == {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "custom-h100": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 3, "4g.40gb": 1}}],
        "all-balanced": [
            {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}}
        ],
        "all-3g.20gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}],
    }
    release = mixed_sharing.by_name("ml-gpu-operator-release")
    values = release.inputs["values"]
    # The ConfigMaps are auto-named (a new name on every change rolls the device plugin out again).
    assert "name" not in device_plugin["metadata"]
    assert values["devicePlugin"]["config"]["name"].startswith("ml-gpu-operator-device-plugin-config-")
    assert values["devicePlugin"]["config"]["default"] == "default"
    assert values["mig"] == {"strategy": "mixed"}
    assert values["migManager"]["env"] == [{"name": "WITH_REBOOT", "value": "true"}]
    assert values["migManager"]["config"]["name"].startswith("ml-gpu-operator-mig-config-")
    assert values["migManager"]["config"]["default"] == "all-disabled"
    for name in ("ml-gpu-operator-device-plugin-config", "ml-gpu-operator-mig-config"):
        assert mixed_sharing.by_name(name).urn in release.dependencies


def test_built_in_layouts_need_no_custom_mig_config(aws_eks):
    operator_maps = {name for name in _config_maps(aws_eks) if name.startswith("ml-gpu-operator-")}
    assert operator_maps == {"ml-gpu-operator-device-plugin-config"}
    values = aws_eks.by_name("ml-gpu-operator-release").inputs["values"]
    assert "config" not in values["migManager"]


def test_a_cluster_without_mig_leaves_the_mig_manager_alone(aws_eks_config):
    config = copy.deepcopy(aws_eks_config)
    config["gpu-k8s:cluster"]["gpuPools"] = config["gpu-k8s:cluster"]["gpuPools"][:3]
    values = run_program("no-mig", config).by_name("ml-gpu-operator-release").inputs["values"]
    assert "mig" not in values and "migManager" not in values


def test_every_problem_of_every_pool_is_reported_at_once(cluster_raw):
    cluster_raw["gpuPools"][1]["sharing"]["replicas"] = 1
    cluster_raw["gpuPools"][3]["sharing"]["profile"] = "9g.99gb"
    with pytest.raises(ConfigError) as caught:
        load_spec(cluster_raw)
    assert {issue.path for issue in caught.value.issues} == {
        "gpu-k8s:cluster.gpuPools[1].sharing.replicas",
        "gpu-k8s:cluster.gpuPools[3].sharing.profile",
    }
