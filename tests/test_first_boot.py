"""The k3s nodes' first boot, run for real: each plan's rendered cloud-config for a server and a GPU agent on
both clouds is executed as cloud-init would (tests/node_boot.py), against local fakes of the cloud on
127.0.0.1 and the metadata address, in namespaces that reach nothing else.

These need root (namespaces, overlay and chroot), as CI and the quickstart run them.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_k8s.tools.engine import Recording, Secret, run_program
from tests.conftest import ec2_cloud_config, user_data_files
from tests.node_boot import BootResult, Scenario, boot

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="booting a node needs root (namespaces, chroot)")

K3S_VERSION = "v1.36.3+k3s1"
CONFIG_DIR = "/etc/rancher/k3s"
NODE_CONFIG = f"{CONFIG_DIR}/config.yaml.d/10-node.yaml"
TLS_DIR = "/var/lib/rancher/k3s/server/tls"
BOOT_LOG = "/var/log/gpu-k8s-bootstrap.log"
INSTALLER = "raw.githubusercontent.com"
# How often an agent tries a step that never succeeds: 22 waits fit in its 600 s.
AGENT_ATTEMPTS = 23
FOUNDING_MARKER = "gpu-k8s/founded"
SNAPSHOT = "ml/etcd-snapshot-ml-server-1-1764806400.zip"
# The kubelet's protect-kernel-defaults values (kubelet setupKernelTunables; k3s CIS hardening guide).
KUBELET_SYSCTLS = {
    "vm.panic_on_oom=0",
    "vm.overcommit_memory=1",
    "kernel.panic=10",
    "kernel.panic_on_oops=1",
    "kernel.keys.root_maxkeys=1000000",
    "kernel.keys.root_maxbytes=25000000",
}
AWS_AGENT_FACTS = {"zone": "us-east-1b", "instance_type": "g6.xlarge", "instance_id": "i-0123456789abcdef0"}
AWS_SERVER_FACTS = {"zone": "us-east-1a", "instance_type": "m7i.large", "instance_id": "i-0fedcba9876543210"}
GCE_AGENT_FACTS = {
    "zone": "us-central1-a",
    "instance_type": "g2-standard-8",
    "name": "ml-gpu-l4-x7kq",
    "project": "gpu-k8s-demo",
}
GCE_SERVER_FACTS = {
    "zone": "us-central1-a",
    "instance_type": "e2-standard-4",
    "name": "ml-server-0",
    "project": "gpu-k8s-demo",
}


def revealed(value: Any) -> Any:
    return value.value if isinstance(value, Secret) else value


def secret_payload(recording: Recording, resource_name: str) -> str:
    inputs = recording.by_name(resource_name).inputs
    return revealed(inputs.get("secretString") or inputs.get("secretData"))


def aws_agent_scenario(aws_k3s: Recording, template: str = "ml-gpu-l4-lt", **changes: Any) -> Scenario:
    user_data = ec2_cloud_config(aws_k3s.by_name(template).inputs)
    return Scenario(
        cloud="aws",
        user_data=user_data,
        secret_id=secret_arn_in(user_data),
        secret_payload=secret_payload(aws_k3s, "ml-agents-bootstrap-value"),
        facts=AWS_AGENT_FACTS,
        server_address=server_address(user_data),
        **changes,
    )


def aws_server_scenario(
    aws_k3s: Recording, index: int = 0, answering: int = 0, bucket_objects: Mapping[str, str] | None = None
) -> Scenario:
    """Server `index` booting while the first `answering` of its peers already run k3s and the snapshot
    bucket holds `bucket_objects`."""
    user_data = ec2_cloud_config(aws_k3s.by_name(f"ml-server-{index}").inputs)
    peers = peer_addresses(user_data)
    return Scenario(
        cloud="aws",
        user_data=user_data,
        secret_id=secret_arn_in(user_data),
        secret_payload=secret_payload(aws_k3s, "ml-servers-bootstrap-value"),
        facts=AWS_SERVER_FACTS,
        peer_addresses=peers,
        answering_peers=peers[:answering],
        snapshot_bucket=snapshot_bucket(user_data),
        bucket_objects=dict(bucket_objects or {}),
    )


def gce_user_data(recording: Recording, name: str) -> str:
    return recording.by_name(name).inputs["metadata"]["user-data"]


def gce_agent_scenario(gcp_k3s: Recording, **changes: Any) -> Scenario:
    user_data = gce_user_data(gcp_k3s, "ml-gpu-l4-template")
    return Scenario(
        cloud="gce",
        user_data=user_data,
        secret_id="projects/gpu-k8s-demo/secrets/ml-k3s-agents",
        secret_payload=secret_payload(gcp_k3s, "ml-agents-bootstrap-value"),
        facts=GCE_AGENT_FACTS,
        server_address=server_address(user_data),
        **changes,
    )


def gce_server_scenario(
    gcp_k3s: Recording, index: int = 0, answering: int = 0, bucket_objects: Mapping[str, str] | None = None
) -> Scenario:
    user_data = gce_user_data(gcp_k3s, f"ml-server-{index}")
    peers = peer_addresses(user_data)
    return Scenario(
        cloud="gce",
        user_data=user_data,
        # Named for the cluster (tests/test_restore_material.py): the id the plan gives the secret.
        secret_id=gcp_k3s.by_name("ml-servers-bootstrap").id,
        secret_payload=secret_payload(gcp_k3s, "ml-servers-bootstrap-value"),
        facts=GCE_SERVER_FACTS,
        peer_addresses=peers,
        answering_peers=peers[:answering],
        snapshot_bucket=snapshot_bucket(user_data),
        bucket_objects=dict(bucket_objects or {}),
    )


def server_scenario(cloud: str, aws_k3s: Recording, gcp_k3s: Recording, **which: Any) -> Scenario:
    return aws_server_scenario(aws_k3s, **which) if cloud == "aws" else gce_server_scenario(gcp_k3s, **which)


def written_files(user_data: str) -> dict[str, str]:
    return user_data_files(user_data)


def secret_arn_in(user_data: str) -> str:
    script = written_files(user_data)["/usr/local/lib/gpu-k8s/bootstrap.sh"]
    (arn,) = {word for word in script.replace('"', " ").split() if word.startswith("arn:aws:secretsmanager:")}
    return arn


def peer_addresses(user_data: str) -> list[str]:
    """The other servers a server's boot script asks, as their addresses."""
    script = written_files(user_data)["/usr/local/lib/gpu-k8s/bootstrap.sh"]
    lines = [line for line in script.splitlines() if line.startswith("peers=(")]
    if not lines:  # the only server
        return []
    (line,) = lines
    urls = shlex.split(line.removeprefix("peers=(").removesuffix(")"))
    return [url.removeprefix("https://").removesuffix(":6443") for url in urls]


