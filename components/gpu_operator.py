"""The NVIDIA GPU Operator: its namespace and its Helm release, with values derived from the platform."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from gpu_k8s.components.cluster import GpuCluster, GpuPool, PlatformTraits
from gpu_k8s.components.helm import helm_release
from gpu_k8s.components.sharing import (
    DEFAULT_DEVICE_PLUGIN_CONFIG,
    MIG_DISABLED_LAYOUT,
    Sharing,
    device_plugin_config,
    mig_parted_config,
)
from gpu_k8s.components.yamltext import yaml_text

NVIDIA_HELM_REPO = "https://helm.ngc.nvidia.com/nvidia"
OPERATOR_NAMESPACE = "gpu-operator"
# The chart's own defaults for these toleration lists (values.yaml v26.7.0); ours extend them.
_CONTROL_PLANE_TOLERATION = {
    "key": "node-role.kubernetes.io/control-plane",
    "operator": "Equal",
    "value": "",
    "effect": "NoSchedule",
}


def pool_tolerations(pools: Sequence[GpuPool]) -> list[dict[str, str]]:
    """One `Exists` toleration per distinct (key, effect) among the pools' taints, in a stable order."""
    seen = sorted({(t.key, t.effect) for pool in pools for t in pool.taints})
    return [{"key": key, "operator": "Exists", "effect": effect} for key, effect in seen]


def _yaml(document: dict[str, Any]) -> str:
    return yaml_text(document)


def device_plugin_configs(pools: Sequence[GpuPool]) -> dict[str, str]:
    """ConfigMap data: one device-plugin config per pool (its nodes carry the key as a label), and a safe
    default for GPU nodes without one: whole GPUs."""
    data = {DEFAULT_DEVICE_PLUGIN_CONFIG: _yaml(device_plugin_config(Sharing()))}
    data.update({pool.spec.name: _yaml(device_plugin_config(pool.sharing)) for pool in pools})
    return data


def custom_mig_config(pools: Sequence[GpuPool]) -> dict[str, str] | None:
    """ConfigMap data (key `config.yaml`) for the MIG manager when some pool's layout is not built in.

    It replaces the operator's built-in config, so it also carries the built-in layouts other pools use.
    """
    layouts = [pool.sharing.mig for pool in pools if pool.sharing.mig is not None]
    if all(layout.builtin for layout in layouts):
        return None
    unique = {layout.name: layout for layout in layouts}
    return {"config.yaml": _yaml(mig_parted_config(unique.values()))}


# Pods of the operator's namespace one node can run at most: one per operand DaemonSet the ClusterPolicy can
# enable (ccManager, dcgm, dcgmExporter, devicePlugin, driver, gfd, kataManager, kataSandboxDevicePlugin,
# migManager, nodeStatusExporter, sandboxDevicePlugin, toolkit, vfioManager, vgpuDeviceManager, vgpuManager:
# the CRD's operands with an `enabled` switch, less cdi/psa/psp/sandboxWorkloads, which are settings, and
# gdrcopy/gds, which run inside the driver pod), the validator, and NFD's worker.
OPERATOR_PODS_PER_NODE = 17
# Pods not tied to a node: the operator, NFD's master and garbage collector, and the chart's hook jobs.
OPERATOR_CONTROL_PODS = 8


def operator_pod_quota(pools: Sequence[GpuPool], system_nodes: int) -> int:
    """Pods the operator's namespace needs when every pool runs at its maximum (NVIDIA's example quota of
    100 pods runs out at about 15 GPU nodes; every operator pod is system-node-critical)."""
    nodes = sum(pool.spec.max_nodes for pool in pools) + system_nodes
    return OPERATOR_PODS_PER_NODE * nodes + OPERATOR_CONTROL_PODS


