"""A throwaway certificate authority for the test stack's TLS listeners, made in-process with `cryptography`.

`Pki.create(folder)` writes a CA, a server certificate for loopback (SAN `IP:127.0.0.1`, `DNS:localhost`) and
a client certificate, all signed by the CA, as PEM files; keys are unencrypted PKCS#8, the form both
librdkafka and Kafka's PEM key stores read. `Pki.other_ca()` is a second, unrelated CA: what a client
configured with the wrong CA bundle trusts. Not guaranteed: anything beyond tests (short keys, no
revocation, a week's validity).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=7)
_CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
    key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
)  # fmt: skip


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its unencrypted PKCS#8 PEM private key."""

    cert_pem: str
    key_pem: str


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates."""

    def __init__(self, common_name: str) -> None:
        self._key = _key()
        name = _name(common_name)
        self._name = name
        self.cert = (
            _builder(common_name, name, self._key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_CA_KEY_USAGE, critical=True)
            .sign(self._key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    def issue(self, common_name: str, *, server: bool) -> KeyPair:
        """A certificate for `common_name`: for loopback servers (`server=True`) or for a TLS client."""
        key = _key()
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            _builder(common_name, self._name, key)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM).decode(), _key_pem(key))


@dataclass(frozen=True)
class Pki:
    """The CA, the loopback server's and the client's certificates, and where they are written."""

    ca_pem: str
    server: KeyPair
    client: KeyPair
    folder: Path

    @classmethod
    def create(cls, folder: Path) -> Pki:
        ca = CertificateAuthority("icefall test CA")
        pki = cls(
            ca.cert_pem,
            ca.issue("localhost", server=True),
            ca.issue("icefall-client", server=False),
            folder,
        )
        folder.mkdir(parents=True, exist_ok=True)
        pki.ca_path.write_text(pki.ca_pem)
        # Kafka's PEM key store file: the private key, then the certificate chain.
        pki.server_keystore_path.write_text(pki.server.key_pem + pki.server.cert_pem + pki.ca_pem)
        pki.server_keystore_path.chmod(0o600)
        return pki

    @property
    def ca_path(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def server_keystore_path(self) -> Path:
        return self.folder / "server-keystore.pem"

    @staticmethod
    def other_ca() -> str:
        """The PEM certificate of a CA that signed nothing here: trusting only it, no server is trusted."""
        return CertificateAuthority("some other CA").cert_pem
