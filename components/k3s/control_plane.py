"""The k3s control plane as the program sees it: PKI, join secrets and the admin kubeconfig, for any cloud."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random
import pulumi_tls as tls

from gpu_k8s.components.cluster import POOL_LABEL, SYSTEM_POOL_NAME, GpuPool, PlatformTraits
from gpu_k8s.components.compat import DriverFacts, operator_driver
from gpu_k8s.components.gpu_operator import OPERATOR_NAMESPACE
from gpu_k8s.components.k3s.cloudinit import (
    EXCLUDE_FROM_LOAD_BALANCERS,
    SERVER_TAINT,
    NodeBootstrap,
    ServerNode,
    SnapshotStore,
    agent_secret_payload,
    server_cloud_config,
    server_secret_payload,
)
from gpu_k8s.components.k3s.paths import API_PORT
from gpu_k8s.components.k3s.pki import K3sPki, root_ca_hash
from gpu_k8s.components.k3s.settings import K3sClusterSpec
from gpu_k8s.components.kubeconfig import client_certificate_kubeconfig

CONTAINERD_SOCKET = "/run/k3s/containerd/containerd.sock"
# Servers refuse instance metadata to pods, so the cluster-autoscaler, which runs there with their cloud
# identity, uses the host network (hostNetwork pods resolve with the host's DNS under the chart's
# ClusterFirst, which reaches the cloud's APIs). Its port (8085) then is a host port: a rolling update would
# start the new pod beside the old one, which one server cannot place, so the old pod goes first.
AUTOSCALER_ON_HOST_NETWORK = {"hostNetwork": True, "updateStrategy": {"type": "Recreate"}}


def k3s_traits(spec: K3sClusterSpec, accelerator_label: str) -> PlatformTraits:
    """GPUs on k3s over a plain Ubuntu image: the GPU Operator installs driver and toolkit, and talks to
    k3s's own containerd (REFERENCE.md 2c)."""
    return PlatformTraits(
        driver=DriverFacts(owner="gpu-operator", version=operator_driver(spec.addon_versions)),
        toolkit_preinstalled=False,
        accelerator_label=accelerator_label,
        containerd_socket=CONTAINERD_SOCKET,
        system_taint=SERVER_TAINT,
        pod_security=spec.k3s.pod_security,
    )


def agent_taints(pool: GpuPool) -> list[str]:
    """k3s `node-taint` strings: key=value:Effect, or key:Effect for a taint without a value."""
    return [f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}" for t in pool.taints]


def server_user_data(
    spec: K3sClusterSpec,
    secret_name: pulumi.Output[str],
    tls_sans: Sequence[pulumi.Output[str]],
    peer_urls: Sequence[pulumi.Output[str]],
    founder: bool,
    snapshots: pulumi.Output[SnapshotStore],
    bootstrap: NodeBootstrap,
    external_cloud_provider: bool,
    extra_files: pulumi.Input[dict[str, str]] | None = None,
) -> pulumi.Output[str]:
    """One server's cloud-config, once the names it is reached by, its peers' addresses and its snapshot
    bucket are known."""

    def render(parts: list[Any]) -> str:
        sans, secret, peers, store, files = parts
        node = ServerNode(
            k3s_version=spec.k3s.version,
            tls_sans=sans,
            secret_name=secret,
            peer_urls=peers,
            founder=founder,
            snapshots=store,
            labels={POOL_LABEL: SYSTEM_POOL_NAME, **EXCLUDE_FROM_LOAD_BALANCERS},
            exempt_namespaces=[OPERATOR_NAMESPACE],
            pod_security=spec.k3s.pod_security,
            external_cloud_provider=external_cloud_provider,
            extra_files=files,
        )
        return server_cloud_config(node, bootstrap)

    return pulumi.Output.all(
        pulumi.Output.all(*tls_sans), secret_name, pulumi.Output.all(*peer_urls), snapshots, extra_files or {}
    ).apply(render)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _kubeconfig(
    cluster_name: str,
    api_host: pulumi.Input[str],
    ca_bundle: pulumi.Input[str],
    cert_pem: pulumi.Input[str],
    key_pem: pulumi.Input[str],
) -> pulumi.Output[str]:
    return pulumi.Output.secret(
        pulumi.Output.all(api_host, ca_bundle, cert_pem, key_pem).apply(
            lambda parts: client_certificate_kubeconfig(
                cluster_name,
                f"https://{parts[0]}:{API_PORT}",
                _b64(parts[1]),
                _b64(parts[2]),
                _b64(parts[3]),
            )
        )
    )