def priority_quota_manifest(namespace: str, pods: int) -> dict[str, Any]:
    """The ResourceQuota that lets the operator's node-critical pods run outside kube-system on platforms
    that demand one (NVIDIA's google-gke-gpu-operator-quota.yaml)."""
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu-operator-quota", "namespace": namespace},
        "spec": {
            "hard": {"pods": str(pods)},
            "scopeSelector": {
                "matchExpressions": [
                    {
                        "operator": "In",
                        "scopeName": "PriorityClass",
                        "values": ["system-node-critical", "system-cluster-critical"],
                    }
                ]
            },
        },
    }


def _dcgm_service_monitor(scraped: bool) -> dict[str, Any]:
    """The chart enables the DCGM exporter's ServiceMonitor by default, which needs the Prometheus Operator's
    CRDs: off unless `monitoring` installs them. When on, each GPU series gets the name of its node as
    `node`, from the scrape target itself, the label the toolkit's alerts group by."""
    if not scraped:
        return {"enabled": False}
    return {
        "relabelings": [
            {
                "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                "targetLabel": "node",
                "action": "replace",
            }
        ]
    }


def operator_values(
    traits: PlatformTraits,
    pools: Sequence[GpuPool],
    device_plugin_config_name: pulumi.Input[str] | None,
    mig_config_name: pulumi.Input[str] | None = None,
    scraped: bool = False,
) -> dict[str, Any]:
    """Helm values for the gpu-operator chart on a platform with these traits and pools; `scraped`: a
    Prometheus Operator (this toolkit's `monitoring`) reads the DCGM exporter."""
    tolerations = pool_tolerations(pools)
    toolkit: dict[str, Any] = {"enabled": not traits.toolkit_preinstalled}
    toolkit_env = []
    if traits.containerd_socket:
        toolkit_env.append({"name": "CONTAINERD_SOCKET", "value": traits.containerd_socket})
    if traits.toolkit_runtime_config_source:
        toolkit_env.append({"name": "RUNTIME_CONFIG_SOURCE", "value": traits.toolkit_runtime_config_source})
    if toolkit_env:
        toolkit["env"] = toolkit_env
    if traits.toolkit_install_dir:
        toolkit["installDir"] = traits.toolkit_install_dir
    driver: dict[str, Any] = {"enabled": not traits.driver_preinstalled}
    if not traits.driver_preinstalled:
        driver["version"] = str(traits.driver.version)
    # cdi.enabled keeps the chart's default (true since v25.10). AWS's AL2023 NVIDIA example values do not
    # set it either; whether CDI injection works with the AMI's preinstalled toolkit is UNCONFIRMED here
    # and needs a GPU smoke test on a real node.
    system = traits.system_tolerations
    nfd: dict[str, Any] = {"worker": {"tolerations": [_CONTROL_PLANE_TOLERATION, *tolerations]}}
    values: dict[str, Any] = {
        "driver": driver,
        "toolkit": toolkit,
        "daemonsets": {"tolerations": tolerations},
        "node-feature-discovery": nfd,
        "dcgmExporter": {"serviceMonitor": _dcgm_service_monitor(scraped)},
    }
    if system:
        # The operator (and its hook jobs), NFD's master and its garbage collector run on the system nodes.
        values["operator"] = {"tolerations": [_CONTROL_PLANE_TOLERATION, *system]}
        nfd["master"] = {"tolerations": [_CONTROL_PLANE_TOLERATION, *system]}
        nfd["gc"] = {"tolerations": list(system)}
    if traits.driver_install_dir:
        values["hostPaths"] = {"driverInstallDir": traits.driver_install_dir}
    if traits.gpu_sharing_owner == "platform":
        # The platform's device plugin advertises the GPUs and the platform partitions MIG GPUs; a second
        # plugin for nvidia.com/gpu, or a MIG manager applying its default layout, would fight it.
        values["devicePlugin"] = {"enabled": False}
        # GKE's plugin hands pods device names (nvidia0, nvidia0/vgpu1, nvidia0/gi1), not GPU UUIDs: the
        # DCGM exporter matches the kubelet's allocations by name only when told so, else its series carry
        # no pod or namespace (review-gcp.md NG7; the env var: dcgm-exporter pkg/cmd/app.go, 4.5.3-4.8.2).
        values["dcgmExporter"]["env"] = [
            {"name": "DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE", "value": "device-name"}
        ]
        values["migManager"] = {"enabled": False}
        return values
    values["devicePlugin"] = {
        "config": {"name": device_plugin_config_name, "default": DEFAULT_DEVICE_PLUGIN_CONFIG}
    }
    mig_pools = [pool for pool in pools if pool.sharing.mig is not None]
    if mig_pools:
        # One strategy for the whole cluster; resolve_pools gave every MIG pool the same.
        values["mig"] = {"strategy": mig_pools[0].sharing.mig_strategy}
        # Changing MIG mode on a cloud VM needs a GPU reset, which only a reboot gives (AWS and NVIDIA docs).
        mig_manager: dict[str, Any] = {"env": [{"name": "WITH_REBOOT", "value": "true"}]}
        if mig_config_name is not None:
            mig_manager["config"] = {"name": mig_config_name, "default": MIG_DISABLED_LAYOUT}
        values["migManager"] = mig_manager
    return values


