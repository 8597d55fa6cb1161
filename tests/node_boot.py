"""Boot a k3s node's rendered cloud-config for real, on this machine, against local fakes of its cloud.

`boot()` (called by the tests) runs this module as root in fresh network and mount namespaces
(`unshare --net --mount`). There, `main()`:
- gives the namespace only a loopback interface, with the metadata address (169.254.169.254) and the first
  server's address on it, so the node can reach the fakes and nothing else;
- starts the fakes: the cloud's metadata service (IMDSv2, or GCE's), an HTTPS endpoint that serves the
  secret store (AWS: moto's real Secrets Manager, signatures checked against an STS role's credentials;
  GCP: a Secret Manager fake that checks the bearer token), the k3s install script (a stand-in that records
  how it was called) and the first server's /cacerts;
- lays an overlay over `/` whose upper layer catches every write, bind-mounts an `/etc/hosts` naming the fakes
  and a CA bundle holding only the fakes' CA, and replaces `sleep`, `sysctl` and `systemctl` by recorders on
  PATH (the host's kernel settings and services are never touched; retry back-off takes no time);
- does what cloud-init does with the document (write_files, then runcmd) in a chroot of that overlay;
- copies what the node wrote, the console, and what each fake saw into the work directory.

The node gets the rendered files unchanged; only the world around them is fake.
"""

from __future__ import annotations

import base64
import http.server
import ipaddress
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

METADATA_ADDRESS = "169.254.169.254"
NODE_PATH = "/mnt:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
AWS_ACCOUNT = "123456789012"
GCE_TOKEN = "ya29.gpu-k8s-test-token"
INSTALLER_HOST = "raw.githubusercontent.com"
GCP_SECRETS_HOST = "secretmanager.googleapis.com"
GCP_STORAGE_HOST = "storage.googleapis.com"
# What the stand-in k3s installer records (the real one would download and start k3s).
FAKE_INSTALLER = """#!/bin/sh
{
  echo "INSTALL_K3S_VERSION=${INSTALL_K3S_VERSION:-}"
  echo "INSTALL_K3S_EXEC=${INSTALL_K3S_EXEC:-}"
  echo "INSTALL_K3S_SKIP_ENABLE=${INSTALL_K3S_SKIP_ENABLE:-}"
  echo "INSTALL_K3S_SKIP_START=${INSTALL_K3S_SKIP_START:-}"
  echo "ARGS=$*"
} > /mnt/records/installer
echo install >> /mnt/records/sequence
"""
FAILING_INSTALLER = '#!/bin/sh\necho "[ERROR]  Download failed" >&2\nexit 1\n'
FAKE_SLEEP = '#!/bin/sh\necho "$1" >> /mnt/records/sleeps\n'
# The chroot has no systemd running: what the boot asks of it is recorded.
FAKE_SYSTEMCTL = '#!/bin/sh\necho "$*" >> /mnt/records/systemctl\n'
FAKE_SYSCTL = """#!/bin/sh
echo "$*" >> /mnt/records/sysctl
cat /etc/sysctl.d/*.conf >> /mnt/records/sysctl-files
echo sysctl >> /mnt/records/sequence
"""


@dataclass
class Scenario:
    """One boot: the node's cloud-config and the state of the world around it."""

    cloud: str  # aws | gce
    user_data: str
    secret_id: str  # as the user data names it
    secret_payload: str
    facts: dict[str, str]  # zone, instance_type, instance_id (aws) / name, project (gce)
    server_address: str | None = None  # the registration address agents wait for: an IP or a DNS name
    peer_addresses: list[str] = field(default_factory=list)  # a server's other servers (IPs)
    answering_peers: list[str] = field(default_factory=list)  # those of them that run k3s already
    peer_refusals: int = 0  # the first N questions to those close the connection unanswered (k3s starting)
    secret_store_failures: int = 0  # the first N secret reads answer 503; -1: every one
    # AWS: what the instance profile's credentials are worth: valid, a wrong secret key (the store must
    # refuse the signature), or valid but without read permission (the store must refuse the call).
    aws_credentials: str = "valid"
    server_up: bool = True
    installer_failures: int = 0  # the first N runs of the install script fail, as a failed download would
    # A server's snapshot bucket (named in its k3s config) and what it holds at boot (key: content).
    snapshot_bucket: str = ""
    bucket_objects: dict[str, str] = field(default_factory=dict)
    # A server's own k3s answers on 127.0.0.1:6443 once the (stand-in) install has run, unless this is False:
    # a first start that failed without the install script noticing.
    local_server_starts: bool = True
    workdir: str = ""

    @property
    def region(self) -> str:
        return self.facts["zone"][:-1] if self.cloud == "aws" else self.facts["zone"].rsplit("-", 1)[0]


