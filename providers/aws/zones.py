"""The availability zones a cluster uses, by zone ID, and which of them offer each GPU pool's instance type.

Zone names map to different physical zones in every account; zone IDs do not. EKS refuses cluster subnets
in a few zone IDs (`UnsupportedAvailabilityZoneException`), and a GPU type is offered in only some zones of
a region: a node group in a zone without it can never start a node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from gpu_k8s.components.availability import aws_offerings, where_offered
from gpu_k8s.components.catalog import Catalog
from gpu_k8s.components.configbase import ConfigIssue, config_path
from gpu_k8s.components.placement import ZonePlacement, placement_of, zone_placement
from gpu_k8s.components.spec import GpuPoolSpec
from gpu_k8s.providers.aws.settings import AwsNetwork

# Zone IDs whose subnets EKS refuses for a cluster: use1-az3 is the known case (cloudposse's EKS component
# changelog 1.203.0, eksctl#817); usw1-az2 and cac1-az3 are named next to it in the review of this stack
# (shared/docs/reviews/review-eks.md F2) and are UNCONFIRMED here.
EKS_UNSUPPORTED_ZONE_IDS = ("use1-az3", "usw1-az2", "cac1-az3")


@dataclass(frozen=True)
class Zone:
    name: str
    zone_id: str


def cluster_zones(network: AwsNetwork, invoke: pulumi.InvokeOptions) -> list[Zone]:
    """The zones of the cluster's private subnets, in subnet order: the first `availabilityZones` default
    zones EKS supports for a new VPC, or the zones of the given subnets."""
    if not network.creates_vpc:
        subnets = [aws.ec2.get_subnet(id=subnet, opts=invoke) for subnet in network.private_subnet_ids]
        return [Zone(s.availability_zone, s.availability_zone_id) for s in subnets]
    found = aws.get_availability_zones(
        state="available",
        filters=[aws.GetAvailabilityZonesFilterArgs(name="opt-in-status", values=["opt-in-not-required"])],
        exclude_zone_ids=list(EKS_UNSUPPORTED_ZONE_IDS),
        opts=invoke,
    )
    zones = [Zone(name, zone_id) for name, zone_id in zip(found.names, found.zone_ids, strict=True)]
    return zones[: network.availability_zones]


def pool_zone_indexes(instance_type: str, zones: Sequence[Zone], invoke: pulumi.InvokeOptions) -> list[int]:
    """Indexes into `zones` (and the private subnets) where a pool's instance type can start."""
    offerings = aws.ec2.get_instance_type_offerings(
        filters=[aws.ec2.GetInstanceTypeOfferingsFilterArgs(name="instance-type", values=[instance_type])],
        location_type="availability-zone-id",
        opts=invoke,
    )
    return [index for index, zone in enumerate(zones) if zone.zone_id in offerings.locations]


def offering_issues(pools: Sequence[GpuPoolSpec], region: str, catalog: Catalog) -> Iterable[ConfigIssue]:
    """Pool types the region does not offer at all, from the committed offerings table: refused before the
    provider exists, naming where the type is offered and what the region offers instead. (The zones are
    chosen at preview, from what AWS answers then.)"""
    offerings = aws_offerings()
    source = offerings.source
    offered_here = [name for name in catalog.gpu_types("aws") if offerings.offered(name, region)]
    for index, pool in enumerate(pools):
        named = [("instanceType", pool.instance_type)] + [
            (f"extraInstanceTypes.{i}", name) for i, name in enumerate(pool.extra_instance_types)
        ]
        for key, type_name in named:
            if offerings.offered(type_name, region) is not False:
                continue
            machine = catalog.machine_type("aws", type_name)
            same_gpu = [
                other
                for other in offered_here
                if machine is not None and machine.gpu_model == catalog.machine_types["aws"][other].gpu_model
            ]
            smallest_same_gpu = ", ".join(_smallest_first(same_gpu, catalog)[:4])
            alternatives = (
                f"a type with the same GPU offered there ({smallest_same_gpu})"
                if same_gpu
                else f"a GPU offered there ({_one_type_per_gpu(offered_here, catalog) or 'none in the data'})"
            )
            yield ConfigIssue(
                config_path("gpuPools", index, *key.split(".")),
                type_name,
                f"is not offered in {region} by AWS's instance-type offerings of {source['uploaded']} "
                f"(moto {source['version']}'s copy); it is offered in "
                f"{where_offered(offerings.places(type_name), region.split('-')[0], limit=5)}",
                f"set aws:region to one of those, or use {alternatives}",
            )


@dataclass(frozen=True)
class CapacityBlock:
    """What EC2 says about a pool's Capacity Block."""

    zone_id: str
    instance_type: str
    instance_count: int
    # scheduled, payment-pending, active, expired, ... (EC2 DescribeCapacityReservations).
    state: str


