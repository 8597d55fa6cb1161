"""The programs under examples/ plan under the mock engine, as `gpu-k8s plan` runs them from their project."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpu_k8s.components.catalog import load_catalog
from gpu_k8s.components.configbase import ConfigError
from gpu_k8s.components.queued_gpus import OPT_OUT_LABEL
from gpu_k8s.components.spec import SUPPORTED_KUBERNETES_MINORS
from gpu_k8s.tools.engine import Secret, load_project, run_program, stack_config
from tests.conftest import some
from tests.paths import REPO_ROOT
from tests.test_charts import crd_schemas, validate_custom_resource

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
    # Capped by its quota, not the queues: it opts out of batch's queued-GPU policy (components/queued_gpus).
    from gpu_k8s.components.queued_gpus import OPT_OUT_LABEL, OPT_OUT_VALUE

    (namespace,) = [r for r in team_quota.by_type("kubernetes:core/v1:Namespace") if r.name == "ml-team"]
    assert namespace.inputs["metadata"]["labels"] == {OPT_OUT_LABEL: OPT_OUT_VALUE}
    assert team_quota.outputs["teamNamespace"] == "ml-team"
    assert [pool["name"] for pool in team_quota.outputs["gpuPools"]] == ["l4", "a10g-notebooks"]


def test_the_library_still_refuses_bad_cluster_config_in_a_user_program():
    config = stack_config(TEAM_QUOTA / "stacks" / "Pulumi.dev.yaml", load_project(TEAM_QUOTA))
    cluster = {**config["gpu-k8s:cluster"], "kubernetesVersion": "1.20"}
    with pytest.raises(ConfigError, match=r"gpu-k8s:cluster\.kubernetesVersion"):
        plan_example({"gpu-k8s:cluster": cluster})


EXISTING_EKS = REPO_ROOT / "examples" / "existing-eks"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"


class _ExistingCluster:
    """The realistic mocks, with EKS's description of the existing cluster changed field by field."""

    def __init__(self, **cluster: Any):
        from gpu_k8s.tools.engine import RealisticMocks

        self.inner = RealisticMocks()
        self.cluster = cluster

    def new_resource(self, args):
        return self.inner.new_resource(args)

    def call(self, args):
        answer, failures = self.inner.call(args)
        if args.token == "aws:eks/getCluster:getCluster":
            answer = {**answer, **self.cluster}
        return answer, failures


def plan_existing_eks(layer_changes: dict | None = None, mocks=None):
    project = load_project(EXISTING_EKS)
    config = stack_config(project.stack_dir / "Pulumi.dev.yaml", project)
    config["gpu-k8s:gpuLayer"] = {**config["gpu-k8s:gpuLayer"], **(layer_changes or {})}
    return run_program("dev", config, project=project, mocks=mocks)


@pytest.fixture(scope="module")
def existing_eks():
    return plan_existing_eks()


def test_the_gpu_layer_creates_nothing_of_the_cluster_itself(existing_eks):
    kinds = {r.type for r in existing_eks.registrations}
    for absent in (
        "aws:eks/cluster:Cluster",
        "aws:ec2/vpc:Vpc",
        "aws:ec2/subnet:Subnet",
        "aws:eks/addon:Addon",
    ):
        assert absent not in kinds
    assert {r.name for r in existing_eks.by_type("gpu-k8s:aws:GpuNodePool")} == {
        "gpus-gpu-l4",
        "gpus-gpu-a10g-shared",
    }


def test_its_node_groups_join_the_named_cluster_in_the_listed_subnets(existing_eks):
    """The layer's own subnets, not the cluster's list (review-aws.md AN-A3: it often holds public ones)."""
    from gpu_k8s.tools.engine import RealisticMocks

    cluster = RealisticMocks().call(
        type("Args", (), {"token": "aws:eks/getCluster:getCluster", "args": {"name": "prod"}})()
    )[0]
    listed = {"subnet-0b2c3d4e5f6071829", "subnet-0d4e5f60718293a41", "subnet-0a1b2c3d4e5f60718"}
    groups = some(existing_eks.by_type(NODE_GROUP), at_least=4)
    for group in groups:
        assert group.inputs["clusterName"] == "prod"
        assert group.inputs["version"] == "1.35"
        (subnet,) = group.inputs["subnetIds"]
        assert subnet in listed and subnet not in cluster["vpcConfig"]["subnetIds"]
        assert group.inputs["scalingConfig"]["minSize"] == 0
    (association,) = existing_eks.by_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    assert association.inputs["clusterName"] == "prod"


