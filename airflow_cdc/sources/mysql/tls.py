"""TLS towards MySQL/MariaDB: ``database.ssl.mode``, the CAs the server is checked against
(``database.ssl.truststore``) and the client certificate (``database.ssl.keystore``).

Debezium reads Java keystores; pymysql takes an :class:`ssl.SSLContext`.  Stores are read with
``cryptography``, whatever their file name says:

* PKCS#12 (``keytool``'s default since Java 9, ``openssl pkcs12 -export``), opened with
  ``database.ssl.keystore.password`` / ``database.ssl.truststore.password``;
* PEM: a certificate chain and its private key in one file, or (our names, MySQL's own
  ``--ssl-cert``/``--ssl-key``) ``database.ssl.cert`` and ``database.ssl.key``;
* JKS and JCEKS: refused with the ``keytool`` command that converts them.

The private key reaches OpenSSL through an anonymous memory file (``memfd``; a 0600 file in a
0700 temporary directory where there is none), encrypted with a one-time passphrase and closed
as soon as the context holds it: no clear key is written anywhere, and no password reaches a
file, a message or a log.  A context is built once per configuration object (one run).
"""

from __future__ import annotations

import os
import secrets
import ssl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from cryptography import x509
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.hazmat.primitives.serialization import pkcs12

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import AuthenticationFailed, CdcError, ConfigError, ConnectionFailed

KEYSTORE, KEYSTORE_PASSWORD = "database.ssl.keystore", "database.ssl.keystore.password"
TRUSTSTORE, TRUSTSTORE_PASSWORD = "database.ssl.truststore", "database.ssl.truststore.password"
CERT, KEY = "database.ssl.cert", "database.ssl.key"
_JAVA_STORES = {b"\xfe\xed\xfe\xed": "JKS", b"\xce\xce\xce\xce": "JCEKS"}
#: DER of the OID pkcs7-data, which opens every PKCS#12 file's authSafe
_PKCS7_DATA = bytes.fromhex("06092a864886f70d010701")


@dataclass(frozen=True)
class ClientIdentity:
    """A client certificate chain (leaf first) and its private key."""

    chain: tuple[x509.Certificate, ...]
    key: PrivateKeyTypes

    @property
    def subject(self) -> str:
        return self.chain[0].subject.rfc4514_string()


@dataclass(frozen=True)
class _Built:
    params: dict[str, Any]
    subject: str | None


_BUILT: WeakKeyDictionary[ConnectorConfig, _Built] = WeakKeyDictionary()


def check_properties(config: ConnectorConfig) -> None:
    """Refuse combinations that cannot work, before any file is read.

    :raises ConfigError: two client certificates, ``database.ssl.key`` alone, or a client
        certificate with ``database.ssl.mode=disabled``.
    """
    if config[KEYSTORE] and (config[CERT] or config[KEY]):
        raise ConfigError(
            f"properties {KEYSTORE!r} and {CERT!r}/{KEY!r} both give a client certificate; set one"
        )
    if config[KEY] and not config[CERT]:
        raise ConfigError(f"property {KEY!r} needs {CERT!r} (the certificate of that key)")
    if (config[KEYSTORE] or config[CERT]) and config["database.ssl.mode"] == "disabled":
        raise ConfigError(
            "property 'database.ssl.mode': a client certificate is only sent over TLS; set it to "
            "required, verify_ca or verify_identity (not disabled)"
        )


def tls_params(config: ConnectorConfig) -> dict[str, Any]:
    """pymysql arguments for ``database.ssl.mode`` and the client certificate.

    ``preferred`` upgrades to TLS when the server offers it (unverified, like MySQL's own
    clients); ``required`` refuses a server without TLS; ``verify_ca`` also checks the server
    certificate against ``database.ssl.truststore`` (the system CAs when unset);
    ``verify_identity`` also checks that it names ``database.hostname``.  A client certificate
    makes TLS required in ``preferred`` too (as pymysql and MySQL 5.7's client do).

    :raises ConfigError: naming the property whose file cannot be read or opened.
    """
    built = _BUILT.get(config)
    if built is None:
        identity = client_identity(config)
        subject = None if identity is None else identity.subject
        built = _BUILT[config] = _Built(_params(config, identity), subject)
    return dict(built.params)