# Blocks no instance can ever launch into again.
ENDED_BLOCK_STATES = frozenset({"expired", "cancelled", "failed", "payment-failed"})


def capacity_block(reservation_id: str, invoke: pulumi.InvokeOptions) -> CapacityBlock:
    found = aws.ec2.get_capacity_block_reservation(id=reservation_id, opts=invoke)
    return CapacityBlock(found.availability_zone_id, found.instance_type, found.instance_count, found.state)


@dataclass(frozen=True)
class ZonePlan:
    """The cluster's zones (in private-subnet order) and, per GPU pool, the indexes of those it has a node
    group in: the user's `zones`, else the first that offer every instance type of the pool, as many as
    `maxNodes` (one with an interconnect; for a pool in a Capacity Block: the block's zone)."""

    zones: tuple[Zone, ...]
    pool_zones: Mapping[str, tuple[int, ...]]
    blocks: Mapping[str, CapacityBlock] = field(default_factory=dict)
    # Per instance type of a pool with several, the indexes of the zones offering it.
    type_zones: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


def zone_plan(network: AwsNetwork, pools: Sequence[GpuPoolSpec], invoke: pulumi.InvokeOptions) -> ZonePlan:
    zones = tuple(cluster_zones(network, invoke))
    blocks = {
        pool.name: capacity_block(pool.capacity_reservation_id, invoke)
        for pool in pools
        if pool.capacity_reservation_id is not None
    }
    type_zones = {
        name: tuple(pool_zone_indexes(name, zones, invoke))
        for pool in pools
        if pool.name not in blocks
        for name in dict.fromkeys((pool.instance_type, *pool.extra_instance_types))
    }
    pool_zones = {}
    for pool in pools:
        if pool.zones:
            # The user's: kept as listed whatever EC2 offers now (pinned_zone_warnings says when it does not).
            pool_zones[pool.name] = tuple(
                i
                for wanted in pool.zones
                for i, zone in enumerate(zones)
                if wanted in (zone.name, zone.zone_id)
            )
            continue
        if pool.name in blocks:
            offered = tuple(i for i, zone in enumerate(zones) if zone.zone_id == blocks[pool.name].zone_id)
        else:
            offered = tuple(
                i
                for i in type_zones[pool.instance_type]
                if all(i in type_zones[name] for name in pool.extra_instance_types)
            )
        # A pool with an interconnect keeps its nodes in one zone: a cluster placement group cannot span
        # two, and traffic between zones would leave the fabric. Others use as many zones as they may have
        # nodes (a zone's group holds at least one).
        pool_zones[pool.name] = offered[: 1 if pool.interconnect is not None else pool.max_nodes]
    return ZonePlan(zones, pool_zones, blocks, type_zones)


def zone_issues(network: AwsNetwork, pools: Sequence[GpuPoolSpec], plan: ZonePlan) -> Iterable[ConfigIssue]:
    """Too few zones for the cluster, and GPU pools whose type none of the cluster's zones offers."""
    zones = plan.zones
    if len(zones) < network.availability_zones and network.creates_vpc:
        yield ConfigIssue(
            config_path("network", "availabilityZones"),
            network.availability_zones,
            f"the region has only {len(zones)} default zones EKS supports",
            f"set it to at most {len(zones)}",
        )
    listed = ", ".join(f"{z.name} ({z.zone_id})" for z in zones)
    for index, pool in enumerate(pools):
        unknown = [w for w in pool.zones if not any(w in (z.name, z.zone_id) for z in zones)]
        if unknown:
            yield ConfigIssue(
                config_path("gpuPools", index, "zones"),
                list(pool.zones),
                f"{', '.join(unknown)} is not a zone of the cluster's subnets: {listed}",
                "list zones of the cluster, by name or zone ID",
            )
            continue
        if pool.zones:
            continue
        block = plan.blocks.get(pool.name)
        if block is not None:
            yield from _capacity_block_issues(index, pool, block, plan.pool_zones[pool.name], listed)
            continue
        if plan.type_zones[pool.instance_type] and not plan.pool_zones[pool.name]:
            yield ConfigIssue(
                config_path("gpuPools", index, "extraInstanceTypes"),
                list(pool.extra_instance_types),
                "no zone of the cluster offers all of the pool's types: "
                + "; ".join(
                    f"{name} in {', '.join(zones[i].zone_id for i in plan.type_zones[name]) or 'none'}"
                    for name in (pool.instance_type, *pool.extra_instance_types)
                ),
                "list only types offered where instanceType is, or make another pool for them",
            )
        elif not plan.pool_zones[pool.name]:
            yield ConfigIssue(
                config_path("gpuPools", index, "instanceType"),
                pool.instance_type,
                f"is offered in none of the cluster's zones: {listed}",
                "pick a type these zones offer, or a region or subnets in zones that offer it "
                "(aws ec2 describe-instance-type-offerings --location-type availability-zone-id)",
            )


