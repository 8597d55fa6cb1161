"""What only AWS stacks configure: the VPC (new or existing), the `eks` section, and the AWS rules for pools
(several instance types, EC2 Capacity Blocks) and the system pool. Registered in `platforms.py`."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, ClassVar

from pydantic import Field

from gpu_k8s.components.catalog import Catalog, MachineType
from gpu_k8s.components.configbase import ConfigIssue, StrictModel, config_path
from gpu_k8s.components.k3s.settings import K3sClusterSpec, overlay_issues
from gpu_k8s.components.spec import (
    ClusterSpec,
    GpuPoolSpec,
    NetworkSettings,
    PoolRules,
    cidr_issue,
    host_range_issue,
)

EFA = "efa"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
AWS_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")
# EC2 capacity reservation IDs: "cr-" and 17 hexadecimal digits (cr-02168da1478b509e0 in the EKS user guide,
# "Create a managed node group with Capacity Blocks for ML").
CAPACITY_RESERVATION_ID = re.compile(r"cr-[0-9a-f]{17}")
# EC2 resource IDs: the prefix and 8 or (since 2018) 17 hexadecimal digits.
AWS_VPC_ID = re.compile(r"vpc-(?:[0-9a-f]{8}|[0-9a-f]{17})")
AWS_SUBNET_ID = re.compile(r"subnet-(?:[0-9a-f]{8}|[0-9a-f]{17})")


class AwsNetwork(NetworkSettings):
    """A new VPC (`cidr` + `availabilityZones`) or an existing one (`vpcId` + subnet ids)."""

    cidr: str | None = None
    availability_zones: Annotated[int, Field(ge=2, le=6)] = 3
    # One NAT gateway for all zones instead of one per zone: cheaper, but a zone outage cuts egress.
    single_nat_gateway: bool = False
    vpc_id: str | None = None
    private_subnet_ids: tuple[str, ...] = ()
    public_subnet_ids: tuple[str, ...] = ()

    @property
    def creates_vpc(self) -> bool:
        return self.vpc_id is None


class EksSpec(StrictModel):
    """Settings only EKS has."""

    # EKS refuses to delete the cluster until this is false and applied.
    deletion_protection: bool = True
    # IAM roles and users (ARNs) that get cluster-admin. Empty: whoever runs `pulumi up` (its role), which
    # changes when CI and a person take turns.
    admins: tuple[str, ...] = ()
    # The EKS AMI release of every node group ("1.35.2-20261110"), or "latest" (the release EKS recommends
    # for the minor, read at every `up`). Unset: each group keeps the release it was created with, so no
    # `up` rolls running nodes unless asked.
    node_image_release: str | None = None


# A zone's name (us-east-1a) or its ID (use1-az1), as `aws ec2 describe-availability-zones` lists them.
AWS_ZONE = re.compile(r"[a-z]{2}(-[a-z]+)+-\d[a-z]|[a-z]{2,5}\d-az\d{1,2}", re.ASCII)


class AwsPoolRules(PoolRules):
    """EC2 pools: several instance types, EC2 Capacity Blocks, zones kept where they were placed."""

    def pool_zone_issues(self, index: int, pool: GpuPoolSpec) -> Iterable[ConfigIssue]:
        """`zones` places a pool for good: a node group in each (by name or zone ID), whatever EC2 offers
        later (components/placement.py)."""
        if not pool.zones:
            return
        where = config_path("gpuPools", index, "zones")
        malformed = [zone for zone in pool.zones if not AWS_ZONE.fullmatch(zone)]
        if malformed:
            yield ConfigIssue(
                where,
                list(pool.zones),
                f"{', '.join(repr(z) for z in malformed)} is not a zone name or zone ID",
                "list zones as `aws ec2 describe-availability-zones` names them, e.g. [us-east-1a, "
                "us-east-1b] or [use1-az1, use1-az2]",
            )
        elif len(set(pool.zones)) < len(pool.zones):
            yield ConfigIssue(where, list(pool.zones), "lists a zone twice", "list each zone once")
        elif pool.capacity_reservation_id is not None:
            yield ConfigIssue(where, list(pool.zones), "a Capacity Block has its own zone", "remove zones")
        elif pool.interconnect is not None and len(pool.zones) != 1:
            yield ConfigIssue(
                where,
                list(pool.zones),
                "a pool with an interconnect keeps its nodes in one zone (one placement group)",
                f"keep one zone, e.g. zones: [{pool.zones[0]}]",
            )
        elif pool.max_nodes < len(pool.zones):
            yield ConfigIssue(
                where,
                list(pool.zones),
                f"each zone's node group holds at least one node, and maxNodes is {pool.max_nodes}",
                f"raise maxNodes to {len(pool.zones)}, or list fewer zones (empty a group's zone first)",
            )

    def capacity_block_issues(self, where: str, pool: GpuPoolSpec) -> Iterable[ConfigIssue]:
        block = pool.capacity_reservation_id
        if not CAPACITY_RESERVATION_ID.fullmatch(block or ""):
            yield ConfigIssue(
                where,
                block,
                "not a capacity reservation ID",
                "use the Capacity Block's reservation ID, e.g. cr-02168da1478b509e0 (aws ec2 "
                "describe-capacity-reservations --filters Name=reservation-type,Values=capacity-block)",
            )

    def extra_type_issues(
        self, path: Callable[..., str], pool: GpuPoolSpec, catalog: Catalog
    ) -> Iterable[ConfigIssue]:
        """More instance types for a pool: same GPUs and architecture, at least the first type's size."""
        if pool.capacity_reservation_id is not None:
            yield ConfigIssue(
                path("extraInstanceTypes"),
                list(pool.extra_instance_types),
                "a pool in a Capacity Block launches the block's instance type only",
                "remove it, or capacityReservationId",
            )
        first = catalog.machine_type("aws", pool.instance_type)
        seen = {pool.instance_type}
        for index, name in enumerate(pool.extra_instance_types):
            where = path("extraInstanceTypes", index)
            machine = catalog.machine_type("aws", name)
            if name in seen:
                yield ConfigIssue(where, name, "listed twice (or is the pool's instanceType)", "list it once")
                continue
            seen.add(name)
            if machine is None:
                hint = ", ".join(catalog.nearest_gpu_types("aws", name))
                yield ConfigIssue(
                    where, name, "not a GPU type of aws in the catalog", f"did you mean one of: {hint}?"
                )
            elif first is None:  # the pool's instanceType is refused already
                continue
            elif _gpus(machine) != _gpus(first):
                yield ConfigIssue(
                    where,
                    name,
                    f"has {machine.gpu_count} x {_model_name(machine)} ({machine.arch}), not the "
                    f"{first.gpu_count} x {_model_name(first)} ({first.arch}) of {pool.instance_type}",
                    "list only types with the same GPUs and CPU architecture; make another pool for others",
                )
            elif (machine.vcpu or 0) < (first.vcpu or 0) or (machine.memory_gib or 0) < (
                first.memory_gib or 0
            ):
                yield ConfigIssue(
                    where,
                    name,
                    f"is smaller than {pool.instance_type} ({machine.vcpu} vCPUs and "
                    f"{machine.memory_gib} GiB against {first.vcpu} and {first.memory_gib}): the autoscaler "
                    "would plan pods onto a node that cannot hold them",
                    f"make {name} the pool's instanceType and list {pool.instance_type} here",
                )

    def interconnect_issues(
        self, path: Callable[..., str], pool: GpuPoolSpec, catalog: Catalog
    ) -> Iterable[ConfigIssue]:
        """EFA where the instance type has it, for one instance type (the interfaces are sized for it)."""
        if pool.interconnect != EFA:
            yield ConfigIssue(
                path("interconnect"), pool.interconnect, "not an interconnect of aws", f"use {EFA}"
            )
            return
        machine = catalog.machine_type("aws", pool.instance_type)
        if machine is not None and machine.efa_max_interfaces == 0:
            # Types with EFA, those with the pool's GPU first.
            same_gpu: list[str] = []
            other_gpus: list[str] = []
            for name in catalog.gpu_types("aws"):
                other = catalog.machine_type("aws", name)
                if other is not None and other.efa_max_interfaces:
                    (same_gpu if other.gpu_model == machine.gpu_model else other_gpus).append(name)
            capable = same_gpu + other_gpus
            yield ConfigIssue(
                path("interconnect"),
                pool.interconnect,
                f"{pool.instance_type} has no EFA (EC2 DescribeInstanceTypes: MaximumEfaInterfaces 0)",
                f"remove it, or use a type with EFA, e.g. {', '.join(capable[:4])}",
            )
        if pool.extra_instance_types:
            yield ConfigIssue(
                path("extraInstanceTypes"),
                list(pool.extra_instance_types),
                "a pool with an interconnect runs one instance type (its interfaces are sized for it)",
                "remove extraInstanceTypes, or interconnect",
            )

    def interconnect_resources(self, pool: GpuPoolSpec, machine: MachineType) -> dict[str, int]:
        # The EFA device plugin advertises each interface as one vpc.amazonaws.com/efa (EKS user guide,
        # "Run machine learning training on Amazon EKS with Elastic Fabric Adapter").
        return {EFA_RESOURCE: machine.efa_max_interfaces} if pool.interconnect == EFA else {}


