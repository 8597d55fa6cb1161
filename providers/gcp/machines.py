"""Compute Engine facts shared by the GCP platforms: machine type names, boot disks, OS images."""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpu_k8s.components.catalog import Catalog
from gpu_k8s.components.configbase import ConfigIssue, config_path
from gpu_k8s.providers.gcp.settings import GcpClusterSpec

GCE_MACHINE_TYPE = re.compile(r"^[a-z][a-z0-9]*-[a-z0-9]+(-[a-z0-9]+)*$")
BALANCED_PD = "pd-balanced"
# Machine series whose boot disk must be Hyperdisk: A3 Ultra per Vertex AI's DiskSpec ("for A3U machines,
# the default value is hyperdisk-balanced"); A4, A4X and G4 recalled from the Compute Engine machine-series
# pages, which were not retrieved here (UNCONFIRMED).
HYPERDISK_ONLY_SERIES = ("a3-ultragpu", "a4-highgpu", "a4x-highgpu", "g4-standard")
HYPERDISK_BALANCED = "hyperdisk-balanced"
# Access is decided by IAM on the node's service account; the scope only has to allow it.
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# Canonical's Ubuntu 24.04 LTS image families in the ubuntu-os-cloud project (the amd64 name is in wide
# public use; the arm64 one follows the same scheme). A family resolves to its newest image at creation.
UBUNTU_IMAGE_PROJECT = "ubuntu-os-cloud"
UBUNTU_FAMILY = "ubuntu-2404-lts-{arch}"
UBUNTU_IMAGE_FAMILY = f"projects/{UBUNTU_IMAGE_PROJECT}/global/images/family/{UBUNTU_FAMILY}"
# Arm series (Ampere T2A, Axion C4A/N4A, Grace A4X), recalled from the machine-series pages (UNCONFIRMED).
ARM_SERIES = ("t2a-", "c4a-", "n4a-", "a4x-")


def boot_disk_type(machine_type: str) -> str:
    return HYPERDISK_BALANCED if machine_type.startswith(HYPERDISK_ONLY_SERIES) else BALANCED_PD


def gce_arch(machine_type: str) -> str:
    """The Debian/Kubernetes name of the machine's CPU architecture."""
    return "arm64" if machine_type.startswith(ARM_SERIES) else "amd64"


def ubuntu_image(machine_type: str) -> str:
    return UBUNTU_IMAGE_FAMILY.format(arch=gce_arch(machine_type))


def system_pool_issues(spec: GcpClusterSpec, catalog: Catalog) -> Iterable[ConfigIssue]:
    """The system pool runs add-ons (and on k3s the servers): a Compute Engine CPU machine type."""
    system = spec.system_pool.instance_type
    well_formed = GCE_MACHINE_TYPE.match(system) is not None
    if not well_formed or catalog.machine_type("gcp", system) is not None:
        yield ConfigIssue(
            config_path("systemPool", "instanceType"),
            system,
            "not a CPU machine type" if well_formed else "not a Compute Engine machine type",
            "use a CPU type such as e2-standard-4 or n2-standard-4",
        )
