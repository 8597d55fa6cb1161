"""The cloud-agnostic k3s core: tokens, secret payloads, and the rendered cloud-config checked against
cloud-init's schema, shellcheck and golden files."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpu_k8s.components.k3s import cloudinit, paths, pki
from gpu_k8s.components.k3s.cloudinit import AgentNode, NodeBootstrap, ServerNode, SnapshotStore
from gpu_k8s.components.k3s.files import write_secret_files
from gpu_k8s.providers.aws.k3s_bootstrap import EC2_USER_DATA_LIMIT, aws_node_bootstrap, ec2_user_data
from gpu_k8s.providers.gcp.k3s_agents import SPOT_GRACEFUL_SHUTDOWN
from gpu_k8s.providers.gcp.k3s_bootstrap import gce_node_bootstrap
from gpu_k8s.tools import fake_tls
from tests.conftest import ec2_cloud_config, node_drop_in, upstream, user_data_files, venv_tool

GOLDEN = Path(__file__).parent / "golden"
CLOUD_INIT_SCHEMA = "cloud-init/26.2/schema-cloud-config-v1.json"
# EC2 user data limit, before base64 (EC2 user guide; REFERENCE.md 13).

SERVER = ServerNode(
    k3s_version="v1.36.3+k3s1",
    tls_sans=["ml-api-0123456789abcdef.elb.us-east-1.amazonaws.com"],
    secret_name="arn:aws:secretsmanager:us-east-1:123456789012:secret:ml-servers-bootstrap-abc123",
    peer_urls=["https://10.40.4.21:6443", "https://10.40.5.9:6443"],
    founder=True,
    snapshots=SnapshotStore(
        endpoint="s3.us-east-1.amazonaws.com",
        region="us-east-1",
        bucket="ml-etcd-20261201095959000000000001",
        folder="ml",
    ),
    labels={"gpu-k8s.io/pool": "system"},
    exempt_namespaces=["gpu-operator"],
)
JOINING_SERVER = ServerNode(
    **{
        **SERVER.__dict__,
        "peer_urls": ["https://10.40.3.17:6443", "https://10.40.5.9:6443"],
        "founder": False,
    }
)
SINGLE_SERVER = ServerNode(**{**SERVER.__dict__, "peer_urls": []})
AGENT = AgentNode(
    k3s_version="v1.36.3+k3s1",
    server_url="https://10.40.3.17:6443",
    secret_name="arn:aws:secretsmanager:us-east-1:123456789012:secret:ml-agents-bootstrap-def456",
    labels={
        "gpu-k8s.io/pool": "l4",
        "nvidia.com/device-plugin.config": "l4",
        "k8s.amazonaws.com/accelerator": "nvidia-l4",
    },
    taints=["nvidia.com/gpu=true:NoSchedule"],
)
GCE_SERVER = ServerNode(
    **{
        **SERVER.__dict__,
        "tls_sans": ["34.118.7.21"],
        "secret_name": "projects/demo/secrets/ml-k3s-servers",
        "snapshots": SnapshotStore(
            endpoint="storage.googleapis.com",
            region="us-central1",
            bucket="ml-etcd-snapshots-3f2a1bc",
            folder="ml",
        ),
    }
)
GCE_SPOT_AGENT = AgentNode(
    **{
        **AGENT.__dict__,
        "secret_name": "projects/demo/secrets/ml-k3s-agents",
        "labels": {
            "gpu-k8s.io/pool": "l4",
            "nvidia.com/device-plugin.config": "l4",
            "cloud.google.com/gke-accelerator": "nvidia-l4",
        },
        "kubelet_config": SPOT_GRACEFUL_SHUTDOWN,
    }
)
RENDERED = {
    "aws-server.yaml": lambda: cloudinit.server_cloud_config(SERVER, aws_node_bootstrap()),
    "aws-joining-server.yaml": lambda: cloudinit.server_cloud_config(JOINING_SERVER, aws_node_bootstrap()),
    "aws-single-server.yaml": lambda: cloudinit.server_cloud_config(SINGLE_SERVER, aws_node_bootstrap()),
    "aws-agent.yaml": lambda: cloudinit.agent_cloud_config(AGENT, aws_node_bootstrap()),
    "gce-server.yaml": lambda: cloudinit.server_cloud_config(GCE_SERVER, gce_node_bootstrap()),
    "gce-spot-agent.yaml": lambda: cloudinit.agent_cloud_config(GCE_SPOT_AGENT, gce_node_bootstrap()),
}


@pytest.fixture(scope="module")
def cloud_config_validator():
    schema = json.loads(upstream(CLOUD_INIT_SCHEMA).read_text())
    return jsonschema.validators.validator_for(schema)(schema)


@pytest.mark.parametrize("golden", sorted(RENDERED))
def test_rendered_user_data_matches_its_golden_file(golden):
    """Golden files show reviewers the exact first-boot setup (GPU_K8S_UPDATE_GOLDEN=1 rewrites them)."""
    rendered = RENDERED[golden]()
    path = GOLDEN / golden
    if os.environ.get("GPU_K8S_UPDATE_GOLDEN") == "1":
        path.write_text(rendered)
    assert rendered == path.read_text(), (
        f"{path} is out of date; rerun with GPU_K8S_UPDATE_GOLDEN=1 and review"
    )


@pytest.mark.parametrize("golden", sorted(RENDERED))
def test_user_data_is_valid_cloud_config_within_the_ec2_limit(golden, cloud_config_validator):
    rendered = RENDERED[golden]()
    assert rendered.startswith("#cloud-config\n")
    errors = [error.message for error in cloud_config_validator.iter_errors(yaml.safe_load(rendered))]
    assert errors == []
    # EC2 gets it gzipped (providers/aws/k3s_bootstrap.ec2_user_data); half the limit leaves room to grow.
    assert len(gzip.compress(rendered.encode())) < EC2_USER_DATA_LIMIT / 2


def test_ec2_user_data_is_the_gzipped_config_and_too_much_is_refused():
    config = RENDERED["aws-server.yaml"]()
    assert gzip.decompress(base64.b64decode(ec2_user_data(config))).decode() == config
    assert ec2_user_data(config) == ec2_user_data(config)  # no timestamp: no diff without a change
    incompressible = base64.b64encode(random.Random(0).randbytes(EC2_USER_DATA_LIMIT)).decode()
    with pytest.raises(ValueError, match="EC2 takes at most 16384"):
        ec2_user_data(f"#cloud-config\n# {incompressible}\n")


def test_the_schema_check_catches_a_misspelt_key(cloud_config_validator):
    broken = yaml.safe_load(RENDERED["aws-agent.yaml"]())
    broken["write_files"][0]["permisions"] = broken["write_files"][0].pop("permissions")
    assert list(cloud_config_validator.iter_errors(broken))


@pytest.mark.parametrize("golden", sorted(RENDERED))
def test_every_shell_script_passes_shellcheck(golden, tmp_path: Path):
    files = user_data_files(RENDERED[golden]())
    scripts = [path for path in files if path.endswith(".sh")]
    assert {paths.BOOTSTRAP_FILE, paths.NODE_FACTS_FILE} <= set(scripts)
    for path in scripts:
        script = tmp_path / Path(path).name
        script.write_text(files[path])
        result = subprocess.run(
            [venv_tool("shellcheck"), "--shell=bash", "--severity=style", str(script)],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stdout


def test_shellcheck_still_catches_an_unquoted_expansion(tmp_path: Path):
    script = tmp_path / "bad.sh"
    script.write_text("#!/bin/bash\nfile=$1\nrm $file\n")
    result = subprocess.run([venv_tool("shellcheck"), str(script)], capture_output=True, text=True)
    assert "SC2086" in result.stdout


def test_agents_set_their_provider_id_real_instance_type_zone_labels_and_taints():
    script = user_data_files(RENDERED["aws-agent.yaml"]())[paths.BOOTSTRAP_FILE]
    config = node_drop_in(script)
    assert "provider-id=${PROVIDER_ID}" in config["kubelet-arg"]
    assert {
        "node.kubernetes.io/instance-type=${INSTANCE_TYPE}",
        "topology.kubernetes.io/zone=${ZONE}",
        "topology.kubernetes.io/region=${REGION}",
        "gpu-k8s.io/pool=l4",
        "nvidia.com/device-plugin.config=l4",
        "k8s.amazonaws.com/accelerator=nvidia-l4",
    } <= set(config["node-label"])
    assert config["node-taint"] == ["nvidia.com/gpu=true:NoSchedule"]
    # The facts come from instance metadata, in the format the cluster-autoscaler parses.
    facts = user_data_files(RENDERED["aws-agent.yaml"]())[paths.NODE_FACTS_FILE]
    assert "NODE_NAME=$(imds instance-id)" in facts and 'PROVIDER_ID="aws:///$ZONE/$NODE_NAME"' in facts
    assert config["node-name"] == "${NODE_NAME}"
    assert "X-aws-ec2-metadata-token" in facts


def test_agents_wait_for_the_server_boundedly_before_installing():
    script = user_data_files(RENDERED["aws-agent.yaml"]())[paths.BOOTSTRAP_FILE]
    wait, install = script.index("/cacerts"), script.index("INSTALL_K3S_EXEC=agent")
    assert wait < install
    assert script.index("retry() {") < script.index('retry "waiting for server')
    assert "limit=${3:-600}" in script and 'log "$1: giving up"\n    exit 1' in script
    assert "\nwait_limit=480\n" in script
    assert 'retry "waiting for server $server" server_answers "$wait_limit"' in script


def test_server_config_is_hardened_and_reads_tokens_from_files():
    config = yaml.safe_load(user_data_files(RENDERED["aws-server.yaml"]())[f"{paths.CONFIG_DIR}/config.yaml"])
    assert config["token-file"] == paths.TOKEN_FILE
    assert config["agent-token-file"] == paths.AGENT_TOKEN_FILE
    assert config["tls-san"] == list(SERVER.tls_sans)
    assert config["secrets-encryption"] is True and config["protect-kernel-defaults"] is True
    # The admin kubeconfig k3s writes on the server holds a cluster-admin key: root only.
    assert config["write-kubeconfig-mode"] == "0600"
    # Founding or joining is decided at boot (tests/test_first_boot.py runs both).
    assert "cluster-init" not in config and "server" not in config
    assert "local-storage" in config["disable"]
    apiserver = config["kube-apiserver-arg"]
    assert f"audit-policy-file={paths.AUDIT_POLICY_FILE}" in apiserver
    assert f"admission-control-config-file={paths.ADMISSION_CONFIG_FILE}" in apiserver


@pytest.mark.parametrize("golden", ["aws-server.yaml", "aws-joining-server.yaml", "gce-server.yaml"])
def test_every_server_names_itself_from_its_own_facts_with_the_system_labels(golden):
    """A joining server's node settings are its own (name, provider ID, zone, system pool label), never a
    copy of another's: the cloud controller and the policy recognise servers by them."""
    config = node_drop_in(user_data_files(RENDERED[golden]())[paths.BOOTSTRAP_FILE])
    assert config["node-name"] == "${NODE_NAME}"
    assert "provider-id=${PROVIDER_ID}" in config["kubelet-arg"]
    assert {
        "topology.kubernetes.io/zone=${ZONE}",
        "node.kubernetes.io/instance-type=${INSTANCE_TYPE}",
        "gpu-k8s.io/pool=system",
    } <= set(config["node-label"])
    # The servers' taint is in every server's config.yaml, not in the per-node settings.
    assert "node-taint" not in config
    server_config = yaml.safe_load(user_data_files(RENDERED[golden]())[f"{paths.CONFIG_DIR}/config.yaml"])
    assert server_config["node-taint"] == ["CriticalAddonsOnly=true:NoExecute"]