def snapshot_bucket(user_data: str) -> str:
    return yaml.safe_load(written_files(user_data)[f"{CONFIG_DIR}/config.yaml"])["etcd-s3-bucket"]


def server_address(user_data: str) -> str:
    server = yaml.safe_load(written_files(user_data)[f"{CONFIG_DIR}/config.yaml"])["server"]
    return server.removeprefix("https://").removesuffix(":6443")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def secret_strings(payload: str) -> list[str]:
    """Every secret value the payload carries (tokens, keys), as they would appear if printed."""
    files = json.loads(payload)["files"]
    values = [content.strip() for content in files.values()]
    return [*values, *(line for v in values for line in v.splitlines() if len(line) > 40)]


def assert_nothing_secret_printed(result: BootResult, scenario: Scenario) -> None:
    printed = result.console + (result.file(BOOT_LOG).read_text() if result.file(BOOT_LOG).exists() else "")
    assert printed.strip(), "the boot printed no progress at all"
    for value in secret_strings(scenario.secret_payload):
        assert value not in printed


def assert_secret_files_written(result: BootResult, scenario: Scenario) -> list[str]:
    files = json.loads(scenario.secret_payload)["files"]
    for path, content in files.items():
        written = result.file(path)
        assert written.read_text() == content, path
        assert mode(written) == 0o600, path
    return list(files)


def node_config(result: BootResult) -> dict[str, Any]:
    config = yaml.safe_load(result.file(NODE_CONFIG).read_text())
    assert mode(result.file(NODE_CONFIG).parent) & 0o022 == 0  # nobody but root writes the node's config
    return config


# The kubelet settings of the k3s CIS hardening guide ("v1.29 and Newer"), on every node.
HARDENED_KUBELET_ARGS = {
    "streaming-connection-idle-timeout=5m",
    "tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,"
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,"
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305,TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
}


