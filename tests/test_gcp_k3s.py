"""Graph, security, autoscaler and storage tests of the gcp-k3s stack, and the bad inputs it refuses."""

from __future__ import annotations

import base64
import copy
import io
import ipaddress
import json
import re
import sys
import urllib.request
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpu_k8s.components.catalog import load_catalog
from gpu_k8s.components.k3s import paths
from gpu_k8s.components.spec import SUPPORTED_KUBERNETES_MINORS
from gpu_k8s.providers.gcp import cloud_controller, pd_csi
from gpu_k8s.providers.gcp.autoscaling import AUTOSCALER_READ_PERMISSIONS, AUTOSCALER_RESIZE_PERMISSIONS
from gpu_k8s.providers.gcp.k3s_bootstrap import FILES as GCE_FILES
from gpu_k8s.tools.engine import Recording, Registration, Secret, run_program
from tests.conftest import (
    assert_refused_before_any_resource,
    delete_key,
    node_drop_in,
    set_path,
    some,
    upstream,
    upstream_yaml,
    user_data_files,
)
from tests.test_contracts import AUTOSCALER_FLAGS, unknown_values

FIREWALL = "gcp:compute/firewall:Firewall"
INSTANCE = "gcp:compute/instance:Instance"
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
GROUP_MANAGER = "gcp:compute/instanceGroupManager:InstanceGroupManager"
FORWARDING_RULE = "gcp:compute/forwardingRule:ForwardingRule"
SERVERS_SA = "serviceAccount:ml-k3s-servers@gpu-k8s-demo.iam.gserviceaccount.com"
AGENTS_SA = "serviceAccount:ml-k3s-agents@gpu-k8s-demo.iam.gserviceaccount.com"
# cloudprovider/gce/gce_url.go: the instance group URL the autoscaler's --nodes flag takes.
MIG_URL = re.compile(
    r"^https://www\.googleapis\.com/compute/v1/projects/(.*)/zones/(.*)/instanceGroups/(.*)$"
)


# --- the autoscaler's kube-env parser, ported line by line from cloudprovider/gce/templates.go ---


def extract_autoscaler_var(kube_env: str, name: str) -> tuple[str, bool]:
    """extractAutoscalerVarFromKubeEnv: kube-env is YAML map[string]string; AUTOSCALER_ENV_VARS is split on
    ";", each item on the first "=", and the value trimmed of spaces and quotes."""
    values = yaml.safe_load(kube_env)
    assert isinstance(values, dict) and all(isinstance(v, str) for v in values.values())
    variables = values.get("AUTOSCALER_ENV_VARS", "")
    if variables.strip(" ") == "":
        return "", False
    for item in variables.split(";"):
        item = item.strip(" ")
        parts = item.split("=", 1)
        if len(parts) != 2:
            raise ValueError(f"malformed autoscaler var: {item}")
        if parts[0].strip(" ") == name:
            return parts[1].strip(" \"'"), True
    return "", False


def parse_key_value_list(text: str) -> dict[str, str]:
    """parseKeyValueListToMap: ","-separated key=value, split on the first "="."""
    result: dict[str, str] = {}
    if not text:
        return result
    for item in text.split(","):
        parts = item.split("=", 1)
        if len(parts) != 2:
            raise ValueError(f"error while parsing key-value list, val: {item}")
        result[parts[0]] = parts[1]
    return result


def build_taints(taints: dict[str, str]) -> set[tuple[str, str, str]]:
    """buildTaints: each value is value:Effect, split on the first ":"."""
    result = set()
    for key, value in taints.items():
        parts = value.split(":", 1)
        if len(parts) != 2:
            raise ValueError(f"error while parsing node taint value and effect: {value}")
        result.add((key, parts[0], parts[1]))
    return result


def autoscaler_view(kube_env: str) -> dict[str, Any]:
    """What the autoscaler builds a node of the group from."""
    labels, _ = extract_autoscaler_var(kube_env, "node_labels")
    taints, _ = extract_autoscaler_var(kube_env, "node_taints")
    resources, _ = extract_autoscaler_var(kube_env, "extended_resources")
    options, _ = extract_autoscaler_var(kube_env, "autoscaling_options")
    return {
        "labels": parse_key_value_list(labels),
        "taints": build_taints(parse_key_value_list(taints)),
        "resources": parse_key_value_list(resources),
        "options": parse_key_value_list(options),
        "os": extract_autoscaler_var(kube_env, "os")[0],
        "os_distribution": extract_autoscaler_var(kube_env, "os_distribution")[0],
        "arch": extract_autoscaler_var(kube_env, "arch")[0],
    }


def test_the_ported_parser_reads_upstreams_own_example_and_refuses_broken_input():
    # The kube-env of cloudprovider/gce/templates_test.go TestExtractExtendedResourcesFromKubeEnv.
    upstream_example = (
        "AUTOSCALER_ENV_VARS: node_labels=a=b,c=d,cloud.google.com/gke-nodepool=pool-3,"
        "cloud.google.com/gke-preemptible=true;node_taints='dedicated=ml:NoSchedule,test=dev:PreferNoSchedule,"
        "a=b:c';kube_reserved=cpu=1000m,memory=300000Mi;extended_resources=foo=10"
    )
    view = autoscaler_view(upstream_example)
    assert view["resources"] == {"foo": "10"}
    assert ("dedicated", "ml", "NoSchedule") in view["taints"]
    assert view["labels"]["cloud.google.com/gke-nodepool"] == "pool-3"
    with pytest.raises(ValueError):
        autoscaler_view("AUTOSCALER_ENV_VARS: node_labels=a=b;broken")
    with pytest.raises(ValueError):
        autoscaler_view("AUTOSCALER_ENV_VARS: node_taints=dedicated=ml")


# --- helpers ---


def template(rec: Recording, pool: str) -> dict[str, Any]:
    return rec.by_name(f"ml-gpu-{pool}-template").inputs


def agent_user_data(rec: Recording, pool: str) -> str:
    return template(rec, pool)["metadata"]["user-data"]


def secret_payload(rec: Recording, audience: str) -> dict[str, str]:
    value = rec.by_name(f"ml-{audience}-bootstrap-value").inputs["secretData"]
    assert isinstance(value, Secret)
    return json.loads(value.value)["files"]


def pools_by_name(stack_config: dict[str, Any]) -> dict[str, Any]:
    return {pool["name"]: pool for pool in stack_config["gpu-k8s:cluster"]["gpuPools"]}


# --- servers, load balancer, no SSH ---