def test_kernel_settings_are_applied_before_k3s_starts():
    files = user_data_files(RENDERED["aws-server.yaml"]())
    assert files[paths.SYSCTL_FILE].splitlines() == [f"{k}={v}" for k, v in cloudinit.KUBELET_SYSCTLS.items()]
    script = files[paths.BOOTSTRAP_FILE]
    assert script.index("sysctl --system") < script.index("k3s-install.sh")


def test_pod_security_exempts_the_gpu_operator_and_kube_system():
    admission = yaml.safe_load(user_data_files(RENDERED["aws-server.yaml"]())[paths.ADMISSION_CONFIG_FILE])
    configuration = admission["plugins"][0]["configuration"]
    assert configuration["exemptions"]["namespaces"] == ["gpu-operator", "kube-system"]
    assert configuration["defaults"]["enforce"] == "baseline"
    assert configuration["defaults"]["warn"] == "restricted"


def test_install_script_is_pinned_to_the_release_tag():
    script = user_data_files(RENDERED["aws-agent.yaml"]())[paths.BOOTSTRAP_FILE]
    assert "https://raw.githubusercontent.com/k3s-io/k3s/v1.36.3%2Bk3s1/install.sh" in script
    assert "INSTALL_K3S_VERSION=v1.36.3+k3s1" in script
    assert "get.k3s.io" not in script


