"""A test PKI for SPIFFE: CAs per trust domain and X.509 SVIDs (URI SANs), written as a SPIRE agent writes
them (cert chain, key, trust bundle PEM files). Real certificates, for real TLS handshakes on loopback."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


class CA:
    def __init__(self, domain: str):
        self.domain = domain
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self.cert = (x509.CertificateBuilder().subject_name(_name(f"{domain} CA")).issuer_name(_name(f"{domain} CA"))
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def svid(self, out: Path, name: str, ids: list[str], *, expired: bool = False) -> tuple[str, str]:
        """An SVID for ``ids`` (URI SANs) written to OUT/NAME.pem and OUT/NAME.key."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        start, end = (now - dt.timedelta(days=3), now - dt.timedelta(days=1)) if expired else \
            (now - dt.timedelta(minutes=5), now + dt.timedelta(days=1))
        cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(self.cert.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(start).not_valid_after(end)
                .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(i) for i in ids]),
                               critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=True,
                                             encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                                      x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(self.key, hashes.SHA256()))
        c, k = out / f"{name}.pem", out / f"{name}.key"
        c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
        return str(c), str(k)
