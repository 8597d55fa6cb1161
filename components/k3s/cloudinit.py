"""First-boot cloud-config for k3s servers and agents: pure functions of plain values.

Nothing secret is ever in the rendered text. A node reads its secrets (CAs, keys, join tokens) from the
cloud's secret store with its own instance identity, through a fetch script the cloud provider supplies;
the payload lists the files to write, and the core's writer writes them. The provider also supplies a shell
snippet that reads the node's facts (provider ID, instance type, zone, region) from the metadata service.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpu_k8s.components.k3s.boot_script import (
    ServerTask,
    bootstrap_script,
    join_or_found,
    server_started,
    wait_for_server,
)
from gpu_k8s.components.k3s.paths import (
    ADMISSION_CONFIG_FILE,
    AGENT_POOL_UNIT_DROP_IN,
    AGENT_TOKEN_FILE,
    AGENT_UNIT_DROP_IN,
    AUDIT_LOG_DIR,
    AUDIT_POLICY_FILE,
    BOOTSTRAP_FILE,
    CONFIG_DIR,
    CREDENTIAL_PROVIDER_BIN_DIR,
    CREDENTIAL_PROVIDER_CONFIG,
    ETCD_S3_CREDENTIALS_FILE,
    FETCH_FILE,
    KUBELET_CONFIG_DROP_IN,
    LIB_DIR,
    NETWORKD_DROP_IN,
    NODE_FACTS_FILE,
    POD_METADATA_BLOCK_FILE,
    POOL_SYSCTL_FILE,
    SERVER_UNIT_DROP_IN,
    SNAPSHOT_STORE_FILE,
    SYSCTL_FILE,
    SYSTEMD_DIR,
    TLS_DIR,
    TOKEN_FILE,
    WRITE_SECRET_FILES_FILE,
)
from gpu_k8s.components.spec import TaintSpec
from gpu_k8s.components.yamltext import yaml_text

WRITE_SECRET_FILES_SCRIPT = Path(__file__).parent / "files" / "write_secret_files.py"
# Servers take no workloads: they hold the cluster's CA keys and, through their instance identity, the
# bootstrap secret. k3s's packaged CoreDNS tolerates this taint (k3s manifests/coredns.yaml); the add-ons
# gpu-k8s installs on servers are given the toleration (PlatformTraits.system_tolerations).
SERVER_TAINT = TaintSpec(key="CriticalAddonsOnly", value="true", effect="NoExecute")
# Pods on any k3s node reach no instance metadata, where the node's cloud credentials are; the node itself
# and host-network pods (the termination handler, CSI node plugins, on servers the cloud controller, the CSI
# controllers and the cluster-autoscaler) keep it. A policy-routing rule refuses what
# comes from the pod network (k3s's default cluster-cidr) for the metadata address. It is applied before
# every start of k3s (a drop-in of the unit the install script writes), and systemd-networkd is told to
# leave rules it did not make alone (networkd.conf ManageForeignRoutingPolicyRules, systemd >= 249).
POD_CIDR = "10.42.0.0/16"
METADATA_ADDRESS = "169.254.169.254"
POD_METADATA_BLOCK = f"""#!/bin/bash
# gpu-k8s: pods on this node may not reach instance metadata ({METADATA_ADDRESS}).
set -euo pipefail
rule=(from {POD_CIDR} to {METADATA_ADDRESS}/32)
while ip rule del "${{rule[@]}}" 2> /dev/null; do :; done
ip rule add "${{rule[@]}}" prohibit priority 100
"""

# What `protect-kernel-defaults` requires the host to have before k3s starts: the k3s CIS hardening guide
# lists the first four; the kubelet also checks the root key quotas (kubernetes pkg/kubelet/cm
# container_manager_linux.go setupKernelTunables, values from pkg/util/sysctl).
KUBELET_SYSCTLS = {
    "vm.panic_on_oom": "0",
    "vm.overcommit_memory": "1",
    "kernel.panic": "10",
    "kernel.panic_on_oops": "1",
    "kernel.keys.root_maxkeys": "1000000",
    "kernel.keys.root_maxbytes": "25000000",
}
# kube-proxy's health endpoint on every address, where k3s binds it to 127.0.0.1 (k3s's kube-proxy
# arguments): Compute Engine's load balancer health checks ask it on each node for a Service with
# externalTrafficPolicy Cluster (the cloud controller opens 10256 to Google's health-check ranges only).
KUBE_PROXY_ARGS = ("healthz-bind-address=0.0.0.0:10256",)
# Servers take no workloads, so no Service's load balancer sends them traffic: the service controller
# leaves out nodes with this label (Kubernetes "Well-Known Labels": node.kubernetes.io/
# exclude-from-external-load-balancers), which a kubelet may set on itself (node.kubernetes.io/ prefix). On
# Compute Engine a server could not join the controller's instance group anyway: it is already in the API
# balancer's, and an instance belongs to one load-balanced group.
EXCLUDE_FROM_LOAD_BALANCERS = {"node.kubernetes.io/exclude-from-external-load-balancers": "true"}
# Bundled add-ons this toolkit replaces: the cloud's CSI driver is the default storage, and nodes take no
# host-port load balancers or ingress they were not asked for.
DISABLED_ADDONS = ("traefik", "servicelb", "local-storage")
# Scheduled etcd snapshots, every six hours; each server keeps its last 28 (a week) in the bucket. k3s's own
# defaults are every 12 hours and 5 (k3s pkg/cli/cmds/server.go).
SNAPSHOT_SCHEDULE = "0 */6 * * *"
SNAPSHOT_RETENTION = 28

PodSecurityLevel = Literal["baseline", "restricted"]


@dataclass(frozen=True)
class NodeBootstrap:
    """What a cloud provider supplies so a node can learn about itself and read its secrets."""

    # Sourced by bash: sets NODE_NAME (the node's name in Kubernetes, as the cloud's controller manager
    # expects it), PROVIDER_ID, INSTANCE_TYPE, ZONE and REGION from the metadata service.
    node_facts_sh: str
    # Run with python3 and one argument, the secret's name: prints the secret's value (the payload) to stdout
    # and exits non-zero, printing nothing of it, when it cannot.
    fetch_secret_py: str
    # Run on servers with python3 and two arguments: `founded <bucket>` prints `founded` when the snapshot
    # bucket holds anything (a cluster was founded from it: the bucket is the stack's own) and `new` when it
    # is empty; `record <bucket>` writes the founding marker, an empty object: k3s lists the keys that start
    # with the folder name (a cluster named `gpu` takes in `gpu-k8s/founded` too) and skips empty objects
    # (k3s pkg/etcd/s3 ListSnapshots), and prunes only its own snapshots' names. Non-zero exit when the
    # bucket cannot be asked.
    snapshot_store_py: str
    # Modules the fetch script imports (name: content), written beside it.
    support_files: Mapping[str, str] = field(default_factory=dict)
    # What every server of this cloud runs on a timer once its k3s answers.
    server_tasks: Sequence[ServerTask] = ()


@dataclass(frozen=True)
class SnapshotStore:
    """Where the servers ship their etcd snapshots: an S3 API bucket (k3s `etcd-s3`). Credentials, where the
    store needs keys, come with the servers' secret (`etcd_s3_credentials`); without them k3s uses the
    instance's role (k3s pkg/etcd/s3: no access key means minio-go's IAM credentials)."""

    endpoint: str
    region: str
    bucket: str
    folder: str


@dataclass(frozen=True)
class ServerNode:
    """A k3s server: the first one initialises the cluster, the others join it."""

    k3s_version: str
    # Names the API is reached by from outside (the load balancer): certificate SANs.
    tls_sans: Sequence[str]
    secret_name: str
    # The other servers' fixed URLs (their addresses outlive their instances): a booting server joins the
    # first that answers. Servers reach each other directly, never through a load balancer in front of
    # themselves: on Compute Engine the guest agent routes a balancer's address locally on each of its
    # backends (Google Cloud, "Internal passthrough Network Load Balancer overview"), so a server asking
    # the balancer would only reach itself.
    peer_urls: Sequence[str]
    # The first server founds the cluster when no other server answers, as on the cluster's first boot; when
    # it is replaced later, the others answer and it joins them. The others only ever join.
    founder: bool
    snapshots: SnapshotStore
    labels: Mapping[str, str]
    exempt_namespaces: Sequence[str]
    pod_security: PodSecurityLevel = "baseline"
    # The cloud's own controller manager runs instead of k3s's embedded one (which reports every node as
    # existing): k3s's is disabled and every kubelet waits for the cloud's to initialise its node.
    external_cloud_provider: bool = False
    # Files the cloud's own add-ons read from the server (path: content), e.g. a cloud config; no secrets.
    extra_files: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ImageCredentialProvider:
    """A kubelet image credential provider (Kubernetes, "Configure a kubelet image credential provider"): for
    an image matching `match_images`, the kubelet runs `<bin dir>/<name>`, a link to `script` (an executable
    the cloud supplies, written beside the fetch script and what it imports), and pulls with the credentials
    it prints."""

    name: str
    match_images: Sequence[str]
    script: str


def credential_provider_config(provider: ImageCredentialProvider) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1",
        "kind": "CredentialProviderConfig",
        "providers": [
            {
                "name": provider.name,
                "matchImages": list(provider.match_images),
                "defaultCacheDuration": "6h",
                "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
            }
        ],
    }


@dataclass(frozen=True)
class AgentNode:
    """A k3s agent of a GPU pool."""

    k3s_version: str
    server_url: str
    secret_name: str
    labels: Mapping[str, str]
    # "key=value:Effect" strings.
    taints: Sequence[str] = field(default_factory=tuple)
    # KubeletConfiguration fields that have no command-line flag (e.g. graceful node shutdown).
    kubelet_config: Mapping[str, Any] = field(default_factory=dict)
    # As for ServerNode: must be the same on every node of a cluster.
    external_cloud_provider: bool = False
    # Kernel settings the pool's hardware needs (e.g. huge pages for EFA), applied with the kubelet's before
    # k3s starts, so the kubelet finds them when it reports the node's resources.
    sysctls: Mapping[str, str] = field(default_factory=dict)
    # Settings of k3s-agent's systemd [Service] section; containerd, a child of k3s, and so every container
    # inherits its resource limits (e.g. LimitMEMLOCK for EFA's memory registration).
    service_settings: Mapping[str, str] = field(default_factory=dict)
    # Credentials for images of a private registry the pool's add-ons pull (e.g. AWS's EKS registry).
    image_credential_provider: ImageCredentialProvider | None = None


def server_secret_payload(
    server_token: str,
    agent_token: str,
    tls_files: Mapping[str, str],
    extra_files: Mapping[str, str] | None = None,
) -> str:
    """The servers' secret: both join tokens, the cluster CAs and any `extra_files` (path: content), as files
    to write before k3s starts."""
    files = {TOKEN_FILE: server_token, AGENT_TOKEN_FILE: agent_token}
    files.update({f"{TLS_DIR}/{name}": content for name, content in sorted(tls_files.items())})
    files.update(extra_files or {})
    return json.dumps({"files": files}, sort_keys=True)


def agent_secret_payload(agent_token: str) -> str:
    """The agents' secret: the agent join token only (it cannot join a server)."""
    return json.dumps({"files": {AGENT_TOKEN_FILE: agent_token}})


