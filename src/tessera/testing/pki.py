"""Certificates and keys for a throw-away test cluster: a CA, the API server's serving certificate,
an admin client certificate (group ``system:masters``) and the service-account signing key."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=7)


@dataclass(frozen=True)
class ClusterPKI:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_private_key: Path
    sa_public_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
             ) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def _sans(hosts: list[str]) -> list[x509.GeneralName]:
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    return sans


def issue_serving_cert(
    pki: ClusterPKI, directory: Path, name: str, hosts: list[str] | None = None
) -> tuple[Path, Path]:
    """A serving certificate signed by the cluster CA (for webhook servers on loopback).

    Returns (certificate, key) paths; the API server trusts them through ``pki.ca_cert``."""
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _key()
    cert = (
        _builder(_name(name), ca.subject, key.public_key())
        .add_extension(
            x509.SubjectAlternativeName(_sans(hosts or ["127.0.0.1", "localhost"])),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(_key_pem(key))
    key_path.chmod(0o600)
    return cert_path, key_path


def generate(directory: Path, *, hosts: list[str] | None = None) -> ClusterPKI:
    """Write a fresh CA, serving/admin certificates and the SA key pair into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    hosts = hosts or ["127.0.0.1", "localhost"]

    ca_key = _key()
    ca_name = _name("tessera-test-ca")
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    sans = _sans([*hosts, "kubernetes", "kubernetes.default", "kubernetes.default.svc"])

    serving_key = _key()
    serving = (
        _builder(_name("kube-apiserver"), ca_name, serving_key.public_key())
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    admin_key = _key()
    admin = (
        _builder(_name("tessera-admin", "system:masters"), ca_name, admin_key.public_key())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    pki = ClusterPKI(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_private_key=directory / "sa.key",
        sa_public_key=directory / "sa.pub",
    )
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.ca_key.write_bytes(_key_pem(ca_key))
    pki.serving_cert.write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    pki.serving_key.write_bytes(_key_pem(serving_key))
    pki.admin_cert.write_bytes(admin.public_bytes(serialization.Encoding.PEM))
    pki.admin_key.write_bytes(_key_pem(admin_key))
    pki.sa_private_key.write_bytes(_key_pem(sa_key))
    pki.sa_public_key.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    for key_file in (pki.ca_key, pki.serving_key, pki.admin_key, pki.sa_private_key):
        key_file.chmod(0o600)
    return pki


def generate_client_ca(directory: Path, client_name: str) -> tuple[Path, Path, Path]:
    """A CA of its own and one client certificate it signed (CN ``client_name``): for a server
    that accepts only that client, e.g. tessera-webhook --client-ca with the API server's
    admission kubeconfig. Returns (ca certificate, client certificate, client key)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name(f"{client_name}-ca")
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = _key()
    cert = (
        _builder(_name(client_name), ca_name, key.public_key())
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = (directory / f"{client_name}-ca.crt", directory / f"{client_name}.crt",
             directory / f"{client_name}.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(_key_pem(key))
    paths[2].chmod(0o600)
    return paths
