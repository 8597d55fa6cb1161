"""`storage.shared: efs`: an encrypted EFS file system that only the cluster's nodes reach, the EFS CSI
driver (the EKS add-on, or the pinned chart on k3s), and the StorageClass `shared-rwx` whose claims are
access points on that file system."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from gpu_k8s.components import storage
from gpu_k8s.components.helm import helm_release
from gpu_k8s.components.storage import SharedStorage
from gpu_k8s.providers.aws import addons
from gpu_k8s.providers.aws.iam import EFS_CSI_POLICIES
from gpu_k8s.providers.aws.network import Network
from gpu_k8s.providers.aws.settings import EFS_STORAGE
from gpu_k8s.providers.aws.zones import Zone

EFS_CSI_ADDON = "aws-efs-csi-driver"
EFS_CSI_CHART = "aws-efs-csi-driver"
EFS_CSI_CHART_VERSION = "4.4.1"
EFS_CSI_REPO = "https://kubernetes-sigs.github.io/aws-efs-csi-driver"
# The chart's default controller replica count (values.yaml controller.replicaCount).
EFS_CONTROLLER_REPLICAS = 2
EFS_PROVISIONER = "efs.csi.aws.com"
# The controller makes access points, which needs the role; the node plugin mounts over NFS and needs AWS
# credentials only for the `iam` mount option, which `shared-rwx` does not use. The managed add-on takes a
# Pod Identity association for the controller's service account only: EKS refuses others in CreateAddon
# ("Service account ... in pod identity configuration is not supported for addon", terraform-aws-eks#3520;
# aws-efs-csi-driver#1759 and #1630). Recorded in upstream/references/eks-addons.json.
EFS_CSI_SERVICE_ACCOUNTS = ("efs-csi-controller-sa",)
# The chart's own controller tolerations (values.yaml, 4.4.1): Helm replaces a list, so ours repeat them.
EFS_CSI_CONTROLLER_TOLERATIONS = (
    {"key": "CriticalAddonsOnly", "operator": "Exists"},
    {"key": "efs.csi.aws.com/agent-not-ready", "operator": "Exists"},
)
NFS_PORT = 2049


def efs_storage_class_manifest(file_system_id: pulumi.Input[str]) -> dict[str, Any]:
    """`shared-rwx` on EFS: each claim is an access point with its own directory on the one file system
    (parameters as in the aws-efs-csi-driver 4.4.1 chart's `storageClasses` example). The access point
    enforces its own uid/gid on every request, so mode 700 keeps claims apart whatever user a pod runs as.
    EFS grows and shrinks with the data: a claim's size is not enforced and cannot be expanded."""
    return storage.shared_storage_class_manifest(
        EFS_PROVISIONER,
        {"provisioningMode": "efs-ap", "fileSystemId": file_system_id, "directoryPerms": "700"},
        zonal=False,
        expandable=False,
    )


def efs_csi_chart_values(
    controller_node_selector: dict[str, str], servers: int, tolerations: Sequence[dict[str, str]]
) -> dict[str, Any]:
    """The chart on k3s: the controller on the servers, whose instance role may make access points; it reads
    role and region from instance metadata, which only the host network reaches there. Its health port
    (9909) is then a host port: one replica per server, at most the chart's two, and a rollout replaces a
    pod before it starts another. The node plugin (host network, every node: the chart tolerates every
    taint) mounts."""
    return {
        "controller": {
            "nodeSelector": controller_node_selector,
            "tolerations": [*EFS_CSI_CONTROLLER_TOLERATIONS, *tolerations],
            "hostNetwork": True,
            "replicaCount": min(EFS_CONTROLLER_REPLICAS, servers),
            "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
        }
    }


def mount_zones(zones: Sequence[Zone]) -> dict[str, int]:
    """Zone name -> index of its first private subnet: EFS takes one mount target per zone."""
    first: dict[str, int] = {}
    for index, zone in enumerate(zones):
        first.setdefault(zone.name, index)
    return first


def efs_csi_addon(
    name: str,
    cluster_name: pulumi.Input[str],
    kubernetes_version: str,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource],
    cluster_label: str,
) -> aws.eks.Addon:
    """The EFS CSI add-on; its controller makes access points with the role, its node plugin mounts."""
    return addons.pod_identity_addon(
        name,
        EFS_CSI_ADDON,
        f"{name}-efs-csi",
        EFS_CSI_POLICIES,
        EFS_CSI_SERVICE_ACCOUNTS,
        cluster_name,
        kubernetes_version,
        parent,
        depends_on,
        cluster_label,
    )