def test_servers_are_shielded_private_os_login_vms_on_reserved_addresses(gcp_k3s):
    servers = sorted(gcp_k3s.by_type(INSTANCE), key=lambda r: r.name)
    assert [s.inputs["zone"] for s in servers] == ["us-central1-a", "us-central1-b", "us-central1-c"]
    for server in servers:
        inputs = server.inputs
        assert inputs["machineType"] == "e2-standard-4"
        assert inputs["shieldedInstanceConfig"] == {
            "enableSecureBoot": True,
            "enableVtpm": True,
            "enableIntegrityMonitoring": True,
        }
        interface = inputs["networkInterfaces"][0]
        assert "accessConfigs" not in interface, "servers have no public address"
        address = gcp_k3s.by_name(f"{server.name}-address")
        assert address.inputs["addressType"] == "INTERNAL" and address.urn in server.dependencies
        assert ipaddress.IPv4Address(interface["networkIp"]) in ipaddress.IPv4Network("10.40.0.0/20")
        assert inputs["serviceAccount"]["email"] == SERVERS_SA.removeprefix("serviceAccount:")
        assert inputs["bootDisk"]["initializeParams"]["image"].endswith("/family/ubuntu-2404-lts-amd64")
        assert server.options["ignoreChanges"] == ["bootDisk.initializeParams.image", 'metadata["user-data"]']


def test_no_ssh_anywhere(gcp_k3s):
    metadata = [r.inputs["metadata"] for r in gcp_k3s.by_type(INSTANCE) + gcp_k3s.by_type(TEMPLATE)]
    for items in some(metadata, at_least=5):
        assert items["enable-oslogin"] == "TRUE"
        assert items["block-project-ssh-keys"] == "TRUE"
        assert items["serial-port-enable"] == "FALSE"
        assert "ssh-keys" not in items and "sshKeys" not in items
        assert "ssh_authorized_keys" not in items["user-data"]
    for rule in some(gcp_k3s.by_type(FIREWALL)):
        for allow in some(rule.inputs["allows"]):
            assert "22" not in allow["ports"]
        assert "0.0.0.0/0" not in rule.inputs.get("sourceRanges", [])


def test_firewall_is_exactly_the_k3s_ports_between_the_clusters_identities(gcp_k3s, gcp_k3s_config):
    rules = {
        r.name.removeprefix("ml-"): (
            r.inputs["allows"][0]["protocol"],
            tuple(r.inputs["allows"][0]["ports"]),
            tuple(r.inputs.get("sourceServiceAccounts", r.inputs.get("sourceRanges"))),
            tuple(r.inputs["targetServiceAccounts"]),
        )
        for r in gcp_k3s.by_type(FIREWALL)
    }
    servers, agents = (sa.removeprefix("serviceAccount:") for sa in (SERVERS_SA, AGENTS_SA))
    admins = tuple(gcp_k3s_config["gpu-k8s:cluster"]["apiAccessCidrs"])
    assert rules == {
        "api-admins": ("tcp", ("6443",), admins, (servers,)),
        "api-health-checks": (
            "tcp",
            ("6443",),
            # External passthrough probes, and internal passthrough ones (130.211.0.0/22) for registration.
            ("130.211.0.0/22", "209.85.152.0/22", "209.85.204.0/22", "35.191.0.0/16"),
            (servers,),
        ),
        "api-nodes": ("tcp", ("6443",), (servers, agents), (servers,)),
        "vxlan": ("udp", ("8472",), (servers, agents), (servers, agents)),
        "kubelet": ("tcp", ("10250",), (servers, agents), (servers, agents)),
        "etcd": ("tcp", ("2379-2380",), (servers,), (servers,)),
        # `monitoring`: Prometheus (on a server) reaches node-exporter on each node's own address.
        "node-exporter": ("tcp", ("9100",), (servers, agents), (servers, agents)),
    }
    for rule in gcp_k3s.by_type(FIREWALL):
        assert rule.inputs["direction"] == "INGRESS"


def test_one_server_opens_no_etcd_port_and_is_its_own_registration_address(gcp_k3s_config):
    config = copy.deepcopy(gcp_k3s_config)
    config["gpu-k8s:cluster"]["systemPool"]["nodes"] = 1
    rec = run_program("single", config)
    assert len(rec.by_type(INSTANCE)) == 1
    assert not [r for r in rec.by_type(FIREWALL) if r.name == "ml-etcd"]
    assert [r.name for r in rec.by_type(FORWARDING_RULE)] == ["ml-api"]
    server_address = rec.by_name("ml-server-0-address").outputs["address"]
    assert agent_server_url(rec) == f"https://{server_address}:6443"
    script = server_files(rec, 0)[paths.BOOTSTRAP_FILE]
    assert 'log "founding the cluster"' in script and "peers=(" not in script
    assert "snapshot_store.py founded" in script  # not again if the bucket shows it was


def server_files(rec: Recording, index: int) -> dict[str, str]:
    return user_data_files(rec.by_name(f"ml-server-{index}").inputs["metadata"]["user-data"])


def agent_server_url(rec: Recording) -> str:
    files = user_data_files(rec.by_name("ml-gpu-l4-template").inputs["metadata"]["user-data"])
    return yaml.safe_load(files[f"{paths.CONFIG_DIR}/config.yaml"])["server"]


def test_agents_register_through_an_internal_balancer_in_front_of_every_server(gcp_k3s):
    address = gcp_k3s.by_name("ml-registration-address")
    assert address.inputs["addressType"] == "INTERNAL"
    assert address.inputs["subnetwork"] == gcp_k3s.by_name("ml-network-nodes").id
    rule = gcp_k3s.by_name("ml-registration").inputs
    assert (rule["ipAddress"], rule["ports"], rule["loadBalancingScheme"]) == (
        address.outputs["address"],
        ["6443"],
        "INTERNAL",
    )
    assert rule["subnetwork"] == address.inputs["subnetwork"]
    backend = gcp_k3s.by_name("ml-registration-backend").inputs
    assert backend["loadBalancingScheme"] == "INTERNAL"
    # The same server groups as the API's balancer (GKE's controllers share instance groups between
    # internal and external balancers the same way).
    api_backend = gcp_k3s.by_name("ml-api-backend").inputs
    assert backend["backends"] == api_backend["backends"] and len(backend["backends"]) == 3
    assert agent_server_url(gcp_k3s) == f"https://{address.outputs['address']}:6443"


def test_each_server_asks_the_others_at_their_reserved_addresses_and_only_server_0_founds(gcp_k3s):
    addresses = [gcp_k3s.by_name(f"ml-server-{i}-address").outputs["address"] for i in range(3)]
    for index in range(3):
        script = server_files(gcp_k3s, index)[paths.BOOTSTRAP_FILE]
        (line,) = [line for line in script.splitlines() if line.startswith("peers=(")]
        others = [f"https://{a}:6443" for i, a in enumerate(addresses) if i != index]
        assert line == f"peers=({' '.join(others)})"
        assert ("founding the cluster" in script) == (index == 0)
        instance = gcp_k3s.by_name(f"ml-server-{index}").inputs
        assert instance["networkInterfaces"][0]["networkIp"] == addresses[index]