def test_the_operator_and_autoscaler_reach_the_cluster_through_its_endpoint(existing_eks):
    (provider,) = existing_eks.by_type("pulumi:providers:kubernetes")
    assert isinstance(provider.inputs["kubeconfig"], Secret)
    kubeconfig = json.loads(provider.inputs["kubeconfig"].value)
    assert kubeconfig["clusters"][0]["cluster"]["server"].endswith(".gr7.us-east-1.eks.amazonaws.com")
    token_command = kubeconfig["users"][0]["user"]["exec"]["args"]
    assert "prod" in token_command and "us-east-1" in token_command
    releases = {r.inputs["chart"]: r for r in existing_eks.by_type("kubernetes:helm.sh/v3:Release")}
    assert set(releases) == {"gpu-operator", "cluster-autoscaler"}
    for release in releases.values():
        assert release.provider_urn == provider.urn
    assert releases["cluster-autoscaler"].inputs["values"]["autoDiscovery"]["clusterName"] == "prod"


def test_the_autoscaler_leaves_the_clusters_own_node_groups_alone(existing_eks):
    """review-aws.md AN-B2: EKS tags every managed node group of a cluster `k8s.io/cluster-autoscaler/
    enabled` and `.../<cluster>`; discovering by those, the layer's autoscaler would adopt and scale down the
    cluster's other groups. It discovers its own tag only, every group of the layer carries it, and its role
    may resize only groups with it. AN-A2: it runs on any node (the cluster's carry no label of ours)."""
    layer_tag = "gpu-k8s.io/autoscale/gpus"
    cluster_tag = "k8s.io/cluster-autoscaler/prod"
    (release,) = [
        r
        for r in existing_eks.by_type("kubernetes:helm.sh/v3:Release")
        if r.inputs["chart"] == "cluster-autoscaler"
    ]
    values = release.inputs["values"]
    # Both tags: a layer of the same name on another cluster of the account carries the layer's tag too.
    assert values["autoDiscovery"] == {"clusterName": "prod", "tags": [cluster_tag, layer_tag]}
    assert "nodeSelector" not in values
    groups = existing_eks.by_type(NODE_GROUP)
    tagged = [
        r.inputs["tag"]
        for r in existing_eks.by_type("aws:autoscaling/tag:Tag")
        if r.inputs["tag"]["key"] == layer_tag
    ]
    assert len(tagged) == len(groups) >= 4
    assert all(tag["value"] == "owned" and not tag["propagateAtLaunch"] for tag in tagged)
    (policy,) = [
        json.loads(r.inputs["policy"])
        for r in existing_eks.by_type("aws:iam/rolePolicy:RolePolicy")
        if "autoscaler" in r.name
    ]
    writes = [s for s in policy["Statement"] if "autoscaling:SetDesiredCapacity" in s["Action"]]
    assert [s["Condition"] for s in writes] == [
        {"StringEquals": {f"aws:ResourceTag/{cluster_tag}": "owned", f"aws:ResourceTag/{layer_tag}": "owned"}}
    ]


def test_the_example_projects_refresh_before_every_operation():
    """review-aws.md AN-B3: the autoscaler owns the groups' sizes, which the program ignores; only a
    refreshed state holds the running size."""
    for example in (EXISTING_EKS, REPO_ROOT / "examples" / "team-quota"):
        assert yaml.safe_load((example / "Pulumi.yaml").read_text())["options"]["refresh"] == "always"


