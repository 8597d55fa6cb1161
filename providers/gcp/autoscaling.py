"""The Compute Engine half of the cluster-autoscaler on k3s: scale-from-zero templates in `kube-env`,
the managed instance groups it may resize, and the permissions that takes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pulumi

from gpu_k8s.components.autoscaler import NodeTemplate
from gpu_k8s.components.yamltext import yaml_text

# The label the autoscaler's GCE provider reads as "this node has GPUs" (cloudprovider/gce
# gce_cloud_provider.go GPULabel; REFERENCE.md 5.4).
ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
KUBE_ENV_KEY = "kube-env"
COMPUTE_API = "https://www.googleapis.com/compute/v1"
# What the autoscaler's GCE client calls (cloudprovider/gce/autoscaling_gce_client.go, in the copy read
# here; that a 1.36 autoscaler calls nothing more is UNCONFIRMED): reads of machine types, groups, templates,
# zones, regions and operations everywhere in the project...
AUTOSCALER_READ_PERMISSIONS = (
    "compute.instanceGroupManagers.get",
    "compute.instanceGroupManagers.list",
    "compute.instanceTemplates.get",
    "compute.machineTypes.get",
    "compute.machineTypes.list",
    "compute.regions.get",
    "compute.zones.list",
    "compute.zoneOperations.get",
)
# ...and resize, createInstances and deleteInstances on the groups it manages, granted per group.
AUTOSCALER_RESIZE_PERMISSIONS = ("compute.instanceGroupManagers.update",)


def autoscaler_env_vars(template: NodeTemplate, arch: str) -> str:
    """`AUTOSCALER_ENV_VARS`: `;`-separated name=value, lists inside `,`-separated key=value (the format
    cloudprovider/gce/templates.go extractAutoscalerVarFromKubeEnv and parseKeyValueListToMap read).

    Labels and resources are what a node of the pool will carry; GPUs from the instance template's
    accelerators are overridden by `extended_resources`, so a time-sliced node counts its replicas.
    """
    variables = {
        "node_labels": ",".join(f"{key}={value}" for key, value in sorted(template.labels.items())),
        "node_taints": ",".join(f"{t.key}={t.value}:{t.effect}" for t in template.taints),
        "extended_resources": ",".join(
            f"{name}={count}" for name, count in sorted(template.resources.items())
        ),
        "os": "linux",
        "os_distribution": "ubuntu",
        "arch": arch,
    }
    if template.scale_down_unneeded_time:
        variables["autoscaling_options"] = f"scaledownunneededtime={template.scale_down_unneeded_time}"
    return ";".join(f"{name}={value}" for name, value in variables.items() if value)


def kube_env(template: NodeTemplate, arch: str) -> str:
    """The instance template's `kube-env` metadata value: a YAML map the autoscaler unmarshals."""
    return yaml_text(
        {"AUTOSCALER_ENV_VARS": autoscaler_env_vars(template, arch)}, sort_keys=True, width=100_000
    )


def instance_group_url(
    project: pulumi.Input[str], zone: pulumi.Input[str], name: pulumi.Input[str]
) -> pulumi.Output[str]:
    """The group's URL as `--nodes` takes it (cloudprovider/gce gce_url.go:
    projects/<project>/zones/<zone>/instanceGroups/<name>)."""
    return pulumi.Output.format(
        "{0}/projects/{1}/zones/{2}/instanceGroups/{3}", COMPUTE_API, project, zone, name
    )


def autoscaler_cloud_values(groups: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Chart values for the GCE provider with one `--nodes=<min>:<max>:<group URL>` per group: the chart
    renders `autoscalingGroups` that way for every provider but Hetzner (templates/deployment.yaml)."""
    return {"cloudProvider": "gce", "autoscalingGroups": [dict(group) for group in groups]}
