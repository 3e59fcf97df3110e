"""The relay session's SilenceLimit as the settings and parameters both ends of the connection get."""

from __future__ import annotations

import pytest

from pin_identity.adapters.postgres.database import SilenceLimit


def _options(options: str) -> dict[str, str]:
    return dict(option.removeprefix("-c ").split("=") for option in options.split(" -c "))


@pytest.mark.parametrize("after_s", [2, 5, 10, 15, 20, 29, 60])
def test_keepalive_probes_give_a_silent_peer_up_within_the_limit_on_both_ends(after_s: float) -> None:
    limit = SilenceLimit(after_s)
    client = limit.client_parameters()
    server = _options(limit.server_options(180_000))
    for idle, interval, count in (
        (client["keepalives_idle"], client["keepalives_interval"], client["keepalives_count"]),
        (
            int(server["tcp_keepalives_idle"]),
            int(server["tcp_keepalives_interval"]),
            int(server["tcp_keepalives_count"]),
        ),
    ):
        assert after_s - interval < idle + interval * count <= after_s
    assert client["tcp_user_timeout"] == int(server["tcp_user_timeout"]) == after_s * 1000
    assert int(server["idle_session_timeout"]) == after_s * 1000


def test_transaction_timeout_is_asked_only_of_a_server_that_has_it() -> None:
    """PostgreSQL 17 brought it; an older server refuses a connection that names it."""
    assert "transaction_timeout" not in _options(SilenceLimit(15).server_options(160_004))
    assert _options(SilenceLimit(15).server_options(170_000))["transaction_timeout"] == "15000"


def test_a_session_idle_by_design_is_watched_on_its_path_only() -> None:
    server = _options(SilenceLimit(20, idle_allowed=True).server_options(170_000))
    assert "idle_session_timeout" not in server and "transaction_timeout" not in server
    assert (
        int(server["tcp_keepalives_idle"])
        + int(server["tcp_keepalives_interval"]) * int(server["tcp_keepalives_count"])
        <= 20
    )
