"""The Compute Engine PD CSI driver on a self-managed cluster, rendered from the upstream deployment.

Upstream ships no Helm chart; non-GKE installs run kustomize over `deploy/kubernetes/overlays/stable-master`
(base controller + Linux node, an image-tag transformer and two JSON patches). `pd_csi_manifests` does the
same steps in Python on the files pinned under `upstream/`, then adapts them to this toolkit:

* credentials: upstream mounts a service-account key (Secret `cloud-sa`); here the controller runs on the
  servers and authenticates as their service account through the metadata server (the driver falls back to
  Google's default credentials when GOOGLE_APPLICATION_CREDENTIALS is unset: pkg/gce-cloud-provider/compute
  gce.go generateTokenSource), so no key exists anywhere;
* no Windows node plugin (the cluster has no Windows nodes);
* the namespace admits privileged pods (the node plugin mounts host paths), whatever the cluster default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from gpu_k8s.components.manifests import kubernetes_object

PD_CSI_VERSION = "v1.26.4"
PD_CSI_ROOT = (
    Path(__file__).resolve().parents[2]
    / "upstream"
    / "gcp-compute-persistent-disk-csi-driver"
    / PD_CSI_VERSION
)
KUSTOMIZE_DIR = PD_CSI_ROOT / "deploy" / "kubernetes"
CUSTOM_ROLE_FILE = PD_CSI_ROOT / "deploy" / "gcp-compute-persistent-disk-csi-driver-custom-role.yaml"
PROVISIONER = "pd.csi.storage.gke.io"
DRIVER_IMAGE = "registry.k8s.io/cloud-provider-gcp/gcp-compute-persistent-disk-csi-driver"
# At tag v1.26.4 the stable-master transformer still pins the driver at v1.17.4, which lacks the
# --run-taint-controller flag the same tag's controller passes, so that controller crash-loops
# (kubernetes-sigs/gcp-compute-persistent-disk-csi-driver#2343, fixed on master by moving to v1.26.0).
# v1.26.0 is the newest v1.26 image whose promotion to registry.k8s.io was confirmed here
# (kubernetes/k8s.io#9586); whether v1.26.4 was promoted too is UNCONFIRMED.
DRIVER_IMAGE_TAG = "v1.26.0"
# The upstream controller Deployment, and the Secret-mounted key it reads by default.
CONTROLLER = "csi-gce-pd-controller"
CREDENTIALS_ENV = "GOOGLE_APPLICATION_CREDENTIALS"
CREDENTIALS_VOLUME = "cloud-sa-volume"
PRIVILEGED_NAMESPACE_LABELS = {
    "pod-security.kubernetes.io/enforce": "privileged",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kustomization(directory: Path) -> dict[str, Any]:
    return yaml.safe_load((directory / "kustomization.yaml").read_text())


def _resources(directory: Path, skip: Sequence[str]) -> list[dict[str, Any]]:
    """The objects a kustomization lists, recursively (files and directories), except `skip` directories."""
    objects: list[dict[str, Any]] = []
    for entry in _kustomization(directory)["resources"]:
        target = (directory / entry).resolve()
        if target.name in skip:
            continue
        objects += _resources(target, skip) if target.is_dir() else _documents(target)
    return objects


def _image_tags(transformer_dir: Path) -> dict[str, tuple[str, str]]:
    """image name -> (new name, new tag), from kustomize ImageTagTransformer documents."""
    tags = {}
    for doc in _documents(transformer_dir / "image.yaml"):
        rule = doc["imageTag"]
        tags[rule["name"]] = (rule.get("newName", rule["name"]), rule["newTag"])
    return tags


def _json_patch_add(target: dict[str, Any], patch: Sequence[Mapping[str, Any]]) -> None:
    """RFC 6902 "add" operations, the only kind the overlay uses; anything else is refused loudly."""
    for operation in patch:
        if operation["op"] != "add":
            raise ValueError(f"unsupported JSON patch operation {operation['op']!r}")
        *parents, last = operation["path"].lstrip("/").split("/")
        node: Any = target
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if last == "-":
            node.append(operation["value"])
        elif isinstance(node, list):
            node.insert(int(last), operation["value"])
        else:
            node[last] = operation["value"]


def _containers(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    return obj["spec"]["template"]["spec"]["containers"]


def _use_node_identity(controller: dict[str, Any]) -> None:
    pod = controller["spec"]["template"]["spec"]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != CREDENTIALS_VOLUME]
    for container in _containers(controller):
        container["env"] = [e for e in container.get("env", []) if e["name"] != CREDENTIALS_ENV]
        if not container["env"]:
            del container["env"]
        container["volumeMounts"] = [
            m for m in container.get("volumeMounts", []) if m["name"] != CREDENTIALS_VOLUME
        ]
        if not container["volumeMounts"]:
            del container["volumeMounts"]


def pd_csi_manifests(
    controller_node_selector: Mapping[str, str], controller_tolerations: Sequence[Mapping[str, str]] = ()
) -> list[dict[str, Any]]:
    """Every object of the driver, namespace first; the controller runs where `controller_node_selector`
    matches (nodes whose service account holds the driver's roles), tolerating `controller_tolerations`."""
    overlay = KUSTOMIZE_DIR / "overlays" / "stable-master"
    kustomization = _kustomization(overlay)
    objects = [
        obj
        for obj in _resources(overlay, skip=("node_windows",))
        if not obj["metadata"]["name"].endswith("-win")
    ]
    tags = _image_tags((overlay / kustomization["transformers"][0]).resolve())
    namespace = kustomization["namespace"]
    for obj in objects:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding", "CSIDriver", "PriorityClass"):
            obj["metadata"]["namespace"] = namespace
        for subject in obj.get("subjects", []):
            if subject["kind"] == "ServiceAccount":
                subject.setdefault("namespace", namespace)
        if obj["kind"] in ("Deployment", "DaemonSet"):
            for container in _containers(obj):
                name, _, _ = container["image"].partition(":")
                new_name, new_tag = tags[name]
                if new_name == DRIVER_IMAGE:
                    new_tag = DRIVER_IMAGE_TAG
                container["image"] = f"{new_name}:{new_tag}"
    for patch in kustomization["patchesJson6902"]:
        target = next(
            o
            for o in objects
            if o["kind"] == patch["target"]["kind"] and o["metadata"]["name"] == patch["target"]["name"]
        )
        _json_patch_add(target, yaml.safe_load((overlay / patch["path"]).read_text()))
    controller = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == CONTROLLER)
    _use_node_identity(controller)
    controller["spec"]["template"]["spec"]["nodeSelector"].update(controller_node_selector)
    controller["spec"]["template"]["spec"]["tolerations"].extend(dict(t) for t in controller_tolerations)
    # Upstream runs the controller on the host network: its ports are host ports, so a rolling update would
    # start the new pod beside the old one, which one server cannot place. The old one goes first.
    controller["spec"]["strategy"] = {"type": "Recreate"}
    namespace_object = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": dict(PRIVILEGED_NAMESPACE_LABELS)},
    }
    return [namespace_object, *objects]


def custom_role_permissions() -> list[str]:
    """The permissions upstream's custom role gives the driver on instances and disks."""
    return list(yaml.safe_load(CUSTOM_ROLE_FILE.read_text())["includedPermissions"])


class PdCsiDriver(pulumi.ComponentResource):
    """The driver's objects, created through the cluster's Kubernetes provider, namespace first."""

    def __init__(
        self,
        name: str,
        manifests: Sequence[Mapping[str, Any]],
        provider: k8s.Provider,
        depends_on: Sequence[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("gpu-k8s:gcp:PdCsiDriver", name, None, opts)
        namespace_manifest, *rest = manifests
        namespace = kubernetes_object(
            f"{name}-namespace",
            namespace_manifest,
            pulumi.ResourceOptions(parent=self, provider=provider, depends_on=list(depends_on)),
        )
        after_namespace = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[namespace])
        self.objects = [
            kubernetes_object(f"{name}-{m['kind'].lower()}-{m['metadata']['name']}", m, after_namespace)
            for m in rest
        ]
        self.register_outputs({})
