"""A synchronous client of Talent's HTTP API (ApiPull, CONTRACTS section 5), shared by the import threads.

It raises the source port's own errors: SourceUnavailableError when Talent gives no usable answer even after
the retries, SourceRejectedError when it refuses our credentials (retrying cannot help). Their message is one
line without PII: a status or an exception class, never a body or the token."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any, Self
from uuid import UUID

import httpx

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.adapters.talent_wire import Undecodable, decode_page
from pin_identity.domain.backoff import Backoff
from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import SourceRejectedError, SourceUnavailableError
from pin_identity.observability.logging import get_logger

log = get_logger("talent-api")

HEALTH_PATH = "/health"
TENANTS_PATH = "/api/v1/tenants"
USERS_PATH = "/api/v1/users"
_REJECTED_STATUSES = frozenset({401, 403})
# The statuses whose Retry-After says when Talent expects us back (RFC 9110 section 10.2.3).
_THROTTLING_STATUSES = frozenset({429, 503})
# How a failure starts: the log line of a page that failed says which source it was.
_TALENT = "Talent API"


class _AttemptError(Exception):
    """One failed attempt that a later attempt may fix; the message is the one-line reason.

    `retry_after_s` is how long Talent asked us to wait (its Retry-After), if it asked.
    """

    def __init__(self, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class TalentPage:
    """One page of snapshots, raw: an item that is not a JSON object is passed through for quarantine."""

    items: list[dict[str, Any]]
    next_cursor: str | None


class TalentApiClient:
    """One keep-alive connection pool; a semaphore caps the calls in flight across the threads sharing it."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        timeout_s: float = 10.0,
        max_concurrent_calls: int = 4,
        max_attempts: int = 5,
        backoff_base_s: float = 0.2,
        backoff_max_s: float = 5.0,
        retry_after_max_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Clock = SYSTEM_CLOCK,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """`transport` replaces the network, for tests only. A Retry-After longer than `retry_after_max_s`
        is cut to it: a page's wait stays bounded whatever Talent answers."""
        if max_concurrent_calls < 1 or max_attempts < 1:
            raise ValueError("max_concurrent_calls and max_attempts must be at least 1")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            transport=transport,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(
                max_connections=max_concurrent_calls, max_keepalive_connections=max_concurrent_calls
            ),
        )
        self._call_slots = threading.BoundedSemaphore(max_concurrent_calls)
        self._max_attempts = max_attempts
        # Jitter keeps the threads that failed together from retrying together.
        self._backoff = Backoff(base_s=backoff_base_s, cap_s=backoff_max_s, jitter=0.5)
        self._retry_after_max_s = retry_after_max_s
        self._sleep, self._clock = sleep, clock
        self._rng = random.Random()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def health(self) -> None:
        """A probe, so no retries: unless Talent answers 200, raises SourceUnavailableError."""
        try:
            self._send(HEALTH_PATH, {})
        except _AttemptError as failure:
            raise SourceUnavailableError(f"{_TALENT}: GET {HEALTH_PATH} failed: {failure}") from None

    def list_tenants(
        self, limit: int, cursor: str | None = None, tenant_id: UUID | None = None
    ) -> TalentPage:
        return self._fetch_page(TENANTS_PATH, _page_params(limit, cursor, tenant_id))

    def list_users(self, limit: int, cursor: str | None = None, tenant_id: UUID | None = None) -> TalentPage:
        return self._fetch_page(USERS_PATH, _page_params(limit, cursor, tenant_id))

    def _fetch_page(self, path: str, params: dict[str, str]) -> TalentPage:
        reason = ""
        for attempt in range(1, self._max_attempts + 1):
            try:
                return _parse_page(_json_body(self._send(path, params)))
            except _AttemptError as failure:
                reason = str(failure)
                if attempt < self._max_attempts:
                    self._pause(path, reason, attempt, failure.retry_after_s)
        raise SourceUnavailableError(
            f"{_TALENT}: GET {path} failed after {self._max_attempts} attempts: {reason}"
        )

    def _send(self, path: str, params: dict[str, str]) -> httpx.Response:
        """One attempt, answered 200 or failed.

        Reasons name a status or an exception class only: never the body, never the token.
        """
        with self._call_slots:
            try:
                response = self._http.get(path, params=params)
            except httpx.RequestError as exc:
                raise _AttemptError(type(exc).__name__) from None
        if response.status_code in _REJECTED_STATUSES:
            raise SourceRejectedError(
                f"{_TALENT} rejected the token: Talent refused the credentials "
                f"(HTTP {response.status_code} on GET {path}); check the Talent API token"
            )
        if response.status_code in _THROTTLING_STATUSES:
            retry_after_s = _retry_after_s(response.headers.get("Retry-After"), self._clock.now())
            raise _AttemptError(f"HTTP {response.status_code}", retry_after_s)
        if response.status_code != 200:
            raise _AttemptError(f"HTTP {response.status_code}")
        return response

    def _pause(self, path: str, reason: str, attempt: int, retry_after_s: float | None) -> None:
        """Talent's Retry-After, bounded; never shorter than our own backoff, which spreads the threads."""
        pause_s = self._backoff.delay(attempt, self._rng)
        if retry_after_s is not None:
            pause_s = max(pause_s, min(retry_after_s, self._retry_after_max_s))
        log.warning("talent-api-retry", path=path, reason=reason, attempt=attempt, pause_s=round(pause_s, 3))
        self._sleep(pause_s)


def _retry_after_s(value: str | None, now: datetime) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP-date; None when absent or malformed."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:  # "-0000": no zone stated; HTTP-dates are GMT
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (moment - now).total_seconds())


def _page_params(limit: int, cursor: str | None, tenant_id: UUID | None) -> dict[str, str]:
    if limit < 1:
        raise ValueError("limit must be at least 1")
    params = {"limit": str(limit)}
    if cursor is not None:
        params["cursor"] = cursor
    if tenant_id is not None:
        params["tenantId"] = str(tenant_id)
    return params


def _json_body(response: httpx.Response) -> Any:
    """The page; a poison item inside it stays an Undecodable item (quarantined), not a page failure."""
    page = decode_page(response.content)
    if isinstance(page, Undecodable):
        raise _AttemptError(f"malformed page: {page.reason}")
    return page


def _parse_page(body: Any) -> TalentPage:
    if not isinstance(body, dict):
        raise _AttemptError("malformed page: not a JSON object")
    items = body.get("items")
    if not isinstance(items, list):
        raise _AttemptError("malformed page: `items` is not a list")
    if "nextCursor" not in body:
        raise _AttemptError("malformed page: no `nextCursor`")
    next_cursor = body["nextCursor"]
    # An empty cursor would restart the listing from the top: treat it as malformed, not as the end.
    if next_cursor is not None and (not isinstance(next_cursor, str) or not next_cursor):
        raise _AttemptError("malformed page: `nextCursor` is not a non-empty string or null")
    return TalentPage(items=items, next_cursor=next_cursor)
