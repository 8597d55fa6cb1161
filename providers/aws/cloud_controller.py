"""The AWS cloud controller manager of aws-k3s: its chart values, the tag it finds the cluster by, and the
servers' permissions for it, scoped to what carries that tag.

Sources, kubernetes/cloud-provider-aws at v1.35.2 (1c494fbc3edacf55e2a1e06df21858c03ff9c457), the image
1.35 and 1.36 clusters run; v1.33.4 and v1.34.3 have the same tagging (commits 551de69d, 620e81ca):
- the cluster's ID is the `kubernetes.io/cluster/<id>` tag of the instance the CCM runs on; without it
  the CCM exits ("AWS cloud failed to find ClusterID": pkg/providers/v1/aws.go newAWSCloud2 -> tags.go
  initFromTags, init), and only instances with it become load-balancer targets (aws.go describeInstances);
- every resource the service controller creates carries `kubernetes.io/cluster/<id>=owned` in its create
  request (tags.go buildTags): security groups (aws.go ensureSecurityGroup, TagSpecifications), Classic
  and Network Load Balancers, target groups and listeners (aws_loadbalancer.go, `Tags` of each create);
- it writes only to what it created or to the security group tagged with the cluster (aws.go
  findSecurityGroupForInstance, getTaggedSecurityGroups, buildSecurityGroupsToDelete).
So every write is conditioned on that tag: on the request's tags when creating, on the resource's
otherwise (the condition keys per action: AWS Service Authorization Reference, Amazon EC2 and Elastic Load
Balancing; the same pattern as aws-load-balancer-controller's docs/install/iam_policy.json).
"""

from __future__ import annotations

from typing import Any

from gpu_k8s.components.cluster import POOL_LABEL, SYSTEM_POOL_NAME
from gpu_k8s.providers.aws.iam import POLICY_VERSION

CCM_CHART = "aws-cloud-controller-manager"
CCM_CHART_VERSION = "0.0.11"
CCM_REPO = "https://kubernetes.github.io/cloud-provider-aws"
# One CCM build per Kubernetes minor (cloud-provider-aws docs/README.md, "Compatibility with Kubernetes"), the
# newest one registry.k8s.io serves, by digest (the chart's template writes `repository:tag`, so the digest
# rides in the tag): upstream/references/registry.k8s.io/k8s-staging-provider-aws.yaml. The promoter
# manifest lists no v1.36.x (git tags v1.36.0 and v1.36.1 exist, but are not images), so 1.36 clusters run
# the 1.35 build: Kubernetes' version skew policy lets cloud-controller-manager be one minor older than
# kube-apiserver.
# The same policy makes a 1.36 cluster wait for a promoted 1.36 build before it moves to 1.37 (the CCM must
# reach the old minor before kube-apiserver leaves it).
CCM_IMAGE_TAGS = {
    "1.33": "v1.33.4@sha256:b54bc094711e9d7ace6c9bab3d6f02a598e7570ac1fedd6341940e1de79ea476",
    "1.34": "v1.34.3@sha256:ab45cec4a1ee68a556d09a362746db8fd66b258101aefcf0542f51e960248810",
    "1.35": "v1.35.2@sha256:5a5d4e5942ad078a184c12bf5435f8226ccb157ee15e9e1f87c183a4bf4b8f1a",
    "1.36": "v1.35.2@sha256:5a5d4e5942ad078a184c12bf5435f8226ccb157ee15e9e1f87c183a4bf4b8f1a",
}
# The node controllers name, label and address nodes from EC2 and delete the Node of a terminated instance;
# the service controller makes a load balancer for each `Service type=LoadBalancer` (canonical names:
# k8s.io/cloud-provider names package). The route controller is off: flannel routes pods itself.
CCM_CONTROLLERS = ("cloud-node-controller", "cloud-node-lifecycle-controller", "service-lb-controller")
CLUSTER_TAG_PREFIX = "kubernetes.io/cluster/"
UNINITIALIZED_TAINT = "node.cloudprovider.kubernetes.io/uninitialized"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"


