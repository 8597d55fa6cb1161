"""Graph, security and PKI tests of the aws-k3s stack, and the bad inputs it refuses."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpu_k8s.components.k3s import paths
from gpu_k8s.providers.aws import cloud_controller, k3s_agents
from gpu_k8s.tools import reference_data
from gpu_k8s.tools.engine import Recording, Registration, Secret, run_program
from tests.conftest import (
    assert_refused_before_any_resource,
    ec2_cloud_config,
    node_drop_in,
    set_path,
    some,
    upstream_yaml,
    user_data_files,
)
from tests.test_contracts import operator_chart_values, serious_findings, unknown_values

ASG = "aws:autoscaling/group:Group"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
# The CAs k3s signs with (k3s docs, cli/certificate.md), written out here rather than read from the code.
LEAF = ("server-ca", "client-ca", "request-header-ca", "etcd/peer-ca", "etcd/server-ca")


def agent_user_data(rec: Recording, pool: str) -> str:
    return ec2_cloud_config(rec.by_name(f"ml-gpu-{pool}-lt").inputs)


def secret_payload(rec: Recording, audience: str) -> dict[str, str]:
    value = rec.by_name(f"ml-{audience}-bootstrap-value").inputs["secretString"]
    assert isinstance(value, Secret)
    return json.loads(value.value)["files"]


def kubeconfig(rec: Recording) -> dict[str, Any]:
    value = rec.by_name("ml-k8s").inputs["kubeconfig"]
    assert isinstance(value, Secret)
    return json.loads(value.value)


def pem_certs(text: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(text.encode())


# --- PKI ---


def test_the_deployer_certificate_chains_to_the_client_ca_and_is_in_system_masters(aws_k3s):
    user = kubeconfig(aws_k3s)["users"][0]["user"]
    admin, client_ca = pem_certs(base64.b64decode(user["client-certificate-data"]).decode())
    tls_client_ca = pem_certs(secret_payload(aws_k3s, "servers")[f"{paths.TLS_DIR}/client-ca.crt"])[0]
    assert client_ca == tls_client_ca
    public_key = client_ca.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    public_key.verify(admin.signature, admin.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))
    assert admin.issuer == client_ca.subject
    assert [a.value for a in admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "system:masters"
    ]
    assert admin.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gpu-k8s-deployer"
    usages = admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages
    assert not admin.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    key = serialization.load_pem_private_key(base64.b64decode(user["client-key-data"]), password=None)
    assert key.public_key().public_numbers() == admin.public_key().public_numbers()  # type: ignore[union-attr]


def test_client_certificates_are_renewed_by_an_up_in_their_last_60_days_and_cas_are_not(aws_k3s):
    signed = {r.name: r.inputs for r in aws_k3s.by_type("tls:index/locallySignedCert:LocallySignedCert")}
    for client in ("admin", "deployer"):
        cert = signed.pop(f"ml-control-plane-pki-{client}-cert")
        assert (cert["validityPeriodHours"], cert["earlyRenewalHours"]) == (365 * 24, 60 * 24)
    assert len(signed) >= 4
    for name, ca in signed.items():
        assert "earlyRenewalHours" not in ca, name  # a renewed CA would cut every node off


def test_every_ca_file_is_signed_by_the_root_and_its_key_matches(aws_k3s):
    files = secret_payload(aws_k3s, "servers")
    roots = {pem_certs(files[f"{paths.TLS_DIR}/{ca}.crt"])[-1].fingerprint(hashes.SHA256()) for ca in LEAF}
    assert len(roots) == 1
    for ca in LEAF:
        leaf, root = pem_certs(files[f"{paths.TLS_DIR}/{ca}.crt"])
        assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        root.public_key().verify(leaf.signature, leaf.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))  # type: ignore[call-arg,union-attr]
        key = serialization.load_pem_private_key(files[f"{paths.TLS_DIR}/{ca}.key"].encode(), password=None)
        assert key.public_key().public_numbers() == leaf.public_key().public_numbers()  # type: ignore[union-attr]
    assert "PRIVATE KEY" in files[f"{paths.TLS_DIR}/service.key"]


def test_join_tokens_carry_the_root_ca_hash_and_differ(aws_k3s):
    files = secret_payload(aws_k3s, "servers")
    root = pem_certs(files[f"{paths.TLS_DIR}/server-ca.crt"])[-1]
    digest = hashlib.sha256(root.public_bytes(serialization.Encoding.DER)).hexdigest()
    server_token, agent_token = files[paths.TOKEN_FILE], files[paths.AGENT_TOKEN_FILE]
    assert server_token.startswith(f"K10{digest}::server:")
    assert agent_token.startswith(f"K10{digest}::node:")
    assert server_token.split(":")[-1] != agent_token.split(":")[-1]
    # Agents get only their own token.
    assert secret_payload(aws_k3s, "agents") == {paths.AGENT_TOKEN_FILE: agent_token}


def test_kubeconfig_trusts_the_server_ca_and_points_at_the_load_balancer(aws_k3s):
    cluster = kubeconfig(aws_k3s)["clusters"][0]["cluster"]
    chain = pem_certs(base64.b64decode(cluster["certificate-authority-data"]).decode())
    files = secret_payload(aws_k3s, "servers")
    assert chain == pem_certs(files[f"{paths.TLS_DIR}/server-ca.crt"])
    load_balancer = aws_k3s.by_name("ml-api")
    assert cluster["server"].startswith("https://ml-api-") and cluster["server"].endswith(":6443")
    assert load_balancer.inputs["loadBalancerType"] == "network"
    assert isinstance(aws_k3s.outputs["kubeconfig"], Secret)


def test_secret_material_is_secret_everywhere_and_absent_from_user_data(aws_k3s):
    files = secret_payload(aws_k3s, "servers")
    needles = [files[paths.TOKEN_FILE], files[paths.AGENT_TOKEN_FILE]]
    needles += [content for path, content in files.items() if path.endswith((".key",))]
    texts = [ec2_cloud_config(r.inputs) for r in aws_k3s.by_type("aws:ec2/instance:Instance")]
    texts += [agent_user_data(aws_k3s, pool) for pool in ("l4", "h100")]
    for text in texts:
        assert isinstance(text, str)
        for needle in needles:
            assert needle not in text
        assert "PRIVATE KEY" not in text and "K10" not in text
    for key in some(aws_k3s.by_type("tls:index/privateKey:PrivateKey"), at_least=7):
        assert "privateKeyPem" in key.options["additionalSecretOutputs"]
    for name in ("clusterName", "gpuPools", "gpuDriver"):
        assert "PRIVATE KEY" not in json.dumps(aws_k3s.outputs[name])


# --- no SSH, exact network rules ---


def test_no_ssh_anywhere(aws_k3s):
    for instance in aws_k3s.by_type("aws:ec2/instance:Instance"):
        assert "keyName" not in instance.inputs
    for template in aws_k3s.by_type("aws:ec2/launchTemplate:LaunchTemplate"):
        assert "keyName" not in template.inputs
    for rule in aws_k3s.by_type(INGRESS):
        assert not rule.inputs["fromPort"] <= 22 <= rule.inputs["toPort"]
    assert not aws_k3s.by_type("aws:ec2/keyPair:KeyPair")


def test_security_group_rules_are_exactly_the_k3s_ports(aws_k3s):
    role_of = {
        group.id: group.name.removeprefix("ml-").removesuffix("-sg")
        for group in aws_k3s.by_type("aws:ec2/securityGroup:SecurityGroup")
    }
    ingress = {
        (
            role_of[rule.inputs["securityGroupId"]],
            rule.inputs["ipProtocol"],
            int(rule.inputs["fromPort"]),
            int(rule.inputs["toPort"]),
            rule.inputs.get("cidrIpv4") or role_of[rule.inputs["referencedSecurityGroupId"]],
        )
        for rule in aws_k3s.by_type(INGRESS)
    }
    assert ingress == {
        ("nodes", "udp", 8472, 8472, "nodes"),
        ("nodes", "tcp", 10250, 10250, "nodes"),
        ("servers", "tcp", 6443, 6443, "nodes"),
        ("servers", "tcp", 6443, 6443, "api"),
        ("servers", "tcp", 2379, 2380, "servers"),
        ("api", "tcp", 6443, 6443, "203.0.113.0/24"),
        # Agents register through the internal balancer, which forwards to the servers only.
        ("registration", "tcp", 6443, 6443, "nodes"),
        ("servers", "tcp", 6443, 6443, "registration"),
        # storage.shared: efs: NFS from the nodes to the file system's mount targets, nothing else.
        ("efs-mount-targets", "tcp", 2049, 2049, "nodes"),
        # monitoring (on unless a stack says false): Prometheus on a server reads each node's node-exporter.
        ("nodes", "tcp", 9100, 9100, "nodes"),
    }
    egress = {
        (
            role_of[rule.inputs["securityGroupId"]],
            rule.inputs.get("cidrIpv4") or role_of[rule.inputs["referencedSecurityGroupId"]],
        )
        for rule in aws_k3s.by_type(EGRESS)
    }
    # The load balancers reach only the servers; nodes reach registries and AWS APIs.
    assert egress == {
        ("api", "servers"),
        ("registration", "servers"),
        ("nodes", "0.0.0.0/0"),
        ("servers", "0.0.0.0/0"),
    }


def test_one_server_by_default_opens_no_etcd_ports_and_is_its_own_registration_address(aws_k3s_config):
    config = copy.deepcopy(aws_k3s_config)
    del config["gpu-k8s:cluster"]["systemPool"]["nodes"]
    rec = run_program("single", config)
    assert not [r for r in rec.by_type(INGRESS) if int(r.inputs["fromPort"]) == 2379]
    assert len(rec.by_type("aws:ec2/instance:Instance")) == 1
    # No balancer in front of one server: agents register at its own lasting address.
    assert [lb.name for lb in rec.by_type("aws:lb/loadBalancer:LoadBalancer")] == ["ml-api"]
    assert not [g for g in rec.by_type("aws:ec2/securityGroup:SecurityGroup") if "registration" in g.name]
    assert (
        agent_server_url(rec, "l4") == f"https://{rec.by_name('ml-server-0-eni').outputs['privateIp']}:6443"
    )
    # It founds the cluster without asking anyone; embedded etcd, so snapshots exist.
    script = user_data_files(ec2_cloud_config(rec.by_name("ml-server-0").inputs))[paths.BOOTSTRAP_FILE]
    assert 'log "founding the cluster"' in script and "peers=(" not in script
    assert "snapshot_store.py founded" in script  # not again if the bucket shows it was


def agent_server_url(rec: Recording, pool: str) -> str:
    user_data = ec2_cloud_config(rec.by_name(f"ml-gpu-{pool}-lt").inputs)
    return yaml.safe_load(user_data_files(user_data)[f"{paths.CONFIG_DIR}/config.yaml"])["server"]


def server_peers(rec: Recording, index: int) -> list[str]:
    script = user_data_files(ec2_cloud_config(rec.by_name(f"ml-server-{index}").inputs))[paths.BOOTSTRAP_FILE]
    (line,) = [line for line in script.splitlines() if line.startswith("peers=(")]
    return line.removeprefix("peers=(").removesuffix(")").split()


# --- servers, agents and templates ---


def test_servers_are_private_imdsv2_encrypted_with_stable_addresses(aws_k3s):
    servers = aws_k3s.by_type("aws:ec2/instance:Instance")
    assert len(servers) == 3
    api_host = (
        kubeconfig(aws_k3s)["clusters"][0]["cluster"]["server"].removeprefix("https://").removesuffix(":6443")
    )
    assert api_host.endswith(".elb.us-east-1.amazonaws.com")
    for index in range(len(servers)):
        server = aws_k3s.by_name(f"ml-server-{index}")
        inputs = server.inputs
        assert inputs["metadataOptions"]["httpTokens"] == "required"
        assert inputs["rootBlockDevice"]["encrypted"] is True
        assert "associatePublicIpAddress" not in inputs
        interface = aws_k3s.by_name(f"ml-server-{index}-eni")
        assert inputs["networkInterfaces"] == [{"networkInterfaceId": interface.id, "deviceIndex": 0}]
        # First-boot data: a change must not stop and start every server (upgrades go in place).
        assert server.options["ignoreChanges"] == ["ami", "userData", "userDataBase64"]
        # No pod gets an IMDSv2 token: the add-ons that use the role run on the host network.
        assert inputs["metadataOptions"]["httpPutResponseHopLimit"] == 1
        files = user_data_files(ec2_cloud_config(inputs))
        assert paths.POD_METADATA_BLOCK_FILE in files
        config = yaml.safe_load(files[f"{paths.CONFIG_DIR}/config.yaml"])
        # The names the kubeconfig and the agents reach the API by are in every server's certificate.
        registration = aws_k3s.by_name("ml-registration").outputs["dnsName"]
        assert config["tls-san"] == [api_host, registration]
        assert "cluster-init" not in config and "server" not in config
        # Each server asks the two others, at their lasting interface addresses; server 0 alone may found.
        others = [aws_k3s.by_name(f"ml-server-{i}-eni").outputs["privateIp"] for i in range(3) if i != index]
        assert server_peers(aws_k3s, index) == [f"https://{ip}:6443" for ip in others]
        script = files[paths.BOOTSTRAP_FILE]
        assert ("founding the cluster" in script) == (index == 0)


@pytest.mark.parametrize(
    ("balancer", "internal", "subnets"), [("api", False, "public"), ("registration", True, "private")]
)
def test_both_load_balancers_forward_6443_to_every_server(aws_k3s, balancer, internal, subnets):
    load_balancer = aws_k3s.by_name(f"ml-{balancer}").inputs
    assert load_balancer["internal"] is internal
    assert load_balancer["subnets"] == [aws_k3s.by_name(f"ml-network-{subnets}-{i}").id for i in range(3)]
    group = aws_k3s.by_name(f"ml-{balancer}-targets")
    assert (group.inputs["port"], group.inputs["protocol"], group.inputs["targetType"]) == (6443, "TCP", "ip")
    listener = aws_k3s.by_name(f"ml-{balancer}-listener").inputs
    assert (listener["port"], listener["protocol"]) == (6443, "TCP")
    targets = {
        t.inputs["targetId"]
        for t in aws_k3s.by_type("aws:lb/targetGroupAttachment:TargetGroupAttachment")
        if t.inputs["targetGroupArn"] == group.outputs["arn"]
    }
    assert targets == {aws_k3s.by_name(f"ml-server-{i}-eni").outputs["privateIp"] for i in range(3)}


def test_agents_register_through_the_internal_balancer(aws_k3s):
    """Any running server takes a new GPU node: server 0 is no single point of failure for scale-up."""
    registration = aws_k3s.by_name("ml-registration").outputs["dnsName"]
    assert registration.startswith("internal-")
    for pool in ("l4", "h100"):
        assert agent_server_url(aws_k3s, pool) == f"https://{registration}:6443"


def pool_groups(rec: Recording, pool: str) -> list[Registration]:
    return sorted(
        (r for r in rec.by_type(ASG) if r.name.startswith(f"ml-gpu-{pool}-asg-")), key=lambda r: r.name
    )


def test_each_pool_has_one_group_per_zone_with_its_limits_split_over_them(aws_k3s):
    """One zone per group (the autoscaler models a group in one zone; AZ rebalancing kills busy nodes): the
    example's l4 pool (max 4) over three zones, h100 (max 1) in one."""
    subnets = [aws_k3s.by_name(f"ml-network-private-{i}").id for i in range(3)]
    l4, h100 = pool_groups(aws_k3s, "l4"), pool_groups(aws_k3s, "h100")
    assert [(g.inputs["vpcZoneIdentifiers"], g.inputs["maxSize"]) for g in l4] == [
        ([subnets[0]], 2),
        ([subnets[1]], 1),
        ([subnets[2]], 1),
    ]
    assert [(g.inputs["vpcZoneIdentifiers"], g.inputs["maxSize"]) for g in h100] == [([subnets[0]], 1)]
    for group in [*l4, *h100]:
        assert group.inputs["suspendedProcesses"] == ["AZRebalance"]
        assert group.inputs["minSize"] == 0
    assert [g.inputs["capacityRebalance"] for g in l4] == [True] * 3


