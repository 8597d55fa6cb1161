"""k3s upgrades of running servers through rancher/system-upgrade-controller (pinned under `upstream/`).

`k3s.version` is written into a Plan; when it changes, the controller upgrades the servers one at a time,
in place (cordon, replace the binary with rancher/k3s-upgrade, restart k3s), the way k3s's "Automated
upgrades" documents. GPU agents get no Plan: an upgrade job would cordon a node the moment it joins (they
scale from zero all day) and drain running GPU jobs; they take the new version from their launch template or
instance template when they are next created.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from gpu_k8s.components.manifests import kubernetes_object, resource_name_part

SUC_VERSION = "v0.20.1"
SUC_ROOT = Path(__file__).resolve().parents[2] / "upstream" / "system-upgrade-controller" / SUC_VERSION
CRD_FILE = SUC_ROOT / "pkg" / "crds" / "yaml" / "generated" / "upgrade.cattle.io_plans.yaml"
CONTROLLER_IMAGE = "rancher/system-upgrade-controller"
UPGRADE_IMAGE = "rancher/k3s-upgrade"
SERVER_PLAN = "k3s-server"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"


def upgrade_namespace() -> str:
    """Where the controller and its upgrade jobs run (the release's kustomization says)."""
    return str(yaml.safe_load((SUC_ROOT / "kustomization.yaml").read_text())["namespace"])


def controller_manifests() -> list[dict[str, Any]]:
    """What the release asset `system-upgrade-controller.yaml` is (scripts/package-controller at the tag):
    the kustomization's resources in its namespace, with the image set to the release's tag."""
    kustomization = yaml.safe_load((SUC_ROOT / "kustomization.yaml").read_text())
    namespace = kustomization["namespace"]
    objects = [
        doc
        for resource in kustomization["resources"]
        for doc in yaml.safe_load_all((SUC_ROOT / resource).read_text())
        if doc
    ]
    for obj in objects:
        if obj["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            obj["metadata"]["namespace"] = namespace
        for subject in obj.get("subjects", []):
            if subject["kind"] == "ServiceAccount":
                subject.setdefault("namespace", namespace)
        for container in obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            if container["image"].split(":")[0] == CONTROLLER_IMAGE:
                container["image"] = f"{CONTROLLER_IMAGE}:{SUC_VERSION}"
    return objects


def plan_crd() -> dict[str, Any]:
    """The Plan CRD (the release asset `crd.yaml`), applied before the Plan: the controller would register
    it only once it runs."""
    crd: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    return crd


def server_plan(version: str, namespace: str, tolerations: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """Upgrade the servers to `version`, one at a time (the servers run no workloads to drain)."""
    return {
        "apiVersion": "upgrade.cattle.io/v1",
        "kind": "Plan",
        "metadata": {"name": SERVER_PLAN, "namespace": namespace},
        "spec": {
            "concurrency": 1,
            "version": version,
            "nodeSelector": {"matchExpressions": [{"key": CONTROL_PLANE_LABEL, "operator": "Exists"}]},
            "tolerations": [dict(t) for t in tolerations],
            "serviceAccountName": "system-upgrade",
            "cordon": True,
            "upgrade": {"image": UPGRADE_IMAGE},
        },
    }


class K3sUpgrades(pulumi.ComponentResource):
    """The controller, the Plan CRD and the servers' Plan, through the cluster's Kubernetes provider."""

    def __init__(
        self,
        name: str,
        k3s_version: str,
        tolerations: Sequence[Mapping[str, str]],
        provider: k8s.Provider,
        depends_on: Sequence[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("gpu-k8s:k3s:Upgrades", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=list(depends_on))
        manifests = controller_manifests()
        namespace_manifest = next(m for m in manifests if m["kind"] == "Namespace")
        namespace = kubernetes_object(f"{name}-namespace", namespace_manifest, child)
        after_namespace = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[namespace])
        for manifest in manifests:
            if manifest is not namespace_manifest:
                kubernetes_object(
                    f"{name}-{manifest['kind'].lower()}-{resource_name_part(manifest['metadata']['name'])}",
                    manifest,
                    after_namespace,
                )
        crd = kubernetes_object(f"{name}-plan-crd", plan_crd(), child)
        plan = server_plan(k3s_version, namespace_manifest["metadata"]["name"], tolerations)
        self.server_plan = k8s.apiextensions.CustomResource(
            f"{name}-server-plan",
            api_version=plan["apiVersion"],
            kind=plan["kind"],
            metadata=plan["metadata"],
            spec=plan["spec"],
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[namespace, crd]),
        )
        self.register_outputs({})
