"""How a Compute Engine node of a k3s cluster learns about itself and reads its secrets (no gcloud, no
SSH)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from gpu_k8s.components.k3s.boot_script import ServerTask
from gpu_k8s.components.k3s.cloudinit import NodeBootstrap

FILES = Path(__file__).parent / "files"
FETCH_SCRIPT = FILES / "fetch_secret.py"

# The metadata server answers only requests that carry Metadata-Flavor: Google. Zone and machine type come
# back as resource paths (projects/<number>/zones/<zone>); the provider ID is the form the cluster-autoscaler
# parses (gce://<project-id>/<zone>/<instance-name>, cloudprovider/gce GceRefFromProviderId). Nodes are
# named after their instance, as Compute Engine's hostname already names them.
NODE_FACTS_SH = """\
metadata() {
  curl -sf --retry 5 -H "Metadata-Flavor: Google" "http://metadata.google.internal/computeMetadata/v1/$1"
}
ZONE=$(metadata instance/zone)
ZONE=${ZONE##*/}
REGION=${ZONE%-*}
INSTANCE_TYPE=$(metadata instance/machine-type)
INSTANCE_TYPE=${INSTANCE_TYPE##*/}
NODE_NAME=$(metadata instance/name)
PROVIDER_ID="gce://$(metadata project/project-id)/$ZONE/$NODE_NAME"
export ZONE REGION INSTANCE_TYPE NODE_NAME PROVIDER_ID
"""

# Metadata every node gets: OS Login decides who may log in (nobody can: no port 22 is open), project-wide
# SSH keys do not reach the node, and the interactive serial console is off (its output stays readable).
NODE_ACCESS_METADATA = {
    "enable-oslogin": "TRUE",
    "block-project-ssh-keys": "TRUE",
    "serial-port-enable": "FALSE",
}

# A managed instance group recreates a Spot VM under its old name, whose Node k3s would hold against it
# (recreated_nodes.py says why and what it deletes). Once a minute: a Node turns not Ready within a minute
# of its last heartbeat (the node lifecycle controller's grace period); a new VM boots in a minute or more.
RECREATED_NODES = ServerTask(
    name="gpu-k8s-recreated-nodes",
    description="gpu-k8s: delete the Nodes of agent VMs recreated under the same name",
    script=(FILES / "recreated_nodes.py").read_text(),
    every="1min",
)


@cache
def gce_node_bootstrap() -> NodeBootstrap:
    return NodeBootstrap(
        node_facts_sh=NODE_FACTS_SH,
        fetch_secret_py=FETCH_SCRIPT.read_text(),
        snapshot_store_py=(FILES / "snapshot_store.py").read_text(),
        support_files={"gce_api.py": (FILES / "gce_api.py").read_text()},
        server_tasks=(RECREATED_NODES,),
    )
