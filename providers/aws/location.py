"""Where an AWS stack lives: the provider's region, required before anything is planned."""

from __future__ import annotations

import pulumi

from components.configbase import ConfigError, ConfigIssue


def region_from_config() -> str:
    """`aws:region`, or a ConfigError saying how to set it."""
    region = pulumi.Config("aws").get("region")
    if not region:
        raise ConfigError(
            [
                ConfigIssue(
                    "aws:region",
                    None,
                    "is not set",
                    "pulumi config set aws:region us-east-1 (or set it in the stack file)",
                )
            ]
        )
    return region