@dataclass
class BootResult:
    exit_code: int
    console: str
    written: Path  # what the node wrote, as a tree rooted like /
    records: dict[str, Any] = field(default_factory=dict)

    def file(self, path: str) -> Path:
        return self.written / path.lstrip("/")


def boot(scenario: Scenario, workdir: Path, timeout: float = 120) -> BootResult:
    """Boot the scenario's node in its own namespaces; returns what happened."""
    scenario.workdir = str(workdir)
    (workdir / "scenario.json").write_text(json.dumps(scenario.__dict__))
    project_root = Path(__file__).resolve().parent.parent
    subprocess.run(
        ["unshare", "--net", "--mount", "--fork", sys.executable, "-m", "tests.node_boot", str(workdir)],
        cwd=project_root,
        check=True,
        timeout=timeout,
        capture_output=True,
    )
    outcome = json.loads((workdir / "outcome.json").read_text())
    return BootResult(
        outcome["exit_code"], (workdir / "console.log").read_text(), workdir / "written", outcome
    )


# --- inside the namespaces ----------------------------------------------------------------------------


class Fakes:
    """What every fake saw, shared by the servers' threads."""

    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        self.lock = threading.Lock()
        self.log: list[dict[str, Any]] = []
        self.secret_reads = 0
        self.secret_answers = 0
        self.installer_fetches = 0
        self.peer_questions = 0

    def record(self, **entry: Any) -> None:
        with self.lock:
            self.log.append(entry)

    def secret_store_down(self) -> bool:
        with self.lock:
            self.secret_reads += 1
            failures = self.scenario.secret_store_failures
            return failures < 0 or self.secret_reads <= failures

    def installer(self, path: str) -> tuple[int, dict[str, str], bytes]:
        if not path.startswith("/k3s-io/k3s/") or not path.endswith("/install.sh"):
            return _text(404, "not found")
        with self.lock:
            self.installer_fetches += 1
            failing = self.installer_fetches <= self.scenario.installer_failures
        return _text(200, FAILING_INSTALLER if failing else FAKE_INSTALLER)

    def peer_refuses(self) -> bool:
        with self.lock:
            self.peer_questions += 1
            return self.peer_questions <= self.scenario.peer_refusals

    def secret_answered(self, status: int) -> None:
        with self.lock:
            self.secret_answers += status == 200


def _handler(fakes: Fakes, respond):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            host = (self.headers.get("Host") or "").split(":")[0]
            status, headers, payload = respond(self.command, host, self.path, self.headers, body)
            error = payload[:300].decode(errors="replace") if status >= 400 else ""
            fakes.record(host=host, method=self.command, path=self.path, status=status, error=error)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_PUT = do_POST = _serve

    return Handler


def _peer_handler(fakes: Fakes):
    """A running server's /cacerts; while it refuses, the connection closes without an answer."""
    answer = _handler(fakes, lambda *a: _text(200, "server CA bundle"))

    class Peer(answer):  # type: ignore[misc, valid-type]
        def handle(self) -> None:
            if fakes.peer_refuses():
                fakes.record(host="peer", method="", path="", status=0, error="closed")
                return
            super().handle()

    return Peer


def _local_server_handler(fakes: Fakes, installed: Path):
    """The node's own k3s: /cacerts answers once the install has run (and the scenario lets it start)."""
    answer = _handler(fakes, lambda *a: _text(200, "server CA bundle"))

    class LocalServer(answer):  # type: ignore[misc, valid-type]
        def handle(self) -> None:
            if not (installed.exists() and fakes.scenario.local_server_starts):
                fakes.record(host="local-server", method="", path="", status=0, error="closed")
                return
            super().handle()

    return LocalServer


