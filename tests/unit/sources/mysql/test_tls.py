"""Reading MySQL client certificates and truststores (:mod:`airflow_cdc.sources.mysql.tls`):
PKCS#12 and PEM accepted, Java keystores refused with the keytool fix, wrong or missing passwords
named by property and never shown, the key handed to OpenSSL without a clear copy on disk."""

from __future__ import annotations

import datetime as dt
import os
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from airflow_cdc.core.errors import AuthenticationFailed, ConfigError, ConnectionFailed
from airflow_cdc.sources.mysql import tls
from airflow_cdc.sources.mysql.config import mysql_config

PASSWORD = "Keystore-pw-5b1"  # noqa: S105 - a test keystore's
BASE = {"name": "m", "connector": "mysql", "staging.path": "/tmp/x", "database.ssl.mode": "required"}


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None = None,
):
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer[0])]) if issuer else name
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(issuer[1] if issuer else key, hashes.SHA256())
    )


@pytest.fixture(scope="module")
def material():
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test-ca", ca_key)
    return ca, key, _cert("cdc-client", key, ("test-ca", ca_key))


def _pem(*objs) -> bytes:
    out = b""
    for o in objs:
        if isinstance(o, x509.Certificate):
            out += o.public_bytes(ser.Encoding.PEM)
        else:
            out += o.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    return out


def _p12(material, password: str | None = PASSWORD, with_key: bool = True) -> bytes:
    ca, key, cert = material
    encryption = ser.BestAvailableEncryption(password.encode()) if password else ser.NoEncryption()
    if not with_key:
        return pkcs12.serialize_key_and_certificates(b"trust", None, None, [ca], encryption)
    return pkcs12.serialize_key_and_certificates(b"client", key, cert, [ca], encryption)


def _config(**props):
    return mysql_config({**BASE, **{k.replace("__", "."): v for k, v in props.items()}})


def _write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_pkcs12_keystore_gives_the_chain_leaf_first(tmp_path, material):
    path = _write(tmp_path, "client.p12", _p12(material))
    identity = tls.client_identity(
        _config(database__ssl__keystore=path, database__ssl__keystore__password=PASSWORD)
    )
    assert identity is not None and identity.subject == "CN=cdc-client"
    assert [c.subject.rfc4514_string() for c in identity.chain] == ["CN=cdc-client", "CN=test-ca"]


@pytest.mark.parametrize("password", ["wrong-one", None])
def test_pkcs12_password_wrong_or_missing_names_the_property(tmp_path, material, password):
    path = _write(tmp_path, "client.p12", _p12(material))
    props = {"database.ssl.keystore": path}
    if password:
        props["database.ssl.keystore.password"] = password
    expected = "wrong password" if password else "is not set"
    with pytest.raises(ConfigError, match=rf"property 'database.ssl.keystore.password'.*{expected}") as err:
        tls.client_identity(_config(**props))
    assert path in str(err.value)
    assert PASSWORD not in str(err.value) and "wrong-one" not in str(err.value)


def test_a_keystore_without_a_password_opens_without_one(tmp_path, material):
    path = _write(tmp_path, "open.p12", _p12(material, password=None))
    assert tls.client_identity(_config(database__ssl__keystore=path)) is not None


@pytest.mark.parametrize("magic,kind", [(b"\xfe\xed\xfe\xed", "JKS"), (b"\xce\xce\xce\xce", "JCEKS")])
def test_java_keystores_are_refused_with_the_keytool_command(tmp_path, magic, kind):
    path = _write(tmp_path, "client.jks", magic + b"\x00\x00\x00\x02" + b"\x00" * 64)
    with pytest.raises(
        ConfigError, match=rf"property 'database.ssl.keystore': .* {kind} Java keystore"
    ) as err:
        tls.client_identity(_config(database__ssl__keystore=path, database__ssl__keystore__password=PASSWORD))
    assert (
        f"keytool -importkeystore -srckeystore {path} -srcstoretype {kind} -destkeystore "
        f"{tmp_path / 'client.p12'} -deststoretype pkcs12" in str(err.value)
    )
    with pytest.raises(ConfigError, match=r"property 'database.ssl.truststore': .*keytool -importkeystore"):
        tls.tls_params(_config(database__ssl__mode="verify_ca", database__ssl__truststore=path))


def test_other_files_and_truststores_given_as_keystores_are_named(tmp_path, material):
    junk = _write(tmp_path, "junk.bin", b"\x01\x02 not a keystore")
    with pytest.raises(ConfigError, match=r"'database.ssl.keystore': .* neither a PKCS#12 keystore nor PEM"):
        tls.client_identity(_config(database__ssl__keystore=junk, database__ssl__keystore__password=PASSWORD))
    trust = _write(tmp_path, "trust.p12", _p12(material, with_key=False))
    with pytest.raises(ConfigError, match=r"holds no private key entry"):
        tls.client_identity(
            _config(database__ssl__keystore=trust, database__ssl__keystore__password=PASSWORD)
        )
    with pytest.raises(ConfigError, match=r"'database.ssl.keystore': cannot read '/nonexistent/k.p12'"):
        tls.client_identity(_config(database__ssl__keystore="/nonexistent/k.p12"))


