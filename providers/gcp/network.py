"""The VPC a cluster runs in: a subnet (VPC-native with pod and service ranges for GKE; node addresses only
for k3s, whose overlay network addresses pods itself) and Cloud NAT so private nodes reach registries (nvcr.io
for the GPU Operator) without public addresses. Or an existing subnet."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_gcp as gcp

from gpu_k8s.providers.gcp.settings import GcpNetwork

PODS_RANGE = "pods"
SERVICES_RANGE = "services"


class Network(pulumi.ComponentResource):
    """Names the cluster needs: network, subnetwork and, when the spec has them, the two secondary ranges.
    `after`: resources the new VPC waits for (the Compute Engine API)."""

    network: pulumi.Output[str]
    # The VPC's short name (services such as Filestore take it instead of a self link).
    network_name: pulumi.Output[str]
    subnetwork: pulumi.Output[str]
    pods_range_name: pulumi.Output[str] | None = None
    services_range_name: pulumi.Output[str] | None = None

    def __init__(
        self,
        name: str,
        cluster_name: str,
        spec: GcpNetwork,
        region: str,
        after: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("gpu-k8s:gcp:Network", name, None, opts)
        self._spec, self._region = spec, region
        if not spec.creates_vpc:
            assert spec.network_name and spec.subnetwork_name, "validated by load_spec"
            self.network = pulumi.Output.from_input(spec.network_name)
            self.network_name = pulumi.Output.from_input(spec.network_name.rsplit("/", 1)[-1])
            self.subnetwork = pulumi.Output.from_input(spec.subnetwork_name)
            if spec.pods_range_name and spec.services_range_name:
                self.pods_range_name = pulumi.Output.from_input(spec.pods_range_name)
                self.services_range_name = pulumi.Output.from_input(spec.services_range_name)
            self.register_outputs({})
            return
        assert spec.cidr, "validated by load_spec"
        vpc_native = spec.pods_cidr is not None and spec.services_cidr is not None
        child = pulumi.ResourceOptions(parent=self)
        vpc = gcp.compute.Network(
            f"{name}-vpc",
            auto_create_subnetworks=False,
            routing_mode="REGIONAL",
            description=f"GPU cluster {cluster_name}",
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(after)),
        )
        subnet = gcp.compute.Subnetwork(
            f"{name}-nodes",
            network=vpc.id,
            region=region,
            ip_cidr_range=spec.cidr,
            secondary_ip_ranges=[
                gcp.compute.SubnetworkSecondaryIpRangeArgs(
                    range_name=PODS_RANGE, ip_cidr_range=spec.pods_cidr
                ),
                gcp.compute.SubnetworkSecondaryIpRangeArgs(
                    range_name=SERVICES_RANGE, ip_cidr_range=spec.services_cidr
                ),
            ]
            if vpc_native
            else None,
            # Private nodes reach Google APIs (Artifact Registry, logging) without NAT.
            private_ip_google_access=True,
            opts=child,
        )
        router = gcp.compute.Router(f"{name}-router", network=vpc.id, region=region, opts=child)
        gcp.compute.RouterNat(
            f"{name}-nat",
            router=router.name,
            region=region,
            nat_ip_allocate_option="AUTO_ONLY",
            source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
            log_config=gcp.compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"),
            opts=child,
        )
        self.network = vpc.id
        self.network_name = vpc.name
        self.subnetwork = subnet.id
        if vpc_native:
            self.pods_range_name = pulumi.Output.from_input(PODS_RANGE)
            self.services_range_name = pulumi.Output.from_input(SERVICES_RANGE)
        self.register_outputs({"network": self.network, "subnetwork": self.subnetwork})

    def node_cidr(self) -> pulumi.Output[str]:
        """The subnet's primary range, where the nodes' addresses come from: the configured `cidr`, or the
        existing subnet's, read from Compute Engine."""
        if self._spec.cidr is not None:
            return pulumi.Output.from_input(self._spec.cidr)
        subnet = self._spec.subnetwork_name
        assert subnet, "validated by load_spec"
        by_link = "/" in subnet
        return gcp.compute.get_subnetwork_output(
            name=None if by_link else subnet,
            self_link=subnet if by_link else None,
            region=None if by_link else self._region,
            opts=pulumi.InvokeOutputOptions(parent=self),
        ).ip_cidr_range
