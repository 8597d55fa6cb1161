"""The default StorageClass: block volumes from the cloud's CSI driver, created where the pod runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
import pulumi_kubernetes as k8s


def default_storage_class_manifest(
    name: str, provisioner: str, parameters: Mapping[str, str]
) -> dict[str, Any]:
    """A default StorageClass whose volumes are created in the zone of the first pod that uses them (GPU
    nodes are zonal and scale from zero, so a volume made earlier could sit in a zone without a node)."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": provisioner,
        "parameters": dict(parameters),
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": True,
        "reclaimPolicy": "Delete",
    }


def default_storage_class(
    name: str,
    manifest: Mapping[str, Any],
    provider: k8s.Provider,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource],
) -> k8s.storage.v1.StorageClass:
    return k8s.storage.v1.StorageClass(
        f"{name}-storage-class",
        metadata=manifest["metadata"],
        provisioner=manifest["provisioner"],
        parameters=manifest["parameters"],
        volume_binding_mode=manifest["volumeBindingMode"],
        allow_volume_expansion=manifest["allowVolumeExpansion"],
        reclaim_policy=manifest["reclaimPolicy"],
        opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=list(depends_on)),
    )