@pytest.mark.parametrize(
    ("min_nodes", "max_nodes", "zones", "expected"),
    [
        (0, 4, 3, [(0, 2), (0, 1), (0, 1)]),
        (2, 3, 3, [(1, 1), (1, 1), (0, 1)]),
        (1, 1, 3, [(1, 1)]),
        (0, 6, 2, [(0, 3), (0, 3)]),
    ],
)
def test_zone_limits_add_up_to_the_pools(min_nodes, max_nodes, zones, expected):
    from gpu_k8s.providers.aws.autoscaling import zone_limits

    limits = zone_limits(min_nodes, max_nodes, range(zones))
    assert [(z.min_nodes, z.max_nodes) for z in limits] == expected
    assert sum(z.max_nodes for z in limits) == max_nodes and sum(z.min_nodes for z in limits) == min_nodes


def test_gpu_pools_are_asgs_from_zero_with_template_tags_matching_the_pool(aws_k3s):
    groups = {pool: pool_groups(aws_k3s, pool)[0] for pool in ("l4", "h100")}
    for pool, group in groups.items():
        assert int(group.inputs["minSize"]) == 0
        assert group.options["ignoreChanges"] == ["desiredCapacity"]
        tags = {t["key"]: t["value"] for t in group.inputs["tags"]}
        assert all(t["propagateAtLaunch"] is False for t in group.inputs["tags"])
        assert tags["k8s.io/cluster-autoscaler/enabled"] == "true"
        assert tags["k8s.io/cluster-autoscaler/ml"] == "owned"
        label = "k8s.io/cluster-autoscaler/node-template/label/"
        assert tags[f"{label}gpu-k8s.io/pool"] == pool
        assert tags[f"{label}nvidia.com/device-plugin.config"] == pool
        assert tags["k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu"] == "true:NoSchedule"
    l4 = {t["key"]: t["value"] for t in groups["l4"].inputs["tags"]}
    assert l4["k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"] == "4"  # 1 L4 x 4 slices
    assert l4["k8s.io/cluster-autoscaler/node-template/resources/ephemeral-storage"] == "170Gi"  # 85% of 200
    assert l4["k8s.io/cluster-autoscaler/node-template/label/gpu-k8s.io/capacity-type"] == "spot"
    h100 = {t["key"]: t["value"] for t in groups["h100"].inputs["tags"]}
    assert (
        h100["k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"] == "56"
    )  # 8 x 7 MIG slices
    assert h100["k8s.io/cluster-autoscaler/node-template/label/nvidia.com/mig.config"] == "all-1g.10gb"


