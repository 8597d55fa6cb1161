"""Config validation: every bad input is refused at preview, names its key and registers nothing."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_k8s.components.configbase import ConfigError
from gpu_k8s.components.spec import load_spec, pool_child_name
from gpu_k8s.tools.engine import run_program
from tests.conftest import (
    Mutation,
    assert_refused_before_any_resource,
    delete_key,
    minimal_cluster,
    set_path,
    some,
)
from tests.paths import REPO_ROOT

# A gcp/k3s cluster written with GKE's network keys.
GCP_K3S_WITH_GKE_NETWORK = {
    "cloud": "gcp",
    "kind": "k3s",
    "kubernetesVersion": "1.36",
    "network": {
        "cidr": "10.40.0.0/20",
        "podsCidr": "10.64.0.0/14",
        "servicesCidr": "10.68.0.0/20",
        "zones": ["us-central1-a"],
    },
    "systemPool": {"instanceType": "e2-standard-4", "nodes": 1},
    "gpuPools": [{"name": "l4", "instanceType": "g2-standard-8", "maxNodes": 2}],
}

# (id, mutation, key path the message must name, words the message must contain)
BAD_CONFIGS: list[tuple[str, Mutation, str, tuple[str, ...]]] = [
    (
        "unknown-top-level-key",
        set_path("gpuPool", []),
        "gpu-k8s:cluster.gpuPool",
        ("unknown key", "gpuPools"),
    ),
    (
        "typo-in-pool-key",
        set_path("gpuPools.0.minNodez", 1),
        "gpuPools[0].minNodez",
        ("did you mean minNodes?",),
    ),
    (
        "decided-key",
        set_path("gpuPools.0.amiType", "BOTTLEROCKET_x86_64_NVIDIA"),
        "gpuPools[0].amiType",
        ("Bottlerocket",),
    ),
    (
        "duplicate-pool-names",
        set_path("gpuPools.1.name", "l40s"),
        "gpuPools[1].name",
        ("duplicates gpuPools[0]",),
    ),
    ("min-greater-than-max", set_path("gpuPools.0.minNodes", 5), "gpuPools[0].minNodes", ("maxNodes (4)",)),
    (
        "max-below-one",
        set_path("gpuPools.0.maxNodes", 0),
        "gpuPools[0].maxNodes",
        ("must be at least 1",),
    ),
    (
        "negative-min",
        set_path("gpuPools.0.minNodes", -1),
        "gpuPools[0].minNodes",
        ("must be at least 0",),
    ),
    (
        "instance-type-typo",
        set_path("gpuPools.0.instanceType", "g5.xlarg"),
        "gpuPools[0].instanceType",
        ("g5.xlarge",),
    ),
    (
        "cpu-instance-type",
        set_path("gpuPools.0.instanceType", "m5.large"),
        "gpuPools[0].instanceType",
        ("GPU type", "did you mean"),
    ),
    (
        "fractional-gpu",
        set_path("gpuPools.0.instanceType", "g6f.large"),
        "gpuPools[0].instanceType",
        ("fractional",),
    ),
    (
        "gcp-type-on-aws",
        set_path("gpuPools.0.instanceType", "a2-highgpu-1g"),
        "gpuPools[0].instanceType",
        ("not a GPU type of aws",),
    ),
    ("kubernetes-too-old", set_path("kubernetesVersion", "1.31"), "kubernetesVersion", ("1.33-1.36",)),
    ("kubernetes-too-new", set_path("kubernetesVersion", "1.37"), "kubernetesVersion", ("1.33-1.36",)),
    ("kubernetes-unquoted", set_path("kubernetesVersion", 1.35), "kubernetesVersion", ("quote it",)),
    ("kubernetes-patch", set_path("kubernetesVersion", "1.35.2"), "kubernetesVersion", ("minor version",)),
    (
        "malformed-vpc-cidr",
        set_path("network.cidr", "10.40.0.0/33"),
        "network.cidr",
        ("not a valid IPv4 CIDR",),
    ),
    ("vpc-cidr-host-bits", set_path("network.cidr", "10.40.0.1/16"), "network.cidr", ("host bits",)),
    ("vpc-cidr-too-small", set_path("network.cidr", "10.40.0.0/24"), "network.cidr", ("/16 to /20",)),
    (
        "cidr-and-vpc-id",
        set_path("network.vpcId", "vpc-0123456789abcdef0"),
        "network",
        ("exclude each other",),
    ),
    (
        "api-open-to-world",
        set_path("apiAccessCidrs", ["0.0.0.0/0"]),
        "apiAccessCidrs[0]",
        ("whole internet", "allowPublicApiFromAnywhere"),
    ),
    (
        "api-cidr-without-prefix",
        set_path("apiAccessCidrs", ["203.0.113.7"]),
        "apiAccessCidrs[0]",
        ("prefix length",),
    ),
    ("api-cidrs-empty", set_path("apiAccessCidrs", []), "apiAccessCidrs", ("at least 1",)),
    (
        "gpu-disk-too-small",
        set_path("gpuPools.0.diskSizeGiB", 20),
        "gpuPools[0].diskSizeGiB",
        ("at least 50",),
    ),
    ("pool-name-not-a-label", set_path("gpuPools.0.name", "L40S_pool"), "gpuPools[0].name", ("DNS label",)),
    ("cluster-name-invalid", set_path("name", "ML_cluster"), "gpu-k8s:cluster.name", ("DNS label",)),
    (
        "reserved-label-prefix",
        set_path("gpuPools.0.labels", {"node.kubernetes.io/role": "x"}),
        "gpuPools[0].labels.node.kubernetes.io/role",
        ("reserved prefix",),
    ),
    (
        "bad-label-value",
        set_path("gpuPools.0.labels", {"team": "a b"}),
        "gpuPools[0].labels.team",
        ("label value",),
    ),
    (
        "bad-taint-effect",
        set_path("gpuPools.0.taints", [{"key": "team", "effect": "NoSchedul"}]),
        "gpuPools[0].taints[0].effect",
        ("NoSchedule",),
    ),
    (
        "duplicate-gpu-taint",
        set_path("gpuPools.0.taints", [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
        "gpuPools[0].taints[0].key",
        ("already",),
    ),
    (
        "bad-duration",
        set_path("gpuPools.0.scaleDownUnneededTime", "5 minutes"),
        "scaleDownUnneededTime",
        ("duration",),
    ),
    ("no-gpu-pools", delete_key("gpuPools"), "gpu-k8s:cluster.gpuPools", ("missing",)),
    ("empty-gpu-pools", set_path("gpuPools", []), "gpu-k8s:cluster.gpuPools", ("at least 1",)),
    ("kind-not-on-cloud", set_path("kind", "gke"), "gpu-k8s:cluster.kind", ("does not exist on aws",)),
    ("unknown-cloud", set_path("cloud", "azure"), "gpu-k8s:cluster.cloud", ("'aws' or 'gcp'",)),
    (
        "k3s-with-vpc-native-ranges",
        lambda cluster: cluster.update(GCP_K3S_WITH_GKE_NETWORK),
        "gpu-k8s:cluster.network.podsCidr",
        ("k3s gives pods and services addresses itself", "10.42.0.0/16", "gcp/k3s network keys"),
    ),
    (
        "k3s-vpc-overlaps-pod-range",
        lambda cluster: cluster.update(
            {**GCP_K3S_WITH_GKE_NETWORK, "network": {"cidr": "10.42.0.0/20", "zones": ["us-central1-a"]}}
        ),
        "gpu-k8s:cluster.network.cidr",
        ("overlaps k3s's pod range 10.42.0.0/16", "10.40.0.0/16"),
    ),
    (
        "gpu-type-not-on-eks-ami",
        set_path("gpuPools.0.instanceType", "g7.2xlarge"),
        "gpuPools[0].instanceType",
        ("AL2023 NVIDIA AMI", "g7e"),
    ),
    (
        "node-group-name-too-long",
        lambda c: (set_path("name", "c" * 32)(c), set_path("gpuPools.0.name", "p" * 40)(c)),
        "gpuPools[0].name",
        ("longer than 63", "at most 13"),
    ),
    (
        "system-pool-size",
        set_path("systemPool.nodes", 0),
        "systemPool.nodes",
        ("must be at least 1",),
    ),
    (
        "system-type-not-an-ec2-name",
        set_path("systemPool.instanceType", "m7i_large"),
        "systemPool.instanceType",
        ("not an EC2 instance type name", "m7i.large"),
    ),
    (
        "label-key-not-a-kubernetes-key",
        set_path("gpuPools.0.labels", {"team name": "ml"}),
        "gpuPools[0].labels.team name",
        ("not a valid Kubernetes label/taint key",),
    ),
    ("network-empty", set_path("network", {}), "gpu-k8s:cluster.network", ("neither cidr nor vpcId",)),
    (
        "subnet-ids-with-cidr",
        set_path("network.privateSubnetIds", ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]),
        "gpu-k8s:cluster.network",
        ("only used with vpcId",),
    ),
    (
        "existing-vpc-one-private-subnet",
        set_path(
            "network",
            {
                "vpcId": "vpc-0123456789abcdef0",
                "privateSubnetIds": ["subnet-0123456789abcdef0"],
                "publicSubnetIds": ["subnet-0123456789abcdef2", "subnet-0123456789abcdef3"],
            },
        ),
        "network.privateSubnetIds",
        ("at least 2 private subnets",),
    ),
    (
        "eks-admin-is-a-session-arn",
        set_path("eks", {"admins": ["arn:aws:sts::123456789012:assumed-role/deployer/ci"]}),
        "eks.admins[0]",
        ("not the ARN of an IAM role or user", "role's ARN"),
    ),
    (
        "eks-admin-listed-twice",
        set_path("eks", {"admins": ["arn:aws:iam::123456789012:role/a", "arn:aws:iam::123456789012:role/a"]}),
        "eks.admins[1]",
        ("is the principal of eks.admins[0]",),
    ),
    (
        "eks-admin-twice-in-two-cases",
        set_path(
            "eks", {"admins": ["arn:aws:iam::123456789012:role/Ops", "arn:aws:iam::123456789012:role/ops"]}
        ),
        "eks.admins[1]",
        ("IAM names ignore case",),
    ),
    (
        "eks-admin-without-a-name",
        set_path("eks", {"admins": ["arn:aws:iam::123456789012:role/"]}),
        "eks.admins[0]",
        ("a name of 1-64 characters",),
    ),
    (
        "eks-admin-name-over-64",
        set_path("eks", {"admins": ["arn:aws:iam::123456789012:role/" + "r" * 65]}),
        "eks.admins[0]",
        ("a name of 1-64 characters",),
    ),
    (
        "eks-admin-in-another-partition",
        set_path("eks", {"admins": ["arn:aws-cn:iam::123456789012:role/ops"]}),
        "eks.admins[0]",
        ("is in partition aws-cn, but the stack's region is in aws",),
    ),
    ("vpc-cidr-multicast", set_path("network.cidr", "224.1.0.0/16"), "network.cidr", ("hosts can have",)),
    ("vpc-cidr-this-network", set_path("network.cidr", "0.0.0.0/16"), "network.cidr", ("hosts can have",)),
    ("vpc-cidr-link-local", set_path("network.cidr", "169.254.0.0/16"), "network.cidr", ("hosts can",)),
    ("vpc-cidr-reserved", set_path("network.cidr", "240.0.0.0/16"), "network.cidr", ("hosts can have",)),
    ("vpc-cidr-documentation", set_path("network.cidr", "198.51.96.0/20"), "network.cidr", ("RFC 5737",)),
    (
        "vpc-id-empty",
        set_path("network", {"vpcId": "", "privateSubnetIds": ["subnet-0a", "subnet-0b"]}),
        "network.vpcId",
        ("not a VPC ID",),
    ),
    (
        "subnet-id-malformed",
        set_path("network", {"vpcId": "vpc-0123456789abcdef0", "privateSubnetIds": ["subnet-1", "x"]}),
        "network.privateSubnetIds[1]",
        ("not a subnet ID",),
    ),
    (
        "subnet-listed-twice",
        set_path(
            "network",
            {
                "vpcId": "vpc-0123456789abcdef0",
                "privateSubnetIds": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
                "publicSubnetIds": ["subnet-0123456789abcdef1"],
            },
        ),
        "network.publicSubnetIds[0]",
        ("is listed already in network.privateSubnetIds", "list each subnet once"),
    ),
    (
        "two-subnet-ids-that-are-one",
        set_path(
            "network",
            {
                "vpcId": "vpc-01234567",
                "privateSubnetIds": ["subnet-01234567", "subnet-01234567"],
            },
        ),
        "network.privateSubnetIds",
        ("at least 2 private subnets",),
    ),
    (
        "api-open-to-world-in-halves",
        set_path("apiAccessCidrs", ["0.0.0.0/1", "128.0.0.0/1"]),
        "gpu-k8s:cluster.apiAccessCidrs: [",
        ("whole internet (the ranges add up to it)", "allowPublicApiFromAnywhere"),
    ),
    (
        "autoscaler-chart-version-empty",
        set_path("addonVersions", {"clusterAutoscaler": ""}),
        "addonVersions.clusterAutoscaler",
        ("not a chart version",),
    ),
    (
        "capitalised-section",
        set_path("K3s", {}),
        "gpu-k8s:cluster.K3s",
        ("did you mean k3s?",),
    ),
    (
        "labels-beyond-the-asg-tag-limit",
        set_path("gpuPools.0.labels", {f"team.example.com/l{i}": "x" for i in range(45)}),
        "gpuPools[0].labels",
        ("its 45 labels", "56 tags", "at most 50", "drop at least 6"),
    ),
    (
        "mig-layout-with-an-unknown-profile",
        set_path("gpuPools.3.sharing", {"mode": "mig", "layout": {"9g.99gb": 1}}),
        "gpuPools[3].sharing.layout",
        ("unknown profiles 9g.99gb", "1g.10gb"),
    ),
]


@pytest.mark.parametrize(
    ("mutation", "path", "words"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_bad_config_is_refused_before_any_resource(aws_eks_config, mutation, path, words):
    assert_refused_before_any_resource(aws_eks_config, mutation, path, words)


def test_missing_region_is_refused_before_any_resource(aws_eks_config):
    config = {k: v for k, v in aws_eks_config.items() if k != "aws:region"}
    with pytest.raises(ConfigError, match="aws:region"):
        run_program("no-region", config)


@pytest.mark.parametrize(("raw", "problem"), [(None, "is not set"), ("ml", "must be a mapping")])
def test_a_missing_or_malformed_cluster_key_is_refused(raw, problem):
    with pytest.raises(ConfigError) as caught:
        load_spec(raw)
    (issue,) = caught.value.issues
    assert (issue.path, issue.problem) == ("gpu-k8s:cluster", problem)
    assert "stacks/Pulumi.<stack>.yaml" in issue.fix


def test_every_problem_is_reported_at_once(cluster_raw):
    cluster_raw["gpuPools"][0]["minNodes"] = 9
    cluster_raw["gpuPools"][1]["instanceType"] = "m5.large"
    cluster_raw["kubernetesVersion"] = "1.30"
    with pytest.raises(ConfigError) as caught:
        load_spec(cluster_raw)
    paths = {issue.path for issue in caught.value.issues}
    assert {
        "gpu-k8s:cluster.gpuPools[0].minNodes",
        "gpu-k8s:cluster.gpuPools[1].instanceType",
        "gpu-k8s:cluster.kubernetesVersion",
    } <= paths


def test_example_stack_parses_with_documented_defaults(cluster_raw):
    spec = load_spec(cluster_raw)
    l40s, h100 = spec.gpu_pools[0], spec.gpu_pools[-1]
    assert (l40s.min_nodes, l40s.max_nodes, l40s.spot, l40s.disk_size_gib) == (0, 4, True, 200)
    assert (h100.disk_size_gib, h100.scale_down_unneeded_time) == (500, "5m")
    assert spec.addon_versions.gpu_operator == "v26.7.0"


def test_spec_is_immutable(cluster_raw):
    spec = load_spec(cluster_raw)
    with pytest.raises(Exception, match="frozen"):
        spec.name = "other"  # type: ignore[misc]


def test_public_api_needs_the_explicit_opt_in(cluster_raw):
    cluster_raw["apiAccessCidrs"] = ["0.0.0.0/0"]
    cluster_raw["allowPublicApiFromAnywhere"] = True
    assert load_spec(cluster_raw).api_access_cidrs == ("0.0.0.0/0",)


# "default" is refused: it names the device-plugin config of GPU nodes outside any pool.
pool_names = st.from_regex(r"[a-z][a-z0-9]{0,10}(-[a-z0-9]{1,8})?", fullmatch=True).filter(
    lambda n: n != "default"
)


@given(st.lists(pool_names, min_size=1, max_size=12, unique=True))
def test_distinct_pools_get_distinct_child_names(names):
    assert len({pool_child_name("ml", n) for n in names}) == len(names)


@given(st.lists(pool_names, min_size=1, max_size=6, unique=True))
def test_valid_pool_names_always_load(names):
    pools = [{"name": n, "instanceType": "g6.xlarge", "maxNodes": 1} for n in names]
    assert [p.name for p in load_spec(minimal_cluster(gpuPools=pools)).gpu_pools] == names


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(pool_names, min_size=1, max_size=5, unique=True))
def test_generated_pools_register_unique_resources_named_after_their_pool(aws_eks_config, names):
    config = copy.deepcopy(aws_eks_config)
    config["gpu-k8s:cluster"]["gpuPools"] = [
        {"name": n, "instanceType": "g6.xlarge", "maxNodes": 1} for n in names
    ]
    first = run_program("pools", config)
    urns = [r.urn for r in first.registrations]
    assert len(urns) == len(set(urns))
    for name in names:
        assert first.by_name(pool_child_name("ml", name)).type == "gpu-k8s:aws:GpuNodePool"
    # Removing a pool leaves every other pool's resources under the same names.
    if len(names) > 1:
        config["gpu-k8s:cluster"]["gpuPools"] = config["gpu-k8s:cluster"]["gpuPools"][1:]
        second = run_program("pools", config)
        kept = {r.urn for r in second.registrations if r.name.startswith(pool_child_name("ml", names[1]))}
        assert kept and kept <= set(urns)


def test_every_config_key_is_documented_in_the_stacks_readme():
    """Each key any platform (or the existing-cluster layer) reads appears in stacks/README.md in backticks,
    alone or in a mapping such as `{key, value, effect}`."""
    import re

    from pydantic import BaseModel

    from gpu_k8s.components.spec import _registered, _structure_model
    from gpu_k8s.providers.aws.existing import ExistingEksSpec

    def keys(model: type[BaseModel]) -> set[str]:
        found = set()
        for name, field in model.model_fields.items():
            found.add(field.alias or name)
            for arg in getattr(field.annotation, "__args__", ()) or (field.annotation,):
                for inner in getattr(arg, "__args__", ()) or (arg,):
                    if isinstance(inner, type) and issubclass(inner, BaseModel):
                        found |= keys(inner)
        return found

    readme = (REPO_ROOT / "stacks" / "README.md").read_text()
    quoted = " ".join(re.findall(r"`[^`\n]+`", readme))
    every_key = some(keys(_structure_model(_registered())) | keys(ExistingEksSpec), at_least=80)
    assert sorted(k for k in every_key if not re.search(rf"[`{{ ,.]{re.escape(k)}[`}}:,\[ ]", quoted)) == []
