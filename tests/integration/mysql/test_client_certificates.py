"""Client certificates against the session's MariaDB (TLS with a throwaway CA): an account created
``REQUIRE X509`` / ``REQUIRE SUBJECT`` captures with Debezium's ``database.ssl.keystore`` (PKCS#12,
as openssl and Java's keytool write it, or PEM) or our ``database.ssl.cert``/``database.ssl.key``,
on every connection (the binlog dump's included), and fails clearly without it, with a wrong
password, with a JKS keystore or with another subject.  No password reaches an error, a log or a
file."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.core.errors import AuthenticationFailed, ConfigError, ConnectionFailed
from airflow_cdc.core.pipeline import build_config
from airflow_cdc.sources.mysql.client import connect
from airflow_cdc.testing.certificates import ClientCertificate, client_certificate, make_ca, run_tool
from tests.integration.mysql.support import assert_converged, execute, pipeline, run_capture, state

STORE_PASSWORD = "St0re-pw-7f3a"  # noqa: S105 - a throwaway test keystore's
USER_PASSWORD = "Us3r-pw-91c2"  # noqa: S105 - a throwaway test account's


@dataclass
class X509User:
    name: str
    cert: ClientCertificate
    db: Any

    def config(self, staging: Path, **props: Any) -> dict[str, Any]:
        """A pipeline config logging in as this user, with ``props`` (``__`` for ``.``)."""
        return pipeline(
            self.db, staging, **{"database.user": self.name, "database.password": USER_PASSWORD}, **props
        )


@pytest.fixture
def x509_user(mariadb_db) -> Iterator[X509User]:
    """An account ``REQUIRE X509`` and a client certificate signed by the server's CA; dropped after."""
    server = mariadb_db.server
    name = f"x509_{mariadb_db.name}"[:32]
    cert = server.client_certificate(name)
    server.create_user(name, USER_PASSWORD, x509=True)
    try:
        yield X509User(name, cert, mariadb_db)
    finally:
        server.drop_user(name)


def _session(config: dict[str, Any]) -> tuple[str, str]:
    """(current user, TLS cipher) of a connection the connector opens."""
    conn = connect(build_config(config))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT CURRENT_USER()")
            user = cur.fetchone()[0]
            cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            return user, cur.fetchone()[1]
    finally:
        conn.close()


def _capture_and_converge(user: X509User, config: dict[str, Any]) -> None:
    """A snapshot, then changes read from the binlog dump (a connection of its own, so it too
    must present the certificate), equal to the table."""
    db = user.db.name
    execute(
        user.db,
        "CREATE TABLE t (id int PRIMARY KEY, v varchar(20))",
        "INSERT INTO t VALUES (1, 'a'), (2, 'b')",
    )
    assert run_capture(config).snapshot_rows == 2
    execute(
        user.db,
        "UPDATE t SET v = 'changed' WHERE id = 1",
        "DELETE FROM t WHERE id = 2",
        "INSERT INTO t VALUES (3, 'c')",
    )
    assert run_capture(config).tables[f"{db}.t"] == {"u": 1, "d": 1, "c": 1}
    assert state(config) is not None
    assert_converged(config, [f"{db}.t"])


def test_pkcs12_keystore_captures_as_an_x509_account(x509_user, tmp_path):
    cert = x509_user.cert
    config = x509_user.config(
        tmp_path / "s",
        **{
            "database.ssl.keystore": str(cert.pkcs12(STORE_PASSWORD)),
            "database.ssl.keystore.password": STORE_PASSWORD,
        },
    )
    user, cipher = _session(config)
    assert user.startswith(f"{x509_user.name}@") and cipher, "logged in over TLS with the certificate"
    _capture_and_converge(x509_user, config)
    # the PKCS#12 file Java's keytool writes (what Debezium users have), with the server verified
    # against a PKCS#12 truststore keytool made from the CA
    trust = cert.folder / f"{x509_user.name}-trust.p12"
    run_tool(cert.folder, "keytool", "-importcert", "-noprompt", "-alias", "ca", "-file", str(cert.ca),
             "-keystore", str(trust), "-storetype", "pkcs12", "-storepass", STORE_PASSWORD)  # fmt: skip
    java = dict(
        config,
        **{
            "database.ssl.keystore": str(cert.keytool_pkcs12(STORE_PASSWORD)),
            "database.ssl.mode": "verify_identity",
            "database.ssl.truststore": str(trust),
            "database.ssl.truststore.password": STORE_PASSWORD,
        },
    )
    assert _session(java)[0].startswith(f"{x509_user.name}@")
    with pytest.raises(ConfigError, match=r"'database.ssl.truststore.password': wrong password") as err:
        _session(dict(java, **{"database.ssl.truststore.password": "not-it"}))
    assert STORE_PASSWORD not in str(err.value)