def auth_hint(config: ConnectorConfig) -> str:
    """What to check when the server refused the login (error 1045 also means a certificate
    the account REQUIREs was missing or not the right one)."""
    built = _BUILT.get(config)
    if built is not None and built.subject is not None:
        return (
            "verify the database user name and password, and that the account's REQUIRE SUBJECT/"
            f"ISSUER matches the client certificate sent ({built.subject})"
        )
    return (
        "verify the database user name and password; an account created REQUIRE X509, SUBJECT or "
        f"ISSUER also needs its client certificate in {KEYSTORE} (or {CERT} and {KEY})"
    )


def tls_failure(config: ConnectorConfig, where: str, code: int, detail: str) -> CdcError | None:
    """The error for a connection that failed in TLS (pymysql error ``code``, its ``detail``),
    or None when it did not.

    2026: the server offers no TLS; 2003 wrapping an SSL error: the server certificate failed
    the check.  A TLS alert from the server once a client certificate was sent (2006/2013) is
    its refusal of that certificate (another CA, expired); an end of the TLS session there may
    be one too, or a network failure, so it stays retryable.
    """
    if code != 2026 and (code not in (2003, 2006, 2013) or "SSL" not in detail):
        return None
    message = (
        f"cannot connect to MySQL at {where} with database.ssl.mode={config['database.ssl.mode']}: {detail}"
    )
    built = _BUILT.get(config)
    sent = None if built is None else built.subject
    if sent is None or code == 2003:
        return ConnectionFailed(message)
    if "ALERT" in detail:
        return AuthenticationFailed(
            f"{message}: the server refused the client certificate {sent}",
            hint="use a client certificate signed by a CA the server trusts (its ssl_ca), still valid",
        )
    return ConnectionFailed(
        f"{message} (if it persists: the server may refuse the client certificate {sent})"
    )


def _params(config: ConnectorConfig, identity: ClientIdentity | None) -> dict[str, Any]:
    mode = config["database.ssl.mode"]
    if mode == "disabled":
        return {"ssl_disabled": True}
    if mode == "preferred" and identity is None:
        return {}  # pymysql's default: TLS when the server offers it, else plain
    verify = mode in ("verify_ca", "verify_identity")
    ctx = _verifying_context(config) if verify else ssl.create_default_context()
    ctx.check_hostname = mode == "verify_identity"
    ctx.verify_mode = ssl.CERT_REQUIRED if verify else ssl.CERT_NONE
    if identity is not None:
        load_identity(ctx, identity)
    return {"ssl": ctx}


def _verifying_context(config: ConnectorConfig) -> ssl.SSLContext:
    path = config[TRUSTSTORE]
    if path is None:
        return ssl.create_default_context()
    data = _read(path, TRUSTSTORE)
    if _is_pem(data, path, TRUSTSTORE):
        cadata: str | None = None
    else:
        store = _pkcs12(data, path, TRUSTSTORE, config.secret(TRUSTSTORE_PASSWORD))
        certs = [c.certificate for c in store.additional_certs] + (
            [store.cert.certificate] if store.cert else []
        )
        if not certs:
            raise ConfigError(f"property {TRUSTSTORE!r}: {path!r} holds no certificate")
        cadata = "".join(c.public_bytes(ser.Encoding.PEM).decode() for c in certs)
    try:
        return ssl.create_default_context(cafile=path if cadata is None else None, cadata=cadata)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"property {TRUSTSTORE!r}: cannot load CA file {path!r}: {e}") from None


def client_identity(config: ConnectorConfig) -> ClientIdentity | None:
    """The configured client certificate and key, or None.

    :raises ConfigError: naming the property: a file that cannot be read, a JKS/JCEKS keystore,
        a missing or wrong password, no private key, or a key that fits no certificate.
    """
    password = config.secret(KEYSTORE_PASSWORD) or None
    path = config[KEYSTORE]
    if path:
        data = _read(path, KEYSTORE)
        if _is_pem(data, path, KEYSTORE):
            return _pem_identity(data, path, KEYSTORE, data, path, KEYSTORE, password)
        store = _pkcs12(data, path, KEYSTORE, password)
        if store.key is None or store.cert is None:
            raise ConfigError(
                f"property {KEYSTORE!r}: {path!r} holds no private key entry (is it a truststore?)"
            )
        chain = [store.cert.certificate, *(c.certificate for c in store.additional_certs)]
        return _identity(store.key, chain, path, KEYSTORE)
    cert_path = config[CERT]
    if not cert_path:
        return None
    cert = _read(cert_path, CERT)
    key_path, key_prop = (config[KEY], KEY) if config[KEY] else (cert_path, CERT)
    key = _read(key_path, KEY) if config[KEY] else cert
    return _pem_identity(cert, cert_path, CERT, key, key_path, key_prop, password)