def efs_csi_chart(
    name: str,
    controller_node_selector: dict[str, str],
    servers: int,
    tolerations: Sequence[dict[str, str]],
    k8s_provider: k8s.Provider,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource],
) -> k8s.helm.v3.Release:
    return helm_release(
        f"{name}-efs-csi",
        chart=EFS_CSI_CHART,
        version=EFS_CSI_CHART_VERSION,
        repository=EFS_CSI_REPO,
        namespace="kube-system",
        values=efs_csi_chart_values(controller_node_selector, servers, tolerations),
        parent=parent,
        provider=k8s_provider,
        depends_on=depends_on,
    )


@dataclass(frozen=True)
class EfsSharedStorageArgs:
    # The cluster's network, and its zones in private-subnet order.
    network: Network
    zones: Sequence[Zone]
    # The group every node of the cluster carries: the only source NFS is open to.
    node_security_group_id: pulumi.Input[str]
    k8s_provider: k8s.Provider
    # The CSI driver and what else must run before claims can be made.
    driver_ready: Sequence[pulumi.Resource]


class EfsSharedStorage(pulumi.ComponentResource):
    """One EFS file system for the cluster, with a mount target in every zone of the cluster (system nodes
    included), and the StorageClass `shared-rwx` on it."""

    # What the stack outputs say of it.
    summary: SharedStorage

    def __init__(self, name: str, args: EfsSharedStorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-k8s:aws:EfsSharedStorage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        file_system = aws.efs.FileSystem(
            f"{name}-fs",
            encrypted=True,
            # Elastic throughput follows the workload (a data loader's burst, a checkpoint) and is billed per
            # GB moved; bursting would tie throughput to the stored size, which is small for a new cluster.
            throughput_mode="elastic",
            performance_mode="generalPurpose",
            tags={"Name": name},
            opts=child,
        )
        mount_group = aws.ec2.SecurityGroup(
            f"{name}-mount-targets",
            vpc_id=args.network.vpc_id,
            description=f"EFS mount targets of {name}: NFS from the cluster's nodes only",
            tags={"Name": f"{name}-mount-targets"},
            opts=child,
        )
        nfs_from_nodes = aws.vpc.SecurityGroupIngressRule(
            f"{name}-nfs-from-nodes",
            security_group_id=mount_group.id,
            referenced_security_group_id=args.node_security_group_id,
            ip_protocol="tcp",
            from_port=NFS_PORT,
            to_port=NFS_PORT,
            description="NFS from the cluster's nodes",
            opts=pulumi.ResourceOptions(parent=mount_group),
        )
        mount_targets = [
            aws.efs.MountTarget(
                f"{name}-mount-{zone}",
                file_system_id=file_system.id,
                subnet_id=args.network.private_subnet_ids[index],
                security_groups=[mount_group.id],
                opts=pulumi.ResourceOptions(parent=file_system, depends_on=[nfs_from_nodes]),
            )
            for zone, index in mount_zones(args.zones).items()
        ]
        storage.shared_storage_classes(
            f"{name}-storage-class",
            efs_storage_class_manifest(file_system.id),
            args.k8s_provider,
            self,
            [*args.driver_ready, *mount_targets],
        )
        self.summary = SharedStorage(EFS_STORAGE, file_system.id)
        self.register_outputs({"fileSystemId": file_system.id})