def pool_zone_ids(plan: ZonePlan) -> dict[str, list[str]]:
    """Each pool's zones by zone ID (the same physical zones in every account), in the order it uses them."""
    return {pool: [plan.zones[i].zone_id for i in indexes] for pool, indexes in plan.pool_zones.items()}


def placement_guard(cluster_name: str, pools: Sequence[GpuPoolSpec], plan: ZonePlan) -> ZonePlacement:
    """The guard every GPU node group waits for: a pool the user did not place keeps the zones it was
    first placed in (components/placement.py). Warns of placed zones EC2 no longer offers the types in."""
    for warning in pinned_zone_warnings(pools, plan):
        pulumi.log.warn(warning)
    return zone_placement(
        cluster_name,
        # A pool in a Capacity Block is placed by its block: moving to a new block moves it.
        placement_of(
            [p.name for p in pools],
            pool_zone_ids(plan),
            [bool(p.zones) or p.capacity_reservation_id is not None for p in pools],
        ),
    )


def pinned_zone_warnings(pools: Sequence[GpuPoolSpec], plan: ZonePlan) -> list[str]:
    """Zones a user placed a pool in that EC2 says do not offer its types now: its group there cannot start
    a node (kept, so that its running nodes are not deleted)."""
    warnings = []
    for pool in pools:
        if not pool.zones or pool.name in plan.blocks:
            continue
        offering = set(plan.type_zones[pool.instance_type]).intersection(
            *(plan.type_zones[name] for name in pool.extra_instance_types)
        )
        for index in plan.pool_zones[pool.name]:
            if index not in offering:
                zone = plan.zones[index]
                warnings.append(
                    f"gpuPools {pool.name}: {zone.name} ({zone.zone_id}) does not offer all of the pool's "
                    "types now; its node group there cannot start a node (remove the zone once it is empty)"
                )
    return warnings


def _capacity_block_issues(
    index: int, pool: GpuPoolSpec, block: CapacityBlock, zone_indexes: Sequence[int], listed: str
) -> Iterable[ConfigIssue]:
    """A pool in a Capacity Block has the block's instance type, a zone of the cluster, and no more nodes
    than the block holds; it keeps nodes only while the block is active."""
    where = config_path("gpuPools", index, "capacityReservationId")
    if block.state in ENDED_BLOCK_STATES:
        yield ConfigIssue(
            where,
            pool.capacity_reservation_id,
            f"this Capacity Block is {block.state}: no instance can launch into it",
            "remove it (the pool then runs on demand), or name a current block",
        )
    elif block.state != "active" and pool.min_nodes > 0:
        # A managed node group waits for its minimum at creation, which cannot launch before the block starts.
        yield ConfigIssue(
            config_path("gpuPools", index, "minNodes"),
            pool.min_nodes,
            f"the Capacity Block {pool.capacity_reservation_id} is {block.state}, not active yet",
            "set minNodes to 0 until the block starts; the autoscaler starts nodes in it when pods ask",
        )
    if block.instance_type != pool.instance_type:
        yield ConfigIssue(
            where,
            pool.capacity_reservation_id,
            f"reserves {block.instance_type}, not the pool's {pool.instance_type}",
            f"set the pool's instanceType to {block.instance_type}, or name a block of {pool.instance_type}",
        )
    if not zone_indexes:
        yield ConfigIssue(
            where,
            pool.capacity_reservation_id,
            f"is in zone {block.zone_id}, none of the cluster's: {listed}",
            "give the cluster a subnet in that zone (network.privateSubnetIds, or a region whose default "
            "zones include it)",
        )
    if pool.max_nodes > block.instance_count:
        yield ConfigIssue(
            config_path("gpuPools", index, "maxNodes"),
            pool.max_nodes,
            f"the Capacity Block {pool.capacity_reservation_id} holds {block.instance_count} instances",
            f"set maxNodes to at most {block.instance_count}",
        )


def _smallest_first(types: Sequence[str], catalog: Catalog) -> list[str]:
    def size(name: str) -> tuple[int, int, str]:
        machine = catalog.machine_types["aws"][name]
        return machine.gpu_count, machine.vcpu or 0, name

    return sorted(types, key=size)


def _one_type_per_gpu(types: Sequence[str], catalog: Catalog) -> str:
    """The smallest type of each GPU model, as `g6.xlarge (L4)`."""
    smallest: dict[str, str] = {}
    for name in _smallest_first(types, catalog):
        model = catalog.machine_types["aws"][name].gpu_model
        if model is not None:
            smallest.setdefault(model.display_name, name)
    return ", ".join(f"{name} ({model})" for model, name in sorted(smallest.items()))
