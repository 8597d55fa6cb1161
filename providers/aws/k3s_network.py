"""How the nodes and balancers of a k3s cluster on EC2 reach each other: security groups with exactly the k3s
ports, one lasting network interface per server, and network load balancers in front of the servers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from gpu_k8s.components.k3s.paths import API_PORT
from gpu_k8s.components.monitoring import NODE_EXPORTER_PORT
from gpu_k8s.providers.aws.cloud_controller import cluster_owned_tag
from gpu_k8s.providers.aws.network import Network
from gpu_k8s.providers.aws.settings import Ec2K3sClusterSpec

FLANNEL_VXLAN_PORT = 8472
KUBELET_PORT = 10250
ETCD_PORTS = (2379, 2380)


@dataclass(frozen=True)
class SecurityGroups:
    nodes: aws.ec2.SecurityGroup
    servers: aws.ec2.SecurityGroup
    api: aws.ec2.SecurityGroup
    # The internal registration balancer's, with more than one server.
    registration: aws.ec2.SecurityGroup | None
    # What every EFA interface carries, where some pool has EFA.
    efa: aws.ec2.SecurityGroup | None


@dataclass(frozen=True)
class ServerBalancer:
    load_balancer: aws.lb.LoadBalancer
    # What must exist before the balancer forwards to the servers.
    ready: list[pulumi.Resource]


def _ingress(
    name: str,
    group: aws.ec2.SecurityGroup,
    port: int | tuple[int, int],
    protocol: str,
    parent: pulumi.Resource,
    source: aws.ec2.SecurityGroup | None = None,
    cidr: str | None = None,
    description: str = "",
) -> aws.vpc.SecurityGroupIngressRule:
    low, high = port if isinstance(port, tuple) else (port, port)
    return aws.vpc.SecurityGroupIngressRule(
        name,
        security_group_id=group.id,
        ip_protocol=protocol,
        from_port=low,
        to_port=high,
        referenced_security_group_id=source.id if source is not None else None,
        cidr_ipv4=cidr,
        description=description,
        opts=pulumi.ResourceOptions(parent=parent),
    )


def _egress_anywhere(name: str, group: aws.ec2.SecurityGroup, parent: pulumi.Resource) -> None:
    """Nodes reach registries, AWS APIs and the NAT gateway; nothing is allowed in this way."""
    aws.vpc.SecurityGroupEgressRule(
        name,
        security_group_id=group.id,
        ip_protocol="-1",
        cidr_ipv4="0.0.0.0/0",
        description="outbound to registries and AWS APIs",
        opts=pulumi.ResourceOptions(parent=parent),
    )


def _egress_to_servers(
    name: str, group: aws.ec2.SecurityGroup, servers: aws.ec2.SecurityGroup, parent: pulumi.Resource
) -> None:
    """A balancer's only way out: the servers' API port."""
    aws.vpc.SecurityGroupEgressRule(
        name,
        security_group_id=group.id,
        ip_protocol="tcp",
        from_port=API_PORT,
        to_port=API_PORT,
        referenced_security_group_id=servers.id,
        description="forward to the servers",
        opts=pulumi.ResourceOptions(parent=parent),
    )


def security_groups(
    parent: pulumi.Resource, name: str, spec: Ec2K3sClusterSpec, vpc_id: pulumi.Input[str], with_efa: bool
) -> SecurityGroups:
    """Exactly the k3s ports, between the cluster's own nodes; the API also from the admin CIDRs,
    through the load balancer. Nothing is open to the internet until a `Service type=LoadBalancer`
    asks for it: the cloud controller manager then opens the `nodes` group to its load balancer. EFA
    interfaces also carry a group open to itself only, in and out, as EFA's OS bypass requires (EC2 user
    guide, "Create and attach an EFA"); it has no cluster tag, so the controller never picks it."""
    child = pulumi.ResourceOptions(parent=parent)
    roles = (
        "nodes",
        "servers",
        "api",
        *(("registration",) if spec.system_pool.nodes > 1 else ()),
        *(("efa",) if with_efa else ()),
    )
    groups = {
        role: aws.ec2.SecurityGroup(
            f"{name}-{role}-sg",
            vpc_id=vpc_id,
            description=f"k3s {role} of {spec.name}",
            tags={
                "Name": f"{spec.name}-{role}",
                **(cluster_owned_tag(spec.name) if role == "nodes" else {}),
            },
            opts=child,
        )
        for role in roles
    }
    nodes, servers, api = groups["nodes"], groups["servers"], groups["api"]
    registration = groups.get("registration")
    _ingress(f"{name}-vxlan", nodes, FLANNEL_VXLAN_PORT, "udp", parent, nodes, description="flannel VXLAN")
    _ingress(f"{name}-kubelet", nodes, KUBELET_PORT, "tcp", parent, nodes, description="kubelet")
    if spec.monitoring is not None:
        _ingress(
            f"{name}-node-exporter",
            nodes,
            NODE_EXPORTER_PORT,
            "tcp",
            parent,
            nodes,
            description="node-exporter",
        )
    _ingress(f"{name}-api-nodes", servers, API_PORT, "tcp", parent, nodes, description="API from nodes")
    _ingress(f"{name}-api-lb", servers, API_PORT, "tcp", parent, api, description="API via load balancer")
    for index, cidr in enumerate(spec.api_access_cidrs):
        _ingress(f"{name}-api-admin-{index}", api, API_PORT, "tcp", parent, cidr=cidr, description="admins")
    _egress_to_servers(f"{name}-api-to-servers", api, servers, parent)
    if registration is not None:
        _ingress(f"{name}-etcd", servers, ETCD_PORTS, "tcp", parent, servers, description="embedded etcd")
        _ingress(
            f"{name}-registration-nodes", registration, API_PORT, "tcp", parent, nodes, description="agents"
        )
        _ingress(
            f"{name}-api-registration",
            servers,
            API_PORT,
            "tcp",
            parent,
            registration,
            description="API via registration balancer",
        )
        _egress_to_servers(f"{name}-registration-to-servers", registration, servers, parent)
    _egress_anywhere(f"{name}-nodes-egress", nodes, parent)
    _egress_anywhere(f"{name}-servers-egress", servers, parent)
    efa = groups.get("efa")
    if efa is not None:
        for direction, rule in (
            ("in", aws.vpc.SecurityGroupIngressRule),
            ("out", aws.vpc.SecurityGroupEgressRule),
        ):
            rule(
                f"{name}-efa-{direction}",
                security_group_id=efa.id,
                ip_protocol="-1",
                referenced_security_group_id=efa.id,
                description="EFA between EFA nodes",
                opts=child,
            )
    return SecurityGroups(nodes=nodes, servers=servers, api=api, registration=registration, efa=efa)


def server_interfaces(
    parent: pulumi.Resource, name: str, spec: Ec2K3sClusterSpec, network: Network, groups: SecurityGroups
) -> list[aws.ec2.NetworkInterface]:
    """One network interface per server: its address outlives the instance, so the other servers, the
    balancers and a replacement keep finding the server there."""
    subnets = network.private_subnet_ids
    return [
        aws.ec2.NetworkInterface(
            f"{name}-server-{index}-eni",
            subnet_id=subnets[index % len(subnets)],
            security_groups=[groups.nodes.id, groups.servers.id],
            tags={"Name": f"{spec.name}-server-{index}"},
            opts=pulumi.ResourceOptions(parent=parent),
        )
        for index in range(spec.system_pool.nodes)
    ]


def load_balancer(
    parent: pulumi.Resource,
    name: str,
    subnets: Sequence[pulumi.Input[str]],
    group: aws.ec2.SecurityGroup,
    vpc_id: pulumi.Input[str],
    interfaces: Sequence[aws.ec2.NetworkInterface],
    internal: bool,
) -> ServerBalancer:
    """A network load balancer forwarding the API port to every server's interface address."""
    child = pulumi.ResourceOptions(parent=parent)
    load_balancer = aws.lb.LoadBalancer(
        name,
        load_balancer_type="network",
        internal=internal,
        subnets=subnets,
        security_groups=[group.id],
        tags={"Name": name},
        opts=child,
    )
    target_group = aws.lb.TargetGroup(
        f"{name}-targets",
        port=API_PORT,
        protocol="TCP",
        target_type="ip",
        vpc_id=vpc_id,
        health_check=aws.lb.TargetGroupHealthCheckArgs(protocol="TCP", port=str(API_PORT)),
        opts=child,
    )
    listener = aws.lb.Listener(
        f"{name}-listener",
        load_balancer_arn=load_balancer.arn,
        port=API_PORT,
        protocol="TCP",
        default_actions=[aws.lb.ListenerDefaultActionArgs(type="forward", target_group_arn=target_group.arn)],
        opts=child,
    )
    targets = [
        aws.lb.TargetGroupAttachment(
            f"{name}-target-{index}",
            target_group_arn=target_group.arn,
            target_id=interface.private_ip,
            port=API_PORT,
            opts=child,
        )
        for index, interface in enumerate(interfaces)
    ]
    return ServerBalancer(load_balancer, [listener, *targets])
