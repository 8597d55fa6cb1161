"""The programs under examples/ plan under the mock engine, as `gpu-k8s plan` runs them from their project."""

from __future__ import annotations

import pytest

from gpu_k8s.components.configbase import ConfigError
from gpu_k8s.tools.engine import load_project, run_program, stack_config
from tests.paths import REPO_ROOT

TEAM_QUOTA = REPO_ROOT / "examples" / "team-quota"


def plan_example(config_changes: dict | None = None):
    project = load_project(TEAM_QUOTA)
    config = {**stack_config(project.stack_dir / "Pulumi.dev.yaml", project), **(config_changes or {})}
    return run_program("dev", config, project=project)


@pytest.fixture(scope="module")
def team_quota():
    return plan_example()


def test_the_user_program_builds_the_library_platform(team_quota):
    (cluster,) = team_quota.by_type("aws:eks/cluster:Cluster")
    assert cluster.inputs["name"] == "research"
    pools = {r.name for r in team_quota.by_type("gpu-k8s:aws:GpuNodePool")}
    assert pools == {"research-gpu-l4", "research-gpu-a10g-notebooks"}
    assert team_quota.by_type("gpu-k8s:index:GpuOperator")


def test_its_own_resources_use_the_cluster_provider_after_the_system_nodes(team_quota):
    (library_provider,) = team_quota.by_type("pulumi:providers:kubernetes")
    system_nodes = [
        r for r in team_quota.by_type("aws:eks/nodeGroup:NodeGroup") if r.name.endswith("-system")
    ]
    assert system_nodes
    for own in (team_quota.by_name("ml-team"), team_quota.by_name("ml-team-gpus")):
        assert own.provider_urn == library_provider.urn
        assert {node.urn for node in system_nodes} <= set(own.dependencies)


def test_the_quota_is_the_team_share_of_the_pools_slots_at_max_nodes(team_quota):
    # l4: 6 nodes x 1 GPU; a10g-notebooks: 2 nodes x 4 time-sliced slots; half of 14.
    quota = team_quota.by_name("ml-team-gpus")
    assert quota.inputs["spec"] == {"hard": {"requests.nvidia.com/gpu": "7"}}
    assert quota.inputs["metadata"]["namespace"] == "ml-team"
    assert team_quota.outputs["teamNamespace"] == "ml-team"
    assert [pool["name"] for pool in team_quota.outputs["gpuPools"]] == ["l4", "a10g-notebooks"]


def test_the_library_still_refuses_bad_cluster_config_in_a_user_program():
    config = stack_config(TEAM_QUOTA / "stacks" / "Pulumi.dev.yaml", load_project(TEAM_QUOTA))
    cluster = {**config["gpu-k8s:cluster"], "kubernetesVersion": "1.20"}
    with pytest.raises(ConfigError, match=r"gpu-k8s:cluster\.kubernetesVersion"):
        plan_example({"gpu-k8s:cluster": cluster})