def test_agent_labels_in_user_data_match_the_template_tags(aws_k3s):
    for pool in ("l4", "h100"):
        script = user_data_files(agent_user_data(aws_k3s, pool))[paths.BOOTSTRAP_FILE]
        node = node_drop_in(script)
        tags = {t["key"]: t["value"] for t in pool_groups(aws_k3s, pool)[0].inputs["tags"]}
        prefix = "k8s.io/cluster-autoscaler/node-template/label/"
        templated = {key.removeprefix(prefix): value for key, value in tags.items() if key.startswith(prefix)}
        assert {f"{key}={value}" for key, value in templated.items()} <= set(node["node-label"])
        assert "provider-id=${PROVIDER_ID}" in node["kubelet-arg"]
        assert "node.kubernetes.io/instance-type=${INSTANCE_TYPE}" in node["node-label"]


def test_launch_templates_ubuntu_imdsv2_hop_one_encrypted_gp3_spot_on_request(aws_k3s):
    for pool, spot, disk in (("l4", True, 200), ("h100", False, 500)):
        template = aws_k3s.by_name(f"ml-gpu-{pool}-lt").inputs
        # Resolved at `up` from Canonical's parameter (a new AMI shows in the diff), never at each launch.
        assert template["imageId"].startswith("ami-")
        assert any(
            invoke.args["name"]
            == "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
            for invoke in aws_k3s.invokes
            if invoke.token == "aws:ssm/getParameter:getParameter"
        )
        assert template["metadataOptions"] == {
            "httpEndpoint": "enabled",
            "httpTokens": "required",
            # No pod on a GPU node reaches IMDS (the termination handler uses host networking).
            "httpPutResponseHopLimit": 1,
        }
        (root,) = template["blockDeviceMappings"]
        assert root["ebs"]["encrypted"] == "true" and root["ebs"]["volumeType"] == "gp3"
        assert root["ebs"]["volumeSize"] == disk
        assert ("instanceMarketOptions" in template) is spot


