"""GPU node pools (scale from zero), the GPU Operator with each pool's sharing, and the cluster-autoscaler on
the EKS cluster `gpu-k8s:gpuLayer.cluster` names. Nothing of the cluster itself is created or changed.

Before the first `pulumi up`, check what the cluster must already have:
    aws eks describe-addon --cluster-name <cluster> --addon-name eks-pod-identity-agent
    kubectl auth can-i '*' '*' --all-namespaces        # as the identity that runs pulumi up
    kubectl get deploy -A | grep -Ei 'cluster-autoscaler|karpenter'   # nothing: two autoscalers would fight
"""

import pulumi

from gpu_k8s import build_existing_eks_gpu_layer, stack_outputs

layer = build_existing_eks_gpu_layer("gpus")
for output_name, value in stack_outputs(layer).items():
    pulumi.export(output_name, value)