def assert_hardened_kubelet(result: BootResult) -> None:
    assert set(node_config(result)["kubelet-arg"]) >= HARDENED_KUBELET_ARGS
    assert (
        yaml.safe_load(result.file(f"{CONFIG_DIR}/config.yaml").read_text())["protect-kernel-defaults"]
        is True
    )


def installer_call(result: BootResult) -> dict[str, str]:
    return dict(line.split("=", 1) for line in result.records["fakes"]["installer"].splitlines())


def assert_kernel_settings_applied_before_k3s(result: BootResult) -> None:
    assert result.records["fakes"]["sysctl"].split() == ["--system"]
    assert set(result.records["fakes"]["sysctl-files"].split()) >= KUBELET_SYSCTLS
    assert result.records["fakes"]["sequence"].split() == ["sysctl", "install"]


def requests_to(result: BootResult, host: str) -> list[dict[str, Any]]:
    return [r for r in result.records["requests"] if r["host"] == host]


@pytest.fixture(scope="module")
def aws_agent_boot(aws_k3s, tmp_path_factory) -> tuple[Scenario, BootResult]:
    scenario = aws_agent_scenario(aws_k3s)
    return scenario, boot(scenario, tmp_path_factory.mktemp("aws-agent"))


@pytest.fixture(scope="module")
def gce_agent_boot(gcp_k3s, tmp_path_factory) -> tuple[Scenario, BootResult]:
    scenario = gce_agent_scenario(gcp_k3s)
    return scenario, boot(scenario, tmp_path_factory.mktemp("gce-agent"))


# --- agents ---------------------------------------------------------------------------------------------


def test_aws_agent_boots_joins_with_its_instance_facts_and_reads_its_secret_once(aws_agent_boot):
    scenario, result = aws_agent_boot
    assert result.exit_code == 0, result.console
    assert result.records["secret_reads"] == 1
    assert assert_secret_files_written(result, scenario) == [f"{CONFIG_DIR}/agent-token"]
    config = node_config(result)
    assert "provider-id=aws:///us-east-1b/i-0123456789abcdef0" in config["kubelet-arg"]
    # Named after its instance, and initialised by the AWS cloud controller manager.
    assert config["node-name"] == "i-0123456789abcdef0"
    assert "cloud-provider=external" in config["kubelet-arg"]
    assert {
        "node.kubernetes.io/instance-type=g6.xlarge",
        "topology.kubernetes.io/zone=us-east-1b",
        "topology.kubernetes.io/region=us-east-1",
        "gpu-k8s.io/pool=l4",
        "k8s.amazonaws.com/accelerator=nvidia-l4",
        "nvidia.com/device-plugin.config=l4",
    } <= set(config["node-label"])
    # The l4 pool is time-sliced: its slots must be asked for.
    assert config["node-taint"] == [
        "nvidia.com/gpu=true:NoSchedule",
        "gpu-k8s.io/sharing=timeSlicing:NoSchedule",
    ]
    assert installer_call(result) == {
        "INSTALL_K3S_VERSION": K3S_VERSION,
        "INSTALL_K3S_EXEC": "agent",
        "INSTALL_K3S_SKIP_ENABLE": "false",
        "INSTALL_K3S_SKIP_START": "false",
        "ARGS": "",
    }
    assert [r["path"] for r in requests_to(result, INSTALLER)] == ["/k3s-io/k3s/v1.36.3%2Bk3s1/install.sh"]
    assert [r["path"] for r in requests_to(result, scenario.server_address)] == ["/cacerts"]
    assert_kernel_settings_applied_before_k3s(result)
    assert_hardened_kubelet(result)
    assert_nothing_secret_printed(result, scenario)


def test_aws_agent_uses_imdsv2_only(aws_agent_boot):
    _, result = aws_agent_boot
    metadata = requests_to(result, "169.254.169.254")
    assert metadata[0]["method"] == "PUT" and metadata[0]["path"] == "/latest/api/token"
    # Every read carried the session token: the fake answers 401 without it, and the boot succeeded.
    assert {r["path"] for r in metadata} >= {
        "/latest/meta-data/instance-id",
        "/latest/meta-data/iam/security-credentials/",
    }