def test_roles_read_only_their_own_secrets_and_servers_may_scale(aws_k3s):
    servers = aws_k3s.by_name("ml-servers-bootstrap")
    agents = aws_k3s.by_name("ml-agents-bootstrap")
    arn = lambda secret: f"arn:aws:secretsmanager:us-east-1:123456789012:secret:{secret.name}-"  # noqa: E731
    server_policy = json.loads(aws_k3s.by_name("ml-server-read-secrets").inputs["policy"])
    agent_policy = json.loads(aws_k3s.by_name("ml-agent-read-secrets").inputs["policy"])
    (agent_resource,) = agent_policy["Statement"][0]["Resource"]
    assert agent_resource.startswith(arn(agents))
    assert sorted(r.startswith(arn(servers)) for r in server_policy["Statement"][0]["Resource"]) == [
        False,
        True,
    ]
    # The servers hold the autoscaler policy (writes limited by the owned tag: tests/test_permissions.py).
    assert aws_k3s.by_name("ml-server-policy").type == "aws:iam/rolePolicy:RolePolicy"
    assert not [r for r in aws_k3s.registrations if r.name == "ml-agent-policy"]


def test_iam_documents_pass_parliament(aws_k3s):
    """The same linting as the EKS documents: no finding, except RESOURCE_STAR on tag-scoped writes."""
    for name in ("ml-server-read-secrets", "ml-agent-read-secrets", "ml-server-policy"):
        assert serious_findings(aws_k3s.by_name(name).inputs["policy"], trust_policy=False) == [], name
    # The cloud controller's document: parliament's own action data is older than the Service Authorization
    # Reference the references check reads (upstream/references/aws-iam-actions.json), and that table
    # refutes each finding parliament makes on it: CreateSecurityGroup is authorized on the VPC too, AddTags
    # takes elasticloadbalancing:CreateAction, Network Load Balancer listeners are listener/net. The one
    # RESOURCE_STAR is the service-linked role, conditioned on its service name.
    controller = aws_k3s.by_name("ml-server-cloud-controller").inputs["policy"]
    found = {
        (issue, entry["action"] if isinstance(entry, dict) else str(entry).split(" for action ")[-1])
        for _, issue, detail in serious_findings(controller, trust_policy=False)
        for entry in (detail if isinstance(detail, list) else [detail])
    }
    assert found == {
        ("RESOURCE_MISMATCH", "ec2:CreateSecurityGroup"),
        ("RESOURCE_MISMATCH", "elasticloadbalancing:DeleteListener"),
        ("RESOURCE_MISMATCH", "elasticloadbalancing:ModifyListener"),
        ("UNKNOWN_CONDITION_FOR_ACTION", "elasticloadbalancing:AddTags"),
        ("RESOURCE_STAR", "iam:CreateServiceLinkedRole"),
    }
    table = json.loads(reference_data.AWS_IAM_FILE.read_text())["services"]
    assert "vpc" in table["ec2"]["actions"]["CreateSecurityGroup"]
    assert "elasticloadbalancing:CreateAction" in table["elasticloadbalancing"]["actions"]["AddTags"][""]
    for action in ("DeleteListener", "ModifyListener"):
        assert "listener/net" in table["elasticloadbalancing"]["actions"][action]
    for role in some(aws_k3s.by_type("aws:iam/role:Role"), at_least=2):
        assert serious_findings(role.inputs["assumeRolePolicy"], trust_policy=True) == [], role.name


