"""`storage.shared: filestore` on gcp-k3s: one basic-tier Filestore instance on the cluster's VPC that only
the node subnet may mount, the NFS CSI driver (pinned chart), and the StorageClass `shared-rwx` whose claims
are directories on the instance's share.

GKE's own Filestore driver is not used here: off GKE it authenticates with a service-account key and its
newest release has no pinnable image (upstream-charts MANIFEST)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from gpu_k8s.components import storage
from gpu_k8s.components.helm import helm_release
from gpu_k8s.components.storage import SharedStorage
from gpu_k8s.providers.gcp.network import Network
from gpu_k8s.providers.gcp.settings import FILESTORE_STORAGE

# Filestore, on GKE through its driver or here directly, needs the Cloud Filestore API (GKE docs, Filestore
# CSI driver, "Before you begin").
FILESTORE_API = "file.googleapis.com"
FILESTORE_TIER = "BASIC_HDD"
# One share per instance, named as pulumi-gcp allows ("16 characters or less").
FILE_SHARE = "shared"
NFS_CSI_CHART = "csi-driver-nfs"
NFS_CSI_CHART_VERSION = "4.13.4"
# The chart's default repository (charts/README.md); its index lists 4.13.4 (upstream/charts/sources.json).
NFS_CSI_REPO = "https://raw.githubusercontent.com/kubernetes-csi/csi-driver-nfs/master/charts"
NFS_PROVISIONER = "nfs.csi.k8s.io"
# The chart's own controller tolerations (values.yaml, 4.13.4): Helm replaces a list, so ours repeat them.
NFS_CSI_CONTROLLER_TOLERATIONS = (
    {"key": "node-role.kubernetes.io/master", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node-role.kubernetes.io/controlplane", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoSchedule"},
)


def nfs_storage_class_manifest(server: pulumi.Input[str]) -> dict[str, Any]:
    """`shared-rwx` on the instance's share: the driver makes a directory per claim (named after its volume)
    and deletes it with the claim (`onDelete` defaults to `delete`, docs/driver-parameters.md). The share is
    one fixed size, so a claim's size is not enforced and cannot be expanded."""
    return storage.shared_storage_class_manifest(
        NFS_PROVISIONER, {"server": server, "share": f"/{FILE_SHARE}"}, zonal=False, expandable=False
    )


def nfs_csi_chart_values(
    controller_node_selector: Mapping[str, str], tolerations: Sequence[Mapping[str, str]]
) -> dict[str, Any]:
    """The controller (it mounts the share to make and delete claim directories) on the servers; the node
    plugin, which mounts with the NFS client in its own image, on every node (the chart tolerates every
    taint). No snapshot sidecar: the cluster has no VolumeSnapshot CRDs or controller for it to serve."""
    return {
        "controller": {
            "nodeSelector": dict(controller_node_selector),
            "tolerations": [*NFS_CSI_CONTROLLER_TOLERATIONS, *tolerations],
            "enableSnapshotter": False,
        }
    }


def filestore_instance_args(
    zone: str,
    capacity_gib: int,
    network_name: pulumi.Input[str],
    reserved_range: str,
    node_cidr: pulumi.Input[str],
) -> gcp.filestore.InstanceArgs:
    """A basic HDD instance peered into the VPC from `reserved_range`, whose share only the node subnet may
    mount, as root (the driver makes each claim's directory as root; pods get them through `fsGroup`)."""
    return gcp.filestore.InstanceArgs(
        location=zone,
        tier=FILESTORE_TIER,
        file_shares=gcp.filestore.InstanceFileSharesArgs(
            name=FILE_SHARE,
            capacity_gb=capacity_gib,
            nfs_export_options=[
                gcp.filestore.InstanceFileSharesNfsExportOptionArgs(
                    ip_ranges=[node_cidr], access_mode="READ_WRITE", squash_mode="NO_ROOT_SQUASH"
                )
            ],
        ),
        networks=[
            gcp.filestore.InstanceNetworkArgs(
                network=network_name,
                modes=["MODE_IPV4"],
                connect_mode="DIRECT_PEERING",
                reserved_ip_range=reserved_range,
            )
        ],
    )


def instance_address(networks: Sequence[gcp.filestore.outputs.InstanceNetwork]) -> str:
    """The address clients mount: Filestore gives a created instance one, from its reserved range."""
    addresses = networks[0].ip_addresses
    assert addresses, "a created Filestore instance has an address"
    return addresses[0]


@dataclass(frozen=True)
class FilestoreSharedStorageArgs:
    network: Network
    # Where the zonal instance lives: the network's first zone (nodes in the region's other zones reach it
    # too, across zones).
    zone: str
    capacity_gib: int
    reserved_range: str
    # The Filestore API, enabled.
    api: pulumi.Resource
    controller_node_selector: Mapping[str, str]
    system_tolerations: Sequence[Mapping[str, str]]
    k8s_provider: k8s.Provider
    # What must run before the driver (the API reachable, the servers initialised).
    system_ready: Sequence[pulumi.Resource]


class FilestoreSharedStorage(pulumi.ComponentResource):
    """The Filestore instance, the NFS CSI driver and `shared-rwx`."""

    # What the stack outputs say of it.
    summary: SharedStorage

    def __init__(
        self, name: str, args: FilestoreSharedStorageArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("gpu-k8s:gcp:FilestoreSharedStorage", name, None, opts)
        instance = gcp.filestore.Instance(
            f"{name}-instance",
            filestore_instance_args(
                args.zone,
                args.capacity_gib,
                args.network.network_name,
                args.reserved_range,
                args.network.node_cidr(),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[args.api]),
        )
        driver = helm_release(
            f"{name}-nfs-csi",
            chart=NFS_CSI_CHART,
            version=NFS_CSI_CHART_VERSION,
            repository=NFS_CSI_REPO,
            namespace="kube-system",
            values=nfs_csi_chart_values(args.controller_node_selector, args.system_tolerations),
            parent=self,
            provider=args.k8s_provider,
            depends_on=args.system_ready,
        )
        server = instance.networks.apply(instance_address)
        storage.shared_storage_classes(
            f"{name}-storage-class",
            nfs_storage_class_manifest(server),
            args.k8s_provider,
            self,
            [driver],
        )
        self.summary = SharedStorage(FILESTORE_STORAGE, instance.name)
        self.register_outputs({"instance": instance.name, "server": server})
