"""What a planned stack costs: each GPU pool's price per node-hour and at its ceiling, and the idle baseline,
what the stack accrues per month with every GPU pool at its floor (control planes, NAT gateways, servers and
system nodes, GPU nodes kept by minNodes), with what the price data cannot count named, not guessed.

Prices come from `components/prices.py` (list prices with their sources and dates); everything else is read
off the recorded resources, so the figures follow the plan, not a second model of it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpu_k8s.components.monitoring import CHART as MONITORING_CHART
from gpu_k8s.components.prices import Price, aws_node_price, fee, gcp_machine_price
from gpu_k8s.tools.engine import HELM_RELEASE, Recording, Registration

HOURS_PER_MONTH = 730
# Resources that bill while the cluster idles but that no committed table prices: named in the plan.
UNPRICED = {
    "aws:lb/loadBalancer:LoadBalancer": "application or gateway load balancer",
    "aws:efs/fileSystem:FileSystem": "EFS file system (per GiB stored)",
    "aws:fsx/lustreFileSystem:LustreFileSystem": "FSx for Lustre file system",
    "gcp:filestore/instance:Instance": "Filestore instance (per provisioned GiB)",
    # Third-party copies of Google's network pricing page say an address a forwarding rule uses costs
    # nothing; Google's own page was not read, so it is named here rather than priced at zero.
    "gcp:compute/address:Address": "external static IP address",
    "aws:s3/bucketV2:BucketV2": "S3 bucket (per GiB stored)",
    "aws:s3/bucket:Bucket": "S3 bucket (per GiB stored)",
    "gcp:secretmanager/secret:Secret": "Secret Manager secret",
    "gcp:storage/bucket:Bucket": "Cloud Storage bucket (per GiB stored)",
    "gcp:kms/cryptoKey:CryptoKey": "Cloud KMS key",
}


@dataclass(frozen=True)
class Charge:
    """One line of the idle baseline: what, how many, and its price each."""

    what: str
    count: int
    price: Price | None
    # A VM (a node or server), which Cloud NAT bills per.
    node: bool = False

    @property
    def usd_per_hour(self) -> float:
        return self.count * self.price.usd_per_hour if self.price is not None else 0.0


def node_price(recording: Recording, pool: dict[str, Any]) -> Price | None:
    """The price of one node of a pool of the `gpuPools` output, where the plan places it."""
    region = recording.region("aws")
    if region:
        return aws_node_price(pool["instanceType"], region, pool["spot"])
    for node_pool in recording.by_type("gcp:container/nodePool:NodePool"):
        if node_pool.name.endswith(f"-gpu-{pool['name']}"):
            return _gcp_price(node_pool.inputs.get("nodeConfig") or {}, recording.region("gcp"))
    for group in recording.by_type("gcp:compute/instanceGroupManager:InstanceGroupManager"):
        if group.name.endswith(f"-gpu-{pool['name']}-group"):
            template = recording.instance_template(group)
            return None if template is None else _gcp_price(template.inputs, recording.region("gcp"))
    return None


def idle_charges(recording: Recording) -> tuple[list[Charge], list[str]]:
    """The priced charges of the stack at rest, and what bills at rest that no table prices."""
    charges = list(_charges(recording, recording.region("aws"), recording.region("gcp")))
    charges += gcp_network_charges(recording, sum(c.count for c in charges if c.node))
    unpriced = Counter(_unpriced(r) for r in recording.registrations if _bills_at_rest(r))
    unpriced.update({f"{c.what} (no price data)": c.count for c in charges if c.price is None})
    not_counted = [f"{n} x {what}" for what, n in sorted(unpriced.items())]
    merged: Counter[tuple[str, Price]] = Counter()
    for charge in charges:
        if charge.price is not None:
            merged[(charge.what, charge.price)] += charge.count
    priced = [Charge(what, count, price) for (what, price), count in sorted(merged.items(), key=_by_what)]
    return priced, not_counted


def _by_what(item: tuple[tuple[str, Price], int]) -> str:
    return item[0][0]


def _bills_at_rest(resource: Registration) -> bool:
    # Internal addresses are free; only external ones bill while reserved.
    if resource.type == "gcp:compute/address:Address":
        return resource.inputs.get("addressType", "EXTERNAL") == "EXTERNAL"
    if resource.type == "aws:lb/loadBalancer:LoadBalancer":
        return resource.inputs.get("loadBalancerType") != "network"
    if resource.type == HELM_RELEASE:
        return resource.inputs.get("chart") == MONITORING_CHART
    return resource.type in UNPRICED


def _unpriced(resource: Registration) -> str:
    if resource.type == HELM_RELEASE:
        # The Prometheus volume: a disk of the cluster's default StorageClass, created with the Prometheus.
        prometheus = resource.inputs["values"]["prometheus"]["prometheusSpec"]
        size = prometheus["storageSpec"]["volumeClaimTemplate"]["spec"]["resources"]["requests"]["storage"]
        return f"Prometheus volume ({size} on the default StorageClass)"
    if resource.type == "gcp:filestore/instance:Instance":
        # Filestore bills the capacity provisioned, used or not (its pricing page), from 1 TiB on Basic HDD.
        capacity = (resource.inputs.get("fileShares") or {}).get("capacityGb")
        size = f"{capacity:g} GiB" if isinstance(capacity, int | float) else "its capacity"
        tier = resource.inputs.get("tier", "")
        return f"Filestore {tier} instance ({size} provisioned, billed used or not)"
    return UNPRICED[resource.type]


def gcp_network_charges(recording: Recording, nodes: int) -> Iterator[Charge]:
    """Cloud NAT bills per VM it serves (every node here: none has an external address) up to 32, then a
    flat rate, and each external address it uses (automatic allocation takes at least one); forwarding rules
    bill one minimum charge for the first five, then per rule."""
    for _ in recording.by_type("gcp:compute/routerNat:RouterNat"):
        if nodes > 32:
            yield Charge("Cloud NAT gateway (more than 32 VMs)", 1, fee("gcp-cloud-nat-gateway-cap"))
        elif nodes:
            yield Charge("Cloud NAT gateway, per VM served", nodes, fee("gcp-cloud-nat-vm"))
        yield Charge("Cloud NAT external IP (at least one)", 1, fee("gcp-cloud-nat-ip"))
    rules = len(recording.by_type("gcp:compute/forwardingRule:ForwardingRule"))
    if rules:
        yield Charge("forwarding rules' minimum (up to 5)", 1, fee("gcp-forwarding-rule"))
    if rules > 5:
        yield Charge("forwarding rule beyond the fifth", rules - 5, fee("gcp-forwarding-rule-beyond-five"))


def _charges(recording: Recording, region: str, gcp_region: str) -> Iterator[Charge]:
    for resource in recording.registrations:
        inputs = resource.inputs
        if resource.type == "aws:eks/cluster:Cluster":
            yield Charge("EKS control plane", 1, fee("eks-cluster"))
        elif resource.type == "aws:ec2/natGateway:NatGateway":
            yield Charge("NAT gateway", 1, fee("aws-nat-gateway", region))
        elif resource.type == "aws:ec2/eip:Eip":
            yield Charge("public IPv4 address", 1, fee("aws-public-ipv4"))
        elif (
            resource.type == "aws:lb/loadBalancer:LoadBalancer"
            and inputs.get("loadBalancerType") == "network"
        ):
            yield Charge("network load balancer", 1, fee("aws-network-load-balancer", region))
            if not inputs.get("internal"):
                # An internet-facing balancer has a public address in each of its subnets' zones.
                subnets = len(inputs.get("subnets") or inputs.get("subnetMappings") or [])
                yield Charge("public IPv4 address", subnets, fee("aws-public-ipv4"))
        elif resource.type == "aws:kms/key:Key":
            yield Charge("KMS key", 1, fee("aws-kms-key"))
        elif resource.type == "aws:secretsmanager/secret:Secret":
            yield Charge("Secrets Manager secret", 1, fee("aws-secrets-manager-secret"))
        elif resource.type == "aws:ec2/instance:Instance":
            yield _node_charge(str(inputs["instanceType"]), 1, aws_node_price(inputs["instanceType"], region))
        elif resource.type == "aws:eks/nodeGroup:NodeGroup":
            count = int((inputs.get("scalingConfig") or {}).get("minSize") or 0)
            instance_type = (inputs.get("instanceTypes") or ["?"])[0]
            spot = inputs.get("capacityType") == "SPOT"
            if count:
                yield _node_charge(instance_type, count, aws_node_price(instance_type, region, spot))
        elif resource.type == "aws:autoscaling/group:Group" and int(inputs.get("minSize") or 0):
            instance_type, spot = _group_node(recording, resource)
            yield _node_charge(
                instance_type, int(inputs["minSize"]), aws_node_price(instance_type, region, spot)
            )
        elif resource.type == "gcp:container/cluster:Cluster":
            yield Charge("GKE cluster management", 1, fee("gke-cluster"))
        elif resource.type == "gcp:container/nodePool:NodePool":
            zones = inputs.get("nodeLocations") or []
            autoscaling = inputs.get("autoscaling") or {}
            count = (
                int(autoscaling.get("totalMinNodeCount") or 0)
                if autoscaling
                else int(inputs.get("nodeCount") or 0) * max(len(zones), 1)
            )
            config = inputs.get("nodeConfig") or {}
            if count:
                yield _node_charge(str(config.get("machineType")), count, _gcp_price(config, gcp_region))
        elif resource.type == "gcp:compute/instance:Instance":
            yield _node_charge(str(inputs["machineType"]), 1, _gcp_price(inputs, gcp_region))
        elif resource.type == "gcp:compute/instanceGroupManager:InstanceGroupManager":
            template = recording.instance_template(resource)
            count = int(inputs.get("targetSize") or 0)
            if count and template is not None:
                machine = str(template.inputs.get("machineType"))
                yield _node_charge(machine, count, _gcp_price(template.inputs, gcp_region))


def _node_charge(instance_type: str, count: int, price: Price | None) -> Charge:
    return Charge(f"{instance_type} node", count, price, node=True)


def _gcp_price(config: dict[str, Any], region: str) -> Price | None:
    machine = str(config.get("machineType"))
    spot = bool(config.get("spot") or (config.get("scheduling") or {}).get("provisioningModel") == "SPOT")
    accelerators = config.get("guestAccelerators") or []
    attached = (str(accelerators[0]["type"]), int(accelerators[0]["count"])) if accelerators else None
    return gcp_machine_price(machine, region, spot, attached)


def _group_node(recording: Recording, group: Registration) -> tuple[str, bool]:
    """A k3s Auto Scaling group's first instance type and whether it buys spot: from its launch template,
    or, with several types, from its mixed instances policy (types in order, spot when nothing is on
    demand)."""
    policy = group.inputs.get("mixedInstancesPolicy") or {}
    if policy:
        overrides = (policy.get("launchTemplate") or {}).get("overrides") or [{}]
        distribution = policy.get("instancesDistribution") or {}
        spot = distribution.get("onDemandPercentageAboveBaseCapacity", 100) == 0
        return str(overrides[0].get("instanceType", "?")), spot
    wanted = (group.inputs.get("launchTemplate") or {}).get("id")
    for template in recording.by_type("aws:ec2/launchTemplate:LaunchTemplate"):
        if template.id == wanted:
            market = (template.inputs.get("instanceMarketOptions") or {}).get("marketType")
            return str(template.inputs.get("instanceType")), market == "spot"
    return "?", False
