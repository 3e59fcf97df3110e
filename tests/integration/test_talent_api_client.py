"""The Talent HTTP client against the simulated Talent API, over real HTTP on loopback."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from pin_identity.adapters.talent_http.client import TalentApiClient, TalentPage
from pin_identity.domain.errors import SourceRejectedError, SourceUnavailableError
from pin_identity.simulation.simulated_talent import SimulatedTalentApi, TalentDataset, generate_dataset

TOKEN = "talent-token"


def _no_sleep(_seconds: float) -> None:
    """Backoff is real in production; here it would only slow the suite down."""


@pytest.fixture(scope="module")
def dataset() -> TalentDataset:
    return generate_dataset(tenants=1_234, users=300, seed=11)


@pytest.fixture
def api(dataset: TalentDataset) -> Iterator[SimulatedTalentApi]:
    with SimulatedTalentApi(dataset, token=TOKEN) as running:
        yield running


@pytest.fixture
def client(api: SimulatedTalentApi) -> Iterator[TalentApiClient]:
    with TalentApiClient(api.url, TOKEN, timeout_s=5.0, sleep=_no_sleep) as opened:
        yield opened


def _all_items(list_page: Callable[[str | None], TalentPage]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = list_page(cursor)
        items.extend(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return items


def test_paging_returns_every_tenant_exactly_once(client: TalentApiClient, dataset: TalentDataset) -> None:
    pages: list[TalentPage] = []

    def list_page(cursor: str | None) -> TalentPage:
        pages.append(client.list_tenants(100, cursor))
        return pages[-1]

    items = _all_items(list_page)

    assert [item["tenantId"] for item in items] == [tenant["tenantId"] for tenant in dataset.tenants]
    assert len(pages) == 13
    assert [len(page.items) for page in pages[:-1]] == [100] * 12


def test_users_are_filtered_by_tenant(client: TalentApiClient, dataset: TalentDataset) -> None:
    tenant_id = uuid.UUID(dataset.users[0]["tenantId"])

    items = _all_items(lambda cursor: client.list_users(2, cursor, tenant_id=tenant_id))

    expected = [user["userId"] for user in dataset.users if user["tenantId"] == str(tenant_id)]
    assert [item["userId"] for item in items] == expected


def test_tenants_are_filtered_by_tenant(client: TalentApiClient, dataset: TalentDataset) -> None:
    wanted = dataset.tenants[500]

    page = client.list_tenants(100, tenant_id=uuid.UUID(wanted["tenantId"]))

    assert page == TalentPage(items=[wanted], next_cursor=None)


def test_an_empty_source_answers_one_empty_last_page(
    api: SimulatedTalentApi, client: TalentApiClient
) -> None:
    api.dataset = TalentDataset(tenants=[], users=[])

    assert client.list_users(100) == TalentPage(items=[], next_cursor=None)


def test_health_follows_the_source(api: SimulatedTalentApi, client: TalentApiClient) -> None:
    client.health()

    api.healthy = False
    with pytest.raises(SourceUnavailableError, match="HTTP 503"):
        client.health()


def test_a_stopped_source_is_unavailable(api: SimulatedTalentApi, client: TalentApiClient) -> None:
    client.health()  # opens a keep-alive connection that the stop must cut
    api.stop()

    with pytest.raises(SourceUnavailableError):
        client.health()


def test_a_wrong_token_is_rejected_without_retry(api: SimulatedTalentApi) -> None:
    with TalentApiClient(api.url, "stolen-token", sleep=_no_sleep) as intruder:
        with pytest.raises(SourceRejectedError) as rejected:
            intruder.list_users(100)
        with pytest.raises(SourceRejectedError):
            intruder.health()

    assert api.requests == 1
    assert "stolen-token" not in str(rejected.value)


def test_a_rejecting_source_fails_at_once(api: SimulatedTalentApi, client: TalentApiClient) -> None:
    api.reject_token = True

    with pytest.raises(SourceRejectedError):
        client.list_tenants(100)

    assert api.requests == 1


def test_a_flaky_source_still_yields_everything(
    api: SimulatedTalentApi, client: TalentApiClient, dataset: TalentDataset
) -> None:
    api.fail_every = 3

    items = _all_items(lambda cursor: client.list_tenants(100, cursor))

    assert [item["tenantId"] for item in items] == [tenant["tenantId"] for tenant in dataset.tenants]
    assert api.requests == 19  # 13 pages, and every third request failed once


def test_a_failing_source_gives_up_after_max_attempts(api: SimulatedTalentApi) -> None:
    api.fail_every = 1
    sleeps: list[float] = []

    client = TalentApiClient(api.url, TOKEN, max_attempts=4, backoff_base_s=0.1, sleep=sleeps.append)
    with client, pytest.raises(SourceUnavailableError, match="after 4 attempts: HTTP 503") as failed:
        client.list_users(100)

    assert not isinstance(failed.value, SourceRejectedError)  # worth trying again later
    assert api.requests == 4
    assert len(sleeps) == 3
    assert all(0.05 * 2**n <= pause <= 0.1 * 2**n for n, pause in enumerate(sleeps))


def test_backoff_is_capped(api: SimulatedTalentApi) -> None:
    api.fail_every = 1
    sleeps: list[float] = []

    with (
        TalentApiClient(
            api.url, TOKEN, max_attempts=6, backoff_base_s=1.0, backoff_max_s=2.0, sleep=sleeps.append
        ) as client,
        pytest.raises(SourceUnavailableError),
    ):
        client.list_tenants(10)

    assert max(sleeps) <= 2.0


def test_concurrent_calls_are_capped(api: SimulatedTalentApi) -> None:
    api.delay_s = 0.05

    with TalentApiClient(api.url, TOKEN, max_concurrent_calls=2) as client, ThreadPoolExecutor(8) as threads:
        pages = list(threads.map(lambda _: client.list_tenants(10), range(8)))

    assert all(len(page.items) == 10 for page in pages)
    assert api.requests == 8
    assert api.max_concurrent <= 2


@pytest.mark.parametrize("query", ["limit=0", "limit=2001", "limit=ten", "", "limit=5&cursor=garbage!"])
def test_the_simulator_refuses_bad_queries(api: SimulatedTalentApi, query: str) -> None:
    response = httpx.get(f"{api.url}/api/v1/tenants?{query}", headers={"Authorization": f"Bearer {TOKEN}"})

    assert response.status_code == 400


@pytest.mark.parametrize(
    "body",
    [
        b"<html>busy</html>",
        b"[]",
        b'{"items": {}, "nextCursor": null}',
        b'{"items": []}',
        b'{"items": [], "nextCursor": 5}',
    ],
)
def test_a_malformed_page_is_retried_then_fails(body: bytes) -> None:
    calls: list[httpx.Request] = []

    def talent(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200, content=body)

    transport = httpx.MockTransport(talent)
    client = TalentApiClient(
        "http://talent.test", TOKEN, max_attempts=2, sleep=_no_sleep, transport=transport
    )
    with client, pytest.raises(SourceUnavailableError, match="after 2 attempts: malformed page"):
        client.list_users(100, cursor="c1", tenant_id=uuid.UUID(int=1))

    assert len(calls) == 2
    assert calls[0].url.path == "/api/v1/users"
    assert dict(calls[0].url.params) == {"limit": "100", "cursor": "c1", "tenantId": str(uuid.UUID(int=1))}
    assert calls[0].headers["Authorization"] == f"Bearer {TOKEN}"


def test_non_object_items_are_passed_through_for_quarantine() -> None:
    body = b'{"items": [{"userId": "u1"}, 42, "junk"], "nextCursor": "next"}'
    transport = httpx.MockTransport(lambda _request: httpx.Response(200, content=body))

    with TalentApiClient("http://talent.test", None, transport=transport) as client:
        page = client.list_users(10)

    assert page == TalentPage(items=[{"userId": "u1"}, 42, "junk"], next_cursor="next")  # type: ignore[list-item]


def test_a_slow_source_times_out_and_is_retried(api: SimulatedTalentApi) -> None:
    api.delay_s = 0.3

    client = TalentApiClient(api.url, TOKEN, timeout_s=0.05, max_attempts=2, sleep=_no_sleep)
    with client, pytest.raises(SourceUnavailableError, match="after 2 attempts: ReadTimeout"):
        client.list_tenants(10)

    assert api.requests == 2


# ---------------------------------------------------------------- Retry-After


@pytest.mark.parametrize("status", [429, 503])
def test_a_throttled_page_is_retried_when_talent_asks(api: SimulatedTalentApi, status: int) -> None:
    api.fail_every, api.fail_status, api.retry_after = 2, status, "1"

    with TalentApiClient(api.url, TOKEN, backoff_base_s=0.01) as client:
        client.list_tenants(10)  # the first request is answered, the second throttled
        started = time.monotonic()
        page = client.list_tenants(10)
        waited_s = time.monotonic() - started

    assert len(page.items) == 10
    assert api.requests == 3
    assert 0.9 <= waited_s < 2.0


def test_a_huge_retry_after_is_capped(api: SimulatedTalentApi) -> None:
    api.fail_every, api.fail_status, api.retry_after = 1, 429, "86400"
    sleeps: list[float] = []

    client = TalentApiClient(api.url, TOKEN, max_attempts=3, sleep=sleeps.append)
    with client, pytest.raises(SourceUnavailableError, match="after 3 attempts: HTTP 429"):
        client.list_tenants(10)

    assert sleeps == [30.0, 30.0]


def _http_date(from_now_s: float) -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=from_now_s), usegmt=True)


@pytest.mark.parametrize(
    ("retry_after", "shortest_s", "longest_s"),
    [
        (lambda: "3", 3.0, 3.0),
        (lambda: _http_date(20), 18.0, 20.0),
        (lambda: "in a while", 0.05, 0.1),  # malformed: the client's own backoff
        (lambda: "2.5", 0.05, 0.1),  # delta-seconds are whole
        (lambda: _http_date(-60), 0.05, 0.1),  # already past
        (lambda: "0", 0.05, 0.1),  # never sooner than the client's own backoff
    ],
    ids=["delta-seconds", "http-date", "malformed", "fractional", "past-date", "zero"],
)
def test_retry_after_is_read_as_delta_seconds_or_http_date(
    retry_after: Callable[[], str], shortest_s: float, longest_s: float
) -> None:
    answers = iter(
        [
            httpx.Response(429, headers={"Retry-After": retry_after()}),
            httpx.Response(200, content=b'{"items": [], "nextCursor": null}'),
        ]
    )
    transport = httpx.MockTransport(lambda _request: next(answers))
    sleeps: list[float] = []

    with TalentApiClient(
        "http://talent.test", TOKEN, backoff_base_s=0.1, sleep=sleeps.append, transport=transport
    ) as client:
        assert client.list_users(10) == TalentPage(items=[], next_cursor=None)

    [pause_s] = sleeps
    assert shortest_s <= pause_s <= longest_s
