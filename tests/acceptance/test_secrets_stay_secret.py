"""No secret leaves its file: a worker publishing on a SASL_SSL broker with every secret read from a file
(the Kafka password through PIN_IDENTITY_KAFKA_CONFIG_FILE, the database password and both tokens through
their _FILE variables), `embedded info`, `kafka ensure-topics`, and the failing runs (a wrong password, a CA
that did not sign the broker): none of them prints a secret, and none is in the command line or the
environment of our processes. A failing run is one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from pin_identity.adapters.kafka.embedded_kafka import free_port
from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics
from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain.events import PUBLISHED_TOPICS
from pin_identity.domain.fanout_policy import FanOutPolicy
from tests.support import seed
from tests.support.certificates import make_server_certificate
from tests.support.cli import CLI, run_cli
from tests.support.health import wait_for_healthz
from tests.support.relay import outbox_count, relay_worker
from tests.support.secured_kafka import JobLogins, SecuredKafka, talent_topics_of_their_own
from tests.support.waiting import wait_until

DATABASE_PASSWORD = "db-secret-7f3e91"
TALENT_TOKEN = "talent-secret-0a5c2d"
ADMIN_TOKEN = "admin-secret-c4e8b6"


@pytest.fixture
def secret_env(
    subprocess_env: dict[str, str], settings: Settings, secured_broker: SecuredKafka, tmp_path: Path
) -> tuple[dict[str, str], list[str]]:
    """The relay's environment on the secured broker: every secret a file; and the secrets themselves."""
    logins = JobLogins(secured_broker, tmp_path / "logins", talent_topics_of_their_own(secured_broker, 0))
    login, principal = logins.login(settings, "outbox-relay")
    ensure_topics(secured_broker.admin_config, PUBLISHED_TOPICS, TopicLayout(3, 1))  # the topic admin's
    files = {}
    for name, secret in (("DATABASE_PASSWORD", DATABASE_PASSWORD), ("TALENT_API_TOKEN", TALENT_TOKEN)):
        path = tmp_path / name.lower()
        path.write_text(secret)
        files[f"PIN_IDENTITY_{name}_FILE"] = str(path)
    (tmp_path / "admin_token").write_text(ADMIN_TOKEN)
    env = {
        **subprocess_env,
        **files,
        "PIN_IDENTITY_ADMIN_TOKEN_FILE": str(tmp_path / "admin_token"),
        "PIN_IDENTITY_TALENT_API_URL": "http://127.0.0.1:9",
        "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": secured_broker.bootstrap,
        "PIN_IDENTITY_KAFKA_CONFIG_FILE": str(login.kafka_config_file),
        "PIN_IDENTITY_OUTBOX_RELAY_CREATES_TOPICS": "false",
    }
    return env, [principal.password, DATABASE_PASSWORD, TALENT_TOKEN, ADMIN_TOKEN]


def _process_text(pid: int) -> str:
    """What anyone allowed to look at a process sees of it: its command line and environment."""
    proc = Path(f"/proc/{pid}")
    return (proc / "cmdline").read_bytes().decode(errors="replace") + (proc / "environ").read_bytes().decode(
        errors="replace"
    )


def test_no_secret_in_output_command_line_or_environment_of_a_working_relay(
    secret_env: tuple[dict[str, str], list[str]], settings: Settings, tmp_path: Path, database_url: str
) -> None:
    env, secrets = secret_env
    writer = Container(settings)
    _, role = seed.held_role(writer.stores.identity_transactions, 3)
    seed.change_permissions(
        writer.stores.identity_transactions, role, ["deals.read"], FanOutPolicy(inline_threshold=10)
    )
    writer.close()
    seen: list[str] = []
    with relay_worker(env, tmp_path) as worker:
        wait_until(
            lambda: outbox_count(database_url) == 0, "the relay publishes on its principal", timeout_s=60
        )
        seen.append(_process_text(worker.process.pid))
    seen.append(worker.log.read_text())
    for command in (("embedded", "info"), ("kafka", "ensure-topics"), ("--version",)):
        done = run_cli(env, *command)
        seen += [done.stdout, done.stderr]
    _no_secret(seen, secrets)


@pytest.mark.parametrize("fault", ["wrong password", "another CA"])
def test_a_failing_login_is_one_line_without_the_secret(
    secret_env: tuple[dict[str, str], list[str]], tmp_path: Path, fault: str
) -> None:
    env, secrets = secret_env
    config = Path(env["PIN_IDENTITY_KAFKA_CONFIG_FILE"])
    wrong = "wrong-kafka-secret-51d0"
    if fault == "wrong password":
        (tmp_path / "wrong-password").write_text(wrong)
        text = config.read_text().replace("${file:", f"${{file:{tmp_path / 'wrong-password'}}}\n#", 1)
    else:
        stranger = make_server_certificate(tmp_path / "another-ca")
        text = config.read_text() + f"ssl.ca.location={stranger.ca}\n"
    altered = tmp_path / "altered.properties"
    altered.write_text(text)
    done = run_cli(
        {**env, "PIN_IDENTITY_KAFKA_CONFIG_FILE": str(altered)}, "kafka", "ensure-topics", timeout=60
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    refused = "error: PIN_IDENTITY_KAFKA_CONFIG_FILE: the broker refused the client ("
    assert lines[0].startswith(refused), lines  # the variable the login came from
    _no_secret([done.stdout, done.stderr], [*secrets, wrong])


# What the console loads and asks for (its page, its script and style, the API routes of its sections), and
# what a scraper or a client of the API sees.
CONSOLE_AND_API = (
    "/ui/", "/ui/console.js", "/ui/console.css", "/admin/v1/whoami", "/admin/v1/health/summary",
    "/admin/v1/roles", "/admin/v1/access-fanout/tasks", "/admin/v1/talent-import/runs",
    "/admin/v1/talent-sync/failed-items", "/openapi.json", "/metrics", "/readyz", "/healthz",
)  # fmt: skip


def test_no_secret_in_what_the_console_and_the_admin_api_serve(
    secret_env: tuple[dict[str, str], list[str]], tmp_path: Path
) -> None:
    env, secrets = secret_env
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as output:
        server = subprocess.Popen([*CLI, "serve", "--port", str(port)], env=env, stdout=output, stderr=output)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_healthz(base, "serve")
        operator = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        with httpx.Client(base_url=base, timeout=30, headers=operator) as api:
            answers = {path: api.get(path) for path in CONSOLE_AND_API}
        seen = [_process_text(server.pid)]
    finally:
        server.terminate()
        server.wait(30)
    assert {path for path, answer in answers.items() if answer.status_code != 200} <= {"/readyz"}, {
        path: answer.status_code for path, answer in answers.items()
    }
    _no_secret([*seen, *(answer.text for answer in answers.values()), log.read_text()], secrets)


def _no_secret(seen: list[str], secrets: list[str]) -> None:
    leaked = sorted({secret for secret in secrets for text in seen if secret in text})
    assert leaked == [], f"{len(leaked)} secrets leaked"


def test_the_process_scan_would_see_a_secret_on_a_command_line(tmp_path: Path) -> None:
    """The scan itself: a secret passed as an argument is found in /proc/<pid>/cmdline."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", ADMIN_TOKEN])
    try:
        wait_until(lambda: ADMIN_TOKEN in _process_text(process.pid), "the argument shows")
    finally:
        process.kill()
        process.wait()
