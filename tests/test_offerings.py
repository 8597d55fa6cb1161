"""A GPU type placed where its cloud does not offer it is refused before any resource exists, naming where it
is offered (AWS per region, GCP per zone, from the committed offering tables); at preview a GKE or GCE pool's
machine type is also asked of Compute Engine in each of its zones."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_k8s.components.configbase import ConfigError
from gpu_k8s.tools.engine import RealisticMocks, run_program


def refused(config: dict[str, Any], mocks: RealisticMocks | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        recording = run_program("offerings", config, mocks=mocks)
        pytest.fail(f"planned {len(recording.registrations)} resources")
    return str(caught.value)


def test_an_aws_gpu_type_the_region_does_not_offer_is_refused_naming_where_it_is(aws_eks_config):
    config = copy.deepcopy(aws_eks_config)
    config["aws:region"] = "af-south-1"
    config["gpu-k8s:cluster"]["gpuPools"][0]["instanceType"] = "p5.48xlarge"
    message = refused(config)
    assert (
        'gpuPools[0].instanceType: "p5.48xlarge" - is not offered in af-south-1 by AWS\'s instance-type '
        "offerings of 2026-10-27 (moto 5.2.5's copy); it is offered in ap-northeast-1, " in message
    ), message
    # The region offers T4s only: the smallest type of each GPU it offers is the alternative.
    assert "Fix: set aws:region to one of those, or use a GPU offered there (g4dn.xlarge (NVIDIA T4))" in (
        message
    )


def test_a_region_missing_from_the_offerings_data_is_left_to_aws(aws_eks_config):
    """A region newer than the data is not judged offline (the zone plan asks AWS at preview)."""
    config = copy.deepcopy(aws_eks_config)
    config["aws:region"] = "mx-central-1"
    assert run_program("offerings", config).registrations


@pytest.mark.parametrize("stack", ["gcp_gke_config", "gcp_k3s_config"])
def test_an_n1_accelerator_the_zone_does_not_offer_is_refused_naming_zones_that_do(request, stack):
    config = copy.deepcopy(request.getfixturevalue(stack))
    pools = config["gpu-k8s:cluster"]["gpuPools"]
    pools.append(
        {
            "name": "p100",
            "instanceType": "n1-standard-8",
            "accelerator": {"type": "nvidia-tesla-p100", "count": 1},
            "maxNodes": 1,
            "zones": ["us-central1-a"],
        }
    )
    message = refused(config)
    index = len(pools) - 1
    assert (
        f'gpuPools[{index}].accelerator.type: "nvidia-tesla-p100" - is not offered in us-central1-a '
        "(SkyPilot's GCP catalog at 017e2502); it is offered in us-central1-c, us-central1-f" in message
    ), message
    assert (
        f"Fix: set gpu-k8s:cluster.gpuPools[{index}].zones to zones of us-central1 that offer it " in message
    )


class NoMachineTypesIn(RealisticMocks):
    """A project that sees no machine type of the asked name in one zone (what Compute Engine answers for a
    type the zone does not have)."""

    def __init__(self, zone: str):
        super().__init__(region="us-central1")
        self.zone = zone

    def call(self, args):
        if args.token == "gcp:compute/getMachineTypes:getMachineTypes" and args.args["zone"] == self.zone:
            return {**args.args, "machineTypes": [], "id": "none"}, []
        return super().call(args)


@pytest.mark.parametrize("stack", ["gcp_gke_config", "gcp_k3s_config"])
def test_at_preview_a_machine_type_compute_engine_does_not_list_in_a_pool_zone_is_refused(request, stack):
    config = request.getfixturevalue(stack)
    message = refused(config, mocks=NoMachineTypesIn("us-central1-c"))
    assert "Compute Engine lists no machine type of this name in us-central1-c for project" in message, (
        message
    )
    assert "Fix: pick zones that offer it (gcloud compute machine-types list --filter=name=<type>)" in message


@pytest.mark.parametrize("stack", ["gcp_gke_config", "gcp_k3s_config"])
def test_a_gpu_machine_type_the_zone_does_not_offer_is_refused_naming_zones_that_do(request, stack):
    config = copy.deepcopy(request.getfixturevalue(stack))
    pools = config["gpu-k8s:cluster"]["gpuPools"]
    pools.append({"name": "h100", "instanceType": "a3-highgpu-8g", "maxNodes": 1, "zones": ["us-central1-f"]})
    message = refused(config)
    index = len(pools) - 1
    assert (
        f'gpuPools[{index}].instanceType: "a3-highgpu-8g" - is not offered in us-central1-f '
        "(SkyPilot's GCP catalog at 017e2502); it is offered in us-central1-a, us-central1-b, us-central1-c"
        in message
    ), message


def test_a_gpu_series_newer_than_the_catalog_is_left_to_compute_engine(gcp_gke_config):
    """The catalog version lists no A4 rows: the offline table does not judge it (the preview does)."""
    config = copy.deepcopy(gcp_gke_config)
    pools = config["gpu-k8s:cluster"]["gpuPools"]
    pools.append({"name": "b200", "instanceType": "a4-highgpu-8g", "maxNodes": 1, "zones": ["us-central1-b"]})
    assert run_program("offerings", config).registrations


def test_at_preview_the_system_machine_type_is_asked_of_compute_engine_in_its_zones(gcp_k3s_config):
    config = copy.deepcopy(gcp_k3s_config)
    config["gpu-k8s:cluster"]["systemPool"]["instanceType"] = "e2-standrd-4"
    message = refused(config, mocks=NoMachineTypesIn("us-central1-b"))
    assert (
        'systemPool.instanceType: "e2-standrd-4" - Compute Engine lists no machine type of this name in '
        "us-central1-b" in message
    ), message
