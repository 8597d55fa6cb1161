"""The GPU pools of a k3s cluster on Compute Engine: an instance template and a zonal managed instance group
each, which the cluster-autoscaler scales from zero, and what their VMs boot with."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from gpu_k8s.components.autoscaler import cluster_scale_down_unneeded_time, node_template
from gpu_k8s.components.cluster import GpuPool
from gpu_k8s.components.configbase import ConfigIssue, config_path
from gpu_k8s.components.k3s.cloudinit import AgentNode, agent_cloud_config
from gpu_k8s.components.k3s.control_plane import agent_taints
from gpu_k8s.components.k3s.paths import API_PORT
from gpu_k8s.providers.gcp.autoscaling import KUBE_ENV_KEY, kube_env
from gpu_k8s.providers.gcp.iam import NodeServiceAccount
from gpu_k8s.providers.gcp.k3s_bootstrap import NODE_ACCESS_METADATA, gce_node_bootstrap
from gpu_k8s.providers.gcp.k3s_network import node_tag
from gpu_k8s.providers.gcp.machines import CLOUD_PLATFORM_SCOPE, boot_disk_type, gce_arch, ubuntu_image
from gpu_k8s.providers.gcp.network import Network
from gpu_k8s.providers.gcp.settings import GceK3sClusterSpec

# Spot VMs get 30 seconds between the preemption notice and the hard stop (Compute Engine). The kubelet
# holds the shutdown 25 of them, so the OS powers off before the stop instead of racing it: workload pods
# keep GKE's 15 s (GKE graceful node shutdown docs) and critical pods get the next 10. The kubelet raises
# logind's InhibitDelayMaxSec itself when that is shorter.
SPOT_GRACEFUL_SHUTDOWN = {"shutdownGracePeriod": "25s", "shutdownGracePeriodCriticalPods": "10s"}
# InstanceGroupManager.baseInstanceName: "The maximum character length is 58" (Compute API discovery
# document, upstream/compute-api).
MAX_BASE_INSTANCE_NAME = 58
# Metadata.items: "The total size of all keys and values must be less than 512 KB" (same document).
MAX_METADATA_BYTES = 512 * 1024
# What the agents' user data can hold at most: the API load balancer's address, and a secret's resource
# name (a project ID is at most 30 characters; a secret ID at most 255, Secret Manager docs as recalled,
# UNCONFIRMED here).
LONGEST_SERVER_URL = f"https://255.255.255.255:{API_PORT}"
LONGEST_SECRET_NAME = f"projects/{'p' * 30}/secrets/{'s' * 255}"


@dataclass(frozen=True)
class GpuGroup:
    pool: GpuPool
    zone: str
    manager: gcp.compute.InstanceGroupManager


def agent_user_data(spec: GceK3sClusterSpec, pool: GpuPool, server_url: str, secret_name: str) -> str:
    """The cloud-init document a GPU agent of the pool boots from."""
    return agent_cloud_config(
        AgentNode(
            k3s_version=spec.k3s.version,
            server_url=server_url,
            secret_name=secret_name,
            labels=pool.node_labels,
            taints=agent_taints(pool),
            kubelet_config=SPOT_GRACEFUL_SHUTDOWN if pool.spec.spot else {},
            external_cloud_provider=True,
        ),
        gce_node_bootstrap(),
    )


def agent_metadata(pool: GpuPool, cluster_unneeded_time: str) -> dict[str, str]:
    """The agents' instance metadata next to their user data: the autoscaler's template and node access."""
    template = node_template(pool, cluster_unneeded_time)
    return {KUBE_ENV_KEY: kube_env(template, gce_arch(pool.machine.name)), **NODE_ACCESS_METADATA}


def metadata_issues(spec: GceK3sClusterSpec, pools: Sequence[GpuPool]) -> Iterable[ConfigIssue]:
    """A pool whose labels and taints would make its instance template's metadata too large to create: they
    are in the user data (k3s flags) and in the autoscaler's template. Measured with the longest server URL
    and secret name the program can produce."""
    unneeded_time = cluster_scale_down_unneeded_time(pools)
    for index, pool in enumerate(pools):
        metadata = {
            "user-data": agent_user_data(spec, pool, LONGEST_SERVER_URL, LONGEST_SECRET_NAME),
            **agent_metadata(pool, unneeded_time),
        }
        size = sum(len(key.encode()) + len(value.encode()) for key, value in metadata.items())
        if size >= MAX_METADATA_BYTES:
            yield ConfigIssue(
                config_path("gpuPools", index, "labels"),
                None,
                f"with the pool's taints they make its VMs' metadata {size:,} bytes; Compute Engine takes "
                f"less than {MAX_METADATA_BYTES:,}",
                "drop or shorten labels",
            )


def instance_base_name(spec: GceK3sClusterSpec, pool_name: str) -> str:
    """The prefix of the pool's VM names (the group appends "-" and four random characters)."""
    return f"{spec.name}-{pool_name}"