def test_nothing_secret_is_in_user_data():
    for render in RENDERED.values():
        text = render()
        for marker in ("PRIVATE KEY", "BEGIN CERTIFICATE", "K10", "::server:", "::node:"):
            assert marker not in text
    assert "ssh_authorized_keys" not in "".join(render() for render in RENDERED.values())


def test_secret_payloads_name_the_files_k3s_reads():
    tls_files = {"server-ca.crt": "A", "service.key": "B", "etcd/peer-ca.key": "C"}
    server = json.loads(cloudinit.server_secret_payload("K10s::server:x", "K10a::node:y", tls_files))["files"]
    assert server == {
        paths.TOKEN_FILE: "K10s::server:x",
        paths.AGENT_TOKEN_FILE: "K10a::node:y",
        f"{paths.TLS_DIR}/server-ca.crt": "A",
        f"{paths.TLS_DIR}/service.key": "B",
        f"{paths.TLS_DIR}/etcd/peer-ca.key": "C",
    }
    agent = json.loads(cloudinit.agent_secret_payload("K10a::node:y"))["files"]
    assert agent == {paths.AGENT_TOKEN_FILE: "K10a::node:y"}


def _self_signed_pem(name: str) -> str:
    key_pem = fake_tls.private_key_outputs(name, {"algorithm": "ECDSA", "ecdsaCurve": "P256"})[
        "privateKeyPem"
    ]
    inputs: dict[str, Any] = {
        "privateKeyPem": key_pem,
        "subject": {"commonName": name},
        "isCaCertificate": True,
        "validityPeriodHours": 24,
        "allowedUses": ["cert_signing"],
    }
    return fake_tls.self_signed_cert_outputs(name, inputs)["certPem"]