ADMIN_BINDING = "gpu-k8s-admin"
CLUSTER_ID_LENGTH = 8


def admin_access_binding(
    name: str,
    admin_user: pulumi.Input[str],
    provider: k8s.Provider,
    parent: pulumi.Resource,
    after: Sequence[pulumi.Resource],
) -> k8s.rbac.v1.ClusterRoleBinding:
    """cluster-admin for the admin kubeconfig's user, and only for its current generation: a rotated
    generation updates this one subject, which revokes every copy of the previous kubeconfig."""
    return k8s.rbac.v1.ClusterRoleBinding(
        f"{name}-admin-access",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=ADMIN_BINDING),
        role_ref=k8s.rbac.v1.RoleRefArgs(
            api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="cluster-admin"
        ),
        subjects=[
            k8s.rbac.v1.SubjectArgs(api_group="rbac.authorization.k8s.io", kind="User", name=admin_user)
        ],
        opts=pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=list(after)),
    )


class K3sControlPlane(pulumi.ComponentResource):
    """Owns the cluster's CAs and tokens and derives what the cloud needs from them: the servers' and the
    agents' bootstrap secrets (to store in the cloud's secret store), the admin's and the deployer's
    kubeconfigs. `server_files`
    (path: content) go into the servers' secret too: the cloud's own secrets for the servers, if any."""

    server_secret: pulumi.Output[str]
    agent_secret: pulumi.Output[str]
    # For people: cluster-admin only while `admin_access_binding` names `admin_user`.
    kubeconfig: pulumi.Output[str]
    admin_user: pulumi.Output[str]
    # For the program's Kubernetes provider only (system:masters; see pki.py).
    deployer_kubeconfig: pulumi.Output[str]
    # The first hex digits of the root CA's hash: one cluster's PKI, unlike its name, which a stack destroyed
    # and made again reuses.
    cluster_id: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        cluster_name: str,
        api_host: pulumi.Input[str],
        server_files: pulumi.Input[dict[str, str]] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("gpu-k8s:k3s:ControlPlane", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # The stack disables default providers; keys and passwords are made locally, no credentials needed.
        local = [tls.Provider(f"{name}-tls", opts=child), random.Provider(f"{name}-random", opts=child)]
        identity = K3sPki(
            f"{name}-pki", cluster_name, opts=pulumi.ResourceOptions(parent=self, providers=local)
        ).identity
        self.server_secret = pulumi.Output.secret(
            pulumi.Output.all(
                identity.server_token, identity.agent_token, identity.server_tls_files, server_files or {}
            ).apply(lambda parts: server_secret_payload(parts[0], parts[1], json.loads(parts[2]), parts[3]))
        )
        self.agent_secret = pulumi.Output.secret(identity.agent_token.apply(agent_secret_payload))
        self.kubeconfig = _kubeconfig(
            cluster_name, api_host, identity.server_ca_bundle, identity.admin_cert_pem, identity.admin_key_pem
        )
        self.deployer_kubeconfig = _kubeconfig(
            cluster_name,
            api_host,
            identity.server_ca_bundle,
            identity.deployer_cert_pem,
            identity.deployer_key_pem,
        )
        self.admin_user = identity.admin_user
        self.root_cert_pem = identity.root_cert_pem
        self.cluster_id = identity.root_cert_pem.apply(lambda pem: root_ca_hash(pem)[:CLUSTER_ID_LENGTH])
        self.register_outputs({"rootCertPem": self.root_cert_pem})