def cloud_controller_values(
    cluster_name: str, kubernetes_version: str, tolerations: list[dict[str, str]]
) -> dict[str, object]:
    """The AWS CCM on the servers, on their network (instance metadata and the API without cluster DNS,
    which waits for initialised nodes), tolerating what every node carries until it initialises them."""
    return {
        "image": {"tag": CCM_IMAGE_TAGS[kubernetes_version]},
        "args": [
            "--v=2",
            "--cloud-provider=aws",
            f"--cluster-name={cluster_name}",
            f"--controllers={','.join(CCM_CONTROLLERS)}",
        ],
        "hostNetworking": True,
        # Helm merges this map into the chart's, whose control-plane label selects "" (kubeadm's value):
        # k3s labels its servers "true".
        "nodeSelector": {CONTROL_PLANE_LABEL: "true", POOL_LABEL: SYSTEM_POOL_NAME},
        "tolerations": [
            {"key": UNINITIALIZED_TAINT, "value": "true", "effect": "NoSchedule"},
            *tolerations,
        ],
    }


def cluster_owned_tag(cluster_name: str) -> dict[str, str]:
    """The tag the CCM finds the cluster by: on every server and GPU node, and on the `nodes` security group
    (the one group it opens to a load balancer)."""
    return {f"{CLUSTER_TAG_PREFIX}{cluster_name}": "owned"}


# Reads, on everything: the node controllers' (the instance behind a provider ID, zones, topology) and the
# service controller's (subnets and route tables to place a load balancer, groups, load balancers).
CCM_READ_ACTIONS = (
    "ec2:DescribeInstances",
    "ec2:DescribeRegions",
    "ec2:DescribeAvailabilityZones",
    "ec2:DescribeInstanceTopology",
    "ec2:DescribeSecurityGroups",
    "ec2:DescribeSubnets",
    "ec2:DescribeRouteTables",
    "ec2:DescribeVpcs",
    "elasticloadbalancing:DescribeListeners",
    "elasticloadbalancing:DescribeLoadBalancerAttributes",
    "elasticloadbalancing:DescribeLoadBalancerPolicies",
    "elasticloadbalancing:DescribeLoadBalancers",
    "elasticloadbalancing:DescribeTargetGroupAttributes",
    "elasticloadbalancing:DescribeTargetGroups",
    "elasticloadbalancing:DescribeTargetHealth",
)
# What it does to its own load balancers (Classic: listeners, policies, health check, instances; Network:
# listeners, target groups and their targets) and to nothing else.
CCM_OWN_LOAD_BALANCER_ACTIONS = (
    "elasticloadbalancing:ApplySecurityGroupsToLoadBalancer",
    "elasticloadbalancing:AttachLoadBalancerToSubnets",
    "elasticloadbalancing:ConfigureHealthCheck",
    "elasticloadbalancing:CreateLoadBalancerListeners",
    "elasticloadbalancing:CreateLoadBalancerPolicy",
    "elasticloadbalancing:DeleteListener",
    "elasticloadbalancing:DeleteLoadBalancer",
    "elasticloadbalancing:DeleteLoadBalancerListeners",
    "elasticloadbalancing:DeleteTargetGroup",
    "elasticloadbalancing:DeregisterInstancesFromLoadBalancer",
    "elasticloadbalancing:DeregisterTargets",
    "elasticloadbalancing:DetachLoadBalancerFromSubnets",
    "elasticloadbalancing:ModifyListener",
    "elasticloadbalancing:ModifyLoadBalancerAttributes",
    "elasticloadbalancing:ModifyTargetGroup",
    "elasticloadbalancing:ModifyTargetGroupAttributes",
    "elasticloadbalancing:RegisterInstancesWithLoadBalancer",
    "elasticloadbalancing:RegisterTargets",
    "elasticloadbalancing:SetLoadBalancerPoliciesForBackendServer",
    "elasticloadbalancing:SetLoadBalancerPoliciesOfListener",
)
SECURITY_GROUPS = "arn:aws:ec2:*:*:security-group/*"
LOAD_BALANCERS = "arn:aws:elasticloadbalancing:*:*:loadbalancer/*"
NETWORK_LOAD_BALANCERS = "arn:aws:elasticloadbalancing:*:*:loadbalancer/net/*/*"
TARGET_GROUPS = "arn:aws:elasticloadbalancing:*:*:targetgroup/*/*"
LISTENERS = "arn:aws:elasticloadbalancing:*:*:listener/net/*/*/*"


