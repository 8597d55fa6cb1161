"""The cluster's certificate authorities, client credentials and join tokens, made by the program.

k3s skips generating its CAs when they exist before the first server starts (k3s docs, cli/certificate.md).
Making them here lets the program know, before any server runs, everything a client needs: the join token
in its secure `K10<root CA hash>::<credentials>` form and the kubeconfigs. Every private key, the token
secrets and the kubeconfigs are Pulumi secrets.

Two client certificates, because a certificate cannot be revoked (Kubernetes has no CRL):
- the deployer's, in `system:masters`, which only the program's Kubernetes provider uses. It lives in the
  stack's state next to the CA keys, so it exposes nothing the state does not already;
- the admin's, the `kubeconfig` people copy to laptops and CI. Its user name carries a generation and holds
  cluster-admin only through a ClusterRoleBinding the program keeps (`admin_access_binding`): replacing the
  generation (stacks/K3S.md, "Rotate the admin kubeconfig") moves the binding to a new name, and every copy
  of the old kubeconfig loses all access at once.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_random as random
import pulumi_tls as tls

# ECDSA P-256 throughout: what k3s's own generator uses for its CAs (contrib/util/generate-custom-ca-certs.sh
# uses RSA only for the root and intermediate), accepted by kube-apiserver for service-account keys too.
KEY_ALGORITHM = "ECDSA"
KEY_CURVE = "P256"
CA_VALIDITY_HOURS = 10 * 365 * 24
ADMIN_VALIDITY_HOURS = 365 * 24
# Any `pulumi up` in a client certificate's last 60 days replaces it (pulumi_tls early_renewal_hours), so a
# stack applied at least every ten months never holds an expired kubeconfig. The renewed admin certificate
# keeps its user name, so the old one stays valid until it expires; rotating the generation revokes it.
ADMIN_EARLY_RENEWAL_HOURS = 60 * 24
CA_USES = ("cert_signing", "crl_signing", "digital_signature")
CLIENT_USES = ("client_auth", "digital_signature", "key_encipherment")
# The group Kubernetes maps to cluster-admin whatever RBAC says; k3s's own admin certificate carries it
# (deps.go genClientCerts). Only the deployer's certificate does here.
DEPLOYER_GROUP = "system:masters"
DEPLOYER_USER = "gpu-k8s-deployer"
# The admin's user name is this prefix and a generation: 8 hex digits of a random.RandomId.
ADMIN_USER_PREFIX = "gpu-k8s-admin-"
ADMIN_GENERATION_BYTES = 4
TOKEN_SECRET_LENGTH = 48

# The CA files k3s reads from <data-dir>/server/tls when they exist before its first start, by the name
# each leaf CA has here (certificate.md: "etcd files are required even if embedded etcd is not in use").
LEAF_CAS = ("server-ca", "client-ca", "request-header-ca", "etcd/peer-ca", "etcd/server-ca")
SERVICE_ACCOUNT_KEY_FILE = "service.key"


def pem_der(pem: str) -> bytes:
    """The DER bytes of the first certificate in a PEM text."""
    body = pem.split("-----BEGIN CERTIFICATE-----", 1)[1].split("-----END CERTIFICATE-----", 1)[0]
    return base64.b64decode("".join(body.split()))


def root_ca_hash(root_cert_pem: str) -> str:
    """The CA hash of a secure token for custom CAs: SHA256 of the root certificate's DER (k3s token.md)."""
    return hashlib.sha256(pem_der(root_cert_pem)).hexdigest()


def secure_token(root_cert_pem: str, username: str, password: str) -> str:
    """`K10<CA hash>::<username>:<password>`: a joining node checks the server's CA against the hash before
    it sends the password, so a man in the middle learns nothing (k3s token.md, clientaccess/token.go)."""
    return f"K10{root_ca_hash(root_cert_pem)}::{username}:{password}"


def server_tls_files(
    root_cert_pem: str, leaf_certs: Mapping[str, str], leaf_keys: Mapping[str, str], service_key: str
) -> dict[str, str]:
    """The files of <data-dir>/server/tls, relative to it: each CA certificate followed by the root (k3s
    finds the root in the bundle to hash and verify it), each CA key, and the service-account key."""
    files = {f"{name}.crt": leaf_certs[name] + root_cert_pem for name in LEAF_CAS}
    files.update({f"{name}.key": leaf_keys[name] for name in LEAF_CAS})
    files[SERVICE_ACCOUNT_KEY_FILE] = service_key
    return files


@dataclass(frozen=True)
class Subject:
    common_name: pulumi.Input[str]
    organization: str | None = None


@dataclass(frozen=True)
class Issuer:
    cert_pem: pulumi.Input[str]
    key_pem: pulumi.Input[str]


@dataclass(frozen=True)
class ClusterIdentity:
    """What the PKI hands to the rest of the program (all secrets except the CA certificates)."""

    root_cert_pem: pulumi.Output[str]
    server_ca_bundle: pulumi.Output[str]
    deployer_cert_pem: pulumi.Output[str]
    deployer_key_pem: pulumi.Output[str]
    admin_user: pulumi.Output[str]
    admin_cert_pem: pulumi.Output[str]
    admin_key_pem: pulumi.Output[str]
    server_token: pulumi.Output[str]
    agent_token: pulumi.Output[str]
    # <data-dir>/server/tls path -> content, as one JSON secret.
    server_tls_files: pulumi.Output[str]