def test_secure_token_hashes_the_root_certificates_der():
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    root = _self_signed_pem("root")
    der = x509.load_pem_x509_certificate(root.encode()).public_bytes(serialization.Encoding.DER)
    token = pki.secure_token(root, "server", "s3cret")
    assert token == f"K10{hashlib.sha256(der).hexdigest()}::server:s3cret"
    assert len(token.split("::")[0]) == 3 + 64  # k3s rejects any other CA hash length (clientaccess/token.go)


def test_server_tls_files_put_the_root_behind_every_ca():
    files = pki.server_tls_files(
        "ROOT\n",
        {ca: f"{ca}-CERT\n" for ca in pki.LEAF_CAS},
        {ca: f"{ca}-KEY\n" for ca in pki.LEAF_CAS},
        "SA\n",
    )
    assert files["server-ca.crt"] == "server-ca-CERT\nROOT\n"
    assert files["etcd/peer-ca.key"] == "etcd/peer-ca-KEY\n"
    assert files["service.key"] == "SA\n"
    # The file set k3s needs before its first start (k3s docs, cli/certificate.md).
    assert set(files) == {
        "server-ca.crt",
        "server-ca.key",
        "client-ca.crt",
        "client-ca.key",
        "request-header-ca.crt",
        "request-header-ca.key",
        "etcd/peer-ca.crt",
        "etcd/peer-ca.key",
        "etcd/server-ca.crt",
        "etcd/server-ca.key",
        "service.key",
    }


def test_secret_writer_writes_private_files_and_nothing_from_a_broken_payload(tmp_path, monkeypatch, capsys):
    write_secret_files.write_files(json.dumps({"files": {paths.TOKEN_FILE: "K10abc::node:x"}}), tmp_path)
    target = tmp_path / paths.TOKEN_FILE.lstrip("/")
    assert target.read_text() == "K10abc::node:x"
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert oct(target.parent.stat().st_mode & 0o777) == "0o700"
    assert "K10abc" not in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO('{"files": {"' + paths.AGENT_TOKEN_FILE + '": "x"'))
    assert write_secret_files.main() == 1


def test_the_secret_writer_writes_every_path_the_payloads_hold():
    """The writer's list of places and the payloads the program builds cannot drift apart."""
    tls = {"server-ca.key": "k", "etcd/server-ca.key": "k", "service.key": "k"}
    payloads = [
        cloudinit.server_secret_payload("t", "a", tls, cloudinit.etcd_s3_credentials("id", "secret")),
        cloudinit.agent_secret_payload("a"),
    ]
    paths = [path for payload in payloads for path in json.loads(payload)["files"]]
    assert len(paths) == 7 and all(write_secret_files.allowed(path) for path in paths)


@pytest.mark.parametrize(
    "path",
    [
        "/etc/cron.d/gpu-k8s",
        "/root/.ssh/authorized_keys",
        "/var/lib/rancher/k3s/server/tls/../../../../../etc/passwd",
        "/var/lib/rancher/k3s/server/tls/sub/x.key",
        "/var/lib/rancher/k3s/server/tls/.hidden",
        "var/lib/rancher/k3s/server/tls/x.key",
        "/etc/rancher/k3s/config.yaml",
        # The directory the etcd files go in, named as a file.
        "/var/lib/rancher/k3s/server/tls/etcd",
    ],
)
def test_a_payload_naming_any_other_path_writes_nothing(tmp_path, path):
    payload = json.dumps({"files": {paths.TOKEN_FILE: "K10abc::node:x", path: "evil"}})
    with pytest.raises(write_secret_files.RefusedPath):
        write_secret_files.write_files(payload, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", [None, 3, ["x"]])
def test_a_payload_with_content_that_is_not_text_writes_nothing(tmp_path, monkeypatch, content):
    files = {paths.TOKEN_FILE: "K10abc::node:x", paths.AGENT_TOKEN_FILE: content}
    with pytest.raises(ValueError):
        write_secret_files.write_files(json.dumps({"files": files}), tmp_path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"files": files})))
    assert write_secret_files.main() == 1


