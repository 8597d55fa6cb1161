"""Where a GCP stack lives: the provider's project and region, and zones that belong to that region."""

from __future__ import annotations

from collections.abc import Iterable

import pulumi

from components.configbase import ConfigError, ConfigIssue, config_path
from components.spec import GCP_ZONE, ClusterSpec


def project_and_region() -> tuple[str, str]:
    """`gcp:project` and `gcp:region`, or a ConfigError naming each one missing."""
    config = pulumi.Config("gcp")
    project, region = config.get("project"), config.get("region")
    missing = [
        ConfigIssue(f"gcp:{key}", None, "is not set", f"pulumi config set gcp:{key} {example}")
        for key, value, example in (("project", project, "my-project"), ("region", region, "us-central1"))
        if not value
    ]
    if missing:
        raise ConfigError(missing)
    assert project and region
    return project, region


def zone_issues(spec: ClusterSpec, region: str) -> Iterable[ConfigIssue]:
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
