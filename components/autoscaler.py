"""The cluster-autoscaler Helm release and the cloud-neutral scale-from-zero node templates.

A provider supplies what is cloud-specific (cloud provider name, region, discovery settings, the
identity the pod runs with) as plain values; this module adds what every platform shares.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml

from gpu_k8s.components.batch import BatchQueues
from gpu_k8s.components.cluster import POOL_LABEL, SYSTEM_POOL_NAME, GpuCluster, GpuPool
from gpu_k8s.components.configbase import duration_seconds
from gpu_k8s.components.gpu_operator import GpuOperator, GpuOperatorArgs
from gpu_k8s.components.helm import helm_release
from gpu_k8s.components.inference import install_inference
from gpu_k8s.components.manifests import kubernetes_object
from gpu_k8s.components.monitoring import install_monitoring
from gpu_k8s.components.prices import Price
from gpu_k8s.components.spec import ClusterSpec, TaintSpec

AUTOSCALER_HELM_REPO = "https://kubernetes.github.io/autoscaler"
AUTOSCALER_NAMESPACE = "kube-system"
AUTOSCALER_SERVICE_ACCOUNT = "cluster-autoscaler"

# The autoscaler's minor must match the cluster's (its README); the newest patch of each minor among
# kubernetes/autoscaler's release tags (upstream/references/cluster-autoscaler-releases.json, which a test
# holds these to).
AUTOSCALER_IMAGE_TAGS = {"1.33": "v1.33.6", "1.34": "v1.34.5", "1.35": "v1.35.2", "1.36": "v1.36.1"}

# The ProvisioningRequest CRD the autoscaler serves with --enable-provisioning-requests; the chart brings its
# RBAC but not the CRD (cluster-autoscaler FAQ). Pinned from the newest tag in AUTOSCALER_IMAGE_TAGS: the
# 1.33 to 1.36 tags differ only in descriptions and in v1beta1's deprecation mark, with v1 served and stored
# and v1beta1 served.
PROVISIONING_REQUEST_CRD = (
    Path(__file__).resolve().parents[1]
    / "upstream"
    / "cluster-autoscaler"
    / "crds"
    / "cluster-autoscaler-1.36.1"
    / "autoscaling.x-k8s.io_provisioningrequests.yaml"
)

# Flags every platform gets. GPU jobs often use emptyDir scratch space; with the upstream default (true)
# such a pod would pin an idle GPU node forever, which is exactly the silent cost scale-to-zero is for.
COMMON_FLAGS: Mapping[str, Any] = {"skip-nodes-with-local-storage": False, "expander": "least-waste"}


def _duration_seconds(duration: str) -> int:
    seconds = duration_seconds(duration)
    assert seconds is not None, "validated by load_spec"
    return seconds


def go_duration(duration: str) -> str:
    """Normalise "5m" or "1h30m" to the form Go's time.Duration prints ("5m0s")."""
    hours, rest = divmod(_duration_seconds(duration), 3600)
    minutes, seconds = divmod(rest, 60)
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "") + f"{seconds}s"


def cluster_scale_down_unneeded_time(pools: Sequence[GpuPool]) -> str:
    """The cluster-wide `--scale-down-unneeded-time`: the value most GPU pools ask for (the shortest on a
    tie, since idle GPUs are the cost to avoid). The system pool has a fixed size, so only GPU pools count;
    pools that differ get a per-group override in their template."""
    counts = Counter(go_duration(pool.spec.scale_down_unneeded_time) for pool in pools)
    return min(counts, key=lambda value: (-counts[value], _duration_seconds(value)))


@dataclass(frozen=True)
class NodeTemplate:
    """What a node of a pool will look like once it exists, for scale-from-zero decisions."""

    labels: Mapping[str, str]
    taints: tuple[TaintSpec, ...]
    resources: Mapping[str, str]
    # Set only when the pool's idle time differs from the cluster-wide flag.
    scale_down_unneeded_time: str | None = None


def node_template(pool: GpuPool, cluster_unneeded_time: str) -> NodeTemplate:
    """The template the autoscaler must assume for a pool that has no node yet."""
    own = go_duration(pool.spec.scale_down_unneeded_time)
    return NodeTemplate(
        labels=dict(pool.node_labels),
        taints=pool.taints,
        resources={
            resource: str(count)
            for resource, count in {**pool.offer.resources, **pool.interconnect_resources}.items()
        },
        scale_down_unneeded_time=None if own == cluster_unneeded_time else own,
    )


def provisioning_request_crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(PROVISIONING_REQUEST_CRD.read_text())
    return crd