def _serve(address: str, port: int, handler, tls: ssl.SSLContext | None = None) -> None:
    server = http.server.ThreadingHTTPServer((address, port), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def _text(status: int, text: str, content_type: str = "text/plain") -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": content_type}, text.encode()


class AwsWorld:
    """IMDSv2 and a real Secrets Manager (moto) that checks SigV4 against an STS role's credentials."""

    ROLE = "ml-k3s-node-role"

    def __init__(self, fakes: Fakes, tls_bundle: str):
        import botocore.session

        # moto checks credentials and IAM policies from the first request on, once set up here.
        from moto import settings as moto_settings
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

        self.fakes = fakes
        self.scenario = fakes.scenario
        self.moto = DomainDispatcherApplication(create_backend_app)
        self.token = "imds-session-token"
        session = botocore.session.get_session()
        session.set_credentials("AKIASETUPSETUPSETUP1", "setup-secret")
        self._tls_bundle = tls_bundle
        self._session = session
        self._moto_settings = moto_settings
        self.credentials: dict[str, str] = {}

    def client(self, service: str):
        return self._session.create_client(
            service,
            region_name=self.scenario.region,
            endpoint_url="https://127.0.0.1",
            verify=self._tls_bundle,
        )

    def set_up(self) -> str:
        """The role, its read permission on the secret (and on a server's snapshot bucket), its STS
        credentials, the secret and the bucket; returns the secret's ARN. From then on every request is
        authenticated and authorised."""
        if self.scenario.snapshot_bucket:
            s3 = self.client("s3")
            s3.create_bucket(Bucket=self.scenario.snapshot_bucket)
            for key, content in self.scenario.bucket_objects.items():
                s3.put_object(Bucket=self.scenario.snapshot_bucket, Key=key, Body=content.encode())
        secrets = self.client("secretsmanager")
        arn = secrets.create_secret(
            Name=self.scenario.secret_id.rsplit(":", 1)[-1].rsplit("-", 1)[0],
            SecretString=self.scenario.secret_payload,
        )["ARN"]
        iam = self.client("iam")
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
            ],
        }
        role_arn = iam.create_role(RoleName=self.ROLE, AssumeRolePolicyDocument=json.dumps(trust))["Role"][
            "Arn"
        ]
        # moto evaluates the action and the caller, not the resource (it authorises against "*"); the
        # policy's scoping to the secret's ARN is checked by the IAM tests of the plan.
        read = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Action": "secretsmanager:GetSecretValue", "Resource": "*"},
                {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:PutObject"], "Resource": "*"},
            ],
        }
        if self.scenario.aws_credentials != "no-permission":
            iam.put_role_policy(
                RoleName=self.ROLE, PolicyName="read-bootstrap", PolicyDocument=json.dumps(read)
            )
        assumed = self.client("sts").assume_role(RoleArn=role_arn, RoleSessionName="i-node")["Credentials"]
        self.credentials = {
            "Code": "Success",
            "Type": "AWS-HMAC",
            "AccessKeyId": assumed["AccessKeyId"],
            "SecretAccessKey": assumed["SecretAccessKey"]
            + ("x" if self.scenario.aws_credentials == "wrong-key" else ""),
            "Token": assumed["SessionToken"],
            "Expiration": assumed["Expiration"].isoformat(),
        }
        self._moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
        return arn

    def bucket_objects(self) -> dict[str, int]:
        """What the snapshot bucket holds after the boot (key: size), read without the node's credentials."""
        if not self.scenario.snapshot_bucket:
            return {}
        self._moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = float("inf")
        listed = self.client("s3").list_objects_v2(Bucket=self.scenario.snapshot_bucket).get("Contents", [])
        return {entry["Key"]: entry["Size"] for entry in listed}

    def metadata(self, method: str, host: str, path: str, headers: Any, body: bytes):
        if method == "PUT" and path == "/latest/api/token":
            if "X-aws-ec2-metadata-token-ttl-seconds" not in headers:
                return _text(400, "missing TTL")
            return _text(200, self.token)
        if headers.get("X-aws-ec2-metadata-token") != self.token:
            return _text(401, "IMDSv2 token required")
        facts = self.scenario.facts
        answers = {
            "/latest/meta-data/placement/availability-zone": facts["zone"],
            "/latest/meta-data/placement/region": self.scenario.region,
            "/latest/meta-data/instance-type": facts["instance_type"],
            "/latest/meta-data/instance-id": facts["instance_id"],
            "/latest/meta-data/iam/security-credentials/": self.ROLE,
            f"/latest/meta-data/iam/security-credentials/{self.ROLE}": json.dumps(self.credentials),
        }
        return _text(200, answers[path]) if path in answers else _text(404, "not found")

    def https(self, method: str, host: str, path: str, headers: Any, body: bytes):
        if host == INSTALLER_HOST:
            return self.fakes.installer(path)
        target = headers.get("X-Amz-Target", "")
        if target != "secretsmanager.GetSecretValue":
            return _wsgi(self.moto, method, host, path, headers, body)
        if self.fakes.secret_store_down():
            return _text(503, '{"__type":"ServiceUnavailable"}', "application/x-amz-json-1.1")
        answer = _wsgi(self.moto, method, host, path, headers, body)
        self.fakes.secret_answered(answer[0])
        return answer


