"""The Google APIs a stack needs, enabled by the stack so a fresh project works."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp


def enabled_services(
    name: str, project: str, services: Sequence[str], parent: pulumi.Resource
) -> dict[str, gcp.projects.Service]:
    """One Service per API, keyed by API name. Left enabled on destroy: other things may use them."""
    return {
        service: gcp.projects.Service(
            f"{name}-{service.split('.')[0]}-api",
            service=service,
            project=project,
            disable_on_destroy=False,
            opts=pulumi.ResourceOptions(parent=parent),
        )
        for service in services
    }