def autoscaler_values(
    kubernetes_minor: str,
    cloud_values: Mapping[str, Any],
    pools: Sequence[GpuPool],
    tolerations: Sequence[Mapping[str, str]] = (),
    provisioning_requests: bool = False,
    node_selector: Mapping[str, str] | None = None,
    scraped: bool = False,
) -> dict[str, Any]:
    """Helm values for the cluster-autoscaler chart: shared settings, then the provider's. It runs on the
    system pool (`node_selector`, default its label; empty: anywhere, on a cluster made elsewhere)."""
    cloud = dict(cloud_values)
    selector = {POOL_LABEL: SYSTEM_POOL_NAME} if node_selector is None else node_selector
    extra_args = {
        **COMMON_FLAGS,
        "scale-down-unneeded-time": cluster_scale_down_unneeded_time(pools),
        **({"enable-provisioning-requests": True} if provisioning_requests else {}),
        **cloud.pop("extraArgs", {}),
    }
    return {
        "image": {"tag": AUTOSCALER_IMAGE_TAGS[kubernetes_minor]},
        "rbac": {"serviceAccount": {"create": True, "name": AUTOSCALER_SERVICE_ACCOUNT}},
        **({"nodeSelector": dict(selector)} if selector else {}),
        **({"tolerations": [dict(t) for t in tolerations]} if tolerations else {}),
        "extraArgs": extra_args,
        # With `monitoring`, a ServiceMonitor (the chart's, in the monitoring namespace) for its scale-up and
        # scale-down metrics.
        **({"serviceMonitor": {"enabled": True}} if scraped else {}),
        **cloud,
    }


@dataclass(frozen=True)
class ClusterAutoscalerArgs:
    """Inputs of the ClusterAutoscaler component."""

    cluster: GpuCluster
    chart_version: str
    cloud_values: Mapping[str, Any]
    # Where the autoscaler runs: the system pool; empty on a cluster made elsewhere, whose nodes carry no
    # label of this toolkit (a selector nothing matches would keep it Pending and fail the release).
    node_selector: Mapping[str, str] | None = None
    # Cloud identity wiring (e.g. a Pod Identity association) the pod needs before it starts.
    identity: Sequence[pulumi.Resource] = field(default_factory=tuple)
    # The ProvisioningRequest CRD, when the autoscaler is to serve ProvisioningRequests (batch queues).
    provisioning_request_crd: pulumi.Resource | None = None
    # The monitoring release whose Prometheus scrapes the autoscaler (it installs the ServiceMonitor CRD).
    metrics: pulumi.Resource | None = None


class ClusterAutoscaler(pulumi.ComponentResource):
    """Scales node groups between their min and max, down to zero for idle GPU pools."""

    release_status: pulumi.Output[Any]

    def __init__(self, name: str, args: ClusterAutoscalerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-k8s:index:ClusterAutoscaler", name, None, opts)
        cluster = args.cluster
        release = helm_release(
            f"{name}-release",
            chart="cluster-autoscaler",
            version=args.chart_version,
            repository=AUTOSCALER_HELM_REPO,
            namespace=AUTOSCALER_NAMESPACE,
            values=autoscaler_values(
                cluster.kubernetes_version,
                args.cloud_values,
                cluster.pools,
                cluster.traits.system_tolerations,
                provisioning_requests=args.provisioning_request_crd is not None,
                node_selector=args.node_selector,
                scraped=args.metrics is not None,
            ),
            parent=self,
            provider=cluster.k8s_provider,
            depends_on=[
                *cluster.system_ready,
                *args.identity,
                *([args.provisioning_request_crd] if args.provisioning_request_crd else []),
                *([args.metrics] if args.metrics is not None else []),
            ],
        )
        self.release_status = release.status
        self.register_outputs({"releaseStatus": self.release_status})


def install_gpu_addons(
    spec: ClusterSpec,
    cluster: GpuCluster,
    autoscaler_cloud_values: Mapping[str, Any],
    autoscaler_identity: Sequence[pulumi.Resource] = (),
    node_price: Callable[[GpuPool], Price | None] | None = None,
) -> GpuCluster:
    """The GPU Operator and the cluster-autoscaler, on a platform whose autoscaler this toolkit runs; with
    `batch`, Kueue's queues admit a job once this autoscaler has provisioned all its pods; `node_price`
    prices the pools for the monitoring dashboard. Returns the cluster with its operator."""
    metrics = install_monitoring(spec, cluster, autoscaled=True, node_price=node_price)
    install_inference(spec, cluster)
    operator = GpuOperator(
        f"{spec.name}-gpu-operator",
        GpuOperatorArgs(cluster, spec.addon_versions.gpu_operator, metrics=metrics),
    )
    crd = None
    if spec.batch is not None:
        crd = kubernetes_object(
            f"{spec.name}-provisioning-request-crd",
            provisioning_request_crd(),
            pulumi.ResourceOptions(provider=cluster.k8s_provider, depends_on=list(cluster.system_ready)),
        )
        BatchQueues(f"{spec.name}-batch", cluster, spec.batch, provisioning_request_crd=crd, metrics=metrics)
    ClusterAutoscaler(
        f"{spec.name}-autoscaler",
        ClusterAutoscalerArgs(
            cluster=cluster,
            chart_version=spec.addon_versions.cluster_autoscaler,
            cloud_values=autoscaler_cloud_values,
            identity=autoscaler_identity,
            provisioning_request_crd=crd,
            metrics=metrics,
        ),
    )
    return dataclasses.replace(cluster, gpu_operator=operator)