def test_listed_subnets_are_the_groups_and_two_in_one_zone_are_refused(existing_eks):
    chosen = ["subnet-0a1b2c3d4e5f60718", "subnet-0b2c3d4e5f6071829"]
    recording = plan_existing_eks({"subnetIds": chosen})
    subnets = {subnet for group in recording.by_type(NODE_GROUP) for subnet in group.inputs["subnetIds"]}
    assert subnets <= set(chosen) and subnets
    # The mock account places subnet-0a1b... and subnet-0c3d... in one zone (us-east-1c, use1-az3).
    with pytest.raises(ConfigError) as caught:
        plan_existing_eks({"subnetIds": ["subnet-0a1b2c3d4e5f60718", "subnet-0c3d4e5f607182930"]})
    message = str(caught.value)
    assert (
        'gpu-k8s:gpuLayer.subnetIds[1]: "subnet-0c3d4e5f607182930" - is in us-east-1c (use1-az3), like '
        in message
    )
    assert "Fix: list one subnet per zone" in message


@pytest.mark.parametrize(
    ("changes", "path", "words"),
    [
        ({"clustr": "prod"}, "gpu-k8s:gpuLayer.clustr", ("unknown key", "did you mean cluster?")),
        (
            {"gpuPools": [{"name": "l4", "instanceType": "m5.large", "maxNodes": 1}]},
            "gpu-k8s:gpuLayer.gpuPools[0].instanceType",
            ("not a GPU type of aws",),
        ),
        ({"gpuPools": []}, "gpu-k8s:gpuLayer.gpuPools", ("at least 1",)),
        ({"cuda": "12.10"}, "gpu-k8s:gpuLayer.cuda", ("12.10",)),
        # EKS's ClusterName shape; subnet IDs as EC2 writes them, each once.
        ({"cluster": ""}, "gpu-k8s:gpuLayer.cluster", ("is not an EKS cluster name",)),
        ({"cluster": "prod; rm -rf /"}, "gpu-k8s:gpuLayer.cluster", ("is not an EKS cluster name",)),
        ({"cluster": "p" * 101}, "gpu-k8s:gpuLayer.cluster", ("1-100 letters",)),
        ({"subnetIds": ["subnet-0A1B2C3D4E5F60718"]}, "gpu-k8s:gpuLayer.subnetIds[0]", ("not a subnet ID",)),
        ({"subnetIds": ["null"]}, "gpu-k8s:gpuLayer.subnetIds[0]", ("not a subnet ID",)),
        ({"subnetIds": []}, "gpu-k8s:gpuLayer.subnetIds", ("is required", "one per zone")),
        (
            {"subnetIds": ["subnet-0a1b2c3d4e5f60718", "subnet-0a1b2c3d4e5f60718"]},
            "gpu-k8s:gpuLayer.subnetIds[1]",
            ("listed twice",),
        ),
    ],
)
def test_a_bad_layer_is_refused_under_its_key_before_any_resource(changes, path, words):
    registered: list = []
    with pytest.raises(ConfigError) as caught:
        registered = plan_existing_eks(changes).registrations
    message = str(caught.value)
    assert path in message and "gpu-k8s:cluster" not in message, message
    for word in words:
        assert word in message, message
    assert registered == []


@pytest.mark.parametrize(
    ("version", "fix"),
    [
        ("1.31", "upgrade the cluster first"),
        # Newer than the operator supports: EKS cannot go back, so the fix is another gpu-k8s release.
        ("1.37", "use a gpu-k8s release whose GPU Operator supports it"),
    ],
)
def test_a_cluster_on_an_unsupported_kubernetes_is_refused_before_any_node_group(version, fix):
    with pytest.raises(ConfigError) as caught:
        plan_existing_eks(mocks=_ExistingCluster(version=version))
    (issue,) = caught.value.issues
    assert issue.path == "gpu-k8s:gpuLayer.cluster"
    assert f"runs Kubernetes {version}" in issue.problem and issue.fix.startswith(fix)