def test_pem_files_capture_as_an_x509_account(x509_user, tmp_path):
    cert = x509_user.cert
    pem = {"database.ssl.cert": str(cert.cert), "database.ssl.key": str(cert.key)}
    config = x509_user.config(
        tmp_path / "s",
        **pem,
        **{"database.ssl.mode": "verify_identity", "database.ssl.truststore": str(cert.ca)},
    )
    _capture_and_converge(x509_user, config)
    encrypted = dict(
        config,
        **{
            "database.ssl.key": str(cert.encrypted_key(STORE_PASSWORD)),
            "database.ssl.keystore.password": STORE_PASSWORD,
        },
    )
    assert _session(encrypted)[0].startswith(f"{x509_user.name}@")
    with pytest.raises(ConfigError, match=r"'database.ssl.keystore.password' is not set"):
        _session({k: v for k, v in encrypted.items() if k != "database.ssl.keystore.password"})
    # one PEM file holding the certificate and the key, as database.ssl.keystore
    both = cert.folder / f"{x509_user.name}-both.pem"
    both.write_bytes(cert.cert.read_bytes() + cert.key.read_bytes())
    combined = {k: v for k, v in config.items() if k not in pem}
    assert _session(dict(combined, **{"database.ssl.keystore": str(both)}))[0].startswith(
        f"{x509_user.name}@"
    )


def test_without_the_certificate_the_login_fails_clearly(x509_user, tmp_path):
    config = x509_user.config(tmp_path / "s")
    with pytest.raises(AuthenticationFailed, match=rf"user '{x509_user.name}'") as err:
        run_capture(config)
    assert "REQUIRE X509" in err.value.hint and "database.ssl.keystore" in err.value.hint
    assert USER_PASSWORD not in str(err.value)


def test_a_wrong_keystore_password_is_a_config_error_and_stays_secret(x509_user, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    keystore = x509_user.cert.pkcs12(STORE_PASSWORD)
    wrong = "Wr0ng-keystore-pw"  # noqa: S105
    config = x509_user.config(
        tmp_path / "s", **{"database.ssl.keystore": str(keystore), "database.ssl.keystore.password": wrong}
    )
    with pytest.raises(
        ConfigError, match=r"property 'database.ssl.keystore.password': wrong password"
    ) as err:
        run_capture(config)
    assert str(keystore) in str(err.value)
    missing = {k: v for k, v in config.items() if k != "database.ssl.keystore.password"}
    with pytest.raises(ConfigError, match=r"'database.ssl.keystore.password' is not set"):
        run_capture(missing)
    shown = [str(err.value), err.value.hint, caplog.text]
    shown += [p.read_bytes().decode("latin-1") for p in tmp_path.rglob("*") if p.is_file()]
    assert not [s for s in shown if wrong in s or STORE_PASSWORD in s or USER_PASSWORD in s]


def test_a_jks_keystore_is_refused_with_the_keytool_fix(x509_user, tmp_path):
    jks = x509_user.cert.jks(STORE_PASSWORD)
    config = x509_user.config(
        tmp_path / "s",
        **{"database.ssl.keystore": str(jks), "database.ssl.keystore.password": STORE_PASSWORD},
    )
    with pytest.raises(ConfigError, match=r"property 'database.ssl.keystore': .* JKS Java keystore") as err:
        run_capture(config)
    assert f"keytool -importkeystore -srckeystore {jks} -srcstoretype JKS" in str(err.value)
    assert f"-destkeystore {jks.with_suffix('.p12')} -deststoretype pkcs12" in str(err.value)


def test_require_subject_takes_only_its_own_certificate(x509_user, tmp_path):
    server, name = x509_user.db.server, x509_user.name
    server.create_user(name, USER_PASSWORD, subject=x509_user.cert.subject)
    config = x509_user.config(
        tmp_path / "s",
        **{"database.ssl.cert": str(x509_user.cert.cert), "database.ssl.key": str(x509_user.cert.key)},
    )
    assert _session(config)[0].startswith(f"{name}@")
    other = server.client_certificate(f"other_{x509_user.db.name}"[:32])
    config.update({"database.ssl.cert": str(other.cert), "database.ssl.key": str(other.key)})
    with pytest.raises(AuthenticationFailed) as err:
        _session(config)
    assert f"CN={other.subject[4:]}" in err.value.hint and "REQUIRE SUBJECT" in err.value.hint


def test_a_certificate_from_another_ca_is_refused(x509_user, tmp_path):
    """The server ends the handshake: with an alert (not retried: it names the certificate) or,
    as TLS 1.3 allows, by closing the session (retryable, the certificate named as the likely cause)."""
    ca = make_ca(tmp_path / "foreign", common_name="not the server's CA")
    stranger = client_certificate(tmp_path / "foreign", ca, ca.with_suffix(".key"), "stranger")
    config = x509_user.config(
        tmp_path / "s", **{"database.ssl.cert": str(stranger.cert), "database.ssl.key": str(stranger.key)}
    )
    with pytest.raises((AuthenticationFailed, ConnectionFailed)) as err:
        _session(config)
    assert "refuse" in str(err.value) and "client certificate CN=stranger" in str(err.value)
    assert "database.ssl.mode=preferred" in str(err.value)