def test_static_address_is_in_tls_san_the_kubeconfig_and_the_load_balancer(gcp_k3s):
    assert gcp_k3s.by_name("ml-api-address").inputs["addressType"] == "EXTERNAL"
    rule = gcp_k3s.by_name("ml-api").inputs
    address = {"address": rule["ipAddress"]}
    assert ipaddress.IPv4Address(address["address"]).is_global
    for server in gcp_k3s.by_type(INSTANCE):
        config = yaml.safe_load(
            user_data_files(server.inputs["metadata"]["user-data"])[f"{paths.CONFIG_DIR}/config.yaml"]
        )
        registration = gcp_k3s.by_name("ml-registration-address").outputs["address"]
        assert config["tls-san"] == [address["address"], registration]
    kubeconfig = gcp_k3s.by_name("ml-k8s").inputs["kubeconfig"]
    assert isinstance(kubeconfig, Secret)
    assert (
        json.loads(kubeconfig.value)["clusters"][0]["cluster"]["server"]
        == f"https://{address['address']}:6443"
    )
    assert (rule["ipAddress"], rule["ports"], rule["loadBalancingScheme"]) == (
        address["address"],
        ["6443"],
        "EXTERNAL",
    )
    backend = gcp_k3s.by_name("ml-api-backend")
    assert gcp_k3s.by_name("ml-api-backend").urn in gcp_k3s.by_name("ml-api").dependencies
    assert gcp_k3s.by_name("ml-api-health").inputs["tcpHealthCheck"]["port"] == 6443
    groups = {b["group"] for b in backend.inputs["backends"]}
    members = {
        link
        for zone in ("us-central1-a", "us-central1-b", "us-central1-c")
        for link in gcp_k3s.by_name(f"ml-servers-{zone}").inputs["instances"]
    }
    assert len(groups) == 3
    assert len(members) == 3 and all("/instances/ml-server-" in link for link in members)


# --- secrets ---


def test_secrets_are_secret_read_only_by_their_own_identity_and_absent_from_metadata(gcp_k3s):
    readers = {
        r.name: (r.inputs["member"], r.inputs["role"], r.inputs["secretId"])
        for r in gcp_k3s.by_type("gcp:secretmanager/secretIamMember:SecretIamMember")
    }
    # The servers' secret is named for its cluster (tests/test_restore_material.py).
    server_secret = gcp_k3s.by_name("ml-servers-bootstrap").inputs["secretId"]
    assert readers == {
        "ml-servers-bootstrap-reader": (
            SERVERS_SA,
            "roles/secretmanager.secretAccessor",
            f"projects/gpu-k8s-demo/secrets/{server_secret}",
        ),
        "ml-agents-bootstrap-reader": (
            AGENTS_SA,
            "roles/secretmanager.secretAccessor",
            "projects/gpu-k8s-demo/secrets/ml-k3s-agents",
        ),
    }
    files = secret_payload(gcp_k3s, "servers")
    needles = [files[paths.TOKEN_FILE], files[paths.AGENT_TOKEN_FILE]]
    needles += [content for path, content in files.items() if path.endswith(".key")]
    assert secret_payload(gcp_k3s, "agents") == {paths.AGENT_TOKEN_FILE: files[paths.AGENT_TOKEN_FILE]}
    metadata = [r.inputs["metadata"] for r in gcp_k3s.by_type(INSTANCE) + gcp_k3s.by_type(TEMPLATE)]
    for items in metadata:
        text = json.dumps(items)
        for needle in needles:
            assert needle not in text
        assert "PRIVATE KEY" not in text and "K10" not in text
    for name in ("clusterName", "gpuPools", "gpuDriver"):
        assert "PRIVATE KEY" not in json.dumps(gcp_k3s.outputs[name])


def test_nodes_boot_only_after_their_secret_value_and_access_exist(gcp_k3s):
    for server in some(gcp_k3s.by_type(INSTANCE), at_least=3):
        assert gcp_k3s.by_name("ml-servers-bootstrap-value").urn in server.dependencies
        assert gcp_k3s.by_name("ml-servers-bootstrap-reader").urn in server.dependencies
    for group in some(gcp_k3s.by_type(TEMPLATE), at_least=2):
        assert gcp_k3s.by_name("ml-agents-bootstrap-value").urn in group.dependencies
        assert gcp_k3s.by_name("ml-agents-bootstrap-reader").urn in group.dependencies


def test_nodes_read_their_secret_by_name_and_facts_from_the_metadata_server(gcp_k3s):
    files = user_data_files(agent_user_data(gcp_k3s, "l4"))
    assert "projects/gpu-k8s-demo/secrets/ml-k3s-agents" in files[paths.BOOTSTRAP_FILE]
    facts = files[paths.NODE_FACTS_FILE]
    assert "NODE_NAME=$(metadata instance/name)" in facts
    assert 'PROVIDER_ID="gce://$(metadata project/project-id)/$ZONE/$NODE_NAME"' in facts
    assert "Metadata-Flavor: Google" in facts
    assert "provider-id=${PROVIDER_ID}" in node_drop_in(files[paths.BOOTSTRAP_FILE])["kubelet-arg"]