class GceWorld:
    """GCE's metadata server and a Secret Manager that answers the node's service-account token."""

    def __init__(self, fakes: Fakes):
        self.fakes = fakes
        self.scenario = fakes.scenario
        self.objects = {key: len(content.encode()) for key, content in self.scenario.bucket_objects.items()}

    def bucket_objects(self) -> dict[str, int]:
        return dict(self.objects)

    def storage(self, method: str, path: str, body: bytes):
        """Cloud Storage's JSON API: objects.list and a media upload, to the server's bucket only."""
        from urllib.parse import parse_qs, urlsplit

        url = urlsplit(path)
        query = {key: values[0] for key, values in parse_qs(url.query).items()}
        bucket = self.scenario.snapshot_bucket
        if method == "GET" and url.path == f"/storage/v1/b/{bucket}/o":
            names = sorted(self.objects)[: int(query.get("maxResults", "1000"))]
            document = {
                "kind": "storage#objects",
                **({"items": [{"name": n} for n in names]} if names else {}),
            }
            return _text(200, json.dumps(document), "application/json")
        if (
            method == "POST"
            and url.path == f"/upload/storage/v1/b/{bucket}/o"
            and query.get("uploadType") == "media"
        ):
            self.objects[query["name"]] = len(body)
            return _text(200, json.dumps({"name": query["name"], "bucket": bucket}), "application/json")
        return _text(404, '{"error": {"code": 404}}', "application/json")

    def metadata(self, method: str, host: str, path: str, headers: Any, body: bytes):
        if headers.get("Metadata-Flavor") != "Google":
            return _text(403, "Metadata-Flavor: Google required")
        facts = self.scenario.facts
        base = "/computeMetadata/v1/"
        answers = {
            "instance/zone": f"projects/123456789012/zones/{facts['zone']}",
            "instance/machine-type": f"projects/123456789012/machineTypes/{facts['instance_type']}",
            "instance/name": facts["name"],
            "project/project-id": facts["project"],
            "instance/service-accounts/default/token": json.dumps(
                {"access_token": GCE_TOKEN, "expires_in": 3599, "token_type": "Bearer"}
            ),
        }
        key = path.removeprefix(base)
        return (
            _text(200, answers[key]) if path.startswith(base) and key in answers else _text(404, "not found")
        )

    def https(self, method: str, host: str, path: str, headers: Any, body: bytes):
        if host == INSTALLER_HOST:
            return self.fakes.installer(path)
        if host not in (GCP_SECRETS_HOST, GCP_STORAGE_HOST):
            return _text(404, "unknown host")
        if headers.get("Authorization") != f"Bearer {GCE_TOKEN}":
            return _text(401, "bad token")
        if host == GCP_STORAGE_HOST:
            return self.storage(method, path, body)
        if path != f"/v1/{self.scenario.secret_id}/versions/latest:access":
            return _text(404, "no such secret")
        if self.fakes.secret_store_down():
            return _text(503, '{"error": {"code": 503}}', "application/json")
        data = base64.b64encode(self.scenario.secret_payload.encode()).decode()
        document = {"name": f"{self.scenario.secret_id}/versions/1", "payload": {"data": data}}
        self.fakes.secret_answered(200)
        return _text(200, json.dumps(document), "application/json")


