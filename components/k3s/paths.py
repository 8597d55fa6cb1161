"""Where things are on a k3s node: k3s's own directories, the files the first boot writes, the systemd
drop-ins it adds, and the port the API answers on."""

from __future__ import annotations

CONFIG_DIR = "/etc/rancher/k3s"
DATA_DIR = "/var/lib/rancher/k3s"
SERVER_DIR = f"{DATA_DIR}/server"
TLS_DIR = f"{SERVER_DIR}/tls"
TOKEN_FILE = f"{CONFIG_DIR}/token"
AGENT_TOKEN_FILE = f"{CONFIG_DIR}/agent-token"
NODE_CONFIG = f"{CONFIG_DIR}/config.yaml.d/10-node.yaml"
AUDIT_POLICY_FILE = f"{SERVER_DIR}/audit.yaml"
AUDIT_LOG_DIR = f"{SERVER_DIR}/logs"
ADMISSION_CONFIG_FILE = f"{SERVER_DIR}/psa.yaml"
SYSCTL_FILE = "/etc/sysctl.d/90-kubelet.conf"
POOL_SYSCTL_FILE = "/etc/sysctl.d/91-gpu-k8s-pool.conf"
LIB_DIR = "/usr/local/lib/gpu-k8s"
NODE_FACTS_FILE = f"{LIB_DIR}/node-facts.sh"
FETCH_FILE = f"{LIB_DIR}/fetch-secret.py"
SNAPSHOT_STORE_FILE = f"{LIB_DIR}/snapshot_store.py"
WRITE_SECRET_FILES_FILE = f"{LIB_DIR}/write-secret-files.py"
# Kubelet settings that have no flag go in a drop-in of k3s's kubelet config directory (k3s docs,
# "Kubelet configuration": the recommended way, k3s >= 1.32).
KUBELET_CONFIG_DROP_IN = f"{DATA_DIR}/agent/etc/kubelet.conf.d/20-gpu-k8s.conf"
BOOTSTRAP_FILE = f"{LIB_DIR}/bootstrap.sh"
POD_METADATA_BLOCK_FILE = f"{LIB_DIR}/block-pod-metadata.sh"
AGENT_UNIT_DROP_IN = "/etc/systemd/system/k3s-agent.service.d/10-gpu-k8s-pod-metadata.conf"
SERVER_UNIT_DROP_IN = "/etc/systemd/system/k3s.service.d/10-gpu-k8s-pod-metadata.conf"
AGENT_POOL_UNIT_DROP_IN = "/etc/systemd/system/k3s-agent.service.d/20-gpu-k8s-pool.conf"
NETWORKD_DROP_IN = "/etc/systemd/networkd.conf.d/90-gpu-k8s.conf"
SYSTEMD_DIR = "/etc/systemd/system"
INSTALL_FILE = f"{LIB_DIR}/k3s-install.sh"
ETCD_S3_CREDENTIALS_FILE = f"{CONFIG_DIR}/config.yaml.d/20-etcd-s3-credentials.yaml"

# Where the kubelet looks for image credential providers and their configuration (the k3s defaults of
# `--image-credential-provider-bin-dir` and `--image-credential-provider-config`, passed explicitly).
CREDENTIAL_PROVIDER_DIR = "/var/lib/rancher/credentialprovider"
CREDENTIAL_PROVIDER_BIN_DIR = f"{CREDENTIAL_PROVIDER_DIR}/bin"
CREDENTIAL_PROVIDER_CONFIG = f"{CREDENTIAL_PROVIDER_DIR}/config.yaml"
API_PORT = 6443