@pytest.fixture
def fetch_secret(monkeypatch) -> Any:
    """The fetcher as the node runs it: beside gce_api.py, which it imports by that name."""
    monkeypatch.syspath_prepend(str(GCE_FILES))
    for name in ("fetch_secret", "gce_api"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import fetch_secret

    return fetch_secret


def test_the_gce_fetcher_asks_the_metadata_server_then_secret_manager(monkeypatch, fetch_secret):
    calls = []
    payload = json.dumps({"files": {"/etc/rancher/k3s/agent-token": "K10x::node:y"}})

    def fake_urlopen(request, timeout):
        calls.append((request.full_url, dict(request.header_items())))
        if request.full_url.startswith("http://metadata.google.internal/"):
            return io.BytesIO(json.dumps({"access_token": "ya29.token", "expires_in": 3599}).encode())
        body = {"name": "x", "payload": {"data": base64.b64encode(payload.encode()).decode()}}
        return io.BytesIO(json.dumps(body).encode())

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    assert fetch_secret.secret_value("projects/p/secrets/ml-k3s-agents") == payload
    (token_url, token_headers), (access_url, access_headers) = calls
    assert (
        token_url
        == "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
    )
    assert token_headers == {"Metadata-flavor": "Google"}
    assert (
        access_url
        == "https://secretmanager.googleapis.com/v1/projects/p/secrets/ml-k3s-agents/versions/latest:access"
    )
    assert access_headers == {"Authorization": "Bearer ya29.token"}


# --- GPU groups and the autoscaler ---


def test_templates_take_machine_and_accelerators_from_the_catalog(gcp_k3s, gcp_k3s_config):
    catalog = load_catalog()
    for name, pool in pools_by_name(gcp_k3s_config).items():
        inputs = template(gcp_k3s, name)
        machine = catalog.machine_type("gcp", pool["instanceType"])
        assert machine is not None and machine.accelerator is not None
        assert inputs["machineType"] == machine.name
        assert inputs["guestAccelerators"] == [{"type": machine.accelerator, "count": machine.gpu_count}]
        assert inputs["scheduling"]["onHostMaintenance"] == "TERMINATE"
        spot = pool.get("spot", False)
        assert inputs["scheduling"]["provisioningModel"] == ("SPOT" if spot else "STANDARD")
        assert inputs["scheduling"]["automaticRestart"] is (not spot)
        # The family, not an image resolved at `up`: a new image would replace the template, which
        # Compute Engine refuses to delete while the group's running VMs use it.
        assert inputs["disks"][0]["sourceImage"].endswith("/family/ubuntu-2404-lts-amd64")
        assert inputs["shieldedInstanceConfig"]["enableSecureBoot"] is False
        assert "accessConfigs" not in inputs["networkInterfaces"][0]


def test_groups_are_zonal_from_zero_and_the_autoscaler_owns_their_size(gcp_k3s):
    zones = {}
    for group in gcp_k3s.by_type(GROUP_MANAGER):
        assert group.inputs["targetSize"] == 0
        assert group.options["ignoreChanges"] == ["targetSize"]
        assert gcp_k3s.by_name(group.name.replace("-group", "-template")).urn in group.dependencies
        zones[group.name] = group.inputs["zone"]
    assert zones == {"ml-gpu-l4-group": "us-central1-a", "ml-gpu-a100-group": "us-central1-c"}


def test_kube_env_parses_like_the_autoscaler_and_matches_the_pool(gcp_k3s):
    l4 = autoscaler_view(template(gcp_k3s, "l4")["metadata"]["kube-env"])
    assert l4["labels"] == {
        "cloud.google.com/gke-accelerator": "nvidia-l4",
        "gpu-k8s.io/pool": "l4",
        "nvidia.com/device-plugin.config": "l4",
    }
    assert l4["taints"] == {
        ("nvidia.com/gpu", "true", "NoSchedule"),
        ("gpu-k8s.io/sharing", "timeSlicing", "NoSchedule"),
    }
    # 1 L4 time-sliced 4 ways: the template offers 4, overriding the 1 GPU the accelerators say.
    assert l4["resources"] == {"nvidia.com/gpu": "4"}
    assert (l4["os"], l4["os_distribution"], l4["arch"]) == ("linux", "ubuntu", "amd64")
    a100 = autoscaler_view(template(gcp_k3s, "a100")["metadata"]["kube-env"])
    assert a100["labels"]["nvidia.com/mig.config"] == "all-1g.5gb"
    assert a100["resources"] == {"nvidia.com/gpu": "7"}


def test_kube_env_labels_and_taints_are_the_ones_the_agents_register_with(gcp_k3s):
    for pool in ("l4", "a100"):
        view = autoscaler_view(template(gcp_k3s, pool)["metadata"]["kube-env"])
        node = node_drop_in(user_data_files(agent_user_data(gcp_k3s, pool))[paths.BOOTSTRAP_FILE])
        # The node's own labels (the rest come from node facts, which the autoscaler derives itself).
        own_labels = dict(label.split("=", 1) for label in node["node-label"] if "${" not in label)
        assert own_labels == view["labels"]
        # k3s node-taint key=value:Effect is the autoscaler's key -> value:Effect: the same parser reads it.
        assert build_taints(parse_key_value_list(",".join(node["node-taint"]))) == view["taints"]


def test_a_pool_idle_for_longer_carries_its_own_scale_down_time(gcp_k3s_config):
    config = copy.deepcopy(gcp_k3s_config)
    config["gpu-k8s:cluster"]["gpuPools"][1]["scaleDownUnneededTime"] = "30m"
    config["gpu-k8s:cluster"]["gpuPools"][1]["taints"] = [{"key": "example.com/team", "effect": "NoExecute"}]
    rec = run_program("options", config)
    view = autoscaler_view(template(rec, "a100")["metadata"]["kube-env"])
    assert view["options"] == {"scaledownunneededtime": "30m0s"}
    assert ("example.com/team", "", "NoExecute") in view["taints"]
    assert autoscaler_view(template(rec, "l4")["metadata"]["kube-env"])["options"] == {}


def test_autoscaler_nodes_flags_name_exactly_the_groups(gcp_k3s, gcp_k3s_config):
    values = gcp_k3s.by_name("ml-autoscaler-release").inputs["values"]
    assert values["cloudProvider"] == "gce"
    groups = {(g.inputs["zone"], g.id.rsplit("/", 1)[1]): g for g in gcp_k3s.by_type(GROUP_MANAGER)}
    pools = pools_by_name(gcp_k3s_config)
    seen = set()
    for entry in values["autoscalingGroups"]:
        project, zone, name = MIG_URL.match(entry["name"]).groups()
        assert project == "gpu-k8s-demo"
        group = groups[(zone, name)]
        pool = pools[group.name.removeprefix("ml-gpu-").removesuffix("-group")]
        assert (entry["minSize"], entry["maxSize"]) == (pool.get("minNodes", 0), pool["maxNodes"])
        seen.add(group.name)
    assert seen == {g.name for g in gcp_k3s.by_type(GROUP_MANAGER)}
    assert (
        gcp_k3s.by_name("ml-autoscaler-resizes").urn in gcp_k3s.by_name("ml-autoscaler-release").dependencies
    )


def test_autoscaler_may_resize_instance_groups_and_read_what_it_plans_with(gcp_k3s):
    reader = gcp_k3s.by_name("ml-autoscaler-reader").inputs
    resizer = gcp_k3s.by_name("ml-autoscaler-resizer").inputs
    assert reader["permissions"] == list(AUTOSCALER_READ_PERMISSIONS)
    assert all(p.endswith((".get", ".list")) for p in reader["permissions"])
    assert resizer["permissions"] == list(AUTOSCALER_RESIZE_PERMISSIONS)
    binding = gcp_k3s.by_name("ml-autoscaler-resizes").inputs
    assert binding["member"] == SERVERS_SA and binding["role"].endswith("/roles/ml_autoscaler_resizer")
    # No condition on the groups' names: IAM does not evaluate resource.name for instance group managers,
    # so one would deny the resize instead of narrowing it (providers/gcp/k3s_access.py autoscaler_access).
    assert "condition" not in binding


def test_autoscaler_values_exist_in_the_pinned_chart(gcp_k3s):
    chart = upstream_yaml("cluster-autoscaler/9.59.0/values.yaml")
    values = gcp_k3s.by_name("ml-autoscaler-release").inputs["values"]
    assert unknown_values(values, chart) == []
    assert set(values["extraArgs"]) <= AUTOSCALER_FLAGS
    # The chart's deployment template reads exactly these keys of each group (`--nodes={{ .minSize }}:...`).
    assert all(set(group) == {"name", "minSize", "maxSize"} for group in values["autoscalingGroups"])


# --- spot ---


def test_spot_agents_hold_shutdown_for_the_preemption_notice(gcp_k3s):
    spot = user_data_files(agent_user_data(gcp_k3s, "l4"))
    drop_in = yaml.safe_load(spot[paths.KUBELET_CONFIG_DROP_IN])
    assert drop_in == {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "shutdownGracePeriod": "25s",
        "shutdownGracePeriodCriticalPods": "10s",
    }
    # Compute Engine stops a Spot VM 30 s after the notice: the hold ends before that, and workload pods keep
    # GKE's 15 s.
    grace, critical = (
        int(drop_in[key].removesuffix("s"))
        for key in ("shutdownGracePeriod", "shutdownGracePeriodCriticalPods")
    )
    assert grace < 30 and grace - critical == 15
    assert paths.KUBELET_CONFIG_DROP_IN.endswith(".conf"), "the kubelet reads only *.conf drop-ins"
    assert paths.KUBELET_CONFIG_DROP_IN not in user_data_files(agent_user_data(gcp_k3s, "a100"))


# --- storage ---


def test_pd_csi_objects_pass_strict_schema_validation():
    for minor in SUPPORTED_KUBERNETES_MINORS:
        for manifest in pd_csi.pd_csi_manifests({"gpu-k8s.io/pool": "system"}):
            kubernetes_validate.validate(manifest, f"{minor}.0", strict=True)


def test_pd_csi_controller_runs_on_the_tainted_servers(gcp_k3s):
    (controller,) = [
        r.inputs
        for r in gcp_k3s.by_type("kubernetes:apps/v1:Deployment")
        if r.inputs["metadata"]["name"] == "csi-gce-pd-controller"
    ]
    spec = controller["spec"]["template"]["spec"]
    assert spec["nodeSelector"]["gpu-k8s.io/pool"] == "system"
    assert {"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoExecute"} in spec["tolerations"]


def test_pd_csi_is_upstreams_deployment_without_a_key_and_with_a_working_image():
    manifests = pd_csi.pd_csi_manifests({"gpu-k8s.io/pool": "system"})
    names = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    root = "gcp-compute-persistent-disk-csi-driver/v1.26.4/deploy/kubernetes/base"
    upstream_objects = [
        doc
        for path in (
            "controller/cluster_setup.yaml",
            "controller/controller.yaml",
            "controller/v1_csidriver.yaml",
            "controller/rbac-taint-controller.yaml",
            "node_linux/node.yaml",
        )
        for doc in yaml.safe_load_all(upstream(f"{root}/{path}").read_text())
        if doc
    ]
    expected = {
        (o["kind"], o["metadata"]["name"])
        for o in upstream_objects
        if not o["metadata"]["name"].endswith("-win")
    }
    assert names == expected | {("Namespace", "gce-pd-csi-driver")}
    text = json.dumps(manifests)
    assert "GOOGLE_APPLICATION_CREDENTIALS" not in text and "cloud-sa" not in text
    images = {
        c["image"]
        for m in manifests
        if m["kind"] in ("Deployment", "DaemonSet")
        for c in m["spec"]["template"]["spec"]["containers"]
    }
    assert all(":" in image for image in images)
    assert "registry.k8s.io/cloud-provider-gcp/gcp-compute-persistent-disk-csi-driver:v1.26.0" in images
    controller = next(m for m in manifests if m["kind"] == "Deployment")
    pod = controller["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux", "gpu-k8s.io/pool": "system"}
    attacher = pod["containers"][1]
    assert attacher["name"] == "csi-attacher"
    assert attacher["args"][-2:] == ["--max-grpc-log-length=10000", "--default-fstype=ext4"]
    assert all(
        m["metadata"].get("namespace") == "gce-pd-csi-driver"
        for m in manifests
        if m["kind"] in ("Deployment", "DaemonSet", "ServiceAccount", "Role", "RoleBinding")
    )
    for m in manifests:
        for subject in m.get("subjects", []):
            assert subject["namespace"] == "gce-pd-csi-driver"


def test_pd_csi_runs_as_the_servers_with_upstreams_roles_and_acts_only_as_node_accounts(gcp_k3s):
    role = gcp_k3s.by_name("ml-pd-csi-role").inputs
    custom = upstream_yaml(
        "gcp-compute-persistent-disk-csi-driver/v1.26.4/deploy/gcp-compute-persistent-disk-csi-driver-custom-role.yaml"
    )
    assert role["permissions"] == custom["includedPermissions"]
    project_roles = {
        r.inputs["role"]
        for r in gcp_k3s.by_type("gcp:projects/iAMMember:IAMMember")
        if r.inputs["member"] == SERVERS_SA
    }
    assert "roles/iam.serviceAccountUser" not in project_roles
    assert {"roles/compute.storageAdmin", role_name(gcp_k3s, "ml-pd-csi-role")} <= project_roles
    acts_as = {
        (r.inputs["serviceAccountId"], r.inputs["role"], r.inputs["member"])
        for r in gcp_k3s.by_type("gcp:serviceaccount/iAMMember:IAMMember")
    }
    assert acts_as == {
        (
            f"projects/gpu-k8s-demo/serviceAccounts/{sa.removeprefix('serviceAccount:')}",
            "roles/iam.serviceAccountUser",
            SERVERS_SA,
        )
        for sa in (SERVERS_SA, AGENTS_SA)
    }
    agent_roles = {
        r.inputs["role"]
        for r in gcp_k3s.by_type("gcp:projects/iAMMember:IAMMember")
        if r.inputs["member"] == AGENTS_SA
    }
    assert agent_roles == set(), "agents need no project role"


def role_name(rec: Recording, resource: str) -> str:
    return f"projects/gpu-k8s-demo/roles/{rec.by_name(resource).inputs['roleId']}"


def test_default_storage_class_is_balanced_pd_after_the_driver(gcp_k3s):
    storage_class = gcp_k3s.by_name("ml-storage-class")
    assert storage_class.inputs["provisioner"] == "pd.csi.storage.gke.io"
    assert storage_class.inputs["parameters"] == {"type": "pd-balanced"}
    assert storage_class.inputs["volumeBindingMode"] == "WaitForFirstConsumer"
    for driver_part in (
        "ml-pd-csi-csidriver-pd.csi.storage.gke.io",
        "ml-pd-csi-deployment-csi-gce-pd-controller",
    ):
        assert gcp_k3s.by_name(driver_part).urn in storage_class.dependencies


def test_gpu_operator_installs_the_driver_and_uses_the_k3s_containerd(gcp_k3s):
    values = gcp_k3s.by_name("ml-gpu-operator-release").inputs["values"]
    assert values["driver"]["enabled"] is True
    env = {e["name"]: e["value"] for e in values["toolkit"]["env"]}
    assert env["CONTAINERD_SOCKET"] == "/run/k3s/containerd/containerd.sock"


# --- bad input ---

BAD_GCP_K3S_INPUTS = [
    (
        "labels-beyond-the-instance-metadata-limit",
        set_path("gpuPools.0.labels", {f"{'t' * 200}.example.com/l{i}": "v" * 63 for i in range(1000)}),
        "gpuPools[0].labels",
        ("VMs' metadata", "less than 524,288", "drop or shorten labels"),
    ),
    (
        "vm-name-prefix-too-long",
        lambda cluster: (set_path("name", "c" * 32)(cluster), set_path("gpuPools.0.name", "p" * 30)(cluster)),
        "gpuPools[0].name",
        ("characters long; Compute Engine takes at most 58", "shorten the pool name"),
    ),
    (
        "pool-in-two-zones",
        set_path("gpuPools.0.zones", ["us-central1-a", "us-central1-b"]),
        "gpuPools[0].zones",
        ("one zonal managed instance group", "one pool per zone"),
    ),
    (
        "gke-network-keys",
        set_path("network.podsCidr", "10.64.0.0/14"),
        "network.podsCidr",
        ("k3s gives pods and services addresses itself",),
    ),
    (
        "vpc-overlaps-service-range",
        set_path("network.cidr", "10.43.0.0/20"),
        "network.cidr",
        ("overlaps k3s's service range 10.43.0.0/16",),
    ),
    (
        "zone-outside-the-region",
        set_path("gpuPools.1.zones", ["europe-west4-a"]),
        "gpuPools[1].zones[0]",
        ("not in gcp:region us-central1",),
    ),
    (
        "gpu-machine-as-server",
        set_path("systemPool.instanceType", "g2-standard-8"),
        "systemPool.instanceType",
        ("not a CPU machine type",),
    ),
    (
        "existing-subnet-without-network",
        lambda c: c.update({"network": {"subnetworkName": "gpu", "zones": ["us-central1-a"]}}),
        "network.networkName",
        ("is missing",),
    ),
    ("two-servers", set_path("systemPool.nodes", 2), "systemPool.nodes", ("1 or 3",)),
    (
        "zones-missing",
        delete_key("network.zones"),
        "network.zones",
        ("GCP clusters need the zones",),
    ),
]


@pytest.mark.parametrize(
    ("mutation", "path", "words"),
    [c[1:] for c in BAD_GCP_K3S_INPUTS],
    ids=[c[0] for c in BAD_GCP_K3S_INPUTS],
)
def test_bad_gcp_k3s_input_is_refused_before_any_resource(gcp_k3s_config, mutation, path, words):
    assert_refused_before_any_resource(gcp_k3s_config, mutation, path, words)


def test_missing_project_is_refused(gcp_k3s_config):
    config = {key: value for key, value in gcp_k3s_config.items() if key != "gcp:project"}
    assert_refused_before_any_resource(config, lambda cluster: None, "gcp:project", ("is not set",))


def test_an_existing_subnet_needs_only_its_names(gcp_k3s_config):
    config = copy.deepcopy(gcp_k3s_config)
    config["gpu-k8s:cluster"]["network"] = {
        "networkName": "shared",
        "subnetworkName": "gpu",
        "zones": ["us-central1-a", "us-central1-c"],
    }
    rec = run_program("existing", config)
    assert not rec.by_type("gcp:compute/network:Network")
    assert {r.inputs["network"] for r in rec.by_type(FIREWALL)} == {"shared"}


# --- Compute Engine enums, against Google's discovery document of the Compute API ---

COMPUTE_API = "compute-api/v1-rev20261106/compute.v1.json"
# (resource type, path in the recorded inputs; "*" = every list item) -> (API schema, API property)
GCE_ENUM_FIELDS = {
    (TEMPLATE, ("scheduling", "onHostMaintenance")): ("Scheduling", "onHostMaintenance"),
    (TEMPLATE, ("scheduling", "provisioningModel")): ("Scheduling", "provisioningModel"),
    (TEMPLATE, ("scheduling", "instanceTerminationAction")): ("Scheduling", "instanceTerminationAction"),
    ("gcp:compute/address:Address", ("addressType",)): ("Address", "addressType"),
    (FIREWALL, ("direction",)): ("Firewall", "direction"),
    ("gcp:compute/forwardingRule:ForwardingRule", ("loadBalancingScheme",)): (
        "ForwardingRule",
        "loadBalancingScheme",
    ),
    ("gcp:compute/forwardingRule:ForwardingRule", ("ipProtocol",)): ("ForwardingRule", "IPProtocol"),
    ("gcp:compute/regionBackendService:RegionBackendService", ("loadBalancingScheme",)): (
        "BackendService",
        "loadBalancingScheme",
    ),
    ("gcp:compute/regionBackendService:RegionBackendService", ("protocol",)): ("BackendService", "protocol"),
    ("gcp:compute/regionBackendService:RegionBackendService", ("backends", "*", "balancingMode")): (
        "Backend",
        "balancingMode",
    ),
    (GROUP_MANAGER, ("updatePolicy", "type")): ("InstanceGroupManagerUpdatePolicy", "type"),
    (GROUP_MANAGER, ("updatePolicy", "minimalAction")): ("InstanceGroupManagerUpdatePolicy", "minimalAction"),
}


def _values_at(value: Any, path: tuple[str, ...]) -> list[Any]:
    if not path:
        return [value]
    if path[0] == "*":
        return [v for item in value for v in _values_at(item, path[1:])]
    return _values_at(value[path[0]], path[1:]) if isinstance(value, dict) and path[0] in value else []


def gce_enum_problems(rec: Recording, schemas: dict[str, Any]) -> list[str]:
    """Every enum-valued field we send that the Compute API would reject, and every table row that checks
    nothing (a renamed provider field would otherwise go unchecked silently)."""
    problems = []
    for (type_, path), (schema, prop) in GCE_ENUM_FIELDS.items():
        allowed = schemas[schema]["properties"][prop]["enum"]
        values = [v for r in rec.by_type(type_) for v in _values_at(r.inputs, path) if v is not None]
        if not values:
            problems.append(f"{type_} {'.'.join(path)}: no value recorded")
        problems += [
            f"{type_} {'.'.join(path)}={v!r} not in {schema}.{prop}" for v in values if v not in allowed
        ]
    return problems


@pytest.fixture(scope="module")
def compute_schemas() -> dict[str, Any]:
    return json.loads(upstream(COMPUTE_API).read_text())["schemas"]


def test_gce_enum_values_are_the_compute_apis(gcp_k3s, compute_schemas):
    assert gce_enum_problems(gcp_k3s, compute_schemas) == []


def test_the_gce_enum_check_catches_a_wrong_value_and_an_unchecked_field(gcp_k3s, compute_schemas):
    broken = copy.deepcopy(gcp_k3s)
    group = next(r for r in broken.by_type(GROUP_MANAGER))
    group.inputs["updatePolicy"]["type"] = "ROLLING"
    template_inputs = broken.by_name("ml-gpu-l4-template").inputs
    template_inputs["scheduling"]["onHostMaintenance"] = "terminate"
    problems = gce_enum_problems(broken, compute_schemas)
    assert any("updatePolicy.type='ROLLING'" in p for p in problems)
    assert any("onHostMaintenance='terminate'" in p for p in problems)
    for rule in broken.by_type(FIREWALL):
        rule.inputs.pop("direction")
    assert any("direction: no value recorded" in p for p in gce_enum_problems(broken, compute_schemas))


# --- etcd snapshots ---


def test_servers_ship_etcd_snapshots_to_the_clusters_bucket_with_their_own_hmac_key(gcp_k3s):
    (bucket,) = gcp_k3s.by_type("gcp:storage/bucket:Bucket")
    (key,) = gcp_k3s.by_type("gcp:storage/hmacKey:HmacKey")
    assert key.inputs["serviceAccountEmail"] == SERVERS_SA.removeprefix("serviceAccount:")
    for index in range(3):
        files = server_files(gcp_k3s, index)
        config = yaml.safe_load(files[f"{paths.CONFIG_DIR}/config.yaml"])
        assert (config["etcd-s3"], config["etcd-s3-endpoint"], config["etcd-s3-bucket"]) == (
            True,
            "storage.googleapis.com",
            bucket.outputs["name"],
        )
        assert config["etcd-s3-folder"] == "ml" and config["etcd-snapshot-retention"] == 28
        assert "etcd-s3-secret-key" not in json.dumps(files)
    # The key reaches only the servers, through their secret, as a k3s config drop-in.
    credentials = yaml.safe_load(secret_payload(gcp_k3s, "servers")[paths.ETCD_S3_CREDENTIALS_FILE])
    assert credentials == {
        "etcd-s3-access-key": key.outputs["accessId"],
        "etcd-s3-secret-key": key.outputs["secret"],
    }
    assert paths.ETCD_S3_CREDENTIALS_FILE not in secret_payload(gcp_k3s, "agents")


def test_the_snapshot_bucket_and_its_key_wait_for_the_cloud_storage_api(gcp_k3s):
    """A project where Cloud Storage is off gets it enabled first (a component's depends_on would not reach
    the bucket: each resource carries the dependency itself)."""
    (api,) = [
        s
        for s in gcp_k3s.by_type("gcp:projects/service:Service")
        if s.inputs["service"] == "storage.googleapis.com"
    ]
    for kind in ("gcp:storage/bucket:Bucket", "gcp:storage/hmacKey:HmacKey"):
        (resource,) = gcp_k3s.by_type(kind)
        assert api.urn in resource.dependencies, kind


def test_the_snapshot_bucket_is_private_versioned_and_only_the_servers_may_use_it(gcp_k3s):
    (bucket,) = gcp_k3s.by_type("gcp:storage/bucket:Bucket")
    assert bucket.options["retainOnDelete"] is True
    inputs = bucket.inputs
    assert (inputs["location"], inputs["uniformBucketLevelAccess"], inputs["publicAccessPrevention"]) == (
        "us-central1",
        True,
        "enforced",
    )
    assert inputs["versioning"] == {"enabled": True}
    (rule,) = inputs["lifecycleRules"]
    assert rule["action"] == {"type": "Delete"} and rule["condition"]["daysSinceNoncurrentTime"] == 30
    (member,) = gcp_k3s.by_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    assert (member.inputs["bucket"], member.inputs["member"]) == (bucket.outputs["name"], SERVERS_SA)
    role = next(
        r
        for r in gcp_k3s.by_type("gcp:projects/iAMCustomRole:IAMCustomRole")
        if r.name.endswith("snapshots-role")
    )
    assert member.inputs["role"] == role.outputs["name"]
    assert sorted(role.inputs["permissions"]) == [
        "storage.buckets.get",
        "storage.objects.create",
        "storage.objects.delete",
        "storage.objects.get",
        "storage.objects.list",
    ]
    # Project-wide, the servers hold no storage role for it.
    assert not [
        r
        for r in gcp_k3s.by_type("gcp:projects/iAMMember:IAMMember")
        if "storage." in r.inputs["role"] or r.inputs["role"] == role.outputs["name"]
    ]
    for index in range(3):
        dependencies = set(gcp_k3s.by_name(f"ml-server-{index}").dependencies)
        assert member.urn in dependencies


# --- the Compute Engine cloud controller manager ---


def test_every_node_defers_to_the_gce_cloud_controller_which_reads_the_cloud_config_of_the_servers(gcp_k3s):
    network = gcp_k3s.by_name("ml-network-vpc").outputs["name"]
    subnetwork = gcp_k3s.by_name("ml-network-nodes").outputs["name"]
    for index in range(3):
        files = server_files(gcp_k3s, index)
        assert "cloud-provider=external" in node_drop_in(files[paths.BOOTSTRAP_FILE])["kubelet-arg"]
        assert yaml.safe_load(files[f"{paths.CONFIG_DIR}/config.yaml"])["disable-cloud-controller"] is True
        assert files["/etc/kubernetes/cloud.config"] == (
            "[global]\n"
            "project-id = gpu-k8s-demo\n"
            f"network-name = {network}\n"
            f"subnetwork-name = {subnetwork}\n"
            "node-tags = ml\n"
            "multizone = true\n"
        )
    for pool in ("l4", "a100"):
        agent = user_data_files(agent_user_data(gcp_k3s, pool))
        assert "cloud-provider=external" in node_drop_in(agent[paths.BOOTSTRAP_FILE])["kubelet-arg"]
        assert "/etc/kubernetes/cloud.config" not in agent


@pytest.mark.parametrize("minor", SUPPORTED_KUBERNETES_MINORS)
def test_the_gce_cloud_controller_objects_pass_strict_schema_validation(minor):
    for manifest in cloud_controller.cloud_controller_manifests(minor, "ml", []):
        kubernetes_validate.validate(manifest, f"{minor}.0", strict=True)


def test_the_gce_cloud_controller_runs_the_node_controllers_on_the_servers_against_k3s(gcp_k3s):
    (daemonset,) = [
        r
        for r in gcp_k3s.by_type("kubernetes:apps/v1:DaemonSet")
        if r.name.startswith("ml-cloud-controller-")
    ]
    pod = daemonset.inputs["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # No 1.36 build is promoted: the 1.35 build, by digest (one minor older is within the skew policy).
    assert container["image"] == (
        "registry.k8s.io/cloud-provider-gcp/cloud-controller-manager:v35.0.2"
        "@sha256:f1cfeca80d58695683ddaeebb41215bf7239cb49534c5eb2b6e6205929822389"
    )
    assert {
        "--cloud-provider=gce",
        "--cloud-config=/etc/kubernetes/cloud.config",
        "--controllers=cloud-node-controller,cloud-node-lifecycle-controller,service-lb-controller",
        # The node controllers act as "node-controller", whose bootstrap role may delete Nodes; the service
        # controller as "service-controller", whose bootstrap role may update a Service's status.
        "--use-service-account-credentials",
    } <= set(container["args"])
    # k3s serves the API on 6443; upstream points the CCM at 127.0.0.1 and keeps the Service's port.
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert pod["hostNetwork"] is True
    assert {"key": "CriticalAddonsOnly", "operator": "Exists", "effect": "NoExecute"} in pod["tolerations"]
    assert {
        "key": "node.cloudprovider.kubernetes.io/uninitialized",
        "value": "true",
        "effect": "NoSchedule",
    } in (pod["tolerations"])
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"} in terms[0][
        "matchExpressions"
    ]


def test_service_load_balancers_open_the_nodes_by_their_tag(gcp_k3s):
    """The service controller's firewall rules target `node-tags`: every server and every agent template
    carries that tag, and it begins every instance's name (the controller's fallback for servers whose cloud
    config predates `node-tags`)."""
    servers = [gcp_k3s.by_name(f"ml-server-{index}") for index in range(3)]
    templates = gcp_k3s.by_type("gcp:compute/instanceTemplate:InstanceTemplate")
    groups = gcp_k3s.by_type("gcp:compute/instanceGroupManager:InstanceGroupManager")
    assert len(templates) == len(groups) == 2
    for node in (*servers, *templates):
        assert node.inputs["tags"] == ["ml"], node.name
    assert "node-tags = ml\n" in server_files(gcp_k3s, 0)["/etc/kubernetes/cloud.config"]
    # Servers are auto-named after their resource name; agents after the group's base name.
    names = [s.name for s in servers] + [g.inputs["baseInstanceName"] for g in groups]
    assert all(name.startswith("ml-") for name in names)


def test_the_service_controller_may_make_load_balancers_and_keep_the_cluster_id(gcp_k3s):
    role = gcp_k3s.by_name("ml-load-balancer-role")
    assert role.inputs["permissions"] == list(cloud_controller.SERVICE_CONTROLLER_PERMISSIONS)
    grant = gcp_k3s.by_name("ml-load-balancer-writes")
    assert grant.inputs["member"] == SERVERS_SA and role.urn in grant.dependencies
    (daemonset,) = [
        r
        for r in gcp_k3s.by_type("kubernetes:apps/v1:DaemonSet")
        if r.name.startswith("ml-cloud-controller-")
    ]
    assert grant.urn in daemonset.dependencies
    # No predefined compute role beyond the disks PD CSI needs, for anyone (security.md S3).
    project_roles = {r.inputs["role"] for r in gcp_k3s.by_type("gcp:projects/iAMMember:IAMMember")}
    assert {r for r in project_roles if r.startswith("roles/compute.")} == {"roles/compute.storageAdmin"}
    objects = {
        (r.inputs["kind"], r.inputs["metadata"]["name"]): r.inputs
        for r in gcp_k3s.registrations
        if r.name.startswith("ml-cloud-controller-") and r.custom and "kind" in r.inputs
    }
    name = "gpu-k8s:gce-cloud-provider-cluster-id"
    role, binding = objects[("Role", name)], objects[("RoleBinding", name)]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "kube-system"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "list", "watch"]}
    ]
    assert binding["roleRef"]["name"] == name
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "cloud-provider", "namespace": "kube-system"}
    ]


