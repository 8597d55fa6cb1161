"""How the nodes and balancers of a k3s cluster on Compute Engine reach each other: firewall rules with
exactly the k3s ports between the cluster's service accounts, the network tag the cloud controller's rules
target, and the passthrough load balancers in front of the servers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from gpu_k8s.components.k3s.paths import API_PORT
from gpu_k8s.components.monitoring import NODE_EXPORTER_PORT
from gpu_k8s.providers.gcp.iam import NodeServiceAccount
from gpu_k8s.providers.gcp.network import Network
from gpu_k8s.providers.gcp.settings import GceK3sClusterSpec

FLANNEL_VXLAN_PORT = 8472
KUBELET_PORT = 10250
ETCD_PORTS = "2379-2380"
# Where an external passthrough load balancer's health checks come from (Google Cloud load-balancing
# "Firewall rules" page; the row for this balancer was cut off in the excerpt retrieved, ranges recalled,
# UNCONFIRMED).
HEALTH_CHECK_RANGES = ("35.191.0.0/16", "209.85.152.0/22", "209.85.204.0/22")
# And an internal passthrough one's (Fortinet's FortiProxy GCP guide quoting Google's table; Google's own row
# was cut off in the excerpts retrieved, UNCONFIRMED there).
INTERNAL_HEALTH_CHECK_RANGES = ("35.191.0.0/16", "130.211.0.0/22")


@dataclass(frozen=True)
class IngressRule:
    """One firewall rule to the `targets` service accounts, from CIDR `ranges` or service `accounts`."""

    name: str
    protocol: str
    port: str
    targets: Sequence[pulumi.Output[str]]
    ranges: Sequence[str] = ()
    accounts: Sequence[pulumi.Output[str]] = ()


@dataclass(frozen=True)
class Identities:
    servers: NodeServiceAccount
    agents: NodeServiceAccount


def server_zones(spec: GceK3sClusterSpec) -> list[str]:
    """Each server's zone: the network's zones in turn."""
    zones = spec.network.zones
    return [zones[index % len(zones)] for index in range(spec.system_pool.nodes)]


def node_tag(spec: GceK3sClusterSpec) -> str:
    """The network tag of every node: the firewall rules the cloud controller makes for a Service target
    it, named in the servers' cloud config (`node-tags`). Servers created before it was there read no
    `node-tags` (their user data is never changed), and then the controller takes, per instance, the
    longest tag that begins the instance's name (gce_instances.go computeHostTags at v36.3.8): the
    cluster's name begins the name of every server and agent this stack makes, and it is a valid tag (a
    DNS label starting with a letter)."""
    return spec.name


def firewall(
    parent: pulumi.Resource, name: str, spec: GceK3sClusterSpec, network: Network, identities: Identities
) -> None:
    """Exactly the k3s ports, between the cluster's service accounts; the API also from the admin CIDRs
    and the load balancer's health checks. Compute Engine denies all other ingress."""
    servers, agents = identities.servers.email, identities.agents.email
    nodes = [servers, agents]
    health_check_ranges = sorted(
        {*HEALTH_CHECK_RANGES, *(INTERNAL_HEALTH_CHECK_RANGES if spec.system_pool.nodes > 1 else ())}
    )
    rules = [
        IngressRule("api-admins", "tcp", str(API_PORT), [servers], ranges=list(spec.api_access_cidrs)),
        IngressRule("api-health-checks", "tcp", str(API_PORT), [servers], ranges=health_check_ranges),
        IngressRule("api-nodes", "tcp", str(API_PORT), [servers], accounts=nodes),
        IngressRule("vxlan", "udp", str(FLANNEL_VXLAN_PORT), nodes, accounts=nodes),
        IngressRule("kubelet", "tcp", str(KUBELET_PORT), nodes, accounts=nodes),
    ]
    if spec.monitoring is not None:
        rules.append(IngressRule("node-exporter", "tcp", str(NODE_EXPORTER_PORT), nodes, accounts=nodes))
    if spec.system_pool.nodes > 1:
        rules.append(IngressRule("etcd", "tcp", ETCD_PORTS, [servers], accounts=[servers]))
    for rule in rules:
        gcp.compute.Firewall(
            f"{name}-{rule.name}",
            network=network.network,
            direction="INGRESS",
            allows=[gcp.compute.FirewallAllowArgs(protocol=rule.protocol, ports=[rule.port])],
            source_ranges=rule.ranges or None,
            source_service_accounts=rule.accounts or None,
            target_service_accounts=rule.targets,
            description=f"k3s {rule.name} of {spec.name}",
            opts=pulumi.ResourceOptions(parent=parent),
        )


def load_balancers(
    parent: pulumi.Resource,
    name: str,
    spec: GceK3sClusterSpec,
    region: str,
    network: Network,
    servers: Sequence[gcp.compute.Instance],
    api_address: gcp.compute.Address,
    registration_address: gcp.compute.Address | None,
) -> list[gcp.compute.ForwardingRule]:
    """The API on the static external address through an external passthrough load balancer (clients
    keep their source address, so the servers' firewall still decides who gets in), and with more than
    one server, the registration address through an internal passthrough one. Both reach every server."""
    child = pulumi.ResourceOptions(parent=parent)
    by_zone: dict[str, list[gcp.compute.Instance]] = {}
    for zone, server in zip(server_zones(spec), servers, strict=True):
        by_zone.setdefault(zone, []).append(server)
    groups = [
        gcp.compute.InstanceGroup(
            f"{name}-servers-{zone}",
            zone=zone,
            instances=[server.self_link for server in members],
            network=network.network,
            opts=child,
        )
        for zone, members in sorted(by_zone.items())
    ]
    health = gcp.compute.RegionHealthCheck(
        f"{name}-api-health",
        region=region,
        tcp_health_check=gcp.compute.RegionHealthCheckTcpHealthCheckArgs(port=API_PORT),
        opts=child,
    )
    balancers = [("api", "EXTERNAL", api_address)]
    if registration_address is not None:
        balancers.append(("registration", "INTERNAL", registration_address))
    rules = []
    for purpose, scheme, address in balancers:
        backend = gcp.compute.RegionBackendService(
            f"{name}-{purpose}-backend",
            region=region,
            load_balancing_scheme=scheme,
            protocol="TCP",
            health_checks=health.id,
            backends=[
                gcp.compute.RegionBackendServiceBackendArgs(
                    group=group.self_link, balancing_mode="CONNECTION"
                )
                for group in groups
            ],
            opts=child,
        )
        internal = scheme == "INTERNAL"
        rules.append(
            gcp.compute.ForwardingRule(
                f"{name}-{purpose}",
                region=region,
                load_balancing_scheme=scheme,
                ip_address=address.address,
                ip_protocol="TCP",
                ports=[str(API_PORT)],
                backend_service=backend.id,
                network=network.network if internal else None,
                subnetwork=network.subnetwork if internal else None,
                opts=child,
            )
        )
    return rules
