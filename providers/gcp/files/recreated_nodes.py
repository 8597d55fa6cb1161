"""On a gcp-k3s server, on a timer: delete the Node of an agent VM that its managed instance group recreated
under the same name (a Spot VM preempted with termination action DELETE, an autohealing repair).

k3s refuses a node that registers under the name of an existing Node with another node password ("Node
password rejected"): the new VM's agent would wait until someone deleted the old Node. The cloud controller's
lifecycle controller deletes a Node only when no instance answers to its provider ID, and Compute Engine
looks instances up by name (cloud-provider-gcp, gce_instances.go), so it keeps this one. Deleting the Node
lets k3s drop its password secret and the new agent register on its next attempt.

Only a Node that is not Ready, whose instance was created after the Node was, is deleted: a kubelet
restarting on the same VM keeps its Node. Servers' Nodes are left alone (deleting one removes its etcd
member: stacks/K3S.md says when to). The delete names the Node's UID (a precondition): every server runs
this, and the new VM may have registered a Node of the same name since the list was read. Compute Engine's
API as the service account (gce_api.py, beside this script); an error is told by its HTTP status, its type,
or kubectl's own last line (which names the Node, never a credential).
"""

import json
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime

from gce_api import access_token

COMPUTE = "https://compute.googleapis.com/compute/v1"
KUBECTL = ("/usr/local/bin/k3s", "kubectl")
PROVIDER_PREFIX = "gce://"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"


class KubectlFailed(Exception):
    def __init__(self, stderr):
        lines = stderr.strip().splitlines()
        super().__init__(lines[-1] if lines else "no output")


def kubectl(*args):
    result = subprocess.run([*KUBECTL, *args], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise KubectlFailed(result.stderr)
    return result.stdout


def delete_node(node):
    """DELETE the Node only if it is still the one listed (its UID); False if it is gone or replaced
    already (NotFound, or a Conflict on the precondition)."""
    name, uid = node["metadata"]["name"], node["metadata"]["uid"]
    options = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as body:
        json.dump(options, body)
        body.flush()
        try:
            kubectl("delete", "--raw", f"/api/v1/nodes/{urllib.parse.quote(name, safe='')}", "-f", body.name)
        except KubectlFailed as error:
            if "NotFound" in str(error) or "Conflict" in str(error):
                return False
            raise
    return True


def instance_created(provider_id):
    """When the instance behind `gce://project/zone/name` was created; None when there is none."""
    project, zone, name = provider_id[len(PROVIDER_PREFIX) :].split("/")
    path = "/".join(urllib.parse.quote(part, safe="") for part in ("projects", project, "zones", zone))
    url = f"{COMPUTE}/{path}/instances/{urllib.parse.quote(name, safe='')}?fields=creationTimestamp"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {access_token()}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return datetime.fromisoformat(json.loads(response.read())["creationTimestamp"])
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise


def ready(node):
    conditions = node.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def recreated(node):
    metadata = node["metadata"]
    provider_id = node.get("spec", {}).get("providerID", "")
    if ready(node) or CONTROL_PLANE_LABEL in metadata.get("labels", {}):
        return False
    if not provider_id.startswith(PROVIDER_PREFIX):
        return False
    created = instance_created(provider_id)
    return created is not None and created > datetime.fromisoformat(metadata["creationTimestamp"])


def describe(error):
    """What went wrong, without any value a response carried: an HTTP status, kubectl's last line (its own
    words), or the error's type."""
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code}"
    if isinstance(error, KubectlFailed):
        return f"kubectl: {error}"
    return type(error).__name__


def main():
    try:
        nodes = json.loads(kubectl("get", "nodes", "-o", "json"))["items"]
    except Exception as error:  # a timer's run: say what failed, never a traceback
        print(f"gpu-k8s: listing Nodes failed ({describe(error)})", file=sys.stderr)
        return 1
    failed = False
    for node in nodes:
        name = node["metadata"]["name"]
        try:
            if recreated(node) and delete_node(node):
                print(f"gpu-k8s: deleted Node {name}: its VM was recreated under the same name")
        except Exception as error:  # one Node's failure leaves the others checked
            print(f"gpu-k8s: checking Node {name} failed ({describe(error)})", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