def test_an_efa_agent_reserves_its_huge_pages_and_lifts_the_memlock_cap_before_k3s_starts(
    aws_k3s_efa, tmp_path
):
    """The pool's kernel settings are applied with the kubelet's, before the install starts k3s (the
    kubelet reports the huge pages it finds at start), and k3s-agent's unit gets its drop-in first."""
    from gpu_k8s.components.k3s.paths import AGENT_POOL_UNIT_DROP_IN

    result = boot(aws_agent_scenario(aws_k3s_efa, "ml-gpu-train-lt"), tmp_path)
    assert result.exit_code == 0, result.console
    assert_kernel_settings_applied_before_k3s(result)
    assert "vm.nr_hugepages=5128" in result.records["fakes"]["sysctl-files"].split()
    assert result.file(AGENT_POOL_UNIT_DROP_IN).read_text() == "[Service]\nLimitMEMLOCK=infinity\n"


def test_gce_agent_boots_with_its_instance_facts_and_reads_its_secret_once(gce_agent_boot):
    scenario, result = gce_agent_boot
    assert result.exit_code == 0, result.console
    assert result.records["secret_reads"] == 1
    assert assert_secret_files_written(result, scenario) == [f"{CONFIG_DIR}/agent-token"]
    config = node_config(result)
    assert "provider-id=gce://gpu-k8s-demo/us-central1-a/ml-gpu-l4-x7kq" in config["kubelet-arg"]
    assert {
        "node.kubernetes.io/instance-type=g2-standard-8",
        "topology.kubernetes.io/zone=us-central1-a",
        "topology.kubernetes.io/region=us-central1",
        "gpu-k8s.io/pool=l4",
        "nvidia.com/device-plugin.config=l4",
    } <= set(config["node-label"])
    # The l4 pool is time-sliced: its slots must be asked for.
    assert config["node-taint"] == [
        "nvidia.com/gpu=true:NoSchedule",
        "gpu-k8s.io/sharing=timeSlicing:NoSchedule",
    ]
    assert installer_call(result)["INSTALL_K3S_EXEC"] == "agent"
    assert_kernel_settings_applied_before_k3s(result)
    assert_hardened_kubelet(result)
    assert_nothing_secret_printed(result, scenario)


def test_gce_spot_agent_gets_the_graceful_shutdown_drop_in(gce_agent_boot):
    _, result = gce_agent_boot
    drop_in = yaml.safe_load(
        result.file("/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/20-gpu-k8s.conf").read_text()
    )
    assert drop_in["kind"] == "KubeletConfiguration"
    assert drop_in["shutdownGracePeriod"] == "25s"
    assert drop_in["shutdownGracePeriodCriticalPods"] == "10s"


# --- servers --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cloud", ["aws", "gce"])
def test_first_server_writes_its_pki_and_founds_the_cluster_when_no_other_server_answers(
    cloud, aws_k3s, gcp_k3s, tmp_path
):
    scenario = server_scenario(cloud, aws_k3s, gcp_k3s)
    result = boot(scenario, tmp_path)
    assert result.exit_code == 0, result.console
    assert result.records["secret_reads"] == 1
    written = assert_secret_files_written(result, scenario)
    assert {
        f"{CONFIG_DIR}/token",
        f"{CONFIG_DIR}/agent-token",
        f"{TLS_DIR}/server-ca.key",
        f"{TLS_DIR}/client-ca.key",
    } <= set(written)
    assert mode(result.file(TLS_DIR)) == 0o700
    assert mode(result.file("/var/lib/rancher/k3s/server/logs")) == 0o700
    config = yaml.safe_load(result.file(f"{CONFIG_DIR}/config.yaml").read_text())
    # It asked both other servers, three times, before founding the cluster.
    assert len(scenario.peer_addresses) == 2
    assert node_config(result)["cluster-init"] is True and "server" not in node_config(result)
    assert "no other server answers (check 3 of 3)" in result.console
    assert result.records["fakes"]["sleeps"].split() == ["10", "10", "10"]
    # It found the bucket empty, then, once k3s ran, left the founding marker there: empty, so k3s, which
    # skips empty objects when it lists snapshots, never takes it for one.
    assert result.records["bucket_objects"] == {FOUNDING_MARKER: 0}
    assert result.console.index("founding the cluster") < result.console.index("k3s server started")
    assert result.console.index("k3s server started") < result.console.index("recording the founding")
    assert installer_call(result)["INSTALL_K3S_SKIP_START"] == "false"
    # Once its k3s answers, a GCE server starts the timer that deletes the Nodes of recreated agent VMs
    # (tests/test_recreated_nodes.py); EC2 names a new instance anew, so AWS servers need none.
    if cloud == "gce":
        assert result.records["fakes"]["systemctl"].splitlines() == [
            "daemon-reload",
            "enable --now gpu-k8s-recreated-nodes.timer",
        ]
        console = result.console
        assert console.index("k3s server started") < console.index("starting the server's timers")
        assert result.file("/etc/systemd/system/gpu-k8s-recreated-nodes.timer").is_file()
    else:
        assert "systemctl" not in result.records["fakes"]
    # Servers take no workloads: they hold the cluster's keys.
    assert config["node-taint"] == ["CriticalAddonsOnly=true:NoExecute"]
    assert "gpu-k8s.io/pool=system" in node_config(result)["node-label"]
    assert installer_call(result)["INSTALL_K3S_EXEC"] == "server"
    assert_kernel_settings_applied_before_k3s(result)
    assert_hardened_kubelet(result)
    assert_nothing_secret_printed(result, scenario)