@dataclass(frozen=True)
class GpuOperatorArgs:
    """Inputs of the GpuOperator component."""

    cluster: GpuCluster
    chart_version: str
    # The monitoring release whose Prometheus scrapes the DCGM exporter (it installs the ServiceMonitor
    # CRD, so the operator's release waits for it); None: not scraped.
    metrics: pulumi.Resource | None = None


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
        in_namespace = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[namespace]))
        configs: list[pulumi.Resource] = []
        device_plugin_config_name: pulumi.Output[str] | None = None
        mig_config_name: pulumi.Output[str] | None = None
        if cluster.traits.gpu_sharing_owner == "operator":
            # Auto-named: a changed config gets a new name, so the operator rolls the device plugin out
            # again (it does not watch the ConfigMap's content; gpu-sharing.rst).
            device_plugin = k8s.core.v1.ConfigMap(
                f"{name}-device-plugin-config",
                metadata=k8s.meta.v1.ObjectMetaArgs(namespace=namespace.metadata.name),
                data=device_plugin_configs(cluster.pools),
                opts=in_namespace,
            )
            configs.append(device_plugin)
            device_plugin_config_name = device_plugin.metadata.name
            mig_data = custom_mig_config(cluster.pools)
            if mig_data is not None:
                mig_config = k8s.core.v1.ConfigMap(
                    f"{name}-mig-config",
                    metadata=k8s.meta.v1.ObjectMetaArgs(namespace=namespace.metadata.name),
                    data=mig_data,
                    opts=in_namespace,
                )
                configs.append(mig_config)
                mig_config_name = mig_config.metadata.name
        if cluster.traits.needs_priority_quota:
            quota = priority_quota_manifest(
                OPERATOR_NAMESPACE, operator_pod_quota(cluster.pools, cluster.system_nodes)
            )
            configs.append(
                k8s.core.v1.ResourceQuota(
                    f"{name}-priority-quota",
                    metadata=k8s.meta.v1.ObjectMetaArgs(
                        name=quota["metadata"]["name"], namespace=namespace.metadata.name
                    ),
                    spec=quota["spec"],
                    opts=in_namespace,
                )
            )
        release = helm_release(
            f"{name}-release",
            chart="gpu-operator",
            version=args.chart_version,
            repository=NVIDIA_HELM_REPO,
            namespace=namespace.metadata.name,
            values=operator_values(
                cluster.traits,
                cluster.pools,
                device_plugin_config_name,
                mig_config_name,
                scraped=args.metrics is not None,
            ),
            parent=self,
            provider=cluster.k8s_provider,
            depends_on=[namespace, *configs, *([args.metrics] if args.metrics is not None else [])],
        )
        self.namespace = namespace.metadata.name
        self.release_status = release.status
        self.register_outputs({"namespace": self.namespace, "releaseStatus": self.release_status})
