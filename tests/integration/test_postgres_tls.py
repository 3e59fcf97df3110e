"""TLS to PostgreSQL, verified: a server of the test's own with a certificate its own CA signed, reached with
`sslmode=verify-full` (the CA and the host's name checked) and the password from
PIN_IDENTITY_DATABASE_PASSWORD_FILE; a server the CA did not sign is refused in one line that holds no
secret."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pin_identity.adapters.kafka.embedded_kafka import free_port
from pin_identity.composition import Container
from pin_identity.composition.connections import Connections
from pin_identity.config import ConfigurationError, Settings
from tests.support.certificates import ServerCertificate, make_server_certificate
from tests.support.older_postgres import older_postgres, older_postgres_bin

PASSWORD = "tls-test-password-5d1f"
ROLE = "pin_identity_tls"


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServerCertificate]]:
    """A PostgreSQL serving TLS on loopback with a certificate of the test's CA (Debian's build: the embedded
    wheel's has no TLS), and a role that logs in with a password."""
    certificate = make_server_certificate(tmp_path_factory.mktemp("tls-postgres"))
    with older_postgres(older_postgres_bin(), tls=certificate, port=free_port()) as admin_url:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            statement = "CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}"  # owns the schema it migrates
            conn.execute(sql.SQL(statement).format(sql.Identifier(ROLE), sql.Literal(PASSWORD)))
        yield admin_url, certificate


def _url(admin_url: str, ca: Path, host: str = "127.0.0.1") -> str:
    """The server's URL as a deployment writes it: the role, TLS verified against `ca`, no password."""
    port = conninfo_to_dict(admin_url)["port"]
    return make_conninfo(
        "", host=host, port=port, dbname="postgres", user=ROLE, sslmode="verify-full", sslrootcert=str(ca)
    )


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_verify_full_against_the_servers_ca_works_with_the_password_from_a_file(
    tls_server: tuple[str, ServerCertificate], tmp_path: Path, host: str
) -> None:
    admin_url, certificate = tls_server
    password_file = tmp_path / "database-password"
    password_file.write_text(PASSWORD + "\n")
    url = _url(admin_url, certificate.ca, host)
    settings = Settings(database_url=url, database_password_file=password_file, data_dir=tmp_path)
    container = Container(settings)
    try:
        container.connections.upgrade_schema()  # the pool's connections, and Alembic's
        with psycopg.connect(admin_url) as conn:
            sessions = conn.execute(
                "SELECT count(*), bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)"
                " WHERE a.usename = %s",
                (ROLE,),
            ).fetchone()
        assert sessions is not None and sessions[0] > 0 and sessions[1] is True, sessions
        assert PASSWORD not in container.connections.database_url
    finally:
        container.close()


WRONG_PASSWORD = "not-the-password-93b2"


@pytest.mark.parametrize(
    ("fault", "said"),
    [("another CA", "certificate verify failed"), ("wrong password", "password authentication failed")],
)
def test_a_failing_login_is_refused_in_one_line_without_the_password(
    tls_server: tuple[str, ServerCertificate], tmp_path: Path, fault: str, said: str
) -> None:
    admin_url, certificate = tls_server
    ca = make_server_certificate(tmp_path / "another-ca").ca if fault == "another CA" else certificate.ca
    password_file = tmp_path / "database-password"
    password_file.write_text(WRONG_PASSWORD if fault == "wrong password" else PASSWORD)
    url = _url(admin_url, ca)
    settings = Settings(database_url=url, database_password_file=password_file, data_dir=tmp_path)
    with pytest.raises(ConfigurationError) as refused:
        Connections(settings).require_database()
    message = str(refused.value)
    assert message.startswith("PIN_IDENTITY_DATABASE_URL: ") and said in message
    assert "\n" not in message and PASSWORD not in message and WRONG_PASSWORD not in message
