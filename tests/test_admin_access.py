"""S6: the k3s admin kubeconfig people copy around can be revoked. It holds cluster-admin through one
ClusterRoleBinding naming its user, not through `system:masters` (which RBAC cannot take away), and rotating
its generation moves that binding to a new user name while the program's own credential stays as it is."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from gpu_k8s.tools import engine
from gpu_k8s.tools.engine import Recording, Secret, run_program

BINDING = "rbac.authorization.k8s.io/v1"
PLATFORMS = ("aws_k3s", "gcp_k3s")


def _reveal(value: Any) -> Any:
    return value.value if isinstance(value, Secret) else value


def client_certificate(kubeconfig_text: str) -> x509.Certificate:
    user = json.loads(kubeconfig_text)["users"][0]["user"]
    return x509.load_pem_x509_certificates(base64.b64decode(user["client-certificate-data"]))[0]


def subject(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> list[str]:
    return [str(attribute.value) for attribute in cert.subject.get_attributes_for_oid(oid)]


def admin_kubeconfig(rec: Recording) -> str:
    return str(_reveal(rec.outputs["kubeconfig"]))


def deployer_kubeconfig(rec: Recording) -> str:
    return str(_reveal(rec.by_name("ml-k8s").inputs["kubeconfig"]))


def admin_binding(rec: Recording) -> dict[str, Any]:
    [binding] = [
        r
        for r in rec.by_type("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
        if r.name == "ml-admin-access"
    ]
    return binding.inputs


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_admin_kubeconfig_is_in_no_group_and_cluster_admin_only_through_its_binding(platform, request):
    rec: Recording = request.getfixturevalue(platform)
    admin = client_certificate(admin_kubeconfig(rec))
    assert subject(admin, NameOID.ORGANIZATION_NAME) == []  # no group: not system:masters
    [user] = subject(admin, NameOID.COMMON_NAME)
    assert user.startswith("gpu-k8s-admin-") and len(user) == len("gpu-k8s-admin-") + 8
    binding = admin_binding(rec)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "cluster-admin",
    }
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    # The program's provider never uses the admin's credential: revoking it cannot lock the stack out.
    deployer = client_certificate(deployer_kubeconfig(rec))
    assert subject(deployer, NameOID.ORGANIZATION_NAME) == ["system:masters"]
    assert deployer.public_key().public_numbers() != admin.public_key().public_numbers()  # type: ignore[union-attr]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_admin_binding_waits_for_the_api_only(platform, request):
    """So the admin kubeconfig works even when an add-on's install fails, when it is needed to debug."""
    rec: Recording = request.getfixturevalue(platform)
    binding = rec.by_name("ml-admin-access")
    waits_for = {rec.by_urn(urn).name for urn in binding.dependencies}
    assert "ml-cloud-controller" not in waits_for and not [n for n in waits_for if "cloud-controller" in n]
    assert any(name.startswith("ml-server-") for name in waits_for), waits_for


@pytest.mark.parametrize("platform", PLATFORMS)
def test_workloads_wait_for_the_admin_binding(platform, request):
    """The GPU Operator (like everything installed on the cluster) starts after the binding exists, so the
    kubeconfig output works as soon as the stack reports the cluster ready."""
    rec: Recording = request.getfixturevalue(platform)
    [binding] = [r for r in rec.registrations if r.name == "ml-admin-access"]
    operator = next(
        r for r in rec.by_type("kubernetes:helm.sh/v3:Release") if r.inputs["name"] == "gpu-operator"
    )
    seen, todo = set(), list(operator.dependencies)
    while todo:
        urn = todo.pop()
        if urn not in seen:
            seen.add(urn)
            todo.extend(rec.by_urn(urn).dependencies)
    assert binding.urn in seen


@pytest.mark.parametrize(
    ("platform", "stack"), [("aws_k3s_config", "aws-k3s"), ("gcp_k3s_config", "gcp-k3s")]
)
def test_rotating_the_generation_moves_the_binding_and_leaves_the_deployer_alone(
    platform, stack, request, monkeypatch
):
    """`pulumi up --replace <admin-generation>` gives a new RandomId: a new admin user, certificate and
    binding subject; every copy of the previous kubeconfig names a user no binding grants anything."""
    config = request.getfixturevalue(platform)
    before = run_program(stack, config)
    rotated_id = {"hex": "0badcafe", "dec": "195939070", "b64Std": "C63K/g==", "b64Url": "C63K_g"}
    monkeypatch.setitem(
        engine._FAKE_PROVIDERS, "random:index/randomId:RandomId", lambda name, inputs: rotated_id
    )
    after = run_program(stack, config)
    assert subject(client_certificate(admin_kubeconfig(after)), NameOID.COMMON_NAME) == [
        "gpu-k8s-admin-0badcafe"
    ]
    assert admin_binding(after)["subjects"][0]["name"] == "gpu-k8s-admin-0badcafe"
    assert admin_binding(before)["subjects"][0]["name"] != "gpu-k8s-admin-0badcafe"
    assert deployer_kubeconfig(after) == deployer_kubeconfig(before)