def _wsgi(app, method: str, host: str, path: str, headers: Any, body: bytes):
    """Call a WSGI application (moto) with one request."""
    import io
    from urllib.parse import urlsplit

    url = urlsplit(path)
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": url.path,
        "QUERY_STRING": url.query,
        "SERVER_NAME": host,
        "SERVER_PORT": "443",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.url_scheme": "https",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.version": (1, 0),
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        "CONTENT_LENGTH": str(len(body)),
        "CONTENT_TYPE": headers.get("Content-Type", ""),
        "HTTP_HOST": headers.get("Host", host),
    }
    for key, value in headers.items():
        environ.setdefault("HTTP_" + key.upper().replace("-", "_"), value)
    status: list[str] = []
    response_headers: list[tuple[str, str]] = []

    def start_response(status_line: str, headers_list: list[tuple[str, str]], exc_info: Any = None) -> None:
        status.append(status_line)
        response_headers.extend(headers_list)

    payload = b"".join(app(environ, start_response))
    skip = {"content-length", "transfer-encoding", "connection"}
    return int(status[0].split()[0]), {k: v for k, v in response_headers if k.lower() not in skip}, payload


def _make_tls(workdir: Path, hosts: list[str]) -> tuple[ssl.SSLContext, str]:
    """A CA and a server certificate for `hosts`; returns the server context and the CA bundle path."""
    from tests.certs import certificate, new_key, pem

    ca_key, key = new_key(), new_key()
    ca = certificate("gpu-k8s test CA", ca_key, ca_key, "gpu-k8s test CA", True)
    leaf = certificate(hosts[0], key, ca_key, "gpu-k8s test CA", False, dns_names=hosts, ips=["127.0.0.1"])
    (workdir / "ca.pem").write_bytes(pem(ca))
    (workdir / "server.pem").write_bytes(pem(leaf) + pem(ca))
    (workdir / "server.key").write_bytes(pem(key))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(workdir / "server.pem", workdir / "server.key")
    return context, str(workdir / "ca.pem")


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _sh(*args: str) -> None:
    subprocess.run(args, check=True)


def _prepare_root(workdir: Path, hosts_file: Path, ca_bundle: str) -> Path:
    layers = workdir / "layers"
    layers.mkdir()
    _sh("mount", "--make-rprivate", "/")
    _sh("mount", "-t", "tmpfs", "tmpfs", str(layers))
    for name in ("upper", "work", "root"):
        (layers / name).mkdir()
    root = layers / "root"
    _sh(
        "mount",
        "-t",
        "overlay",
        "overlay",
        "-o",
        f"lowerdir=/,upperdir={layers}/upper,workdir={layers}/work",
        str(root),
    )
    _sh("mount", "-t", "proc", "proc", str(root / "proc"))
    # Kernel settings are the host's: read-only to the node, whose sysctl is the recorder on PATH anyway.
    _sh("mount", "--bind", str(root / "proc" / "sys"), str(root / "proc" / "sys"))
    _sh("mount", "-o", "remount,bind,ro", str(root / "proc" / "sys"))
    _sh("mount", "--rbind", "/dev", str(root / "dev"))
    console = workdir / "console.log"
    console.touch()
    _sh("mount", "--bind", str(console), str(root / "dev" / "console"))
    _sh("mount", "-t", "tmpfs", "tmpfs", str(root / "tmp"))
    _sh("mount", "--bind", str(hosts_file), str(root / "etc" / "hosts"))
    _sh("mount", "--bind", ca_bundle, str(root / "etc" / "ssl" / "certs" / "ca-certificates.crt"))
    fakes_dir = workdir / "fakes"
    (fakes_dir / "records").mkdir(parents=True)
    for name, script in (("sleep", FAKE_SLEEP), ("sysctl", FAKE_SYSCTL), ("systemctl", FAKE_SYSTEMCTL)):
        (fakes_dir / name).write_text(script)
        (fakes_dir / name).chmod(0o755)
    _sh("mount", "--bind", str(fakes_dir), str(root / "mnt"))
    return root