@pytest.mark.parametrize("cloud", ["aws", "gce"])
def test_a_replaced_first_server_joins_the_running_cluster_instead_of_founding_another(
    cloud, aws_k3s, gcp_k3s, tmp_path
):
    """Split brain is what this prevents: a fresh server 0 with cluster-init would found a second cluster
    next to the one the other servers still run."""
    scenario = server_scenario(cloud, aws_k3s, gcp_k3s, answering=2)
    result = boot(scenario, tmp_path)
    assert result.exit_code == 0, result.console
    config = node_config(result)
    assert config["server"] == f"https://{scenario.peer_addresses[0]}:6443" and "cluster-init" not in config
    assert "sleeps" not in result.records["fakes"]
    assert installer_call(result)["INSTALL_K3S_EXEC"] == "server"


@pytest.mark.parametrize("cloud", ["aws", "gce"])
def test_a_founder_whose_bucket_holds_snapshots_never_founds_again(cloud, aws_k3s, gcp_k3s, tmp_path):
    """Every server lost (or server 0 replaced while the others are down): founding would start an empty
    cluster beside the snapshots. The founder waits for a peer as the others do, then installs k3s without
    enabling or starting it, for the restore runbook, and the boot fails."""
    scenario = server_scenario(cloud, aws_k3s, gcp_k3s, bucket_objects={SNAPSHOT: "snapshot"})
    scenario.installer_failures = 2
    result = boot(scenario, tmp_path, timeout=300)
    assert result.exit_code == 1
    assert "shows the cluster was founded before: not again" in result.console
    assert "cluster-init" not in result.file(NODE_CONFIG).read_text()
    assert "server:" not in result.file(NODE_CONFIG).read_text()
    assert installer_call(result)["INSTALL_K3S_SKIP_START"] == "true"
    assert installer_call(result)["INSTALL_K3S_SKIP_ENABLE"] == "true"
    assert result.console.splitlines()[-1] == (
        "gpu-k8s: k3s is installed, not started: restore a snapshot here (stacks/K3S.md, Restoring)"
    )
    assert set(result.records["bucket_objects"]) == {SNAPSHOT}  # nothing written
    # It waited for a peer 25 of the servers' 30 minutes (the three first checks included), so the install
    # still had its retries: it failed twice and was installed the third time.
    sleeps = [int(s) for s in result.records["fakes"]["sleeps"].split()]
    assert result.records["installer_fetches"] == 3
    assert sum(sleeps[:-2]) <= 1500 < sum(sleeps[:-2]) + 30 and sleeps[-2:] == [5, 10]


def test_a_founder_whose_k3s_never_answers_records_no_founding(aws_k3s, tmp_path):
    """The install script can return success without starting k3s (a retry with unchanged files); a marker
    written then would stop every later server 0 with nothing to restore."""
    scenario = aws_server_scenario(aws_k3s)
    scenario.local_server_starts = False
    result = boot(scenario, tmp_path, timeout=300)
    assert result.exit_code == 1
    assert result.console.splitlines()[-1] == "gpu-k8s: waiting for this server's k3s to answer: giving up"
    assert result.records["bucket_objects"] == {}
    assert "k3s server started" not in result.console