def test_chart_values_exist_in_the_pinned_charts(aws_k3s):
    ebs = aws_k3s.by_name("ml-ebs-csi").inputs
    assert ebs["version"] == "2.64.0"
    assert unknown_values(ebs["values"], upstream_yaml("aws-ebs-csi-driver/2.64.0/values.yaml")) == []
    nth = aws_k3s.by_name("ml-termination-handler").inputs
    assert nth["version"] == "0.27.6"
    assert (
        unknown_values(nth["values"], upstream_yaml("aws-node-termination-handler/0.27.6/values.yaml")) == []
    )
    operator = aws_k3s.by_name("ml-gpu-operator-release").inputs["values"]
    assert unknown_values(operator, operator_chart_values()) == []
    autoscaler = aws_k3s.by_name("ml-autoscaler-release").inputs["values"]
    assert unknown_values(autoscaler, upstream_yaml("cluster-autoscaler/9.59.0/values.yaml")) == []


def test_ebs_values_pass_the_charts_own_schema(aws_k3s):
    import jsonschema

    from tests.conftest import upstream

    schema = json.loads(upstream("aws-ebs-csi-driver/2.64.0/values.schema.json").read_text())
    defaults = upstream_yaml("aws-ebs-csi-driver/2.64.0/values.yaml")
    merged = _merge(defaults, aws_k3s.by_name("ml-ebs-csi").inputs["values"])
    assert [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(merged)] == []


def _merge(base: Any, override: Any) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in override.items()}}
    return override


def test_gpu_operator_installs_the_driver_and_uses_the_k3s_containerd(aws_k3s):
    values = aws_k3s.by_name("ml-gpu-operator-release").inputs["values"]
    assert values["driver"] == {"enabled": True, "version": "595.91.07"}
    assert values["toolkit"] == {
        "enabled": True,
        "env": [{"name": "CONTAINERD_SOCKET", "value": "/run/k3s/containerd/containerd.sock"}],
    }
    assert aws_k3s.outputs["gpuDriver"] == {"owner": "gpu-operator", "version": "595.91.07"}


def test_storage_default_is_encrypted_gp3_and_termination_handler_watches_spot_nodes(aws_k3s):
    storage = aws_k3s.by_name("ml-storage-class").inputs
    assert storage["provisioner"] == "ebs.csi.aws.com"
    assert storage["metadata"]["annotations"] == {"storageclass.kubernetes.io/is-default-class": "true"}
    nth = aws_k3s.by_name("ml-termination-handler").inputs["values"]
    assert nth["daemonsetNodeSelector"] == {k3s_agents.CAPACITY_LABEL: "spot"}


def test_no_spot_pool_no_termination_handler(aws_k3s_config):
    config = copy.deepcopy(aws_k3s_config)
    config["gpu-k8s:cluster"]["gpuPools"][0]["spot"] = False
    rec = run_program("on-demand", config)
    assert not [r for r in rec.registrations if r.name == "ml-termination-handler"]


# --- bad input ---