class K3sPki(pulumi.ComponentResource):
    """A root CA, the five CAs k3s signs with, the service-account key, the deployer's and the admin's
    client certificates and the server and agent join tokens."""

    identity: ClusterIdentity

    def __init__(self, name: str, cluster_name: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-k8s:k3s:Pki", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        root_key = self._key(f"{name}-root")
        root = tls.SelfSignedCert(
            f"{name}-root-ca",
            private_key_pem=root_key.private_key_pem,
            subject=tls.SelfSignedCertSubjectArgs(common_name=f"{cluster_name}-root-ca"),
            is_ca_certificate=True,
            set_subject_key_id=True,
            validity_period_hours=CA_VALIDITY_HOURS,
            allowed_uses=list(CA_USES),
            opts=child,
        )
        leaf_certs: dict[str, pulumi.Output[str]] = {}
        leaf_keys: dict[str, pulumi.Output[str]] = {}
        for ca in LEAF_CAS:
            slug = ca.replace("/", "-")
            key = self._key(f"{name}-{slug}")
            leaf_keys[ca] = key.private_key_pem
            leaf_certs[ca] = self._signed(
                f"{name}-{slug}",
                key,
                Subject(f"{cluster_name}-{slug}"),
                Issuer(root.cert_pem, root_key.private_key_pem),
                is_ca=True,
            )
        service_key = self._key(f"{name}-service-account")
        client_ca = Issuer(leaf_certs["client-ca"], leaf_keys["client-ca"])
        deployer_key = self._key(f"{name}-deployer")
        deployer_cert = self._signed(
            f"{name}-deployer-cert",
            deployer_key,
            Subject(DEPLOYER_USER, DEPLOYER_GROUP),
            client_ca,
            is_ca=False,
        )
        admin_user = random.RandomId(
            f"{name}-admin-generation", byte_length=ADMIN_GENERATION_BYTES, opts=child
        ).hex.apply(lambda generation: f"{ADMIN_USER_PREFIX}{generation}")
        admin_key = self._key(f"{name}-admin")
        admin_cert = self._signed(
            f"{name}-admin-cert", admin_key, Subject(admin_user), client_ca, is_ca=False
        )
        server_secret, agent_secret = (
            random.RandomPassword(
                f"{name}-{role}-token", length=TOKEN_SECRET_LENGTH, special=False, opts=child
            ).result
            for role in ("server", "agent")
        )
        root_pem = root.cert_pem
        self.identity = ClusterIdentity(
            root_cert_pem=root_pem,
            server_ca_bundle=pulumi.Output.concat(leaf_certs["server-ca"], root_pem),
            deployer_cert_pem=pulumi.Output.concat(deployer_cert, leaf_certs["client-ca"]),
            deployer_key_pem=pulumi.Output.secret(deployer_key.private_key_pem),
            admin_user=admin_user,
            admin_cert_pem=pulumi.Output.concat(admin_cert, leaf_certs["client-ca"]),
            admin_key_pem=pulumi.Output.secret(admin_key.private_key_pem),
            server_token=pulumi.Output.secret(
                pulumi.Output.all(root_pem, server_secret).apply(lambda p: secure_token(p[0], "server", p[1]))
            ),
            agent_token=pulumi.Output.secret(
                pulumi.Output.all(root_pem, agent_secret).apply(lambda p: secure_token(p[0], "node", p[1]))
            ),
            server_tls_files=pulumi.Output.secret(
                pulumi.Output.all(
                    root_pem,
                    pulumi.Output.all(**leaf_certs),
                    pulumi.Output.all(**leaf_keys),
                    service_key.private_key_pem,
                ).apply(lambda p: json.dumps(server_tls_files(p[0], p[1], p[2], p[3]), sort_keys=True))
            ),
        )
        self.register_outputs({"rootCertPem": root_pem})

    def _key(self, name: str) -> tls.PrivateKey:
        return tls.PrivateKey(
            f"{name}-key",
            algorithm=KEY_ALGORITHM,
            ecdsa_curve=KEY_CURVE,
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["privateKeyPem"]),
        )

    def _signed(
        self, name: str, key: tls.PrivateKey, subject: Subject, issuer: Issuer, is_ca: bool
    ) -> pulumi.Output[str]:
        """The PEM certificate for `key`, signed by `issuer`: a CA (is_ca) or a client certificate."""
        child = pulumi.ResourceOptions(parent=self)
        request = tls.CertRequest(
            f"{name}-csr",
            private_key_pem=key.private_key_pem,
            subject=tls.CertRequestSubjectArgs(
                common_name=subject.common_name, organization=subject.organization
            ),
            opts=child,
        )
        return tls.LocallySignedCert(
            name,
            cert_request_pem=request.cert_request_pem,
            ca_cert_pem=issuer.cert_pem,
            ca_private_key_pem=issuer.key_pem,
            is_ca_certificate=is_ca,
            set_subject_key_id=is_ca,
            validity_period_hours=CA_VALIDITY_HOURS if is_ca else ADMIN_VALIDITY_HOURS,
            early_renewal_hours=None if is_ca else ADMIN_EARLY_RENEWAL_HOURS,
            allowed_uses=list(CA_USES if is_ca else CLIENT_USES),
            opts=child,
        ).cert_pem
