"""The Compute Engine cloud controller manager on a k3s cluster, from kubernetes/cloud-provider-gcp's own
deployment (`deploy/packages/default`, the manifest its kOps quickstart applies; pinned under `upstream/`).

The repository publishes no chart and leaves two things to "tooling": the image and the arguments.
`cloud_controller_manifests` supplies them, and adapts the DaemonSet to k3s: its API server answers on 6443
(the manifest points the CCM at 127.0.0.1 but keeps the Service's port), and it must tolerate the servers'
taint. The node controllers name, label and address nodes from Compute Engine and delete the Node of a
deleted VM, so a spot VM the group recreates under the same name can join again; the service controller
gives each `Service type=LoadBalancer` a Compute Engine load balancer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from gpu_k8s.components.manifests import kubernetes_object, resource_name_part

CCM_VERSION = "v36.3.8"
MANIFEST = (
    Path(__file__).resolve().parents[2]
    / "upstream"
    / "gcp-cloud-controller-manager"
    / CCM_VERSION
    / "deploy"
    / "packages"
    / "default"
    / "manifest.yaml"
)
IMAGE = "registry.k8s.io/cloud-provider-gcp/cloud-controller-manager"
# One CCM build per Kubernetes minor (cloud-provider-gcp docs/RELEASE.md), the newest one registry.k8s.io
# serves, by digest: git tags are not images, only what kubernetes/k8s.io's promoter manifest lists is
# pulled (review-gcp.md NG1; upstream/references/registry.k8s.io/k8s-staging-cloud-provider-gcp.yaml).
# No 1.36 build is in the promoter data at hand, so 1.36 clusters run the 1.35 build: Kubernetes' version
# skew policy lets cloud-controller-manager be one minor older than kube-apiserver.
# The same policy makes a 1.36 cluster wait for a promoted 1.36 build before it moves to 1.37 (the CCM must
# reach the old minor before kube-apiserver leaves it).
IMAGE_TAGS = {
    "1.33": "v33.4.0@sha256:d9719ba3d95f3d3ce4811fcf9ffd64b158ab9ac8c81b151cc9faa73a945b5170",
    "1.34": "v34.2.0@sha256:4795f50bd273894d46e21b5569a716374377ae06d276343a6e5eae5aa93d5de8",
    "1.35": "v35.0.2@sha256:f1cfeca80d58695683ddaeebb41215bf7239cb49534c5eb2b6e6205929822389",
    "1.36": "v35.0.2@sha256:f1cfeca80d58695683ddaeebb41215bf7239cb49534c5eb2b6e6205929822389",
}
# The cloud config the DaemonSet mounts from each server (its hostPath).
CLOUD_CONFIG_PATH = "/etc/kubernetes/cloud.config"
API_PORT = 6443
CONTROLLERS = ("cloud-node-controller", "cloud-node-lifecycle-controller", "service-lb-controller")
# What the node controllers read from Compute Engine: the instance behind a provider ID, the zones of the
# region (multizone), the network named in the cloud config at start. Assembled from those calls;
# UNCONFIRMED against a running CCM.
PERMISSIONS = (
    "compute.instances.get",
    "compute.instances.list",
    "compute.zones.get",
    "compute.zones.list",
    "compute.regions.get",
    "compute.networks.get",
    "compute.subnetworks.get",
)
# What the service controller needs to give a Service its load balancer: forwarding rules, addresses,
# target pools or instance groups and backend services, health checks, and firewall rules that open the
# Service's ports to the nodes. The repository documents no permission set. These are, for each Compute
# method its load-balancer code calls at v36.3.8, the permissions Google's API reference lists for it, and
# `use` on what the resources it makes point at (a forwarding rule at its target pool, backend service and
# address, `useInternal` for an internal one; a target pool at its health check and instances; a backend
# service at its health check and instance groups), which those lists leave out; and
# `forwardingRules.update`, which no list names but a later sync may need: it reserves the address of a
# rule that exists as a static one (gce_loadbalancer_external.go ensureStaticIP; UNCONFIRMED which
# permission Google checks there). Every one was in the two predefined roles the servers held
# before (`roles/compute.loadBalancerAdmin` and `roles/compute.securityAdmin`), whose routes, routers, SSL,
# security and firewall policies, URL maps, proxies and global load balancers the controller never touches
# (upstream/references/gcp-load-balancer-permissions.json holds the calls, the lists and the two roles). The
# images of v33.4.0, v34.2.0 and v35.0.2 (IMAGE_TAGS) make the same calls: the same extraction at those tags
# gives the same list (run by a review on 2026-12-04; only v36.3.8's list is pinned).
# The writes are still project-wide: Compute grants on these resources take no cluster tag, so the
# controller can change any load balancer or firewall rule of the project (K3S.md: a project per cluster).
SERVICE_CONTROLLER_PERMISSIONS = (
    "compute.addresses.create",
    "compute.addresses.createInternal",
    "compute.addresses.delete",
    "compute.addresses.deleteInternal",
    "compute.addresses.get",
    "compute.addresses.list",
    "compute.addresses.use",
    "compute.addresses.useInternal",
    "compute.firewalls.create",
    "compute.firewalls.delete",
    "compute.firewalls.get",
    "compute.firewalls.update",
    "compute.forwardingRules.create",
    "compute.forwardingRules.delete",
    "compute.forwardingRules.get",
    "compute.forwardingRules.pscDelete",
    "compute.forwardingRules.update",
    "compute.globalOperations.get",
    "compute.healthChecks.create",
    "compute.healthChecks.delete",
    "compute.healthChecks.get",
    "compute.healthChecks.update",
    "compute.healthChecks.useReadOnly",
    "compute.httpHealthChecks.create",
    "compute.httpHealthChecks.delete",
    "compute.httpHealthChecks.get",
    "compute.httpHealthChecks.update",
    "compute.httpHealthChecks.useReadOnly",
    "compute.instanceGroups.create",
    "compute.instanceGroups.delete",
    "compute.instanceGroups.get",
    "compute.instanceGroups.list",
    "compute.instanceGroups.update",
    "compute.instanceGroups.use",
    "compute.instances.list",
    "compute.instances.use",
    "compute.networks.updatePolicy",
    "compute.networks.use",
    "compute.regionBackendServices.create",
    "compute.regionBackendServices.delete",
    "compute.regionBackendServices.get",
    "compute.regionBackendServices.update",
    "compute.regionBackendServices.use",
    "compute.regionOperations.get",
    "compute.subnetworks.use",
    "compute.targetPools.addInstance",
    "compute.targetPools.create",
    "compute.targetPools.delete",
    "compute.targetPools.get",
    "compute.targetPools.removeInstance",
    "compute.targetPools.use",
    "compute.zoneOperations.get",
    "compute.zones.list",
)
# The controller names its health checks and firewall rules after a cluster ID it keeps in the ConfigMap
# kube-system/ingress-uid, created at first use through the client "cloud-provider" (gce_clusterid.go,
# gce.go Initialize): with --use-service-account-credentials that is the ServiceAccount
# kube-system/cloud-provider. Upstream's manifest grants it nothing, and the Kubernetes bootstrap role
# for it in kube-system is marked deprecated, so this Role grants exactly what the code calls.
CLUSTER_ID_ACCOUNT = "cloud-provider"


def cloud_config(project: str, network: str, subnetwork: str, node_tag: str) -> str:
    """gcfg `[global]` (cloud-provider-gcp providers/gce/gce.go): the project and network, every zone of the
    region, where the nodes are, and the network tag every node carries, which the firewall rules the
    service controller makes target."""
    return (
        "[global]\n"
        f"project-id = {project}\n"
        f"network-name = {network}\n"
        f"subnetwork-name = {subnetwork}\n"
        f"node-tags = {node_tag}\n"
        "multizone = true\n"
    )


def cloud_controller_manifests(
    kubernetes_version: str, cluster_name: str, tolerations: Sequence[Mapping[str, str]]
) -> list[dict[str, Any]]:
    """The upstream objects with the image for the cluster's minor, the arguments kube-up passes (node
    controllers only, per-controller service accounts so the lifecycle controller may delete Nodes), the
    API port, and the servers' taint tolerated."""
    objects = [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    container["image"] = f"{IMAGE}:{IMAGE_TAGS[kubernetes_version]}"
    container["args"] = [
        "--cloud-provider=gce",
        f"--cloud-config={CLOUD_CONFIG_PATH}",
        f"--cluster-name={cluster_name}",
        f"--controllers={','.join(CONTROLLERS)}",
        "--use-service-account-credentials",
        "--secure-port=10258",
        "--v=2",
    ]
    container["env"].append({"name": "KUBERNETES_SERVICE_PORT", "value": str(API_PORT)})
    pod["tolerations"].extend(dict(t) for t in tolerations)
    # `nodeSelector: null` reads as absent; the API server would drop it.
    pod.pop("nodeSelector", None)
    return [*objects, *cluster_id_access()]


def cluster_id_access() -> list[dict[str, Any]]:
    """A Role and RoleBinding in kube-system: the cluster-ID client may read, watch and create ConfigMaps
    there (the ID's ConfigMap cannot be named in the rule: `create` takes no resourceNames)."""
    name = "gpu-k8s:gce-cloud-provider-cluster-id"
    metadata = {"name": name, "namespace": "kube-system"}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata,
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "list", "watch"]}
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": CLUSTER_ID_ACCOUNT, "namespace": "kube-system"}],
        },
    ]


class GceCloudController(pulumi.ComponentResource):
    """The CCM's objects, created through the cluster's Kubernetes provider."""

    objects: list[pulumi.CustomResource]

    def __init__(
        self,
        name: str,
        manifests: Sequence[Mapping[str, Any]],
        provider: k8s.Provider,
        depends_on: Sequence[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("gpu-k8s:gcp:CloudController", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=list(depends_on))
        self.objects = [
            kubernetes_object(
                f"{name}-{m['kind'].lower()}-{resource_name_part(m['metadata']['name'])}", m, child
            )
            for m in manifests
        ]
        self.register_outputs({})