AWS_POOL_RULES = AwsPoolRules("aws")
EFS_STORAGE = "efs"


class AwsClusterSpec(ClusterSpec):
    """What every AWS platform configures and checks the same way."""

    network: AwsNetwork
    pool_rules: ClassVar[PoolRules] = AWS_POOL_RULES

    def network_issues(self) -> Iterable[ConfigIssue]:
        yield from _vpc_issues(self.network)

    def system_pool_issues(self) -> Iterable[ConfigIssue]:
        if not AWS_INSTANCE_TYPE.match(self.system_pool.instance_type):
            yield ConfigIssue(
                config_path("systemPool", "instanceType"),
                self.system_pool.instance_type,
                "not an EC2 instance type name",
                "use a type like m7i.large",
            )


class EksClusterSpec(AwsClusterSpec):
    """An EKS cluster with managed GPU node groups."""

    eks: EksSpec = EksSpec()

    shared_storage: ClassVar[Mapping[str, str]] = {
        EFS_STORAGE: "Amazon EFS, through the EKS add-on of its CSI driver"
    }


class Ec2K3sClusterSpec(K3sClusterSpec, AwsClusterSpec):
    """k3s on EC2 instances: servers in the system pool, agents in GPU auto scaling groups."""

    network: AwsNetwork

    shared_storage: ClassVar[Mapping[str, str]] = {
        EFS_STORAGE: "Amazon EFS, through the pinned chart of its CSI driver"
    }

    def network_issues(self) -> Iterable[ConfigIssue]:
        yield from super().network_issues()
        yield from overlay_issues(self.network.cidr)