@pytest.mark.parametrize("cloud", ["aws", "gce"])
def test_a_founder_that_finds_its_marker_joins_a_peer_that_answers_late(cloud, aws_k3s, gcp_k3s, tmp_path):
    """The marker alone (no snapshot yet) is enough, and a peer is still joined."""
    scenario = server_scenario(cloud, aws_k3s, gcp_k3s, bucket_objects={FOUNDING_MARKER: ""})
    scenario.answering_peers = scenario.peer_addresses[:1]
    # Server 1 answers from its fifth question on: after the three checks and one more wait.
    scenario.peer_refusals = 4
    result = boot(scenario, tmp_path, timeout=300)
    assert result.exit_code == 0, result.console
    config = node_config(result)
    assert config["server"] == f"https://{scenario.peer_addresses[0]}:6443" and "cluster-init" not in config
    assert installer_call(result)["INSTALL_K3S_SKIP_START"] == "false"
    assert "recording the founding" not in result.console


@pytest.mark.parametrize("cloud", ["aws", "gce"])
@pytest.mark.parametrize("bucket", [{}, {SNAPSHOT: "snapshot"}], ids=["first-boot", "replaced"])
def test_a_single_server_founds_only_from_an_empty_bucket(
    cloud, bucket, aws_k3s_config, gcp_k3s_config, tmp_path
):
    """One server has no peer to wait for: a replacement with snapshots behind it stops for the restore
    instead of starting an empty cluster that the agents would join."""
    config = copy.deepcopy(aws_k3s_config if cloud == "aws" else gcp_k3s_config)
    del config["gpu-k8s:cluster"]["systemPool"]["nodes"]
    single = run_program("single", config)
    make = aws_server_scenario if cloud == "aws" else gce_server_scenario
    scenario = make(single, bucket_objects=bucket)
    assert scenario.peer_addresses == []
    result = boot(scenario, tmp_path)
    if not bucket:
        assert result.exit_code == 0, result.console
        assert node_config(result)["cluster-init"] is True
        assert result.records["bucket_objects"] == {FOUNDING_MARKER: 0}
    else:
        assert result.exit_code == 1
        assert "cluster-init" not in result.file(NODE_CONFIG).read_text()
        assert installer_call(result)["INSTALL_K3S_SKIP_START"] == "true"
        assert "sleeps" not in result.records["fakes"]
        assert set(result.records["bucket_objects"]) == {SNAPSHOT}


@pytest.mark.parametrize("cloud", ["aws", "gce"])
def test_another_server_waits_for_any_running_server_and_joins_it(cloud, aws_k3s, gcp_k3s, tmp_path):
    """Server 1 comes up while only server 0 runs (the first `up`): it never founds a cluster of its own."""
    scenario = server_scenario(cloud, aws_k3s, gcp_k3s, index=1)
    scenario.answering_peers = scenario.peer_addresses[:1]
    result = boot(scenario, tmp_path)
    assert result.exit_code == 0, result.console
    config = node_config(result)
    assert config["server"] == f"https://{scenario.peer_addresses[0]}:6443" and "cluster-init" not in config
    # Server 2 does not answer: server 0 does, and the founder is no special case for the others.
    scenario = server_scenario(cloud, aws_k3s, gcp_k3s, index=1)
    scenario.answering_peers = scenario.peer_addresses[1:]
    (tmp_path / "second").mkdir()
    config = node_config(boot(scenario, tmp_path / "second"))
    assert config["server"] == f"https://{scenario.peer_addresses[1]}:6443"


def test_a_server_that_finds_no_running_server_never_founds_one(aws_k3s, tmp_path):
    result = boot(aws_server_scenario(aws_k3s, index=2), tmp_path, timeout=300)
    assert result.exit_code == 1
    assert result.console.splitlines()[-1] == "gpu-k8s: waiting for another server to join: giving up"
    assert "cluster-init" not in result.file(NODE_CONFIG).read_text()
    assert "installer" not in result.records["fakes"]


# --- failures -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cloud", ["aws", "gce"])
def test_a_secret_store_that_recovers_is_retried_with_backoff(cloud, aws_k3s, gcp_k3s, tmp_path):
    make = aws_agent_scenario if cloud == "aws" else gce_agent_scenario
    scenario = make(aws_k3s if cloud == "aws" else gcp_k3s, secret_store_failures=2)
    result = boot(scenario, tmp_path)
    assert result.exit_code == 0, result.console
    assert result.records["secret_reads"] == 3 and result.records["secret_answers"] == 1
    assert result.records["fakes"]["sleeps"].split() == ["5", "10"]
    assert "attempt 2 failed; trying again in 10 s" in result.console
    assert installer_call(result)["INSTALL_K3S_EXEC"] == "agent"


