"""On a gcp-k3s server, on a timer: delete the Node of an agent VM that its managed instance group recreated
under the same name (a Spot VM preempted with termination action DELETE, an autohealing repair).

k3s refuses a node that registers under the name of an existing Node with another node password ("Node
password rejected"): the new VM's agent would wait until someone deleted the old Node. The cloud controller's
lifecycle controller deletes a Node only when no instance answers to its provider ID, and Compute Engine
looks instances up by name (cloud-provider-gcp, gce_instances.go), so it keeps this one. Deleting the Node
lets k3s drop its password secret and the new agent register on its next attempt.

Only a Node that is not Ready, whose instance was created after the Node was, is deleted: a kubelet
restarting on the same VM keeps its Node. Servers' Nodes are left alone (deleting one removes its etcd
member: stacks/K3S.md says when to). Compute Engine's API as the service account (gce_api.py, beside this
script); errors name their type only.
"""

import json
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime

from gce_api import access_token

COMPUTE = "https://compute.googleapis.com/compute/v1"
KUBECTL = ("/usr/local/bin/k3s", "kubectl")
PROVIDER_PREFIX = "gce://"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"


def kubectl(*args):
    return subprocess.run([*KUBECTL, *args], check=True, capture_output=True, text=True, timeout=60).stdout


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


def main():
    try:
        nodes = json.loads(kubectl("get", "nodes", "-o", "json"))["items"]
    except (OSError, ValueError, KeyError, subprocess.SubprocessError) as error:
        print(f"gpu-k8s: listing Nodes failed ({type(error).__name__})", file=sys.stderr)
        return 1
    failed = False
    for node in nodes:
        name = node["metadata"]["name"]
        try:
            if recreated(node):
                kubectl("delete", "node", name, "--ignore-not-found", "--wait=false")
                print(f"gpu-k8s: deleted Node {name}: its VM was recreated under the same name")
        except (OSError, ValueError, KeyError, subprocess.SubprocessError) as error:
            print(f"gpu-k8s: checking Node {name} failed ({type(error).__name__})", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