DDP_TRAINING = REPO_ROOT / "examples" / "ddp-training"
# Each JobSet of the example and the aws-eks pool whose queue it names.
DDP_JOBSETS = {"jobset.yaml": "l40s", "jobset-efa.yaml": "h100-train"}


def ddp_jobset(file_name: str) -> dict[str, Any]:
    return yaml.safe_load((DDP_TRAINING / file_name).read_text())


def worker_pod(jobset: dict[str, Any]) -> dict[str, Any]:
    (workers,) = jobset["spec"]["replicatedJobs"]
    return workers["template"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("file_name", sorted(DDP_JOBSETS))
def test_the_ddp_jobsets_pass_the_pinned_jobset_crd_strictly(file_name):
    from tests.test_charts import crd_schemas, validate_custom_resource

    crd_file = REPO_ROOT / "upstream" / "charts" / "jobset-0.12.0" / "crds" / "jobset.x-k8s.io_jobsets.yaml"
    schemas = crd_schemas([yaml.safe_load(crd_file.read_text())])
    jobset = ddp_jobset(file_name)
    validate_custom_resource(jobset, schemas)
    config_map = yaml.safe_load((DDP_TRAINING / "ddp-check.yaml").read_text())
    kubernetes_validate.validate(config_map, "1.35.0", strict=True)
    script = next(v for v in worker_pod(jobset)["volumes"] if "configMap" in v)
    assert script["configMap"]["name"] == config_map["metadata"]["name"]
    assert config_map["metadata"]["namespace"] == jobset["metadata"]["namespace"]


@pytest.mark.parametrize("file_name", sorted(DDP_JOBSETS))
def test_a_disrupted_worker_restarts_the_group_without_spending_a_restart(file_name):
    """review-training.md T1: spot reclaims and drains must not use up `maxRestarts`. A pod that Kubernetes
    disrupted carries the DisruptionTarget condition; the Job's pod failure policy then fails the Job with
    reason PodFailurePolicy (batch/v1 JobReasonPodFailurePolicy), which the JobSet's first rule restarts
    without counting. Failures of the program itself still count (no other rule)."""
    jobset = ddp_jobset(file_name)
    rules = jobset["spec"]["failurePolicy"]["rules"]
    assert rules == [
        {
            "name": "restartOnDisruption",
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": ["PodFailurePolicy"],
        }
    ]
    assert jobset["spec"]["failurePolicy"]["maxRestarts"] == 3
    for replicated in jobset["spec"]["replicatedJobs"]:
        job = replicated["template"]["spec"]
        assert job["podFailurePolicy"]["rules"] == [
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}
        ]
        # A pod failure policy needs pods that are not restarted in place (Job API validation).
        assert job["template"]["spec"]["restartPolicy"] == "Never"


