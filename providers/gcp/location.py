"""Where a GCP stack lives: the provider's project and region, and zones that belong to that region."""

from __future__ import annotations

import re
from collections.abc import Iterable

import pulumi

from gpu_k8s.components.configbase import ConfigError, ConfigIssue, config_path
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