def test_pem_files_in_any_order_and_encrypted_keys(tmp_path, material):
    ca, key, cert = material
    both = _write(tmp_path, "both.pem", _pem(ca, key, cert))  # CA first: the key picks its own certificate
    identity = tls.client_identity(_config(database__ssl__keystore=both))
    assert identity is not None and identity.subject == "CN=cdc-client" and len(identity.chain) == 2
    cert_path = _write(tmp_path, "c.pem", _pem(cert))
    encrypted = key.private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.BestAvailableEncryption(PASSWORD.encode())
    )
    key_path = _write(tmp_path, "c.key", encrypted)
    props = {"database.ssl.cert": cert_path, "database.ssl.key": key_path}
    assert tls.client_identity(_config(**props, **{"database.ssl.keystore.password": PASSWORD})) is not None
    with pytest.raises(
        ConfigError, match=r"'database.ssl.keystore.password' is not set: .*c.key' is encrypted"
    ):
        tls.client_identity(_config(**props))
    with pytest.raises(ConfigError, match=r"'database.ssl.keystore.password': wrong password .*c.key"):
        tls.client_identity(_config(**props, **{"database.ssl.keystore.password": "nope-nope"}))
    stranger = _write(tmp_path, "s.key", _pem(ec.generate_private_key(ec.SECP256R1())))
    with pytest.raises(ConfigError, match=r"'database.ssl.key': the private key in .*s.key' belongs to none"):
        tls.client_identity(_config(database__ssl__cert=cert_path, database__ssl__key=stranger))
    with pytest.raises(ConfigError, match=r"'database.ssl.cert': no PEM private key"):
        tls.client_identity(_config(database__ssl__cert=cert_path))


@pytest.mark.parametrize(
    "props,match",
    [
        ({"database.ssl.keystore": "k.p12", "database.ssl.cert": "c.pem"}, "both give a client certificate"),
        ({"database.ssl.key": "c.key"}, r"'database.ssl.key' needs 'database.ssl.cert'"),
        (
            {"database.ssl.keystore": "k.p12", "database.ssl.mode": "disabled"},
            r"'database.ssl.mode': .*only sent over TLS",
        ),
    ],
)
def test_combinations_that_cannot_work_are_refused_at_once(props, match):
    with pytest.raises(ConfigError, match=match):
        _config(**props)


def test_passwords_are_secrets():
    config = _config(
        **{"database.ssl.keystore.password": PASSWORD, "database.ssl.truststore.password": PASSWORD}
    )
    assert PASSWORD not in repr(config) and PASSWORD not in repr(config.items())
    assert config.secret("database.ssl.keystore.password") == PASSWORD


def test_the_key_reaches_openssl_encrypted_in_memory(tmp_path, material, monkeypatch):
    path = _write(tmp_path, "client.p12", _p12(material))
    handed: list[bytes] = []
    private_file = tls._private_file

    def spy(data: bytes):
        handed.append(data)
        return private_file(data)

    monkeypatch.setattr(tls, "_private_file", spy)
    config = _config(database__ssl__keystore=path, database__ssl__keystore__password=PASSWORD)
    params = tls.tls_params(config)
    ctx = params["ssl"]
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_NONE
    assert tls.tls_params(config)["ssl"] is ctx, "read once per configuration"
    (data,) = handed
    assert b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in data and b"-----BEGIN PRIVATE KEY-----" not in data
    assert PASSWORD.encode() not in data


def test_without_memfd_a_private_file_is_used_and_removed(monkeypatch):
    monkeypatch.delattr(os, "memfd_create")
    with tls._private_file(b"secret bytes") as path:
        assert Path(path).read_bytes() == b"secret bytes"
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))


def test_memfd_leaves_no_file_behind():
    if not hasattr(os, "memfd_create"):
        pytest.skip("no memfd here")
    with tls._private_file(b"x") as path:
        assert path.startswith("/proc/self/fd/") and Path(path).read_bytes() == b"x"
    assert not os.path.exists(path)


def test_pkcs12_truststore_and_its_password(tmp_path, material):
    trust = _write(tmp_path, "trust.p12", _p12(material, with_key=False))
    props = {"database.ssl.mode": "verify_ca", "database.ssl.truststore": trust}
    ctx = tls.tls_params(_config(**props, **{"database.ssl.truststore.password": PASSWORD}))["ssl"]
    assert ctx.cert_store_stats()["x509"] == 1, "the truststore's CA, and only it"
    assert ctx.verify_mode == ssl.CERT_REQUIRED and not ctx.check_hostname
    with pytest.raises(ConfigError, match=r"'database.ssl.truststore.password': wrong password"):
        tls.tls_params(_config(**props, **{"database.ssl.truststore.password": "nope-nope"}))


def test_tls_failures_name_the_certificate_sent(tmp_path, material):
    plain = _config()
    tls.tls_params(plain)
    alert = "Lost connection ([SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca)"
    assert tls.tls_failure(plain, "h:1", 2013, "plain error") is None
    assert isinstance(tls.tls_failure(plain, "h:1", 2013, alert), ConnectionFailed)
    path = _write(tmp_path, "client.p12", _p12(material))
    sent = _config(database__ssl__keystore=path, database__ssl__keystore__password=PASSWORD)
    tls.tls_params(sent)
    refused = tls.tls_failure(sent, "h:1", 2013, alert)
    assert isinstance(refused, AuthenticationFailed) and "client certificate CN=cdc-client" in str(refused)
    closed = tls.tls_failure(sent, "h:1", 2006, "gone away (SSLEOFError(8, 'EOF'))")
    assert isinstance(closed, ConnectionFailed) and "may refuse the client certificate CN=cdc-client" in str(
        closed
    )
    assert "REQUIRE X509" in tls.auth_hint(plain) and "CN=cdc-client" in tls.auth_hint(sent)