def test_the_gce_cloud_controller_goes_first_and_reads_through_a_read_only_role(gcp_k3s):
    ccm = [r for r in gcp_k3s.registrations if r.name.startswith("ml-cloud-controller-") and r.custom]
    daemonset = next(r for r in ccm if r.type == "kubernetes:apps/v1:DaemonSet")

    def waits_for(resource: Registration, urn: str) -> bool:
        seen, todo = set(), list(resource.dependencies)
        while todo:
            current = todo.pop()
            if current == urn:
                return True
            if current not in seen:
                seen.add(current)
                todo.extend(gcp_k3s.by_urn(current).dependencies)
        return False

    others = [
        r
        for r in gcp_k3s.registrations
        # The admin binding schedules nothing, and waits for the API alone (tests/test_admin_access.py).
        if r.custom and r.type.startswith("kubernetes:") and r not in ccm and r.name != "ml-admin-access"
    ]
    assert len(others) >= 5
    assert [r.name for r in others if not waits_for(r, daemonset.urn)] == []
    role = gcp_k3s.by_name("ml-cloud-controller-role").inputs
    assert role["permissions"] == list(cloud_controller.PERMISSIONS)
    assert all(p.endswith((".get", ".list")) for p in role["permissions"])
    grant = gcp_k3s.by_name("ml-cloud-controller-reads")
    assert grant.inputs["member"] == SERVERS_SA and "condition" not in grant.inputs
    assert grant.urn in daemonset.dependencies


def test_every_custom_role_waits_for_the_iam_api(gcp_k3s):
    """A new project gets the IAM API enabled before a role is created in it (roles.create is the IAM API's);
    the parent component's dependencies would not reach the roles."""
    (iam_api,) = [
        s
        for s in gcp_k3s.by_type("gcp:projects/service:Service")
        if s.inputs["service"] == "iam.googleapis.com"
    ]
    roles = gcp_k3s.by_type("gcp:projects/iAMCustomRole:IAMCustomRole")
    assert {r.name for r in some(roles, at_least=6)} >= {"ml-load-balancer-role", "ml-etcd-snapshots-role"}
    assert [r.name for r in roles if iam_api.urn not in r.dependencies] == []