BAD_K3S_INPUTS = [
    (
        "labels-beyond-the-asg-tag-limit",
        set_path("gpuPools.0.labels", {f"team.example.com/l{i}": "x" for i in range(45)}),
        "gpuPools[0].labels",
        ("55 tags", "drop at least 5"),
    ),
    ("two-servers", set_path("systemPool.nodes", 2), "systemPool.nodes", ("1 or 3",)),
    ("k3s-version-malformed", set_path("k3s", {"version": "1.36.3"}), "k3s.version", ("not a k3s release",)),
    (
        "k3s-too-new-for-the-operator",
        set_path("k3s", {"version": "v1.37.1+k3s1"}),
        "k3s.version",
        ("1.33-1.36",),
    ),
    (
        "k3s-minor-not-the-kubernetes-version",
        set_path("k3s", {"version": "v1.35.2+k3s1"}),
        "k3s.version",
        ("kubernetesVersion says 1.36",),
    ),
    (
        "admin-cidr-open-to-the-world",
        set_path("apiAccessCidrs", ["0.0.0.0/0"]),
        "apiAccessCidrs[0]",
        ("whole internet", "allowPublicApiFromAnywhere"),
    ),
    (
        "pod-security-unknown",
        set_path("k3s", {"podSecurity": "privileged"}),
        "k3s.podSecurity",
        ("baseline",),
    ),
    (
        "driver-malformed",
        set_path("addonVersions", {"nvidiaDriver": "latest"}),
        "addonVersions.nvidiaDriver",
        ("not an NVIDIA driver",),
    ),
    (
        "cuda-beyond-the-installed-driver",
        set_path("addonVersions", {"nvidiaDriver": "570.124.06"}),
        "gpu-k8s:cluster.cuda",
        ("CUDA 13.x needs driver >= 580",),
    ),
    (
        "existing-vpc-without-public-subnets",
        set_path(
            "network",
            {"vpcId": "vpc-0a1b2c3d", "privateSubnetIds": ["subnet-0a1b2c3d", "subnet-1a1b2c3d"]},
        ),
        "network.publicSubnetIds",
        ("load balancer needs public subnets",),
    ),
    (
        "gke-settings-on-k3s",
        set_path("gke", {"regional": False}),
        "gpu-k8s:cluster.gke",
        ("only apply to kind gke",),
    ),
]


@pytest.mark.parametrize(
    ("mutation", "path", "words"), [c[1:] for c in BAD_K3S_INPUTS], ids=[c[0] for c in BAD_K3S_INPUTS]
)
def test_bad_k3s_input_is_refused_before_any_resource(aws_k3s_config, mutation, path, words):
    assert_refused_before_any_resource(aws_k3s_config, mutation, path, words)


def test_missing_region_is_refused(aws_k3s_config):
    config = {key: value for key, value in aws_k3s_config.items() if key != "aws:region"}
    assert_refused_before_any_resource(config, lambda cluster: None, "aws:region", ("is not set",))


def test_k3s_settings_on_eks_are_refused(aws_eks_config):
    assert_refused_before_any_resource(
        aws_eks_config,
        set_path("k3s", {"version": "v1.36.3+k3s1"}),
        "gpu-k8s:cluster.k3s",
        ("only apply to kind k3s",),
    )


def test_taints_without_a_value_render_as_key_and_effect(aws_k3s_config):
    config = copy.deepcopy(aws_k3s_config)
    config["gpu-k8s:cluster"]["gpuPools"][0]["taints"] = [
        {"key": "example.com/dedicated", "effect": "NoExecute"}
    ]
    rec = run_program("taints", config)
    script = user_data_files(agent_user_data(rec, "l4"))[paths.BOOTSTRAP_FILE]
    node = node_drop_in(script)
    assert node["node-taint"] == [
        "nvidia.com/gpu=true:NoSchedule",
        "gpu-k8s.io/sharing=timeSlicing:NoSchedule",
        "example.com/dedicated:NoExecute",
    ]
    tags = {t["key"]: t["value"] for t in pool_groups(rec, "l4")[0].inputs["tags"]}
    assert tags["k8s.io/cluster-autoscaler/node-template/taint/example.com/dedicated"] == ":NoExecute"


def test_nodes_boot_only_after_their_secret_and_permission_exist(aws_k3s):
    """A node reads its bootstrap secret once, at first boot."""
    for server in some(aws_k3s.by_type("aws:ec2/instance:Instance"), at_least=3):
        assert aws_k3s.by_name("ml-servers-bootstrap-value").urn in server.dependencies
        assert aws_k3s.by_name("ml-server-read-secrets").urn in server.dependencies
    for group in some(aws_k3s.by_type(ASG), at_least=2):
        assert aws_k3s.by_name("ml-agents-bootstrap-value").urn in group.dependencies
        assert aws_k3s.by_name("ml-agent-read-secrets").urn in group.dependencies


# --- etcd snapshots ---


def snapshot_bucket(rec: Recording) -> Registration:
    (bucket,) = rec.by_type("aws:s3/bucket:Bucket")
    return bucket


def test_servers_ship_etcd_snapshots_to_the_clusters_bucket_with_their_role(aws_k3s):
    bucket = snapshot_bucket(aws_k3s)
    name = bucket.outputs["bucket"]
    assert name.startswith("ml-etcd-")
    for index in range(3):
        files = user_data_files(ec2_cloud_config(aws_k3s.by_name(f"ml-server-{index}").inputs))
        config = yaml.safe_load(files[f"{paths.CONFIG_DIR}/config.yaml"])
        assert {key: value for key, value in config.items() if key.startswith("etcd-")} == {
            "etcd-snapshot-schedule-cron": "0 */6 * * *",
            "etcd-snapshot-retention": 28,
            "etcd-snapshot-compress": True,
            "etcd-s3": True,
            "etcd-s3-endpoint": "s3.us-east-1.amazonaws.com",
            "etcd-s3-region": "us-east-1",
            "etcd-s3-bucket": name,
            "etcd-s3-folder": "ml",
        }
        # No key anywhere: k3s uses the instance role when none is given.
        assert paths.ETCD_S3_CREDENTIALS_FILE not in files
    assert (
        paths.ETCD_S3_CREDENTIALS_FILE
        not in json.loads(aws_k3s.by_name("ml-servers-bootstrap-value").inputs["secretString"].value)["files"]
    )


