"""What the TLS and random providers would return, computed locally and deterministically.

The mock engine answers `tls:` resources with real keys, requests and certificates made by the
`cryptography` package, so tests can verify the PKI the program wires up (chains, subjects, token hashes).
Keys are derived from the resource name and ECDSA signatures are deterministic (RFC 6979), so every run of
the plan produces the same output.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import string
from collections.abc import Mapping
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NOT_BEFORE = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
# secp256r1 group order: a derived scalar must be below it.
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def _seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest(), "big")


def private_key(name: str) -> ec.EllipticCurvePrivateKey:
    return ec.derive_private_key(_seed(name) % (_P256_ORDER - 1) + 1, ec.SECP256R1())


def _load_key(pem: str) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(pem.encode(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey), "the program makes ECDSA keys only"
    return key


def _name(subject: Mapping[str, Any] | None) -> x509.Name:
    subject = subject or {}
    attributes = []
    if subject.get("organization"):
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, subject["organization"]))
    if subject.get("commonName"):
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, subject["commonName"]))
    return x509.Name(attributes)


def private_key_outputs(name: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
    if inputs.get("algorithm") != "ECDSA" or inputs.get("ecdsaCurve") != "P256":
        raise NotImplementedError("the fake TLS provider makes ECDSA P256 keys only")
    key = private_key(name)
    return {
        "privateKeyPem": key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        ).decode(),
        "publicKeyPem": key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode(),
    }


def cert_request_outputs(inputs: Mapping[str, Any]) -> dict[str, Any]:
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(_name(inputs.get("subject")))
        .sign(_load_key(inputs["privateKeyPem"]), hashes.SHA256(), ecdsa_deterministic=True)
    )
    return {"certRequestPem": request.public_bytes(serialization.Encoding.PEM).decode()}


def _certificate(
    name: str,
    inputs: Mapping[str, Any],
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
) -> str:
    uses = set(inputs.get("allowedUses") or [])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(_seed(name) >> 100)
        .not_valid_before(NOT_BEFORE)
        .not_valid_after(NOT_BEFORE + datetime.timedelta(hours=inputs["validityPeriodHours"]))
        .add_extension(x509.BasicConstraints(ca=bool(inputs.get("isCaCertificate")), path_length=None), True)
        .add_extension(
            x509.KeyUsage(
                digital_signature="digital_signature" in uses,
                content_commitment=False,
                key_encipherment="key_encipherment" in uses,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign="cert_signing" in uses,
                crl_sign="crl_signing" in uses,
                encipher_only=False,
                decipher_only=False,
            ),
            True,
        )
    )
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if "client_auth" in uses else []
    usages += [ExtendedKeyUsageOID.SERVER_AUTH] if "server_auth" in uses else []
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), False)
    if inputs.get("setSubjectKeyId"):
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), False)
    if issuer != subject:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False
        )
    certificate = builder.sign(issuer_key, hashes.SHA256(), ecdsa_deterministic=True)
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


def self_signed_cert_outputs(name: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
    key = _load_key(inputs["privateKeyPem"])
    subject = _name(inputs.get("subject"))
    return {"certPem": _certificate(name, inputs, subject, key.public_key(), subject, key)}


def locally_signed_cert_outputs(name: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
    request = x509.load_pem_x509_csr(inputs["certRequestPem"].encode())
    issuer = x509.load_pem_x509_certificate(inputs["caCertPem"].encode())
    public_key = request.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    pem = _certificate(
        name, inputs, request.subject, public_key, issuer.subject, _load_key(inputs["caPrivateKeyPem"])
    )
    return {"certPem": pem}


def random_password_outputs(name: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
    alphabet = string.ascii_letters + string.digits
    digest = hashlib.sha512(name.encode()).digest() * 4
    return {"result": "".join(alphabet[b % len(alphabet)] for b in digest[: int(inputs["length"])])}


def random_id_outputs(name: str, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """RandomId's encodings of `byteLength` bytes derived from the name (pulumi_random's output names)."""
    raw = hashlib.sha512(name.encode()).digest()[: int(inputs["byteLength"])]
    return {
        "hex": raw.hex(),
        "dec": str(int.from_bytes(raw, "big")),
        "b64Std": base64.standard_b64encode(raw).decode(),
        "b64Url": base64.urlsafe_b64encode(raw).decode().rstrip("="),
    }
