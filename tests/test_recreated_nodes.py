"""gcp-k3s servers delete the Node of an agent VM its group recreated under the same name (review-gcp NG10):
the script run as its servers run it (python3, beside gce_api.py), against a local metadata server and
Compute Engine on 127.0.0.1 and a stand-in kubectl; its units checked by systemd's own parser; its timer
started by a server's real first boot (tests/test_first_boot.py)."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpu_k8s.components.k3s.paths import LIB_DIR, SYSTEMD_DIR
from gpu_k8s.providers.gcp.k3s_bootstrap import FILES, RECREATED_NODES
from tests.conftest import user_data_files

TOKEN = "ya29.recreated-nodes-test"
PROJECT = "gpu-k8s-demo"
ZONE = "us-central1-a"
NODE_CREATED = "2026-12-04T10:00:00Z"
# Compute Engine writes creation times in Pacific time with an offset: 17:30 UTC, after the Node was made.
# As text it sorts before the Node's time, so a comparison of strings would keep the stale Node.
RECREATED_AT = "2026-12-04T09:30:00.123-08:00"
# 08:30 UTC: the VM is older than its Node (a kubelet restarting), though as text it sorts after.
SAME_VM_AT = "2026-12-04T10:30:00.000+02:00"


def node(name: str, ready: str, *, server: bool = False, provider: bool = True) -> dict[str, Any]:
    labels = {"node-role.kubernetes.io/control-plane": "true"} if server else {}
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": NODE_CREATED, "labels": labels},
        "spec": {"providerID": f"gce://{PROJECT}/{ZONE}/{name}"} if provider else {},
        "status": {
            "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}]
        },
    }


class Compute:
    """The metadata server's token endpoint and instances.get, with what each request carried."""

    def __init__(self, instances: dict[str, str | int]):
        self.instances = instances  # name: creationTimestamp, or an HTTP status to answer
        self.requests: list[tuple[str, dict[str, str]]] = []

    def answer(self, path: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        self.requests.append((path, headers))
        if path == "/computeMetadata/v1/instance/service-accounts/default/token":
            if headers.get("Metadata-Flavor") != "Google":
                return 403, {}
            return 200, {"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"}
        prefix = f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/"
        if not path.startswith(prefix) or headers.get("Authorization") != f"Bearer {TOKEN}":
            return 401, {}
        name, _, query = path[len(prefix) :].partition("?")
        assert query == "fields=creationTimestamp"
        found = self.instances.get(name, 404)
        return (found, {}) if isinstance(found, int) else (200, {"creationTimestamp": found})

    def asked_about(self) -> list[str]:
        paths = [path for path, _ in self.requests if "/instances/" in path]
        return [path.split("/instances/")[1].split("?")[0] for path in paths]


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[http.server.HTTPServer] = []

    def start(compute: Compute) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                status, body = compute.answer(self.path, dict(self.headers))
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()


def load_script(base: str, kubectl: Path) -> ModuleType:
    """The script as a server imports it (gce_api beside it), pointed at the local servers."""
    sys.path.insert(0, str(FILES))
    try:
        spec = importlib.util.spec_from_file_location("recreated_nodes", FILES / "recreated_nodes.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(FILES))
    sys.modules["gce_api"].METADATA = f"{base}/computeMetadata/v1"  # type: ignore[attr-defined]
    module.COMPUTE = f"{base}/compute/v1"
    module.KUBECTL = (sys.executable, str(kubectl))
    return module


def stand_in_kubectl(
    tmp_path: Path, nodes: list[dict[str, Any]] | None, replaced: tuple[str, ...] = ()
) -> tuple[Path, Path]:
    """kubectl that lists `nodes` (fails as kubectl does when None) and records each raw DELETE's path and
    body, answering Conflict, as the API server does on a failed UID precondition, for Nodes `replaced`
    since the list."""
    listing, deletes = tmp_path / "nodes.json", tmp_path / "deletes"
    if nodes is not None:
        listing.write_text(json.dumps({"items": nodes}))
    script = tmp_path / "kubectl.py"
    script.write_text(
        "import json, sys\n"
        "args = sys.argv[1:]\n"
        "if args[:2] == ['get', 'nodes']:\n"
        "    try:\n"
        f"        sys.stdout.write(open({str(listing)!r}).read())\n"
        "    except OSError:\n"
        "        sys.exit('The connection to the server 127.0.0.1:6443 was refused')\n"
        "elif args[:2] == ['delete', '--raw'] and args[3] == '-f':\n"
        "    body = json.load(open(args[4]))\n"
        f"    open({str(deletes)!r}, 'a').write(json.dumps([args[2], body]) + '\\n')\n"
        f"    if args[2].rsplit('/', 1)[1] in {list(replaced)!r}:\n"
        "        sys.exit('Error from server (Conflict): Operation cannot be fulfilled on nodes: '\n"
        "                 'Precondition failed: UID in precondition')\n"
        "else:\n"
        "    sys.exit(2)\n"
    )
    return script, deletes


def deleted(deletes: Path) -> list[tuple[str, dict[str, Any]]]:
    return [tuple(json.loads(line)) for line in deletes.read_text().splitlines()]  # type: ignore[misc]


def run(module: ModuleType, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = module.main()
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_only_the_not_ready_agent_whose_vm_is_newer_than_its_node_is_deleted(tmp_path, serve, capsys):
    nodes = [
        node("ml-gpu-l4-recreated", "Unknown"),
        node("ml-gpu-l4-restarting", "Unknown"),
        node("ml-gpu-l4-ready", "True"),
        node("ml-server-0", "Unknown", server=True),
        node("ml-gpu-l4-gone", "Unknown"),
        node("ml-gpu-l4-unregistered", "False", provider=False),
    ]
    compute = Compute(
        {
            "ml-gpu-l4-recreated": RECREATED_AT,
            "ml-gpu-l4-restarting": SAME_VM_AT,
            "ml-gpu-l4-ready": RECREATED_AT,
            "ml-server-0": RECREATED_AT,
        }
    )
    kubectl, deletes = stand_in_kubectl(tmp_path, nodes)
    code, output = run(load_script(serve(compute), kubectl), capsys)
    assert code == 0, output
    # Only if it is still the Node listed: its UID as the delete's precondition.
    assert deleted(deletes) == [
        (
            "/api/v1/nodes/ml-gpu-l4-recreated",
            {
                "kind": "DeleteOptions",
                "apiVersion": "v1",
                "preconditions": {"uid": "uid-ml-gpu-l4-recreated"},
            },
        )
    ]
    # Ready Nodes and servers are not even asked about; a VM that no longer exists is the CCM's to clean up.
    assert compute.asked_about() == ["ml-gpu-l4-recreated", "ml-gpu-l4-restarting", "ml-gpu-l4-gone"]
    assert "deleted Node ml-gpu-l4-recreated" in output and TOKEN not in output


def test_a_failing_lookup_is_reported_by_its_node_and_the_others_still_checked(tmp_path, serve, capsys):
    nodes = [node("ml-gpu-l4-unlucky", "Unknown"), node("ml-gpu-l4-recreated", "Unknown")]
    compute = Compute({"ml-gpu-l4-unlucky": 503, "ml-gpu-l4-recreated": RECREATED_AT})
    kubectl, deletes = stand_in_kubectl(tmp_path, nodes)
    code, output = run(load_script(serve(compute), kubectl), capsys)
    assert code == 1
    assert "checking Node ml-gpu-l4-unlucky failed (HTTP 503)" in output and TOKEN not in output
    assert [path for path, _ in deleted(deletes)] == ["/api/v1/nodes/ml-gpu-l4-recreated"]


def test_a_node_another_server_already_replaced_is_left_to_its_new_vm(tmp_path, serve, capsys):
    """Every server runs the check: the new VM's Node may have registered since this one listed the old."""
    compute = Compute({"ml-gpu-l4-recreated": RECREATED_AT})
    listed = [node("ml-gpu-l4-recreated", "Unknown")]
    kubectl, deletes = stand_in_kubectl(tmp_path, listed, replaced=("ml-gpu-l4-recreated",))
    code, output = run(load_script(serve(compute), kubectl), capsys)
    assert code == 0, output
    assert len(deleted(deletes)) == 1 and "deleted Node" not in output


def test_an_api_server_that_does_not_answer_fails_the_run_without_a_traceback(tmp_path, serve, capsys):
    kubectl, deletes = stand_in_kubectl(tmp_path, None)
    code, output = run(load_script(serve(Compute({})), kubectl), capsys)
    assert code == 1
    assert output.strip() == (
        "gpu-k8s: listing Nodes failed (kubectl: The connection to the server 127.0.0.1:6443 was refused)"
    )
    assert not deletes.exists()


# --- how the servers run it ---------------------------------------------------------------------------------


def gce_server_files(gcp_k3s) -> dict[str, str]:
    (server, *_) = [r for r in gcp_k3s.by_type("gcp:compute/instance:Instance") if "server" in r.name]
    return user_data_files(server.inputs["metadata"]["user-data"])


def test_gcp_k3s_servers_carry_the_script_and_its_timer_and_agents_do_not(gcp_k3s):
    files = gce_server_files(gcp_k3s)
    assert files[f"{LIB_DIR}/gpu-k8s-recreated-nodes.py"] == (FILES / "recreated_nodes.py").read_text()
    assert f"{LIB_DIR}/gce_api.py" in files  # what it imports, beside it
    service = files[f"{SYSTEMD_DIR}/gpu-k8s-recreated-nodes.service"]
    assert f"ExecStart=/usr/bin/python3 {LIB_DIR}/gpu-k8s-recreated-nodes.py" in service.splitlines()
    timer = files[f"{SYSTEMD_DIR}/gpu-k8s-recreated-nodes.timer"].splitlines()
    # The first run a minute after the boot starts it (OnUnitActiveSec alone never fires before one), then
    # a minute after each, within 5 s.
    assert {"OnActiveSec=1min", "OnUnitActiveSec=1min", "AccuracySec=5s"} <= set(timer)
    for template in gcp_k3s.by_type("gcp:compute/instanceTemplate:InstanceTemplate"):
        agent_files = user_data_files(template.inputs["metadata"]["user-data"])
        assert not [path for path in agent_files if "recreated" in path]


def test_systemd_parses_the_units(tmp_path):
    """systemd-analyze verify: the units' sections, settings and time spans as systemd reads them."""
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-analyze is missing (Debian's systemd package; .ci/run installs it)")
        pytest.skip("systemd-analyze is not installed")
    for unit, text in RECREATED_NODES.units().items():
        (tmp_path / unit).write_text(text)
    timer = tmp_path / "gpu-k8s-recreated-nodes.timer"
    result = subprocess.run([analyze, "verify", str(timer)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
    timer.write_text(timer.read_text().replace("OnUnitActiveSec=1min", "OnUnitActiveSec=1 minte"))
    broken = subprocess.run([analyze, "verify", str(timer)], capture_output=True, text=True, cwd=tmp_path)
    assert "Failed to parse" in broken.stderr  # the check reads the values, so it could fail
