"""The first-boot shell of a k3s node: kernel settings, node facts, secrets, the node's config, waiting
for the cluster or founding it, the install, and what a server starts once its k3s answers."""

from __future__ import annotations

import shlex
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote

from gpu_k8s.components.k3s.paths import (
    API_PORT,
    AUDIT_LOG_DIR,
    FETCH_FILE,
    INSTALL_FILE,
    LIB_DIR,
    NODE_CONFIG,
    NODE_FACTS_FILE,
    SNAPSHOT_STORE_FILE,
    WRITE_SECRET_FILES_FILE,
)

# Kubelet settings of the k3s CIS hardening guide ("v1.29 and Newer").
KUBELET_ARGS = (
    "streaming-connection-idle-timeout=5m",
    "tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,"
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,"
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305,TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
)
# The install script at the release's tag, so the script is pinned with the binary it installs (it then
# checks the binary against the release's sha256sum file).
INSTALL_SCRIPT_URL = "https://raw.githubusercontent.com/k3s-io/k3s/{tag}/install.sh"

# First-boot steps that wait on something else (the server, the node's identity reaching the secret store)
# are tried again, waiting 5 s longer each time up to 30 s, until the boot has spent this many seconds
# waiting, every step together. A GPU agent must register before the cluster-autoscaler gives up on it and
# deletes it (--max-node-provision-time, 15m0s by default: the cluster-autoscaler chart 9.59.0's values),
# instance start and the install taking their share: a later success would only be thrown away. Servers
# have no such clock.
WAIT_BUDGET_SECONDS = {"agent": 600, "server": 1800}
# Of that, what waiting for another node (the server, a peer) may not take: the install, and on a server the
# check that its k3s answers, always get these seconds of retries.
INSTALL_RESERVE_SECONDS = {"agent": 120, "server": 300}
# How often the first server asks the others whether a cluster already runs before it founds one. On the
# cluster's first boot none can answer (they wait for it); after a replacement they answer at once.
PEER_CHECKS = 3


def install_url(version: str) -> str:
    return INSTALL_SCRIPT_URL.format(tag=quote(version, safe=""))


@dataclass(frozen=True)
class ServerTask:
    """A Python script a server runs every `every` (a systemd time span) as a oneshot unit `name`, beside
    the node scripts (it may import their support files); its output goes to the journal."""

    name: str
    description: str
    script: str
    every: str

    @property
    def script_path(self) -> str:
        return f"{LIB_DIR}/{self.name}.py"

    def units(self) -> dict[str, str]:
        """The service and its timer (unit file name: content); the timer starts the service `every` after
        it is started and after each run, within 5 s (systemd's default accuracy is a minute)."""
        service = (
            f"[Unit]\nDescription={self.description}\nAfter=k3s.service\n\n"
            f"[Service]\nType=oneshot\nExecStart=/usr/bin/python3 {self.script_path}\n"
        )
        timer = (
            f"[Unit]\nDescription={self.description}, every {self.every}\n\n"
            f"[Timer]\nOnActiveSec={self.every}\nOnUnitActiveSec={self.every}\nAccuracySec=5s\n\n"
            "[Install]\nWantedBy=timers.target\n"
        )
        return {f"{self.name}.service": service, f"{self.name}.timer": timer}


def _list_block(key: str, items: Sequence[str]) -> list[str]:
    return [f"{key}:", *(f'  - "{item}"' for item in items)]


