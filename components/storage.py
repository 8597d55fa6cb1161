"""The cluster's StorageClasses: block volumes by default, and `shared-rwx` (with `shared-rwx-retain`) when
the stack asks for a shared file system."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

# The same names on every platform, so a workload's claims move between clouds unchanged.
SHARED_STORAGE_CLASS = "shared-rwx"
# The same volumes, kept when their claim is deleted: checkpoints outlive the job (or `helm uninstall`) that
# claimed them (review-training.md T13).
RETAINED_SHARED_STORAGE_CLASS = "shared-rwx-retain"


@dataclass(frozen=True)
class SharedStorage:
    """What `storage.shared` made, for the stack outputs."""

    # The `storage.shared` value.
    service: str
    # The one file system every claim lives on, where there is one (EFS: load datasets into it from
    # outside); Filestore makes an instance per claim.
    file_system_id: pulumi.Output[str] | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "storageClass": SHARED_STORAGE_CLASS,
            "retainedStorageClass": RETAINED_SHARED_STORAGE_CLASS,
            "service": self.service,
            **({} if self.file_system_id is None else {"fileSystemId": self.file_system_id}),
        }


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


def shared_storage_class_manifest(
    provisioner: str, parameters: Mapping[str, pulumi.Input[str]], *, zonal: bool, expandable: bool
) -> dict[str, Any]:
    """`shared-rwx`: volumes that pods on many nodes mount at once. A zonal service's volume is created in
    the zone of its first pod, as block volumes are; a regional one's (EFS) at once, reachable from every
    zone. Deleting a claim deletes what the driver made for it."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": SHARED_STORAGE_CLASS},
        "provisioner": provisioner,
        "parameters": dict(parameters),
        "volumeBindingMode": "WaitForFirstConsumer" if zonal else "Immediate",
        "allowVolumeExpansion": expandable,
        "reclaimPolicy": "Delete",
    }


def shared_storage_classes(
    resource_name: str,
    manifest: Mapping[str, Any],
    provider: k8s.Provider,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource],
) -> list[k8s.storage.v1.StorageClass]:
    """`shared-rwx`, and `shared-rwx-retain`: the same volumes, whose PersistentVolume and data stay after
    their claim is deleted (the PV turns Released; the driver deletes nothing)."""
    retained = {
        **manifest,
        "metadata": {**manifest["metadata"], "name": RETAINED_SHARED_STORAGE_CLASS},
        "reclaimPolicy": "Retain",
    }
    return [
        storage_class(resource_name, manifest, provider, parent, depends_on),
        storage_class(f"{resource_name}-retain", retained, provider, parent, depends_on),
    ]


def storage_class(
    resource_name: str,
    manifest: Mapping[str, Any],
    provider: k8s.Provider,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource],
) -> k8s.storage.v1.StorageClass:
    return k8s.storage.v1.StorageClass(
        resource_name,
        metadata=manifest["metadata"],
        provisioner=manifest["provisioner"],
        parameters=manifest["parameters"],
        volume_binding_mode=manifest["volumeBindingMode"],
        allow_volume_expansion=manifest["allowVolumeExpansion"],
        reclaim_policy=manifest["reclaimPolicy"],
        opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=list(depends_on)),
    )