def test_the_snapshot_bucket_is_private_encrypted_versioned_and_outlives_destroy(aws_k3s):
    bucket = snapshot_bucket(aws_k3s)
    assert bucket.options["retainOnDelete"] is True
    children = {
        r.type.rsplit(":", 1)[1]: r.inputs for r in aws_k3s.registrations if r.parent == bucket.parent
    }
    assert all(inputs["bucket"] == bucket.id for kind, inputs in children.items() if kind != "Bucket")
    assert {k: v for k, v in children["BucketPublicAccessBlock"].items() if k != "bucket"} == dict.fromkeys(
        ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"), True
    )
    assert children["BucketOwnershipControls"]["rule"] == {"objectOwnership": "BucketOwnerEnforced"}
    (rule,) = children["BucketServerSideEncryptionConfiguration"]["rules"]
    assert rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "AES256"
    assert children["BucketVersioning"]["versioningConfiguration"] == {"status": "Enabled"}
    (lifecycle,) = children["BucketLifecycleConfiguration"]["rules"]
    assert lifecycle["status"] == "Enabled" and lifecycle["noncurrentVersionExpiration"] == {
        "noncurrentDays": 30
    }
    (deny,) = json.loads(children["BucketPolicy"]["policy"])["Statement"]
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_only_the_servers_may_write_snapshots_and_only_to_their_bucket(aws_k3s):
    arn = snapshot_bucket(aws_k3s).outputs["arn"]
    policy = aws_k3s.by_name("ml-server-snapshots")
    assert policy.parent == aws_k3s.by_name("ml-server-role").urn
    statements = json.loads(policy.inputs["policy"])["Statement"]
    assert {
        (tuple(sorted([s["Action"]] if isinstance(s["Action"], str) else s["Action"])), s["Resource"])
        for s in statements
    } == {
        (("s3:ListBucket",), arn),
        (("s3:DeleteObject", "s3:GetObject", "s3:PutObject"), f"{arn}/*"),
    }
    agent_policies = [r for r in aws_k3s.registrations if r.parent == aws_k3s.by_name("ml-agent-role").urn]
    assert not [r for r in agent_policies if "s3:" in json.dumps(r.inputs)]
    # A server's first snapshot finds the bucket closed and its permission in place.
    for index in range(3):
        dependencies = set(aws_k3s.by_name(f"ml-server-{index}").dependencies)
        assert policy.urn in dependencies
        assert aws_k3s.by_name("ml-etcd-snapshots-no-public-access").urn in dependencies


# --- the AWS cloud controller manager ---


def test_every_node_defers_to_the_aws_cloud_controller_and_is_named_after_its_instance(aws_k3s):
    scripts = [
        user_data_files(ec2_cloud_config(aws_k3s.by_name(f"ml-server-{i}").inputs))[paths.BOOTSTRAP_FILE]
        for i in range(3)
    ]
    scripts += [
        user_data_files(ec2_cloud_config(aws_k3s.by_name(f"ml-gpu-{pool}-lt").inputs))[paths.BOOTSTRAP_FILE]
        for pool in ("l4", "h100")
    ]
    for script in scripts:
        node = node_drop_in(script)
        assert "cloud-provider=external" in node["kubelet-arg"]
        assert node["node-name"] == "${NODE_NAME}"
    for index in range(3):
        files = user_data_files(ec2_cloud_config(aws_k3s.by_name(f"ml-server-{index}").inputs))
        assert yaml.safe_load(files[f"{paths.CONFIG_DIR}/config.yaml"])["disable-cloud-controller"] is True


def test_the_cloud_controller_goes_first_and_its_node_controllers_only_describe(aws_k3s):
    release = aws_k3s.by_name("ml-cloud-controller")
    inputs = release.inputs
    assert (inputs["chart"], inputs["version"], inputs["repositoryOpts"]["repo"]) == (
        "aws-cloud-controller-manager",
        "0.0.11",
        "https://kubernetes.github.io/cloud-provider-aws",
    )
    assert inputs["values"]["image"]["tag"] == cloud_controller.CCM_IMAGE_TAGS["1.36"]

    # Every other Kubernetes object waits for it, directly or through what it waits for: nothing schedules
    # on an uninitialised node.
    def waits_for(resource: Registration, urn: str) -> bool:
        seen, todo = set(), list(resource.dependencies)
        while todo:
            current = todo.pop()
            if current == urn:
                return True
            if current not in seen:
                seen.add(current)
                todo.extend(aws_k3s.by_urn(current).dependencies)
        return False

    others = [
        r
        for r in aws_k3s.registrations
        # The admin binding schedules nothing, and waits for the API alone (tests/test_admin_access.py).
        if r.custom
        and r.type.startswith("kubernetes:")
        and r.name not in ("ml-cloud-controller", "ml-admin-access")
    ]
    assert len(others) >= 5
    assert [r.name for r in others if not waits_for(r, release.urn)] == []
    policy = aws_k3s.by_name("ml-server-cloud-controller")
    assert policy.urn in release.dependencies
    statement = json.loads(policy.inputs["policy"])["Statement"][0]
    assert statement["Sid"] == "Read" and "Condition" not in statement
    assert statement["Resource"] == "*"
    assert all(a.split(":")[1].startswith("Describe") for a in statement["Action"])