def audit_policy() -> dict[str, Any]:
    """Who did what, never request or response bodies (Secrets included)."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata"}],
    }


def admission_config(level: PodSecurityLevel, exempt_namespaces: Sequence[str]) -> dict[str, Any]:
    """Pod Security admission for the whole cluster. Namespaces whose pods need host access (kube-system,
    the GPU Operator's) are exempt; everything else gets `level` and warnings at `restricted`."""
    return {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {
                "name": "PodSecurity",
                "configuration": {
                    "apiVersion": "pod-security.admission.config.k8s.io/v1",
                    "kind": "PodSecurityConfiguration",
                    "defaults": {
                        "enforce": level,
                        "enforce-version": "latest",
                        "audit": "restricted",
                        "audit-version": "latest",
                        "warn": "restricted",
                        "warn-version": "latest",
                    },
                    "exemptions": {
                        "usernames": [],
                        "runtimeClasses": [],
                        "namespaces": sorted({"kube-system", *exempt_namespaces}),
                    },
                },
            }
        ],
    }


def server_config(node: ServerNode) -> dict[str, Any]:
    """/etc/rancher/k3s/config.yaml of a server. Node-specific settings come from NODE_CONFIG, written at
    boot, and so does the choice between founding the cluster (`cluster-init`) and joining it (`server`)."""
    return {
        "token-file": TOKEN_FILE,
        "agent-token-file": AGENT_TOKEN_FILE,
        "tls-san": list(node.tls_sans),
        "secrets-encryption": True,
        "protect-kernel-defaults": True,
        "write-kubeconfig-mode": "0600",
        "disable": list(DISABLED_ADDONS),
        "kube-apiserver-arg": [
            f"admission-control-config-file={ADMISSION_CONFIG_FILE}",
            f"audit-policy-file={AUDIT_POLICY_FILE}",
            f"audit-log-path={AUDIT_LOG_DIR}/audit.log",
            "audit-log-maxage=30",
            "audit-log-maxbackup=10",
            "audit-log-maxsize=100",
            "service-account-extend-token-expiration=false",
        ],
        "kube-controller-manager-arg": ["terminated-pod-gc-threshold=100"],
        "node-taint": [f"{SERVER_TAINT.key}={SERVER_TAINT.value}:{SERVER_TAINT.effect}"],
        "kube-proxy-arg": list(KUBE_PROXY_ARGS),
        "disable-cloud-controller": node.external_cloud_provider,
        "etcd-snapshot-schedule-cron": SNAPSHOT_SCHEDULE,
        "etcd-snapshot-retention": SNAPSHOT_RETENTION,
        "etcd-snapshot-compress": True,
        "etcd-s3": True,
        "etcd-s3-endpoint": node.snapshots.endpoint,
        "etcd-s3-region": node.snapshots.region,
        "etcd-s3-bucket": node.snapshots.bucket,
        "etcd-s3-folder": node.snapshots.folder,
    }


