"""The NVIDIA GPU Operator: its namespace and its Helm release, with values derived from the platform."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from components.cluster import GpuCluster, GpuPool, PlatformTraits
from components.helm import helm_release

NVIDIA_HELM_REPO = "https://helm.ngc.nvidia.com/nvidia"
OPERATOR_NAMESPACE = "gpu-operator"
# The chart's own defaults for these toleration lists (values.yaml v26.7.0); ours extend them.
_CONTROL_PLANE_TOLERATION = {
    "key": "node-role.kubernetes.io/control-plane",
    "operator": "Equal",
    "value": "",
    "effect": "NoSchedule",
}


def pool_tolerations(pools: tuple[GpuPool, ...]) -> list[dict[str, str]]:
    """One `Exists` toleration per distinct (key, effect) among the pools' taints, in a stable order."""
    seen = sorted({(t.key, t.effect) for pool in pools for t in pool.taints})
    return [{"key": key, "operator": "Exists", "effect": effect} for key, effect in seen]


def operator_values(traits: PlatformTraits, pools: tuple[GpuPool, ...]) -> dict[str, Any]:
    """Helm values for the gpu-operator chart on a platform with these traits and pools."""
    tolerations = pool_tolerations(pools)
    toolkit: dict[str, Any] = {"enabled": not traits.toolkit_preinstalled}
    if traits.containerd_socket:
        toolkit["env"] = [{"name": "CONTAINERD_SOCKET", "value": traits.containerd_socket}]
    if traits.toolkit_install_dir:
        toolkit["installDir"] = traits.toolkit_install_dir
    # cdi.enabled keeps the chart's default (true since v25.10). AWS's AL2023 NVIDIA example values do not
    # set it either; whether CDI injection works with the AMI's preinstalled toolkit is UNCONFIRMED here
    # and needs a GPU smoke test on a real node.
    values: dict[str, Any] = {
        "driver": {"enabled": not traits.driver_preinstalled},
        "toolkit": toolkit,
        "daemonsets": {"tolerations": tolerations},
        "node-feature-discovery": {"worker": {"tolerations": [_CONTROL_PLANE_TOLERATION, *tolerations]}},
        # The chart enables a ServiceMonitor by default, which needs the Prometheus Operator CRDs;
        # a fresh cluster has none. Users with Prometheus turn it back on in their own program.
        "dcgmExporter": {"serviceMonitor": {"enabled": False}},
    }
    if traits.driver_install_dir:
        values["hostPaths"] = {"driverInstallDir": traits.driver_install_dir}
    return values


@dataclass(frozen=True)
class GpuOperatorArgs:
    """Inputs of the GpuOperator component."""

    cluster: GpuCluster
    chart_version: str


class GpuOperator(pulumi.ComponentResource):
    """Installs the NVIDIA GPU Operator (device plugin, GFD, DCGM exporter, MIG manager) on a GpuCluster."""

    namespace: pulumi.Output[str]
    release_status: pulumi.Output[Any]

    def __init__(self, name: str, args: GpuOperatorArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-k8s:index:GpuOperator", name, None, opts)
        cluster = args.cluster
        child = pulumi.ResourceOptions(parent=self, provider=cluster.k8s_provider)
        namespace = k8s.core.v1.Namespace(
            f"{name}-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=OPERATOR_NAMESPACE,
                # Operands need privileged, hostPID and hostIPC (NVIDIA security considerations).
                labels={"pod-security.kubernetes.io/enforce": "privileged"},
            ),
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=list(cluster.system_ready))
            ),
        )
        release = helm_release(
            f"{name}-release",
            chart="gpu-operator",
            version=args.chart_version,
            repository=NVIDIA_HELM_REPO,
            namespace=namespace.metadata.name,
            values=operator_values(cluster.traits, cluster.pools),
            parent=self,
            provider=cluster.k8s_provider,
            depends_on=[namespace],
        )
        self.namespace = namespace.metadata.name
        self.release_status = release.status
        self.register_outputs({"namespace": self.namespace, "releaseStatus": self.release_status})
