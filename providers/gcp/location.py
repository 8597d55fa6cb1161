"""Where a GCP stack lives: the provider's project and region, and zones that belong to that region."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

import pulumi
import pulumi_gcp as gcp

from gpu_k8s.components.availability import gcp_offerings, where_offered, zone_region
from gpu_k8s.components.configbase import ConfigError, ConfigIssue, config_path
from gpu_k8s.components.spec import GpuPoolSpec
from gpu_k8s.providers.gcp.settings import GCP_ZONE, GcpClusterSpec

# Project IDs: 6-30 lowercase letters, digits and hyphens, starting with a letter, not ending with a hyphen
# (Resource Manager, "Creating and managing projects"); older projects may carry a domain prefix
# ("example.com:my-project").
PROJECT_ID = re.compile(r"(?:[a-z][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]", re.ASCII)
REGION = re.compile(r"[a-z]+-[a-z]+[0-9]+", re.ASCII)
_AWS_REGION = re.compile(r"[a-z]+(-[a-z]+)+-[0-9]+", re.ASCII)


def location_issues(project: str | None, region: str | None) -> Iterable[ConfigIssue]:
    """What is wrong with `gcp:project` and `gcp:region`, if anything."""
    for key, value, example in (("project", project, "my-project"), ("region", region, "us-central1")):
        if not value:
            yield ConfigIssue(f"gcp:{key}", None, "is not set", f"pulumi config set gcp:{key} {example}")
    if project and not PROJECT_ID.fullmatch(project):
        yield ConfigIssue(
            "gcp:project",
            project,
            "is not a project ID (6-30 lowercase letters, digits and hyphens, starting with a letter)",
            "use the project's ID, not its name or number: gcloud projects list",
        )
    if region and not REGION.fullmatch(region):
        shape = (
            "an AWS region name; GCP regions read like us-central1"
            if _AWS_REGION.fullmatch(region)
            else ("not a GCP region name")
        )
        yield ConfigIssue("gcp:region", region, f"is {shape}", "pick one from `gcloud compute regions list`")


def project_and_region() -> tuple[str, str]:
    """`gcp:project` and `gcp:region`, or a ConfigError naming each one that is missing or malformed."""
    config = pulumi.Config("gcp")
    project, region = config.get("project"), config.get("region")
    issues = list(location_issues(project, region))
    if issues:
        raise ConfigError(issues)
    assert project and region
    return project, region


def zone_issues(spec: GcpClusterSpec, region: str) -> Iterable[ConfigIssue]:
    """Every zone the spec names (network and pools) must be a zone of `region`."""
    named = [(("network", "zones", i), zone) for i, zone in enumerate(spec.network.zones)] + [
        (("gpuPools", p, "zones", i), zone)
        for p, pool in enumerate(spec.gpu_pools)
        for i, zone in enumerate(pool.zones)
    ]
    for where, zone in named:
        match = GCP_ZONE.match(zone)
        if match is not None and match.group(1) != region:
            yield ConfigIssue(
                config_path(*where),
                zone,
                f"is not in gcp:region {region}",
                f"use zones of {region}, e.g. {region}-a",
            )


def pool_gpu_type(pool: GpuPoolSpec) -> tuple[str, str]:
    """What must be offered in a pool's zones, and the key that names it: an N1 VM's attached accelerator,
    or the machine type that carries its GPUs."""
    if pool.accelerator is not None and pool.instance_type.startswith("n1-"):
        return pool.accelerator.type, "accelerator.type"
    return pool.instance_type, "instanceType"


def offering_issues(
    spec: GcpClusterSpec, zones_of: Callable[[GpuPoolSpec], Sequence[str]]
) -> Iterable[ConfigIssue]:
    """Pools placed in a zone where their GPU type is not offered, from the committed per-zone table: refused
    before any resource, naming where it is offered. `zones_of` is where the platform puts a pool's nodes."""
    offerings = gcp_offerings()
    source = f"SkyPilot's GCP catalog at {offerings.source['commit'][:8]}"
    for index, pool in enumerate(spec.gpu_pools):
        type_name, key = pool_gpu_type(pool)
        missing = [zone for zone in zones_of(pool) if offerings.offered(type_name, zone) is False]
        if not missing:
            continue
        region = zone_region(missing[0])
        here = [zone for zone in offerings.places(type_name) if zone_region(zone) == region]
        zones_key = config_path("gpuPools", index, "zones") if pool.zones else config_path("network", "zones")
        yield ConfigIssue(
            config_path("gpuPools", index, *key.split(".")),
            type_name,
            f"is not offered in {', '.join(missing)} ({source}); it is offered in "
            f"{where_offered(offerings.places(type_name), region, limit=6)}",
            f"set {zones_key} to zones of {region} that offer it ({', '.join(here)})"
            if here
            else "pick a machine type offered in the cluster's zones, or a region that offers it",
        )


def machine_type_issues(
    spec: GcpClusterSpec,
    project: str,
    zones_of: Callable[[GpuPoolSpec], Sequence[str]],
    system_zones: Sequence[str],
    invoke: pulumi.InvokeOptions,
) -> Iterable[ConfigIssue]:
    """At preview, ask Compute Engine whether each pool's machine type, and the system pool's, exists in each
    zone it is placed in (the project sees what Google offers now, and what the project may use); N1
    accelerators are checked offline only (no provider function lists accelerator types)."""
    placed = [
        (config_path("gpuPools", index, "instanceType"), pool.instance_type, zone)
        for index, pool in enumerate(spec.gpu_pools)
        for zone in zones_of(pool)
    ] + [
        (config_path("systemPool", "instanceType"), spec.system_pool.instance_type, zone)
        for zone in system_zones
    ]
    for key, machine_type, zone in placed:
        found = gcp.compute.get_machine_types(
            filter=f'name = "{machine_type}"', zone=zone, project=project, opts=invoke
        )
        if not found.machine_types:
            yield ConfigIssue(
                key,
                machine_type,
                f"Compute Engine lists no machine type of this name in {zone} for project {project}",
                "pick zones that offer it (gcloud compute machine-types list --filter=name=<type>)",
            )