def file_content(entry: dict[str, Any]) -> str:
    """A write_files entry's content as cloud-init writes it (the renders use no `encoding`)."""
    assert "encoding" not in entry, f"{entry['path']}: the harness reads plain content only"
    return entry["content"]


def _cloud_init(root: Path, document: dict[str, Any]) -> int:
    """cloud-init's write_files (content decoded, mode and owner as given), then each runcmd entry in
    order."""
    for entry in document.get("write_files", []):
        target = root / entry["path"].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(file_content(entry))
        target.chmod(int(entry.get("permissions", "0644"), 8))
        os.chown(target, 0, 0)
    for command in document.get("runcmd", []):
        argv = command if isinstance(command, list) else ["sh", "-c", command]
        result = subprocess.run(
            ["chroot", str(root), *argv],
            env={"PATH": NODE_PATH, "HOME": "/root", "LANG": "C.UTF-8"},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=300,
        )
        if result.returncode != 0:
            return result.returncode
    return 0


def main(workdir: Path) -> None:
    scenario = Scenario(**json.loads((workdir / "scenario.json").read_text()))
    _sh("ip", "link", "set", "lo", "up")
    _sh("ip", "addr", "add", f"{METADATA_ADDRESS}/32", "dev", "lo")
    # Servers the node may ask, each on an address of its own; a DNS name (an AWS balancer) gets one too.
    addresses: dict[str, str] = {}
    for host in filter(None, [scenario.server_address, *scenario.peer_addresses]):
        addresses[host] = host if _is_address(host) else f"10.255.255.{len(addresses) + 1}"
        _sh("ip", "addr", "add", f"{addresses[host]}/32", "dev", "lo")
    fakes = Fakes(scenario)
    secrets_host = (
        f"secretsmanager.{scenario.region}.amazonaws.com" if scenario.cloud == "aws" else GCP_SECRETS_HOST
    )
    storage_host = f"s3.{scenario.region}.amazonaws.com" if scenario.cloud == "aws" else GCP_STORAGE_HOST
    tls, ca_bundle = _make_tls(workdir, [secrets_host, storage_host, INSTALLER_HOST])
    world: AwsWorld | GceWorld = AwsWorld(fakes, ca_bundle) if scenario.cloud == "aws" else GceWorld(fakes)
    _serve(METADATA_ADDRESS, 80, _handler(fakes, world.metadata))
    _serve("127.0.0.1", 443, _handler(fakes, world.https), tls)
    user_data = scenario.user_data
    if isinstance(world, AwsWorld):
        # The store names the secret (its ARN ends in a suffix it picks); the node is told that ARN.
        user_data = user_data.replace(scenario.secret_id, world.set_up())
    answering = [*scenario.answering_peers]
    if scenario.server_address and scenario.server_up:
        answering.append(scenario.server_address)
    for host in answering:
        _serve(addresses[host], 6443, _peer_handler(fakes), tls)
    _serve("127.0.0.1", 6443, _local_server_handler(fakes, workdir / "fakes" / "records" / "installer"), tls)
    hosts = workdir / "hosts"
    hosts.write_text(
        "127.0.0.1 localhost\n"
        f"127.0.0.1 {secrets_host} {storage_host} {INSTALLER_HOST}\n"
        f"{METADATA_ADDRESS} metadata.google.internal\n"
        + "".join(f"{address} {host}\n" for host, address in addresses.items() if host != address)
    )
    root = _prepare_root(workdir, hosts, ca_bundle)
    exit_code = _cloud_init(root, yaml.safe_load(user_data))
    time.sleep(0.2)  # the script's console tee flushes as the script exits
    shutil.copytree(workdir / "layers" / "upper", workdir / "written", symlinks=True)
    records = {p.name: p.read_text() for p in (workdir / "fakes" / "records").iterdir()}
    outcome = {
        "exit_code": exit_code,
        "requests": fakes.log,
        "secret_reads": fakes.secret_reads,
        "secret_answers": fakes.secret_answers,
        "installer_fetches": fakes.installer_fetches,
        "bucket_objects": world.bucket_objects(),
        "fakes": records,
    }
    (workdir / "outcome.json").write_text(json.dumps(outcome))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