def cloud_controller_policy(cluster_name: str) -> dict[str, Any]:
    """The CCM's permissions: reads on everything; every write only where the cluster's tag is, in the
    request that creates a resource or on the resource it changes. Two writes are not tag-conditioned:
    `ec2:CreateSecurityGroup` on the VPC side (a VPC carries no cluster tag; the group it makes must carry
    one, by the statement before) and the load balancers' service-linked role (by service name)."""
    tag_key = f"{CLUSTER_TAG_PREFIX}{cluster_name}"
    tagged_request = {"StringEquals": {f"aws:RequestTag/{tag_key}": "owned"}}
    tagged_resource = {"StringEquals": {f"aws:ResourceTag/{tag_key}": "owned"}}
    # Adding tags to one's own resource, never another cluster's tag (a Service's extra-tags annotation).
    retag_own = {
        **tagged_resource,
        "ForAllValues:StringNotLike": {"aws:TagKeys": f"{CLUSTER_TAG_PREFIX}*"},
    }
    return {
        "Version": POLICY_VERSION,
        "Statement": [
            {"Sid": "Read", "Effect": "Allow", "Action": list(CCM_READ_ACTIONS), "Resource": "*"},
            {
                "Sid": "CreateTaggedSecurityGroups",
                "Effect": "Allow",
                "Action": "ec2:CreateSecurityGroup",
                "Resource": SECURITY_GROUPS,
                "Condition": tagged_request,
            },
            {
                "Sid": "CreateSecurityGroupsInVpcs",
                "Effect": "Allow",
                "Action": "ec2:CreateSecurityGroup",
                "Resource": "arn:aws:ec2:*:*:vpc/*",
            },
            {
                "Sid": "TagSecurityGroupsAtCreation",
                "Effect": "Allow",
                "Action": "ec2:CreateTags",
                "Resource": SECURITY_GROUPS,
                "Condition": {
                    "StringEquals": {
                        "ec2:CreateAction": "CreateSecurityGroup",
                        f"aws:RequestTag/{tag_key}": "owned",
                    }
                },
            },
            {
                "Sid": "TagOwnSecurityGroups",
                "Effect": "Allow",
                "Action": "ec2:CreateTags",
                "Resource": SECURITY_GROUPS,
                "Condition": retag_own,
            },
            {
                "Sid": "OwnSecurityGroupRules",
                "Effect": "Allow",
                "Action": [
                    "ec2:AuthorizeSecurityGroupIngress",
                    "ec2:RevokeSecurityGroupIngress",
                    "ec2:DeleteSecurityGroup",
                ],
                "Resource": SECURITY_GROUPS,
                "Condition": tagged_resource,
            },
            {
                "Sid": "CreateTaggedLoadBalancers",
                "Effect": "Allow",
                "Action": [
                    "elasticloadbalancing:CreateLoadBalancer",
                    "elasticloadbalancing:CreateTargetGroup",
                ],
                "Resource": [LOAD_BALANCERS, TARGET_GROUPS],
                "Condition": tagged_request,
            },
            {
                "Sid": "CreateTaggedListenersOnOwnLoadBalancers",
                "Effect": "Allow",
                "Action": "elasticloadbalancing:CreateListener",
                "Resource": NETWORK_LOAD_BALANCERS,
                "Condition": {
                    "StringEquals": {
                        f"aws:RequestTag/{tag_key}": "owned",
                        f"aws:ResourceTag/{tag_key}": "owned",
                    }
                },
            },
            {
                "Sid": "TagLoadBalancersAtCreation",
                "Effect": "Allow",
                "Action": "elasticloadbalancing:AddTags",
                "Resource": [LOAD_BALANCERS, TARGET_GROUPS, LISTENERS],
                "Condition": {
                    "StringEquals": {
                        "elasticloadbalancing:CreateAction": [
                            "CreateLoadBalancer",
                            "CreateTargetGroup",
                            "CreateListener",
                        ],
                        f"aws:RequestTag/{tag_key}": "owned",
                    }
                },
            },
            {
                "Sid": "TagOwnLoadBalancers",
                "Effect": "Allow",
                "Action": "elasticloadbalancing:AddTags",
                "Resource": LOAD_BALANCERS,
                "Condition": retag_own,
            },
            {
                "Sid": "OwnLoadBalancers",
                "Effect": "Allow",
                "Action": list(CCM_OWN_LOAD_BALANCER_ACTIONS),
                "Resource": [LOAD_BALANCERS, TARGET_GROUPS, LISTENERS],
                "Condition": tagged_resource,
            },
            # An account's first load balancer creates Elastic Load Balancing's service-linked role.
            {
                "Sid": "LoadBalancerServiceRole",
                "Effect": "Allow",
                "Action": "iam:CreateServiceLinkedRole",
                "Resource": "*",
                "Condition": {"StringEquals": {"iam:AWSServiceName": "elasticloadbalancing.amazonaws.com"}},
            },
        ],
    }