def etcd_s3_credentials(access_key: str, secret_key: str) -> dict[str, str]:
    """The servers' secret's extra file when the snapshot store takes keys, not the instance's role."""
    return {
        ETCD_S3_CREDENTIALS_FILE: _yaml({"etcd-s3-access-key": access_key, "etcd-s3-secret-key": secret_key})
    }


def agent_config(node: AgentNode) -> dict[str, Any]:
    return {
        "server": node.server_url,
        "token-file": AGENT_TOKEN_FILE,
        "protect-kernel-defaults": True,
        "kube-proxy-arg": list(KUBE_PROXY_ARGS),
    }


def _yaml(document: Mapping[str, Any]) -> str:
    return yaml_text(dict(document), width=1000, literal_blocks=True)


def _cloud_config(files: Sequence[Mapping[str, Any]]) -> str:
    document = {"write_files": list(files), "runcmd": [[BOOTSTRAP_FILE]]}
    return "#cloud-config\n" + _yaml(document)


def _file(path: str, content: str, permissions: str = "0600") -> dict[str, Any]:
    return {"path": path, "content": content, "owner": "root:root", "permissions": permissions}


def _common_files(bootstrap: NodeBootstrap, script: str) -> list[dict[str, Any]]:
    sysctls = "".join(f"{key}={value}\n" for key, value in KUBELET_SYSCTLS.items())
    return [
        _file(SYSCTL_FILE, sysctls, "0644"),
        _file(NODE_FACTS_FILE, bootstrap.node_facts_sh, "0700"),
        _file(FETCH_FILE, bootstrap.fetch_secret_py, "0700"),
        *(
            _file(f"{LIB_DIR}/{name}", content, "0700")
            for name, content in sorted(bootstrap.support_files.items())
        ),
        _file(WRITE_SECRET_FILES_FILE, WRITE_SECRET_FILES_SCRIPT.read_text(), "0700"),
        _file(BOOTSTRAP_FILE, script, "0700"),
    ]