def test_service_load_balancers_open_exactly_one_group_per_node(aws_k3s):
    """The cloud controller's service controller opens the one group of an instance tagged with the cluster
    (with several groups and none or two tagged, it fails the Service): every node carries `nodes`, the only
    group with the tag."""
    tag = "kubernetes.io/cluster/ml"
    groups = {g.id: g for g in aws_k3s.by_type("aws:ec2/securityGroup:SecurityGroup")}
    assert [g.name for g in groups.values() if tag in g.inputs["tags"]] == ["ml-nodes-sg"]
    assert groups[aws_k3s.by_name("ml-nodes-sg").id].inputs["tags"][tag] == "owned"
    attached = [
        *(i.inputs["securityGroups"] for i in aws_k3s.by_type("aws:ec2/networkInterface:NetworkInterface")),
        *(t.inputs["vpcSecurityGroupIds"] for t in aws_k3s.by_type("aws:ec2/launchTemplate:LaunchTemplate")),
    ]
    for group_ids in some(attached, at_least=4):
        assert [groups[g].name for g in group_ids if tag in groups[g].inputs["tags"]] == ["ml-nodes-sg"]


# What the cloud controller may write, by the condition that limits it (written here from cloud-provider-aws
# v1.35.2's calls, not read from the code): creates only with the cluster's tag in the request, changes only
# to what carries it, and the two writes with another limit.
CCM_WRITES = {
    "request tag": {
        "ec2:CreateSecurityGroup",
        "ec2:CreateTags",
        "elasticloadbalancing:AddTags",
        "elasticloadbalancing:CreateListener",
        "elasticloadbalancing:CreateLoadBalancer",
        "elasticloadbalancing:CreateTargetGroup",
    },
    "resource tag": {
        "ec2:AuthorizeSecurityGroupIngress",
        "ec2:CreateTags",
        "ec2:DeleteSecurityGroup",
        "ec2:RevokeSecurityGroupIngress",
        "elasticloadbalancing:AddTags",
        "elasticloadbalancing:ApplySecurityGroupsToLoadBalancer",
        "elasticloadbalancing:AttachLoadBalancerToSubnets",
        "elasticloadbalancing:ConfigureHealthCheck",
        "elasticloadbalancing:CreateListener",
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
    },
    # A VPC carries no cluster tag; the group made in it must (the request-tag statement).
    "vpc": {"ec2:CreateSecurityGroup"},
    "service name": {"iam:CreateServiceLinkedRole"},
}


def test_every_write_of_the_cloud_controller_is_limited_to_what_carries_the_clusters_tag(aws_k3s):
    """security.md S2: no write on `*` without a condition, so the servers' role can open no other security
    group, change no other load balancer and tag no volume (which would defeat the EBS policy's scoping)."""
    policy = json.loads(aws_k3s.by_name("ml-server-cloud-controller").inputs["policy"])
    writes: dict[str, set[str]] = {}
    for statement in policy["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if all(a.split(":")[1].startswith("Describe") for a in actions):
            assert "Condition" not in statement or statement["Sid"] == "Read"
            continue
        condition = statement.get("Condition", {})
        keys = {key for operator in condition.values() for key in operator}
        if "aws:RequestTag/kubernetes.io/cluster/ml" in keys:
            assert condition["StringEquals"]["aws:RequestTag/kubernetes.io/cluster/ml"] == "owned"
            writes.setdefault("request tag", set()).update(actions)
        if "aws:ResourceTag/kubernetes.io/cluster/ml" in keys:
            assert condition["StringEquals"]["aws:ResourceTag/kubernetes.io/cluster/ml"] == "owned"
            writes.setdefault("resource tag", set()).update(actions)
        if statement["Resource"] == "arn:aws:ec2:*:*:vpc/*":
            assert not keys
            writes.setdefault("vpc", set()).update(actions)
        if keys == {"iam:AWSServiceName"}:
            assert condition == {"StringEquals": {"iam:AWSServiceName": "elasticloadbalancing.amazonaws.com"}}
            writes.setdefault("service name", set()).update(actions)
        assert keys or statement["Resource"] == "arn:aws:ec2:*:*:vpc/*", statement["Sid"]
    assert writes == CCM_WRITES
    # Tags at creation only for what is being created, and never another cluster's tag on one's own.
    statements = {s["Sid"]: s for s in policy["Statement"]}
    assert statements["TagSecurityGroupsAtCreation"]["Condition"]["StringEquals"]["ec2:CreateAction"] == (
        "CreateSecurityGroup"
    )
    for sid in ("TagOwnSecurityGroups", "TagOwnLoadBalancers"):
        assert statements[sid]["Condition"]["ForAllValues:StringNotLike"] == {
            "aws:TagKeys": "kubernetes.io/cluster/*"
        }
    # Nothing for volumes or routes: the CSI driver and flannel own those.
    every = {
        a
        for s in policy["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert not [a for a in every if "Volume" in a or ("Route" in a and a != "ec2:DescribeRouteTables")]


def test_every_instance_carries_the_cluster_tag_the_cloud_controller_needs(aws_k3s):
    """cloud-provider-aws (v1.35.2, pkg/providers/v1/tags.go) takes its cluster ID from its own instance's
    `kubernetes.io/cluster/<id>` tag and refuses to start without one; its load balancers take only
    instances with the tag as targets (aws.go describeInstances). So servers and agents all carry it."""
    tag = {"kubernetes.io/cluster/ml": "owned"}
    servers = aws_k3s.by_type("aws:ec2/instance:Instance")
    templates = aws_k3s.by_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert len(servers) == 3 and len(templates) >= 2
    for server in servers:
        assert tag.items() <= server.inputs["tags"].items(), server.name
    for template in templates:
        (instance,) = [t for t in template.inputs["tagSpecifications"] if t["resourceType"] == "instance"]
        assert tag.items() <= instance["tags"].items(), template.name