def pool_zone(spec: GceK3sClusterSpec, pool: GpuPool) -> str:
    """The pool's own zone, or the network's first: GPU models differ by zone, so name it when it matters."""
    return (pool.spec.zones or spec.network.zones)[0]


def gpu_group(
    parent: pulumi.Resource,
    name: str,
    spec: GceK3sClusterSpec,
    pool: GpuPool,
    network: Network,
    identity: NodeServiceAccount,
    secret: gcp.secretmanager.Secret,
    server_url: pulumi.Output[str],
    cluster_unneeded_time: str,
    boot_after: Sequence[pulumi.Resource],
) -> GpuGroup:
    """An instance template and a zonal managed instance group from zero to maxNodes for one GPU pool."""
    machine = pool.machine
    assert machine.accelerator is not None, "GPU types in the GCP catalog name their accelerator"
    user_data = pulumi.Output.all(server_url, secret.id).apply(
        lambda parts: agent_user_data(spec, pool, parts[0], parts[1])
    )
    template = gcp.compute.InstanceTemplate(
        f"{name}-template",
        description=f"k3s GPU agents of pool {pool.spec.name} in {spec.name}",
        machine_type=machine.name,
        disks=[
            gcp.compute.InstanceTemplateDiskArgs(
                boot=True,
                auto_delete=True,
                # The family, resolved as each VM starts. Resolving it at `up` would replace the template
                # with every new image, and Compute Engine refuses to delete a template that running
                # instances of the group still use (pulumi-gcp#680), failing that `up`.
                source_image=ubuntu_image(machine.name),
                disk_size_gb=pool.spec.disk_size_gib,
                disk_type=boot_disk_type(machine.name),
            )
        ],
        # The autoscaler counts a node's GPUs from these (templates.go BuildCapacity), so they are listed
        # even where the machine type brings its GPUs.
        guest_accelerators=[
            gcp.compute.InstanceTemplateGuestAcceleratorArgs(
                type=machine.accelerator, count=pool.gpus_per_node
            )
        ],
        scheduling=gcp.compute.InstanceTemplateSchedulingArgs(
            # GPU VMs cannot live-migrate.
            on_host_maintenance="TERMINATE",
            automatic_restart=not pool.spec.spot,
            preemptible=pool.spec.spot,
            provisioning_model="SPOT" if pool.spec.spot else "STANDARD",
            # The group recreates a preempted VM when the autoscaler still wants it.
            instance_termination_action="DELETE" if pool.spec.spot else None,
        ),
        network_interfaces=[gcp.compute.InstanceTemplateNetworkInterfaceArgs(subnetwork=network.subnetwork)],
        service_account=gcp.compute.InstanceTemplateServiceAccountArgs(
            email=identity.email, scopes=[CLOUD_PLATFORM_SCOPE]
        ),
        # No Secure Boot: the GPU Operator builds the NVIDIA kernel modules on the node, unsigned.
        shielded_instance_config=gcp.compute.InstanceTemplateShieldedInstanceConfigArgs(
            enable_secure_boot=False, enable_vtpm=True, enable_integrity_monitoring=True
        ),
        metadata={
            "user-data": user_data,
            **agent_metadata(pool, cluster_unneeded_time),
        },
        tags=[node_tag(spec)],
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(boot_after)),
    )
    zone = pool_zone(spec, pool)
    manager = gcp.compute.InstanceGroupManager(
        f"{name}-group",
        zone=zone,
        base_instance_name=instance_base_name(spec, pool.spec.name),
        versions=[gcp.compute.InstanceGroupManagerVersionArgs(instance_template=template.self_link_unique)],
        target_size=pool.spec.min_nodes,
        # A new template reaches new nodes only: running GPU jobs are not restarted by an update.
        update_policy=gcp.compute.InstanceGroupManagerUpdatePolicyArgs(
            type="OPPORTUNISTIC", minimal_action="REPLACE"
        ),
        # The autoscaler owns the size.
        opts=pulumi.ResourceOptions(parent=parent, ignore_changes=["targetSize"]),
    )
    return GpuGroup(pool=pool, zone=zone, manager=manager)