def _gpus(machine: MachineType) -> tuple[object, ...]:
    return machine.gpu_model, machine.gpu_count, machine.arch


def _model_name(machine: MachineType) -> str:
    return machine.gpu_model.id if machine.gpu_model is not None else "no GPU"


def _vpc_issues(net: AwsNetwork) -> Iterable[ConfigIssue]:
    if net.cidr is not None and net.vpc_id is not None:
        yield ConfigIssue(
            config_path("network"),
            {"cidr": net.cidr, "vpcId": net.vpc_id},
            "cidr and vpcId exclude each other",
            "set cidr to create a VPC, or vpcId + privateSubnetIds + publicSubnetIds to use one",
        )
        return
    if net.cidr is None and net.vpc_id is None:
        yield ConfigIssue(
            config_path("network"),
            None,
            "neither cidr nor vpcId is set",
            "set cidr (e.g. 10.40.0.0/16) or vpcId with subnet ids",
        )
        return
    if net.cidr is not None:
        issue = cidr_issue(config_path("network", "cidr"), net.cidr) or host_range_issue(
            config_path("network", "cidr"), net.cidr
        )
        if issue:
            yield issue
        elif not 16 <= ipaddress.IPv4Network(net.cidr).prefixlen <= 20:
            yield ConfigIssue(
                config_path("network", "cidr"),
                net.cidr,
                "prefix must be /16 to /20",
                "a GPU cluster needs room for pod IPs; use a /16",
            )
        if net.private_subnet_ids or net.public_subnet_ids:
            yield ConfigIssue(
                config_path("network"),
                net.cidr,
                "subnet ids are only used with vpcId",
                "remove privateSubnetIds/publicSubnetIds or replace cidr with vpcId",
            )
        return
    if not AWS_VPC_ID.fullmatch(net.vpc_id or ""):
        yield ConfigIssue(
            config_path("network", "vpcId"),
            net.vpc_id,
            "not a VPC ID",
            "use the VPC's ID, e.g. vpc-0a1b2c3d4e5f60718 (aws ec2 describe-vpcs)",
        )
    seen: dict[str, str] = {}
    for key, ids in (
        ("privateSubnetIds", net.private_subnet_ids),
        ("publicSubnetIds", net.public_subnet_ids),
    ):
        for index, subnet in enumerate(ids):
            where = config_path("network", key, index)
            if not AWS_SUBNET_ID.fullmatch(subnet):
                yield ConfigIssue(
                    where, subnet, "not a subnet ID", "use subnet IDs, e.g. subnet-0a1b2c3d4e5f60718"
                )
            elif subnet in seen:
                yield ConfigIssue(
                    where, subnet, f"is listed already in network.{seen[subnet]}", "list each subnet once"
                )
            seen.setdefault(subnet, key)
    if len(set(net.private_subnet_ids)) < 2:
        yield ConfigIssue(
            config_path("network", "privateSubnetIds"),
            list(net.private_subnet_ids),
            "at least 2 private subnets (in 2 availability zones) are required",
            "list the private subnet ids of at least two zones",
        )