def test_the_secret_writer_never_writes_through_a_symbolic_link(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    token = tmp_path / paths.TOKEN_FILE.lstrip("/")
    token.parent.mkdir(parents=True)
    token.symlink_to(elsewhere)
    with pytest.raises(OSError):
        write_secret_files.write_files(json.dumps({"files": {paths.TOKEN_FILE: "x"}}), tmp_path)
    assert not elsewhere.exists()


def test_the_bootstrap_retry_gives_up_after_its_attempts_and_stops_at_success(tmp_path: Path):
    script = user_data_files(RENDERED["aws-agent.yaml"]())[paths.BOOTSTRAP_FILE]
    start = script.index("waited=0")
    retry = script[start : script.index("\n}\n", script.index("retry() {")) + 3]
    harness = tmp_path / "retry.sh"
    harness.write_text(
        '#!/bin/bash\nset -euo pipefail\nlog() { echo "$*"; }\nsleep() { :; }\n'
        + retry
        + 'tries=0\nthird_time() { tries=$((tries + 1)); [ "$tries" -eq 3 ]; }\n'
        + 'retry "thing" third_time\necho "after $tries, waited $waited"\n'
        + 'keep_trying "maybe" false || echo "maybe failed, waited $waited"\n'
        + 'retry "never" false\necho unreachable\n'
    )
    result = subprocess.run(["bash", str(harness)], capture_output=True, text=True)
    assert result.returncode == 1
    assert "thing: done" in result.stdout and "after 3, waited 15" in result.stdout
    # The budget is the boot's, not the step's: "thing" waited 15 s, so "maybe" waits 5 + 10 + 15 + 20 + 25
    # s and then 30 s at a time until 600 s, and "never" may not wait at all.
    assert "maybe: attempt 23 failed, and this boot has waited 600 of its 600 s" in result.stdout
    assert "maybe failed, waited 600" in result.stdout
    assert "never: attempt 1 failed, and this boot has waited 600 of its 600 s" in result.stdout
    assert "never: giving up" in result.stdout and "unreachable" not in result.stdout


def test_node_bootstrap_is_whatever_the_provider_supplies():
    custom = NodeBootstrap(
        node_facts_sh="export PROVIDER_ID=x\n",
        fetch_secret_py="print('x')\n",
        snapshot_store_py="print('s')\n",
    )
    files = user_data_files(cloudinit.agent_cloud_config(AGENT, custom))
    assert files[paths.NODE_FACTS_FILE] == custom.node_facts_sh
    assert files[paths.FETCH_FILE] == custom.fetch_secret_py
    assert paths.SNAPSHOT_STORE_FILE not in files
    server_files = user_data_files(cloudinit.server_cloud_config(SERVER, custom))
    assert server_files[paths.SNAPSHOT_STORE_FILE] == custom.snapshot_store_py


@pytest.mark.parametrize("golden", sorted(RENDERED))
def test_load_balancer_health_checks_reach_kube_proxy_on_every_node(golden):
    """k3s binds kube-proxy's health endpoint to 127.0.0.1; Compute Engine's load balancers ask each node
    on port 10256, so every node (server or agent) binds it on all addresses."""
    config = yaml.safe_load(user_data_files(RENDERED[golden]())[f"{paths.CONFIG_DIR}/config.yaml"])
    assert config["kube-proxy-arg"] == ["healthz-bind-address=0.0.0.0:10256"]


def test_servers_are_left_out_of_service_load_balancers(gcp_k3s, aws_k3s):
    """Servers take no workloads, and on Compute Engine already sit in the API balancer's instance groups,
    which an instance can belong to only one of."""
    texts = {
        "gcp": json.dumps(gcp_k3s.by_name("ml-server-0").inputs),
        "aws": ec2_cloud_config(aws_k3s.by_name("ml-server-0").inputs),
    }
    for cloud, text in texts.items():
        assert "node.kubernetes.io/exclude-from-external-load-balancers=true" in text, cloud
