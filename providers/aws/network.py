"""The VPC a cluster lives in: a new one with public and private subnets per zone, or an existing one."""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from gpu_k8s.providers.aws.settings import AwsNetwork


@dataclass(frozen=True)
class SubnetPlan:
    """The CIDRs of one availability zone's subnets."""

    zone_index: int
    private_cidr: str
    public_cidr: str


def subnet_plan(vpc_cidr: str, zone_count: int) -> list[SubnetPlan]:
    """Split a VPC CIDR into one large private and one small public subnet per zone.

    The first half of the VPC holds the private subnets (nodes and, with the VPC CNI, every pod IP);
    the public subnets (NAT gateways and load balancers) are carved from the start of the second half.
    """
    vpc = ipaddress.IPv4Network(vpc_cidr)
    slots = 1 << math.ceil(math.log2(zone_count))
    halves = list(vpc.subnets(prefixlen_diff=1))
    private = list(halves[0].subnets(prefixlen_diff=int(math.log2(slots))))
    public_block = next(halves[1].subnets(prefixlen_diff=int(math.log2(slots))))
    public = list(public_block.subnets(prefixlen_diff=int(math.log2(slots))))
    return [SubnetPlan(i, str(private[i]), str(public[i])) for i in range(zone_count)]


def subnet_tags(cluster_name: str, tier: str) -> dict[str, str]:
    """Tags the AWS load balancer integrations use to find subnets for internal/internet-facing LBs."""
    role = "kubernetes.io/role/internal-elb" if tier == "private" else "kubernetes.io/role/elb"
    return {f"kubernetes.io/cluster/{cluster_name}": "shared", role: "1", "Name": f"{cluster_name}-{tier}"}


class Network(pulumi.ComponentResource):
    """Private subnets for nodes, public subnets for NAT and load balancers, one NAT gateway per zone."""

    vpc_id: pulumi.Output[str]
    private_subnet_ids: list[pulumi.Output[str]]
    public_subnet_ids: list[pulumi.Output[str]]

    def __init__(
        self,
        name: str,
        cluster_name: str,
        spec: AwsNetwork,
        region: str,
        zone_names: Sequence[str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("gpu-k8s:aws:Network", name, None, opts)
        if not spec.creates_vpc:
            assert spec.vpc_id is not None
            self.vpc_id = pulumi.Output.from_input(spec.vpc_id)
            self.private_subnet_ids = [pulumi.Output.from_input(s) for s in spec.private_subnet_ids]
            self.public_subnet_ids = [pulumi.Output.from_input(s) for s in spec.public_subnet_ids]
            self.register_outputs({"vpcId": self.vpc_id})
            return
        assert spec.cidr is not None
        child = pulumi.ResourceOptions(parent=self)
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=spec.cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={"Name": cluster_name},
            opts=child,
        )
        gateway = aws.ec2.InternetGateway(
            f"{name}-igw", vpc_id=vpc.id, tags={"Name": cluster_name}, opts=child
        )
        public_routes = aws.ec2.RouteTable(
            f"{name}-public-rt",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=gateway.id)],
            tags={"Name": f"{cluster_name}-public"},
            opts=child,
        )
        self.private_subnet_ids, self.public_subnet_ids = [], []
        private_route_tables: list[aws.ec2.RouteTable] = []
        nat: aws.ec2.NatGateway | None = None
        for plan in subnet_plan(spec.cidr, spec.availability_zones):
            zone = zone_names[plan.zone_index]
            index = plan.zone_index
            public = self._subnet(
                name, cluster_name, "public", index, vpc, plan.public_cidr, zone, public_routes
            )
            if nat is None or not spec.single_nat_gateway:
                nat_ip = aws.ec2.Eip(
                    f"{name}-nat-{index}-eip", domain="vpc", tags={"Name": cluster_name}, opts=child
                )
                nat = aws.ec2.NatGateway(
                    f"{name}-nat-{index}",
                    subnet_id=public.id,
                    allocation_id=nat_ip.id,
                    tags={"Name": f"{cluster_name}-{index}"},
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[gateway]),
                )
            private_routes = aws.ec2.RouteTable(
                f"{name}-private-{index}-rt",
                vpc_id=vpc.id,
                routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nat.id)],
                tags={"Name": f"{cluster_name}-private-{index}"},
                opts=child,
            )
            private = self._subnet(
                name, cluster_name, "private", index, vpc, plan.private_cidr, zone, private_routes
            )
            self.private_subnet_ids.append(private.id)
            self.public_subnet_ids.append(public.id)
            private_route_tables.append(private_routes)
        # Image layers and S3 data go to S3 directly (a gateway endpoint is free) instead of through the NAT
        # gateways, which bill per GB: a GPU node pulls multi-GB CUDA images on every scale-up.
        aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc.id,
            service_name=f"com.amazonaws.{region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=[table.id for table in private_route_tables],
            tags={"Name": f"{cluster_name}-s3"},
            opts=child,
        )
        self.vpc_id = vpc.id
        self.register_outputs({"vpcId": self.vpc_id, "privateSubnetIds": self.private_subnet_ids})

    def _subnet(
        self,
        name: str,
        cluster_name: str,
        tier: str,
        index: int,
        vpc: aws.ec2.Vpc,
        cidr: str,
        zone: pulumi.Input[str],
        routes: aws.ec2.RouteTable,
    ) -> aws.ec2.Subnet:
        """A subnet of one tier in one zone, with its route table association."""
        child = pulumi.ResourceOptions(parent=self)
        subnet = aws.ec2.Subnet(
            f"{name}-{tier}-{index}",
            vpc_id=vpc.id,
            cidr_block=cidr,
            availability_zone=zone,
            # Nodes never get public IPs; NAT gateways and internet-facing LBs use Elastic IPs.
            map_public_ip_on_launch=False,
            tags=subnet_tags(cluster_name, tier),
            opts=child,
        )
        aws.ec2.RouteTableAssociation(
            f"{name}-{tier}-{index}-rta", subnet_id=subnet.id, route_table_id=routes.id, opts=child
        )
        return subnet
