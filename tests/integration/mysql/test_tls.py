"""``database.ssl.mode``: what each mode asks of the server, and clear errors when it cannot."""

from __future__ import annotations

import pytest

from airflow_cdc.core.errors import ConfigError, ConnectionFailed
from airflow_cdc.core.pipeline import build_config
from airflow_cdc.sources.mysql.client import connect
from tests.integration.mysql.support import pipeline, run_capture, state


def _cipher(config) -> str:
    conn = connect(build_config(config))
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
            return cur.fetchone()[1]
    finally:
        conn.close()


def test_modes_against_a_tls_server(mariadb_db, tmp_path):
    ca = str(mariadb_db.server.ca_file)
    base = pipeline(mariadb_db, tmp_path / "s")
    assert _cipher(base), "preferred (the default) must use TLS when the server offers it"
    assert _cipher(dict(base, **{"database.ssl.mode": "disabled"})) in (b"", "")
    assert _cipher(dict(base, **{"database.ssl.mode": "required"}))
    verified = dict(base, **{"database.ssl.mode": "verify_identity", "database.ssl.truststore": ca})
    assert _cipher(verified)
    run_capture(verified)  # the binlog stream connects the same way
    assert state(verified) is not None


def test_certificate_checks_fail_clearly(mariadb_db, tmp_path):
    base = pipeline(mariadb_db, tmp_path / "s", **{"database.ssl.mode": "verify_ca"})
    # the system CAs do not know the throwaway CA: the certificate check must fail
    with pytest.raises(ConnectionFailed, match="database.ssl.mode=verify_ca") as err:
        _cipher(base)
    assert mariadb_db.server.password not in str(err.value)
    with pytest.raises(ConfigError, match="database.ssl.truststore.*/nonexistent/ca.pem"):
        _cipher(dict(base, **{"database.ssl.truststore": "/nonexistent/ca.pem"}))
    trusted = dict(base, **{"database.ssl.truststore": str(mariadb_db.server.ca_file)})
    assert _cipher(trusted)  # the same check passes with the throwaway CA