def bootstrap_script(
    role: Literal["server", "agent"],
    k3s_version: str,
    secret_name: str,
    labels: Mapping[str, str],
    taints: Sequence[str],
    start: str,
    external_cloud_provider: bool,
    kubelet_args: Sequence[str] = (),
    prepare: str = "",
    started: str = "",
) -> str:
    """The first-boot script: kernel settings, node facts, secrets, node config, `start` (the shell that
    waits for the cluster, or decides how to start it), install k3s, `started` (what follows once k3s
    runs). `start` may set `skip_start=true`: k3s is then installed, neither enabled nor started.

    Label and taint strings are validated by the spec (no shell or YAML metacharacters); they are quoted
    anyway. The node's facts become k3s settings here because they exist only on the node.
    """
    cloud_provider = ["cloud-provider=external"] if external_cloud_provider else []
    node_lines = [
        'node-name: "${NODE_NAME}"',
        *_list_block(
            "kubelet-arg", ["provider-id=${PROVIDER_ID}", *cloud_provider, *KUBELET_ARGS, *kubelet_args]
        ),
        *_list_block(
            "node-label",
            [
                "node.kubernetes.io/instance-type=${INSTANCE_TYPE}",
                "topology.kubernetes.io/zone=${ZONE}",
                "topology.kubernetes.io/region=${REGION}",
                *(f"{key}={value}" for key, value in sorted(labels.items())),
            ],
        ),
    ]
    if taints:
        node_lines += _list_block("node-taint", list(taints))
    node_config = "\n".join(node_lines)
    if role == "server":
        prepare = f"install -d -m 0700 {AUDIT_LOG_DIR}\n{prepare}"
    budget = WAIT_BUDGET_SECONDS[role]
    wait_line = (
        "# Waiting for another node ends here, so the install keeps its share.\n"
        f"wait_limit={budget - INSTALL_RESERVE_SECONDS[role]}\n"
        if "$wait_limit" in start
        else ""
    )
    return f"""#!/bin/bash
# gpu-k8s first boot of a k3s {role}. Progress goes to the serial console; no secret is ever printed.
set -euo pipefail
exec > >(tee -a /var/log/gpu-k8s-bootstrap.log > /dev/console) 2>&1
log() {{ echo "gpu-k8s: $*"; }}
# Seconds this boot has waited between attempts, every step together: at most {budget}. (Waits, not the
# attempts' own time: each question times out within seconds.)
waited=0
{wait_line}# keep_trying <what> <command> [limit]: run the command until it succeeds, waiting longer each
# time; fail once the next wait would take the boot past `limit` ({budget} by default) seconds of waiting.
keep_trying() {{
  local attempt=0 pause limit=${{3:-{budget}}}
  while true; do
    attempt=$((attempt + 1))
    if "$2"; then
      log "$1: done"
      return 0
    fi
    pause=$((attempt < 6 ? attempt * 5 : 30))
    if [ $((waited + pause)) -gt "$limit" ]; then
      log "$1: attempt $attempt failed, and this boot has waited $waited of its $limit s"
      return 1
    fi
    log "$1: attempt $attempt failed; trying again in $pause s"
    sleep "$pause"
    waited=$((waited + pause))
  done
}}
# retry <what> <command> [limit]: keep_trying, and end the boot when that fails.
retry() {{
  keep_trying "$@" || {{
    log "$1: giving up"
    exit 1
  }}
}}
skip_start=false

log "applying the kernel settings the kubelet requires"
sysctl --system > /dev/null
# shellcheck source=/dev/null
. {NODE_FACTS_FILE}
log "node $PROVIDER_ID ($INSTANCE_TYPE in $ZONE)"
read_secrets() {{ python3 {FETCH_FILE} {shlex.quote(secret_name)} | python3 {WRITE_SECRET_FILES_FILE}; }}
retry "reading bootstrap secrets from {secret_name}" read_secrets
{prepare}mkdir -p "$(dirname {NODE_CONFIG})"
cat > {NODE_CONFIG} <<NODE_CONFIG
{node_config}
NODE_CONFIG
{start}
# The install script downloads the binary itself, without retrying: the whole step is retried. A retry
# restarts k3s even when the files are unchanged (the install script skips the start then, so a failed
# first start would otherwise pass for a started one).
install_k3s() {{
  curl -sfL --connect-timeout 10 --max-time 60 --retry 10 --retry-connrefused -o {INSTALL_FILE} \\
    {shlex.quote(install_url(k3s_version))} &&
    INSTALL_K3S_SKIP_ENABLE=$skip_start INSTALL_K3S_SKIP_START=$skip_start INSTALL_K3S_FORCE_RESTART=true \\
      INSTALL_K3S_VERSION={shlex.quote(k3s_version)} INSTALL_K3S_EXEC={role} sh {INSTALL_FILE}
}}
retry "installing k3s {k3s_version}" install_k3s
{started}"""


def wait_for_server(url: str) -> str:
    """An agent installs k3s only once the registration address answers."""
    return f"""
server={shlex.quote(url)}
server_answers() {{ curl -sk --max-time 5 -o /dev/null "$server/cacerts"; }}
retry "waiting for server $server" server_answers "$wait_limit"
"""