def _read(path: str, prop: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"property {prop!r}: cannot read {path!r}: {e.strerror or e}") from None


def _is_pem(data: bytes, path: str, prop: str) -> bool:
    """Whether ``data`` is PEM (else PKCS#12).

    :raises ConfigError: a Java keystore, with the keytool command that converts it."""
    kind = _JAVA_STORES.get(data[:4])
    if kind is not None:
        stem = os.path.splitext(path)[0]
        raise ConfigError(
            f"property {prop!r}: {path!r} is a {kind} Java keystore, which only Java reads; convert "
            f"it to PKCS#12: keytool -importkeystore -srckeystore {path} -srcstoretype {kind} "
            f"-destkeystore {stem}.p12 -deststoretype pkcs12 (then set {prop} to {stem}.p12)"
        )
    return b"-----BEGIN " in data


def _pkcs12(data: bytes, path: str, prop: str, password: str | None) -> pkcs12.PKCS12KeyAndCertificates:
    password_prop = prop + ".password"
    for candidate in [password.encode()] if password else [None, b""]:
        try:
            return pkcs12.load_pkcs12(data, candidate)
        except ValueError:
            continue  # cryptography's message does not say whether the password or the data
    if _PKCS7_DATA not in data[:64]:
        raise ConfigError(f"property {prop!r}: {path!r} is neither a PKCS#12 keystore nor PEM")
    if not password:
        raise ConfigError(f"property {password_prop!r} is not set: the PKCS#12 file {path!r} needs it")
    raise ConfigError(f"property {password_prop!r}: wrong password for the PKCS#12 file {path!r}")


def _pem_identity(
    cert: bytes,
    cert_path: str,
    cert_prop: str,
    key: bytes,
    key_path: str,
    key_prop: str,
    password: str | None,
) -> ClientIdentity:
    try:
        chain = x509.load_pem_x509_certificates(cert)
    except ValueError:
        raise ConfigError(f"property {cert_prop!r}: no PEM certificate in {cert_path!r}") from None
    if b"PRIVATE KEY-----" not in key:
        where = f"; set {KEY!r}" if key_prop == CERT else ""
        raise ConfigError(f"property {key_prop!r}: no PEM private key in {key_path!r}{where}")
    try:
        private = ser.load_pem_private_key(key, password.encode() if password else None)
    except TypeError:
        if not password:
            raise ConfigError(
                f"property {KEYSTORE_PASSWORD!r} is not set: the private key in {key_path!r} is encrypted"
            ) from None
        private = ser.load_pem_private_key(key, None)  # the password was for something else
    except ValueError:
        if b"ENCRYPTED" in key:
            raise ConfigError(
                f"property {KEYSTORE_PASSWORD!r}: wrong password for the private key in {key_path!r}"
            ) from None
        raise ConfigError(f"property {key_prop!r}: cannot read the private key in {key_path!r}") from None
    return _identity(private, chain, key_path, key_prop)


def _identity(key: PrivateKeyTypes, certs: list[x509.Certificate], path: str, prop: str) -> ClientIdentity:
    """The chain with the key's own certificate first."""
    public = _spki(key.public_key())
    own = [c for c in certs if _spki(c.public_key()) == public]
    if not own:
        raise ConfigError(
            f"property {prop!r}: the private key in {path!r} belongs to none of its certificates"
        )
    return ClientIdentity((own[0], *(c for c in certs if c is not own[0])), key)


def _spki(public: Any) -> bytes:
    return bytes(public.public_bytes(ser.Encoding.DER, ser.PublicFormat.SubjectPublicKeyInfo))


def load_identity(ctx: ssl.SSLContext, identity: ClientIdentity) -> None:
    """Make ``ctx`` present ``identity``; the key passes through a private in-memory file,
    encrypted with a passphrase that lives only in this call."""
    one_time = secrets.token_hex(32)
    pem = b"".join(c.public_bytes(ser.Encoding.PEM) for c in identity.chain)
    pem += identity.key.private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.BestAvailableEncryption(one_time.encode())
    )
    with _private_file(pem) as path:
        ctx.load_cert_chain(path, password=one_time)


@contextmanager
def _private_file(data: bytes) -> Iterator[str]:
    """A path OpenSSL can open holding ``data``, gone when the block ends."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("airflow-cdc-client-key", os.MFD_CLOEXEC)
        try:
            _write_all(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="airflow-cdc-tls-") as folder:  # mode 0700
        path = os.path.join(folder, "client.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        yield path


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