def kubelet_config_drop_in(settings: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", **settings}


def server_cloud_config(node: ServerNode, bootstrap: NodeBootstrap) -> str:
    """User data of a k3s server."""
    script = bootstrap_script(
        "server",
        node.k3s_version,
        node.secret_name,
        node.labels,
        (),
        join_or_found(node.peer_urls, node.founder, node.snapshots.bucket),
        node.external_cloud_provider,
        started=server_started(node.snapshots.bucket, bootstrap.server_tasks),
    )
    return _cloud_config(
        [
            *_common_files(bootstrap, script),
            _file(SNAPSHOT_STORE_FILE, bootstrap.snapshot_store_py, "0700"),
            _file(f"{CONFIG_DIR}/config.yaml", _yaml(server_config(node))),
            _file(AUDIT_POLICY_FILE, _yaml(audit_policy())),
            _file(ADMISSION_CONFIG_FILE, _yaml(admission_config(node.pod_security, node.exempt_namespaces))),
            *(_file(path, content, "0644") for path, content in sorted(node.extra_files.items())),
            *_pod_metadata_block(SERVER_UNIT_DROP_IN),
            *_task_files(bootstrap.server_tasks),
        ]
    )


def _task_files(tasks: Sequence[ServerTask]) -> list[dict[str, Any]]:
    files = []
    for task in tasks:
        files.append(_file(task.script_path, task.script, "0700"))
        files += [_file(f"{SYSTEMD_DIR}/{unit}", text, "0644") for unit, text in task.units().items()]
    return files


def _pod_metadata_block(unit_drop_in: str) -> list[dict[str, str]]:
    """The rule script, run before every start of k3s's unit, and networkd told to leave the rule alone."""
    return [
        _file(POD_METADATA_BLOCK_FILE, POD_METADATA_BLOCK, "0700"),
        _file(unit_drop_in, f"[Service]\nExecStartPre={POD_METADATA_BLOCK_FILE}\n", "0644"),
        _file(NETWORKD_DROP_IN, "[Network]\nManageForeignRoutingPolicyRules=no\n", "0644"),
    ]


def agent_cloud_config(node: AgentNode, bootstrap: NodeBootstrap) -> str:
    """User data of a k3s agent in a GPU pool."""
    wait = wait_for_server(node.server_url)
    provider = node.image_credential_provider
    script = bootstrap_script(
        "agent",
        node.k3s_version,
        node.secret_name,
        node.labels,
        node.taints,
        wait,
        node.external_cloud_provider,
        kubelet_args=(
            (
                f"image-credential-provider-config={CREDENTIAL_PROVIDER_CONFIG}",
                f"image-credential-provider-bin-dir={CREDENTIAL_PROVIDER_BIN_DIR}",
            )
            if provider
            else ()
        ),
        prepare=(
            f"install -d -m 0755 {CREDENTIAL_PROVIDER_BIN_DIR}\n"
            f"ln -sf {LIB_DIR}/{provider.name} {CREDENTIAL_PROVIDER_BIN_DIR}/{provider.name}\n"
            if provider
            else ""
        ),
        started='log "k3s agent started"\n',
    )
    files = [
        *_common_files(bootstrap, script),
        _file(f"{CONFIG_DIR}/config.yaml", _yaml(agent_config(node))),
        *_pod_metadata_block(AGENT_UNIT_DROP_IN),
    ]
    if node.kubelet_config:
        files.append(_file(KUBELET_CONFIG_DROP_IN, _yaml(kubelet_config_drop_in(node.kubelet_config))))
    if node.sysctls:
        files.append(_file(POOL_SYSCTL_FILE, "".join(f"{k}={v}\n" for k, v in node.sysctls.items()), "0644"))
    if provider:
        files.append(_file(f"{LIB_DIR}/{provider.name}", provider.script, "0700"))
        files.append(_file(CREDENTIAL_PROVIDER_CONFIG, _yaml(credential_provider_config(provider)), "0644"))
    if node.service_settings:
        settings = "".join(f"{key}={value}\n" for key, value in node.service_settings.items())
        files.append(_file(AGENT_POOL_UNIT_DROP_IN, f"[Service]\n{settings}", "0644"))
    return _cloud_config(files)