@pytest.mark.parametrize("cloud", ["aws", "gce"])
def test_a_secret_store_that_stays_down_ends_an_agents_boot_within_the_autoscalers_patience(
    cloud, aws_k3s, gcp_k3s, tmp_path
):
    """The cluster-autoscaler deletes a node that has not registered 15 minutes after its scale-up
    (--max-node-provision-time); an agent stops waiting after 10 minutes, its start and install aside."""
    make = aws_agent_scenario if cloud == "aws" else gce_agent_scenario
    scenario = make(aws_k3s if cloud == "aws" else gcp_k3s, secret_store_failures=-1)
    result = boot(scenario, tmp_path, timeout=300)
    assert result.exit_code == 1
    # 5 + 10 + 15 + 20 + 25 s, then 17 waits of 30 s: 585 s; one more would pass 600.
    assert result.records["secret_reads"] == AGENT_ATTEMPTS and result.records["secret_answers"] == 0
    sleeps = [int(s) for s in result.records["fakes"]["sleeps"].split()]
    assert sleeps[:6] == [5, 10, 15, 20, 25, 30] and len(sleeps) == AGENT_ATTEMPTS - 1 and max(sleeps) == 30
    assert sum(sleeps) == 585
    assert f"attempt {AGENT_ATTEMPTS} failed, and this boot has waited 585 of its 600 s" in result.console
    assert re.fullmatch(
        r"gpu-k8s: reading bootstrap secrets from \S+: giving up", result.console.splitlines()[-1]
    )
    assert not result.file(f"{CONFIG_DIR}/agent-token").exists()
    assert "installer" not in result.records["fakes"]
    assert not requests_to(result, INSTALLER)


@pytest.mark.parametrize(
    ("credentials", "refusal"), [("wrong-key", "SignatureDoesNotMatch"), ("no-permission", "AccessDenied")]
)
def test_secrets_manager_checks_the_nodes_signature_and_permission(credentials, refusal, aws_k3s, tmp_path):
    """moto verifies the stdlib SigV4 signature and the role's policy: a wrong key or a missing grant is
    refused, so the successful boots above prove the fetcher signs as AWS expects."""
    result = boot(aws_agent_scenario(aws_k3s, aws_credentials=credentials), tmp_path, timeout=300)
    assert result.exit_code == 1
    reads = [r for r in result.records["requests"] if r["host"].startswith("secretsmanager.")]
    assert len(reads) == AGENT_ATTEMPTS and all(
        r["status"] in (400, 403) and refusal in r["error"] for r in reads
    ), reads[0]
    assert result.records["secret_answers"] == 0


def test_a_failed_k3s_install_is_retried_within_the_bound(aws_k3s, tmp_path):
    result = boot(aws_agent_scenario(aws_k3s, installer_failures=2), tmp_path)
    assert result.exit_code == 0, result.console
    assert result.records["installer_fetches"] == 3
    assert "installing k3s v1.36.3+k3s1: attempt 2 failed; trying again in 10 s" in result.console
    assert installer_call(result)["INSTALL_K3S_EXEC"] == "agent"


def test_an_agent_whose_server_never_answers_gives_up_without_installing(aws_k3s, tmp_path):
    scenario = aws_agent_scenario(aws_k3s, server_up=False)
    result = boot(scenario, tmp_path, timeout=300)
    assert result.exit_code == 1
    assert (
        result.console.splitlines()[-1]
        == f"gpu-k8s: waiting for server https://{scenario.server_address}:6443: giving up"
    )
    # Waiting for the server ends at 480 s (5 + 10 + 15 + 20 + 25, then 13 waits of 30: 465), so an install
    # after a late answer keeps its last 120 s.
    sleeps = [int(s) for s in result.records["fakes"]["sleeps"].split()]
    assert sleeps == [5, 10, 15, 20, 25, *[30] * 13]
    assert "attempt 19 failed, and this boot has waited 465 of its 480 s" in result.console
    assert "installer" not in result.records["fakes"]
