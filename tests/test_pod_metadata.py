"""Pods on a GPU agent, and on a k3s server, cannot reach instance metadata; the node can. Run for
real: the rendered rule script on a node made of network namespaces (a pod behind a veth on the pod
network, instance metadata in a "cloud" namespace the node routes to), before and after, twice. Needs root
(namespaces)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpu_k8s.components.k3s import paths
from tests.conftest import user_data_files
from tests.test_k3s import RENDERED

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

NODE = r"""
set -euo pipefail
mkdir -p /run/netns
mount -t tmpfs none /run/netns
ip link set lo up
ip netns add pod
ip netns add cloud
in_pod() { ip netns exec pod "$@"; }
in_cloud() { ip netns exec cloud "$@"; }
# The pod network: one pod at 10.42.0.5 behind the node's bridge address.
ip link add veth-pod type veth peer name eth0 netns pod
ip addr add 10.42.0.1/24 dev veth-pod
ip link set veth-pod up
in_pod ip link set lo up
in_pod ip addr add 10.42.0.5/24 dev eth0
in_pod ip link set eth0 up
in_pod ip route add default via 10.42.0.1
# Instance metadata is not on the node: it is routed to, as on EC2 and Compute Engine.
ip link add veth-cloud type veth peer name eth0 netns cloud
ip addr add 192.0.2.1/24 dev veth-cloud
ip link set veth-cloud up
in_cloud ip link set lo up
in_cloud ip addr add 169.254.169.254/32 dev lo
in_cloud ip addr add 192.0.2.2/24 dev eth0
in_cloud ip link set eth0 up
in_cloud ip route add 10.42.0.0/16 via 192.0.2.1
ip route add 169.254.169.254/32 via 192.0.2.2
sysctl -qw net.ipv4.ip_forward=1
in_cloud "$PYTHON" -m http.server --bind 169.254.169.254 80 > /dev/null 2>&1 &
# The server must not outlive the test (whatever runs in the metadata namespace stops with it).
trap 'ip netns pids cloud | xargs -r kill' EXIT
probe() { curl -s -o /dev/null -m 3 -w '%{http_code}' http://169.254.169.254/ || true; }
for _ in $(seq 1 50); do [ "$(probe)" = 200 ] && break; sleep 0.1; done
echo "before pod=$(in_pod bash -c "$(declare -f probe); probe") node=$(probe)"
bash "$BLOCK"
bash "$BLOCK"
echo "after pod=$(in_pod bash -c "$(declare -f probe); probe") node=$(probe)"
echo "rules=$(ip rule show | grep -c prohibit)"
"""


def run_node(block_script: str, workdir: Path) -> dict[str, str]:
    script = workdir / "block.sh"
    script.write_text(block_script)
    result = subprocess.run(
        ["unshare", "--net", "--mount", "--fork", "bash", "-c", NODE],
        env={**os.environ, "BLOCK": str(script), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    facts: dict[str, str] = {}
    for line in result.stdout.splitlines():
        phase, _, rest = line.partition(" ")
        for pair in (rest or phase).split():
            key, value = pair.split("=")
            facts[f"{phase}.{key}" if rest else key] = value
    return facts


@pytest.mark.parametrize("golden", ["aws-agent.yaml", "aws-server.yaml", "gce-server.yaml"])
def test_the_rule_refuses_metadata_to_pods_and_keeps_it_for_the_node(tmp_path, golden):
    facts = run_node(user_data_files(RENDERED[golden]())[paths.POD_METADATA_BLOCK_FILE], tmp_path)
    assert (facts["before.pod"], facts["before.node"]) == ("200", "200")
    assert (facts["after.pod"], facts["after.node"]) == ("000", "200")
    # Applied before every k3s start: still one rule however often.
    assert facts["rules"] == "1"


def test_the_node_check_would_see_a_rule_that_does_not_hold(tmp_path):
    facts = run_node("#!/bin/bash\nip rule add from 10.43.0.0/16 to 169.254.169.254/32 prohibit\n", tmp_path)
    assert facts["after.pod"] == "200"


def test_every_agent_and_server_applies_the_rule_before_k3s_starts_and_networkd_keeps_it():
    goldens = {
        "aws-agent.yaml": paths.AGENT_UNIT_DROP_IN,
        "gce-spot-agent.yaml": paths.AGENT_UNIT_DROP_IN,
        "aws-server.yaml": paths.SERVER_UNIT_DROP_IN,
        "aws-joining-server.yaml": paths.SERVER_UNIT_DROP_IN,
        "aws-single-server.yaml": paths.SERVER_UNIT_DROP_IN,
        "gce-server.yaml": paths.SERVER_UNIT_DROP_IN,
    }
    for golden, unit in goldens.items():
        files = user_data_files(RENDERED[golden]())
        assert files[unit] == f"[Service]\nExecStartPre={paths.POD_METADATA_BLOCK_FILE}\n"
        assert "ManageForeignRoutingPolicyRules=no" in files[paths.NETWORKD_DROP_IN].splitlines()
        entries = {f["path"]: f for f in yaml.safe_load(RENDERED[golden]())["write_files"]}
        assert entries[paths.POD_METADATA_BLOCK_FILE]["permissions"] == "0700"
