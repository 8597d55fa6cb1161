"""gpu-k8s: read the stack's cluster spec, build it on its platform, export what users need."""

from gpu_k8s import deploy_stack

deploy_stack()
