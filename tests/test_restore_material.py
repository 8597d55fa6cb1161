"""R2: a k3s cluster's snapshots stay restorable after `pulumi destroy`. The snapshot bucket is kept, and so
is the servers' bootstrap secret, which holds the server token (a snapshot's bootstrap data is encrypted with
it: k3s "Backup and Restore") and the CA keys. The agents' secret, which restores nothing, goes."""

from __future__ import annotations

import hashlib
import json

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpu_k8s.components.k3s import paths
from gpu_k8s.tools.engine import Recording, Secret

PLATFORMS = {
    "aws_k3s": ("aws:secretsmanager/secret:Secret", "aws:secretsmanager/secretVersion:SecretVersion"),
    "gcp_k3s": ("gcp:secretmanager/secret:Secret", "gcp:secretmanager/secretVersion:SecretVersion"),
}


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_the_servers_secret_outlives_destroy_and_the_agents_does_not(platform, request):
    rec: Recording = request.getfixturevalue(platform)
    kept = {
        r.name: r.options.get("retainOnDelete", False)
        for r in rec.registrations
        if r.type in PLATFORMS[platform]
    }
    assert kept == {
        "ml-servers-bootstrap": True,
        "ml-servers-bootstrap-value": True,
        "ml-agents-bootstrap": False,
        "ml-agents-bootstrap-value": False,
    }
    (bucket,) = [
        r for r in rec.registrations if r.type in ("aws:s3/bucket:Bucket", "gcp:storage/bucket:Bucket")
    ]
    assert bucket.options["retainOnDelete"] is True


def test_a_kept_gcp_secret_is_named_for_its_cluster_so_a_new_stack_of_that_name_makes_its_own(gcp_k3s):
    """Secret Manager IDs are the caller's: a kept `ml-k3s-servers` would refuse the next stack named ml.
    The ID ends in the first 8 hex digits of the SHA-256 of the cluster's root CA certificate."""
    secret_id = str(gcp_k3s.by_name("ml-servers-bootstrap").inputs["secretId"])
    value = gcp_k3s.by_name("ml-servers-bootstrap-value").inputs["secretData"]
    assert isinstance(value, Secret)
    files = json.loads(value.value)["files"]
    root = x509.load_pem_x509_certificates(files[f"{paths.TLS_DIR}/server-ca.crt"].encode())[-1]
    digest = hashlib.sha256(root.public_bytes(serialization.Encoding.DER)).hexdigest()
    assert secret_id == f"ml-k3s-servers-{digest[:8]}"
    assert gcp_k3s.by_name("ml-agents-bootstrap").inputs["secretId"] == "ml-k3s-agents"


def test_the_kept_secret_holds_what_a_restore_needs(aws_k3s):
    value = aws_k3s.by_name("ml-servers-bootstrap-value").inputs["secretString"]
    assert isinstance(value, Secret)
    files = json.loads(value.value)["files"]
    assert files[paths.TOKEN_FILE].startswith("K10")
    for ca in ("server-ca", "client-ca", "etcd/server-ca", "etcd/peer-ca", "request-header-ca"):
        assert "PRIVATE KEY" in files[f"{paths.TLS_DIR}/{ca}.key"]