def join_or_found(peer_urls: Sequence[str], founder: bool, bucket: str) -> str:
    """A server joins the first other server that answers. Only the founder ever founds the cluster, and only
    when no other server answers (it asks PEER_CHECKS times) and the snapshot bucket is empty: the cluster's
    first boot. A bucket holding anything (a snapshot, the marker written once the founder's k3s runs) means
    the cluster was founded before, so the founder waits for a peer like the others; if none answers (every
    server was lost) it installs k3s without starting it, for a restore by hand, and the boot fails.
    Founding again would make an empty cluster beside the snapshots (and, where peers come back, a second
    one)."""
    store = f"python3 {SNAPSHOT_STORE_FILE}"
    quoted_bucket = shlex.quote(bucket)
    ask_store = f"""snapshot_bucket={quoted_bucket}
ask_snapshot_bucket() {{ bucket_says=$({store} founded "$snapshot_bucket"); }}
retry "asking the snapshot bucket $snapshot_bucket whether the cluster was founded before" ask_snapshot_bucket
"""
    found = f"""log "founding the cluster"
echo "cluster-init: true" >> {NODE_CONFIG}
founding=true"""
    refuse = """log "the snapshot bucket $snapshot_bucket shows the cluster was founded before: not again"
"""
    restore = """log "no server answers: installing k3s without starting it, for a restore"
skip_start=true"""
    join = f"""log "joining the cluster through $peer"
printf 'server: "%s"\\n' "$peer" >> {NODE_CONFIG}"""
    if not peer_urls:
        decide = f"""{ask_store}if [ "$bucket_says" = new ]; then
{textwrap.indent(found, "  ")}
else
{textwrap.indent(refuse + restore, "  ")}
fi"""
        return f"\nfounding=false\n{decide}\n"
    if founder:
        peer_wait = 'keep_trying "waiting for another server to join" answering_peer "$wait_limit"'
        wait_or_restore = f"""if {peer_wait}; then
{textwrap.indent(join, "  ")}
  return 0
fi
"""
        decide = f"""for check in $(seq 1 {PEER_CHECKS}); do
  answering_peer && break
  log "no other server answers (check $check of {PEER_CHECKS})"
  sleep 10
  waited=$((waited + 10))
done
founder_start() {{
  if [ -n "$peer" ]; then
{textwrap.indent(join, "    ")}
    return 0
  fi
{textwrap.indent(ask_store, "  ")}  if [ "$bucket_says" = new ]; then
{textwrap.indent(found, "    ")}
    return 0
  fi
{textwrap.indent(refuse + wait_or_restore + restore, "  ")}
}}
founder_start"""
    else:
        decide = f"""retry "waiting for another server to join" answering_peer "$wait_limit"
{join}"""
    peers = " ".join(shlex.quote(url) for url in peer_urls)
    return f"""
founding=false
peers=({peers})
peer=""
answering_peer() {{
  for candidate in "${{peers[@]}}"; do
    if curl -sk --max-time 5 -o /dev/null "$candidate/cacerts"; then
      peer=$candidate
      return 0
    fi
  done
  return 1
}}
{decide}
"""


def server_started(bucket: str, tasks: Sequence[ServerTask] = ()) -> str:
    """After the install: a server installed for a restore ends its boot as failed; the others wait until
    their k3s answers, and the founder then records the founding in the bucket at once (the first scheduled
    snapshot may be hours away); then the server's timers start."""
    timers = " ".join(f"{task.name}.timer" for task in tasks)
    start_timers = (
        f'log "starting the server\'s timers: {timers}"\n'
        f"systemctl daemon-reload\nsystemctl enable --now {timers}\n"
        if tasks
        else ""
    )
    return f"""if [ "$skip_start" = true ]; then
  log "k3s is installed, not started: restore a snapshot here (stacks/K3S.md, Restoring)"
  exit 1
fi
local_server_answers() {{ curl -sk --max-time 5 -o /dev/null "https://127.0.0.1:{API_PORT}/cacerts"; }}
retry "waiting for this server's k3s to answer" local_server_answers
log "k3s server started"
if [ "$founding" = true ]; then
  record_founding() {{ python3 {SNAPSHOT_STORE_FILE} record {shlex.quote(bucket)}; }}
  retry "recording the founding in the snapshot bucket" record_founding
fi
{start_timers}"""
