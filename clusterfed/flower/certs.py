"""Test certificates and SuperNode keys for Flower's secure mode, made with `cryptography`.

- A self-signed CA, and a SuperLink certificate it signs for the given host names and IPs:
  `flower-superlink --ssl-ca-certfile ca.crt --ssl-certfile server.pem --ssl-keyfile
  server.key`, `flower-supernode --root-certificates ca.crt`, and `root-certificates` in the
  `flwr` CLI's SuperLink connection.
- One EC P-384 key pair per SuperNode in OpenSSH format (Flower's SuperNode authentication):
  `flwr supernode register supernode-K.pub <connection>` on the SuperLink side, then
  `flower-supernode --auth-supernode-private-key supernode-K`.

These are for tests and trials. For a real deployment, have your organisation's CA sign the
SuperLink's certificate and keep every private key on its own machine.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)
    return path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "clusterfed test"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def make_tls(folder: str | Path, hosts: Sequence[str] = ("127.0.0.1", "localhost"),
             days: int = 30) -> TlsFiles:
    """A CA and a SuperLink certificate valid for `hosts` (IP addresses or DNS names)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_cert = (x509.CertificateBuilder()
               .subject_name(_name("clusterfed test CA")).issuer_name(_name("clusterfed test CA"))
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                            crl_sign=True, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))

    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    server_cert = (x509.CertificateBuilder()
                   .subject_name(_name(hosts[0])).issuer_name(ca_cert.subject)
                   .public_key(server_key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.SubjectAlternativeName(names), critical=False)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                                  critical=True)
                   .add_extension(x509.ExtendedKeyUsage([x509.OID_SERVER_AUTH]), critical=False)
                   .sign(ca_key, hashes.SHA256()))

    pem = serialization.Encoding.PEM
    return TlsFiles(
        ca_cert=_write(folder / "ca.crt", ca_cert.public_bytes(pem)),
        server_cert=_write(folder / "server.pem", server_cert.public_bytes(pem)),
        server_key=_write(folder / "server.key", _pem_key(server_key), private=True),
    )


def make_node_keys(folder: str | Path, count: int) -> list[tuple[Path, Path]]:
    """(private key, public key) files `supernode-K` and `supernode-K.pub`, K = 0..count-1."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pairs = []
    for k in range(count):
        key = ec.generate_private_key(ec.SECP384R1())
        private = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.OpenSSH,
                                    serialization.NoEncryption())
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                               serialization.PublicFormat.OpenSSH)
        pairs.append((_write(folder / f"supernode-{k}", private, private=True),
                      _write(folder / f"supernode-{k}.pub", public + b"\n")))
    return pairs
