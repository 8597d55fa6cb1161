"""The GCE cloud controller's load-balancer permissions as reference data: the Compute methods its service
controller calls (read from kubernetes/cloud-provider-gcp's source), the permissions Google's API reference
lists for each (iann0036/iam-dataset's map), and the predefined roles the gcp-k3s servers held before their
custom role (`providers/gcp/cloud_controller.py` SERVICE_CONTROLLER_PERMISSIONS, which the tests hold to
this table). `gpu-k8s references refresh --cloud-provider-gcp-tree ... --iam-dataset-tree ...` writes it."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_k8s.tools.upstream import UPSTREAM_ROOT

GCP_LOAD_BALANCER_FILE = UPSTREAM_ROOT / "references" / "gcp-load-balancer-permissions.json"
CLOUD_PROVIDER_GCP_SOURCE = {
    "repository": "kubernetes/cloud-provider-gcp",
    "tag": "v36.3.8",
    "commit": "f67fc7e3d02fecb33490fe9d1ddae46c3c0bcadd",
}
IAM_DATASET_SOURCE = {
    "repository": "iann0036/iam-dataset",
    "commit": "2073fa52ac008a45477aa0b1b4580cd99135bf60",
    "commitDate": "2026-08-22",
}
LOAD_BALANCER_ROLES = ("roles/compute.loadBalancerAdmin", "roles/compute.securityAdmin")
_GCE = "providers/gce"
OPERATIONS_SOURCE = "vendor/github.com/GoogleCloudPlatform/k8s-cloud-provider/pkg/cloud/op.go"


def service_controller_calls(tree: Path) -> list[str]:
    """The Compute methods (`<collection>.<method>`, as the API reference names them) reached from the
    load-balancer files of cloud-provider-gcp's GCE provider: every `*Cloud` method they call, followed
    through the methods it calls, down to the generated client's `c.<Collection>().<Method>(` calls; then
    the operation polls of the client every mutation waits on. Following method names over-approximates
    (a name is followed wherever it is defined), which errs towards a permission too many."""
    gce = tree / _GCE
    sources = {
        f.name: f.read_text() for f in gce.glob("*.go") if not f.name.endswith(("_test.go", "_fake.go"))
    }
    bodies: dict[str, str] = {}
    for text in sources.values():
        for match in re.finditer(r"^func \(\w+ \*Cloud\) (\w+)\(", text, re.M):
            bodies[match.group(1)] = text[match.start() : text.find("\n}\n", match.start())]
    entry = "".join(
        t for n, t in sources.items() if n.startswith("gce_loadbalancer") or n == "gce_address_manager.go"
    )
    calls = set(re.findall(r"\.c\.(\w+)\(\)\.(\w+)\(", entry))
    pending, seen = set(re.findall(r"\.(\w+)\(", entry)), set()
    while pending:
        name = pending.pop()
        if name in seen or name not in bodies:
            continue
        seen.add(name)
        calls |= set(re.findall(r"\.c\.(\w+)\(\)\.(\w+)\(", bodies[name]))
        pending |= set(re.findall(r"\.(\w+)\(", bodies[name]))
    calls |= set(re.findall(r"\.GA\.(\w+Operations)\.(\w+)\(", (tree / OPERATIONS_SOURCE).read_text()))
    return sorted(
        f"{collection[0].lower()}{collection[1:]}.{method[0].lower()}{method[1:]}"
        for collection, method in calls
    )


def gcp_load_balancer_permissions(ccm_tree: Path, iam_dataset_tree: Path) -> dict[str, Any]:
    """The service controller's Compute calls, the permissions iam-dataset's map (crawled from the permission
    block of each method's API reference page) gives each, and the permissions of the predefined roles
    LOAD_BALANCER_ROLES, from the same dataset commit."""
    calls = service_controller_calls(ccm_tree)
    methods = json.loads((iam_dataset_tree / "gcp" / "map.json").read_text())["api"]["compute"]["methods"]
    roles = {
        role: sorted(
            json.loads(
                (iam_dataset_tree / "gcp" / "roles" / f"{role.removeprefix('roles/')}.json").read_text()
            )["includedPermissions"]
        )
        for role in LOAD_BALANCER_ROLES
    }
    return {
        "source": {
            "calls": {
                **CLOUD_PROVIDER_GCP_SOURCE,
                "what": "Compute methods reached from providers/gce/gce_loadbalancer*.go and "
                "gce_address_manager.go, and the operation polls of the vendored k8s-cloud-provider op.go "
                "(tools/reference_data.py service_controller_calls)",
            },
            "permissions": {
                **IAM_DATASET_SOURCE,
                "files": ["gcp/map.json", *(f"gcp/roles/{r.removeprefix('roles/')}.json" for r in roles)],
                "what": "per method, the permissions of its API reference page's permission block; per "
                "role, its includedPermissions",
            },
        },
        "calls": {call: _method_permissions(methods, call) for call in calls},
        "roles": roles,
    }


def _method_permissions(methods: Mapping[str, Any], call: str) -> list[str]:
    method = methods.get(f"compute.{call}")
    if method is None:
        # An alpha or beta client's method, or one the dataset does not know: its permissions must be
        # found by hand before the table can say anything about it.
        raise ValueError(f"iam-dataset's map has no compute.{call}")
    return sorted(p["name"] for p in method.get("permissions", []))
