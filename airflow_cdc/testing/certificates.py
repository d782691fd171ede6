"""Throwaway X.509 material for TLS tests, made with the ``openssl`` and ``keytool`` commands:
client certificates signed by a test CA, as PEM, PKCS#12 and Java KeyStore (JKS) files.

Everything is written under the folder given (the server's throwaway ``tls`` folder); nothing
here is fit for anything but tests.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = "7"


class CertificateError(RuntimeError):
    """``openssl`` or ``keytool`` failed."""


def run_tool(folder: Path, *argv: str) -> None:
    """Run ``openssl``/``keytool`` in ``folder``.

    :raises CertificateError: with the tool's error output.
    """
    out = subprocess.run(list(argv), cwd=folder, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise CertificateError(f"{argv[0]} {argv[1]} failed: {(out.stderr or out.stdout)[-2000:]}")


def make_ca(folder: Path, name: str = "ca", common_name: str = "airflow-cdc throwaway test CA") -> Path:
    """A self-signed CA in ``folder`` (``<name>.pem``, key ``<name>.key``); returns the certificate."""
    folder.mkdir(parents=True, exist_ok=True)
    run_tool(folder, "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.pem", "-days", DAYS, "-subj", f"/CN={common_name}")  # fmt: skip
    return folder / f"{name}.pem"


@dataclass(frozen=True)
class ClientCertificate:
    """A client certificate (PEM) and its unencrypted private key (PEM), signed by a test CA.

    :ivar subject: the subject as MariaDB's ``REQUIRE SUBJECT`` spells it (``/CN=...``).
    """

    cert: Path
    key: Path
    ca: Path
    subject: str

    @property
    def folder(self) -> Path:
        return self.cert.parent

    def pkcs12(self, password: str, *, chain: bool = True) -> Path:
        """A PKCS#12 keystore of the key and certificate (and the CA), as ``openssl pkcs12 -export``
        writes it (AES-256, PBKDF2)."""
        out = self.cert.with_suffix(".p12")
        extra = ["-certfile", str(self.ca)] if chain else []
        run_tool(self.folder, "openssl", "pkcs12", "-export", "-in", str(self.cert), "-inkey", str(self.key),
                 *extra, "-name", "client", "-out", str(out), "-passout", f"pass:{password}")  # fmt: skip
        return out

    def keytool_pkcs12(self, password: str) -> Path:
        """The PKCS#12 keystore Java's ``keytool`` writes (its own algorithms and bag attributes)."""
        jks = self.jks(password)
        out = self.cert.with_name(self.cert.stem + "-keytool.p12")
        out.unlink(missing_ok=True)
        run_tool(self.folder, "keytool", "-importkeystore", "-noprompt", "-srckeystore", str(jks),
                 "-srcstoretype", "JKS", "-srcstorepass", password, "-destkeystore", str(out),
                 "-deststoretype", "pkcs12", "-deststorepass", password)  # fmt: skip
        return out

    def jks(self, password: str) -> Path:
        """The same key and certificate in a Java KeyStore (JKS) file; ``password`` (6 characters
        at least, keytool's rule) protects the store and the key."""
        p12 = self.pkcs12(password)
        out = self.cert.with_suffix(".jks")
        out.unlink(missing_ok=True)
        run_tool(self.folder, "keytool", "-importkeystore", "-noprompt", "-srckeystore", str(p12),
                 "-srcstoretype", "pkcs12", "-srcstorepass", password, "-destkeystore", str(out),
                 "-deststoretype", "JKS", "-deststorepass", password)  # fmt: skip
        return out

    def encrypted_key(self, password: str) -> Path:
        """The private key as an encrypted PKCS#8 PEM file."""
        out = self.key.with_name(self.key.stem + "-encrypted.key")
        run_tool(self.folder, "openssl", "pkey", "-in", str(self.key), "-aes256", "-passout",
                 f"pass:{password}", "-out", str(out))  # fmt: skip
        return out


def client_certificate(folder: Path, ca: Path, ca_key: Path, common_name: str) -> ClientCertificate:
    """A client certificate for ``/CN=<common_name>`` signed by ``ca``, written to ``folder`` as
    ``<common_name>.pem`` and ``<common_name>.key`` (readable by the owner only)."""
    folder.mkdir(parents=True, exist_ok=True)
    run_tool(folder, "openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{common_name}.key",
             "-out", f"{common_name}.csr", "-subj", f"/CN={common_name}")  # fmt: skip
    run_tool(folder, "openssl", "x509", "-req", "-in", f"{common_name}.csr", "-CA", str(ca), "-CAkey",
             str(ca_key), "-CAcreateserial", "-out", f"{common_name}.pem", "-days", DAYS)  # fmt: skip
    (folder / f"{common_name}.key").chmod(0o600)
    return ClientCertificate(
        folder / f"{common_name}.pem", folder / f"{common_name}.key", ca, f"/CN={common_name}"
    )
