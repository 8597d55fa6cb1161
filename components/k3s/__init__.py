"""k3s on bare GPU VMs, cloud-agnostic: the cluster PKI and join tokens, and the node cloud-configs."""