@pytest.mark.parametrize(("file_name", "pool_name"), sorted(DDP_JOBSETS.items()))
def test_kueue_can_admit_each_ddp_jobset_whole_on_the_aws_eks_stack(aws_eks, file_name, pool_name):
    """Both workers fit the queue of the pool the JobSet names, for every resource the queue counts, and
    each worker fits one node of that pool."""
    jobset = ddp_jobset(file_name)
    queue_name = jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    namespace = jobset["metadata"]["namespace"]
    local_queues = {
        (r.inputs["metadata"]["namespace"], r.inputs["metadata"]["name"]): r.inputs["spec"]["clusterQueue"]
        for r in aws_eks.by_type("kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue")
    }
    cluster_queue = local_queues[namespace, queue_name]
    assert cluster_queue == pool_name
    (queue,) = [
        r
        for r in aws_eks.by_type("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue")
        if r.inputs["metadata"]["name"] == cluster_queue
    ]
    quota = {
        resource["name"]: int(resource["nominalQuota"])
        for resource in queue.inputs["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    }
    (workers,) = jobset["spec"]["replicatedJobs"]
    pod = worker_pod(jobset)
    limits = pod["containers"][0]["resources"]["limits"]
    pods = workers["template"]["spec"]["parallelism"]
    assert pods == 2
    pool = next(p for p in aws_eks.outputs["gpuPools"] if p["name"] == cluster_queue)
    for resource, total in quota.items():
        # A pod asking for none of a counted resource (no EFA on l40s) needs none of it.
        per_pod = int(limits.get(resource, 0))
        assert pods * per_pod <= total, resource
        assert per_pod <= total // pool["maxNodes"], resource  # one node's share
    assert limits["nvidia.com/gpu"] <= pool["slotsPerNode"]
    # Kueue brings the pool's node selector and tolerations (its ResourceFlavor); the manifest names neither.
    assert "nodeSelector" not in pod and "tolerations" not in pod


def test_the_efa_jobset_takes_a_whole_p5_node_and_only_nccl_over_efa(aws_eks):
    """Each worker asks for its node's 8 GPUs and 32 EFA interfaces (the quota the pool's queue counts) and
    huge pages within what an EFA node advertises; NCCL may use the AWS OFI plugin only, so a missing EFA
    fails the job instead of running it over TCP; the 8 local ranks get a /dev/shm larger than 64 MiB."""
    from gpu_k8s.providers.aws.autoscaling import EFA_HUGE_PAGES_RESOURCE

    pod = worker_pod(ddp_jobset("jobset-efa.yaml"))
    (container,) = pod["containers"]
    limits = container["resources"]["limits"]
    pool = next(p for p in aws_eks.outputs["gpuPools"] if p["name"] == "h100-train")
    assert pool["interconnect"] == "efa"
    assert limits["nvidia.com/gpu"] == pool["slotsPerNode"] == 8
    assert limits["vpc.amazonaws.com/efa"] == 32
    # What a scale-from-zero p5 node advertises (the pool's Auto Scaling group tags).
    tags = {
        t.inputs["tag"]["key"]: t.inputs["tag"]["value"]
        for t in aws_eks.by_type("aws:autoscaling/tag:Tag")
        if t.name.startswith("ml-gpu-h100-train-")
    }
    advertised = tags[f"k8s.io/cluster-autoscaler/node-template/resources/{EFA_HUGE_PAGES_RESOURCE}"]
    assert _mebibytes(limits[EFA_HUGE_PAGES_RESOURCE]) <= _mebibytes(advertised)
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa"] == "32"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NCCL_NET"] == "AWS Libfabric"
    shm = next(m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm")
    assert next(v for v in pod["volumes"] if v["name"] == shm["name"])["emptyDir"] == {"medium": "Memory"}


def _mebibytes(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity.removesuffix("Mi"))


@pytest.mark.parametrize("stack", ["aws-eks", "aws-k3s", "gcp-gke", "gcp-k3s"])
def test_the_built_cluster_hands_out_its_gpu_operator_for_depends_on(stack):
    """A user program waits for "GPUs ready" with depends_on=[cluster.gpu_operator] (newcomer.md F8)."""
    from gpu_k8s import build_cluster, load_spec, stack_cluster_config
    from gpu_k8s.tools.engine import run_program, stack_config
    from tests.paths import FIXTURE_STACKS

    handles = []
    recording = run_program(
        stack,
        stack_config(FIXTURE_STACKS / f"Pulumi.{stack}.yaml"),
        program=lambda: handles.append(build_cluster(load_spec(stack_cluster_config()))),
    )
    (operator,) = recording.by_type("gpu-k8s:index:GpuOperator")
    (cluster,) = handles
    assert cluster.gpu_operator is not None
    assert cluster.gpu_operator._name == operator.name


# --- examples/inference -------------------------------------------------------------------------------------

INFERENCE = REPO_ROOT / "examples" / "inference" / "inference.yaml"


def inference_objects() -> dict[str, dict[str, Any]]:
    return {obj["kind"]: obj for obj in yaml.safe_load_all(INFERENCE.read_text())}


@pytest.mark.parametrize("minor", SUPPORTED_KUBERNETES_MINORS)
def test_the_inference_example_is_valid_for_kubernetes_and_the_crds_the_stack_installs(rendered, minor):
    """Core objects against Kubernetes' schema; the ScaledObject against KEDA's CRD and the PodMonitor against
    the Prometheus Operator's, as the aws-eks plan's releases render them (strict: no unknown field)."""
    objects = inference_objects()
    crds = [
        o
        for chart in ("keda", "kube-prometheus-stack")
        for o in rendered["aws_eks", chart].objects
        if o["kind"] == "CustomResourceDefinition"
    ]
    schemas = crd_schemas(crds)
    for kind in ("ScaledObject", "PodMonitor"):
        validate_custom_resource(objects.pop(kind), schemas)
    assert set(objects) == {"Namespace", "Deployment", "Service", "PodDisruptionBudget"}
    for obj in objects.values():
        kubernetes_validate.validate(obj, f"{minor}.0", strict=True)


def test_the_model_server_runs_on_the_time_sliced_pool_and_fits_its_slots(aws_eks):
    """The pod asks for what the plan's `a10g-shared` pool offers (its gpuPools output): its label, its
    taints, its resource; four servers fit one node (a slot each) and their GPU memory fits each slot's."""
    pool = next(p for p in aws_eks.outputs["gpuPools"] if p["name"] == "a10g-shared")
    pod = inference_objects()["Deployment"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == pool["usage"]["nodeSelector"]
    assert sorted(pod["tolerations"], key=str) == sorted(pool["usage"]["tolerations"], key=str)
    (container,) = pod["containers"]
    requests = container["resources"]["requests"]
    gpu_resources = {name for name in requests if name.startswith("nvidia.com/")}
    assert gpu_resources <= set(pool["usage"]["resources"]) and requests["nvidia.com/gpu"] == 1
    machine = load_catalog().machine_type("aws", pool["instanceType"])
    assert machine is not None and machine.vcpu and machine.memory_gib
    assert machine.gpu_model is not None and machine.gpu_model.memory_gib
    slots = int(pool["slotsPerNode"])
    assert slots * float(requests["cpu"].removesuffix("m")) / 1000 < machine.vcpu
    # Under what the kubelet leaves allocatable: EKS reserves about 1 GiB of a 16 GiB node for itself and
    # the kernel takes some before that; 90% of the node is a bound both stay above.
    limit_gib = float(container["resources"]["limits"]["memory"].removesuffix("Mi")) / 1024
    assert slots * limit_gib <= 0.9 * machine.memory_gib
    (share,) = [a.split("=")[1] for a in container["args"] if a.startswith("--gpu-memory-utilization=")]
    (slot,) = pool["slots"]
    assert float(share) * machine.gpu_model.memory_gib <= slot["memoryGiB"]


def test_the_model_namespace_is_let_through_the_queued_gpu_policy():
    namespace = inference_objects()["Namespace"]
    assert namespace["metadata"]["labels"][OPT_OUT_LABEL] == "allowed"
    assert inference_objects()["Deployment"]["metadata"]["namespace"] == namespace["metadata"]["name"]


def test_rollouts_keep_serving_and_the_scaler_reads_the_stacks_prometheus(rendered):
    objects = inference_objects()
    deployment = objects["Deployment"]
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # Traffic only once the model is loaded.
    assert container["readinessProbe"]["httpGet"]["path"] == "/v1/models"
    scaled = objects["ScaledObject"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaled["spec"]["minReplicaCount"] == 0
    # Servers start one a minute, so two never load on one shared GPU at once.
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]
    (prometheus,) = [t for t in scaled["spec"]["triggers"] if t["type"] == "prometheus"]
    host = prometheus["metadata"]["serverAddress"].removeprefix("http://").split("/")[0]
    name, namespace, _, port = host.replace(":", ".").split(".")
    (service,) = [
        o
        for o in rendered["aws_eks", "kube-prometheus-stack"].of_kind("Service")
        if o["metadata"]["name"] == name
    ]
    assert service["metadata"]["namespace"] == namespace == "monitoring"
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}
    assert objects["PodMonitor"]["spec"]["selector"] == deployment["spec"]["selector"]
