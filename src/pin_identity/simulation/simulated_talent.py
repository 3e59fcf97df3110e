"""A simulated Talent Identity source (CONTRACTS section 5) for tests, benchmarks and the `demo` command.

It generates deterministic raw snapshots, serves them over real HTTP on loopback (ApiPull) and produces them
to the compacted topics (TopicReplay). Snapshots stay raw dicts so that poison items can be malformed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import random
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

TENANTS_TOPIC = "talent.identity.tenants.v1"
USERS_TOPIC = "talent.identity.users.v1"
HEALTH_PATH = "/health"
TENANTS_PATH = "/api/v1/tenants"
USERS_PATH = "/api/v1/users"
MAX_PAGE_LIMIT = 2000
UNKNOWN_COMPANY_TYPE = "Cooperative"
UNPARSEABLE_PHONE = "not-a-phone"

_COMPANY_TYPES = ("Developer", "Agency", "Bank")
_COMPANY_TYPE_WEIGHTS = (8, 3, 1)
# National numbers (without the +7) under the long-allocated codes 910..929: some other 9xx blocks are only
# partly assigned, and a number phonenumbers calls invalid would be unintended poison.
_RUSSIAN_MOBILES = range(9_100_000_000, 9_300_000_000)
_MALE_NAMES = (
    ("Иван", "Алексей", "Дмитрий", "Сергей", "Михаил", "Андрей", "Николай", "Павел"),
    ("Иванов", "Смирнов", "Кузнецов", "Попов", "Соколов", "Лебедев", "Новиков", "Морозов"),
    ("Иванович", "Петрович", "Сергеевич", "Андреевич", "Олегович", "Викторович"),
)
_FEMALE_NAMES = (
    ("Анна", "Мария", "Елена", "Ольга", "Татьяна", "Наталья", "Ирина", "Светлана"),
    ("Иванова", "Смирнова", "Кузнецова", "Попова", "Соколова", "Лебедева", "Новикова", "Морозова"),
    ("Ивановна", "Петровна", "Сергеевна", "Андреевна", "Олеговна", "Викторовна"),
)


@dataclass
class TalentDataset:
    """Raw snapshots in Talent's JSON (camelCase); the poison ids are those an import must quarantine."""

    tenants: list[dict[str, Any]]
    users: list[dict[str, Any]]
    poison_tenant_ids: set[str] = field(default_factory=set)
    poison_user_ids: set[str] = field(default_factory=set)


def generate_dataset(tenants: int, users: int, *, seed: int = 7, poison: bool = False) -> TalentDataset:
    """`tenants` and `users` valid snapshots; `poison` appends one bad tenant and three bad users after them.

    The valid part does not depend on `poison`, so a poisoned dataset is the clean one plus the poison.
    """
    if tenants < 0 or users < 0:
        raise ValueError("tenants and users must not be negative")
    if users and not tenants:
        raise ValueError("users need at least one tenant")
    if poison and not users:
        raise ValueError("the poison duplicates a user's phone, so it needs at least one user")
    rng = random.Random(seed)
    tenant_items = [_tenant(rng, number) for number in range(1, tenants + 1)]
    # One spare number, drawn either way, for the poison user whose only fault is its tenant.
    nationals = rng.sample(_RUSSIAN_MOBILES, users + 1)
    forms = [rng.randrange(4) for _ in range(users)]
    user_items = [
        _user(rng, number, rng.choice(tenant_items)["tenantId"], _written_phone(national, form))
        for number, (national, form) in enumerate(zip(nationals, forms, strict=False), start=1)
    ]
    dataset = TalentDataset(tenant_items, user_items)
    if poison:
        duplicate = _written_phone(nationals[0], forms[0] + 1)
        _add_poison(rng, dataset, duplicate_phone=duplicate, spare_phone=_written_phone(nationals[-1], 0))
    return dataset


def _add_poison(
    rng: random.Random, dataset: TalentDataset, *, duplicate_phone: str, spare_phone: str
) -> None:
    cooperative = _tenant(rng, len(dataset.tenants) + 1, company_type=UNKNOWN_COMPANY_TYPE)
    number = len(dataset.users) + 1
    home = dataset.users[0]["tenantId"]
    # Appended after the clean users, so the first holder of the duplicated phone is the clean one.
    poisoned = [
        _user(rng, number, home, duplicate_phone),
        _user(rng, number + 1, home, UNPARSEABLE_PHONE),
        _user(rng, number + 2, cooperative["tenantId"], spare_phone),
    ]
    dataset.tenants.append(cooperative)
    dataset.users.extend(poisoned)
    dataset.poison_tenant_ids.add(cooperative["tenantId"])
    dataset.poison_user_ids.update(user["userId"] for user in poisoned)


def _tenant(rng: random.Random, number: int, *, company_type: str | None = None) -> dict[str, Any]:
    kind = company_type or rng.choices(_COMPANY_TYPES, weights=_COMPANY_TYPE_WEIGHTS)[0]
    return {
        "tenantId": _uuid(rng),
        "version": rng.randint(1, 3),
        "name": f"{kind} {number:04d} LLC",
        "companyType": kind,
        "taxId": f"{rng.randrange(10**10):010d}" if rng.random() < 0.8 else None,
        "isDeleted": False,
    }


def _user(rng: random.Random, number: int, tenant_id: str, phone: str) -> dict[str, Any]:
    first_names, last_names, middle_names = _FEMALE_NAMES if rng.random() < 0.5 else _MALE_NAMES
    return {
        "userId": _uuid(rng),
        "tenantId": tenant_id,
        "version": rng.randint(1, 3),
        "phone": phone,
        "email": f"user{number:06d}@example.com" if rng.random() < 0.85 else None,
        "firstName": rng.choice(first_names),
        "lastName": rng.choice(last_names),
        "middleName": rng.choice(middle_names) if rng.random() < 0.7 else None,
        "isDeleted": False,
    }


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _written_phone(national: int, form: int) -> str:
    """The forms Talent is known to send (CONTRACTS section 5), all of the same number."""
    d = str(national)
    forms = (f"+7 ({d[:3]}) {d[3:6]}-{d[6:8]}-{d[8:]}", f"8 {d[:3]} {d[3:6]} {d[6:8]} {d[8:]}", f"+7{d}", d)
    return forms[form % len(forms)]


_LONGEST_HOLD_S = 120.0  # a test that forgets to release does not hang its server thread for ever

# What the simulated API answers one GET: the status, the JSON body and any headers beyond the usual ones.
_Answer = tuple[int, object, dict[str, str]]
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


class _BadRequestError(ValueError):
    """The query cannot be answered; the message goes back in the 400 body."""


class SimulatedTalentApi:
    """Talent's HTTP API on loopback, with knobs for faults that may be changed while it runs.

    The knobs and `dataset` are plain attributes: each assignment is atomic, and a request reads each once.
    """

    def __init__(
        self,
        dataset: TalentDataset,
        *,
        token: str | None = "talent-token",  # noqa: S107 - a made-up token for a loopback simulator
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.dataset = dataset
        self.token = token
        self.healthy = True
        self.fail_every = 0  # every n-th list request answers fail_status; 0 = never
        self.fail_status = 503  # 429 to throttle instead
        self.retry_after: str | None = None  # the Retry-After of those answers, as sent; None = no header
        self.delay_s = 0.0  # before each list answer
        self.reject_token = False  # 401 everywhere, whatever the token
        self._address = (host, port)
        self._lock = threading.Lock()
        self._hold_from: int | None = None  # list requests from this number on wait for `release()`
        self._released = threading.Event()
        self._held = 0
        self._requests = 0
        self._in_flight = 0
        self._max_concurrent = 0
        self._server: _Server | None = None
        self._url: str | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where it listens, or listened last: a stopped source keeps its address so that clients fail."""
        if self._url is None:
            raise RuntimeError("the simulated Talent API was never started")
        return self._url

    @property
    def requests(self) -> int:
        """List requests received, answered or not."""
        with self._lock:
            return self._requests

    @property
    def max_concurrent(self) -> int:
        """The most list requests seen in flight at once."""
        with self._lock:
            return self._max_concurrent

    @property
    def held(self) -> int:
        """List requests waiting for `release()` now."""
        with self._lock:
            return self._held

    def hold_after(self, answered: int) -> None:
        """Let `answered` more list requests through, then hold every later one until `release()`: a test
        stops a client in the middle of its work on a signal instead of hoping the source is slow enough."""
        with self._lock:
            self._released.clear()
            self._hold_from = self._requests + answered + 1

    def release(self) -> None:
        with self._lock:
            self._hold_from = None
        self._released.set()

    def start(self) -> Self:
        if self._server is None:
            self._server = _Server(self._address, self)
            host, port = self._server.server_address[:2]
            self._url = f"http://{host!s}:{port}"
            self._thread = threading.Thread(
                target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        server, thread, self._server, self._thread = self._server, self._thread, None, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        # Keep-alive connections outlive the listener; cut them so a stopped source really is gone.
        server.close_connections()
        if thread is not None:
            thread.join()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def answer(self, path: str, query: dict[str, list[str]], authorization: str | None) -> _Answer:
        """The status, JSON body and extra headers for one GET."""
        if path in (TENANTS_PATH, USERS_PATH):
            return self._answer_list(path, query, authorization)
        if not self._authorised(authorization):
            return 401, {"error": "unauthorized"}, _CHALLENGE
        if path == HEALTH_PATH:
            return (200, {"status": "ok"}, {}) if self.healthy else (503, {"status": "unavailable"}, {})
        return 404, {"error": "not found"}, {}

    def _answer_list(self, path: str, query: dict[str, list[str]], authorization: str | None) -> _Answer:
        number = self._list_request_began()
        try:
            self._wait_if_held(number)
            if self.delay_s > 0:
                time.sleep(self.delay_s)
            if not self._authorised(authorization):
                return 401, {"error": "unauthorized"}, _CHALLENGE
            if self.fail_every > 0 and number % self.fail_every == 0:
                return self._injected_failure()
            dataset = self.dataset
            status, body = _page(dataset.tenants if path == TENANTS_PATH else dataset.users, query)
            return status, body, {}
        finally:
            self._list_request_ended()

    def _injected_failure(self) -> _Answer:
        retry_after = self.retry_after
        headers = {} if retry_after is None else {"Retry-After": retry_after}
        return self.fail_status, {"error": "injected failure"}, headers

    def _authorised(self, authorization: str | None) -> bool:
        if self.reject_token:
            return False
        return self.token is None or authorization == f"Bearer {self.token}"

    def _list_request_began(self) -> int:
        with self._lock:
            self._requests += 1
            self._in_flight += 1
            self._max_concurrent = max(self._max_concurrent, self._in_flight)
            return self._requests

    def _wait_if_held(self, number: int) -> None:
        with self._lock:
            held = self._hold_from is not None and number >= self._hold_from
            self._held += held
        if held:
            self._released.wait(_LONGEST_HOLD_S)
            with self._lock:
                self._held -= 1

    def _list_request_ended(self) -> None:
        with self._lock:
            self._in_flight -= 1


def _page(items: list[dict[str, Any]], query: dict[str, list[str]]) -> tuple[int, object]:
    try:
        limit = _limit(query)
        start = _decode_cursor(query)
        tenant_id = _tenant_filter(query)
    except _BadRequestError as bad:
        return 400, {"error": str(bad)}
    if tenant_id is not None:
        items = [item for item in items if isinstance(item, dict) and item.get("tenantId") == tenant_id]
    chunk = items[start : start + limit]
    end = start + len(chunk)
    return 200, {"items": chunk, "nextCursor": _encode_cursor(end) if end < len(items) else None}


def _first(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def _limit(query: dict[str, list[str]]) -> int:
    text = _first(query, "limit") or ""
    if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE_LIMIT:
        raise _BadRequestError(f"limit must be an integer from 1 to {MAX_PAGE_LIMIT}")
    return int(text)


def _tenant_filter(query: dict[str, list[str]]) -> str | None:
    text = _first(query, "tenantId")
    if text is None:
        return None
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise _BadRequestError("tenantId must be a UUID") from None


_CURSOR_PREFIX = "offset:"


def _encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"{_CURSOR_PREFIX}{offset}".encode()).decode("ascii")


def _decode_cursor(query: dict[str, list[str]]) -> int:
    cursor = _first(query, "cursor")
    if cursor is None:
        return 0
    try:
        text = base64.urlsafe_b64decode(cursor.encode("ascii")).decode("ascii")
    except ValueError:
        raise _BadRequestError("unknown cursor") from None
    offset = text.removeprefix(_CURSOR_PREFIX)
    if not text.startswith(_CURSOR_PREFIX) or not offset.isdigit():
        raise _BadRequestError("unknown cursor")
    return int(offset)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], api: SimulatedTalentApi) -> None:
        super().__init__(address, _Handler)
        self.api = api
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients hang up mid-answer in fault tests; that is not worth a traceback."""

    def track(self, connection: socket.socket, *, open_: bool) -> None:
        with self._connections_lock:
            if open_:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as Talent's real API
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, open_=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, open_=False)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        status, body, headers = self.server.api.answer(
            url.path, parse_qs(url.query), self.headers.get("Authorization")
        )
        payload = _json_bytes(body)
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests' output is not the place for an access log."""


class TalentTopicsError(RuntimeError):
    """Some snapshots or tombstones did not reach the broker."""


# Batched as a real Talent producer batches (many records per batch, compressed): TopicReplay's offset
# ranges and the consumer's lag must hold for batches of any size.
_PRODUCER_CONFIG = {"linger.ms": 5, "compression.type": "lz4", "enable.idempotence": True, "acks": "all"}


def produce_to_topics(
    client_config: dict[str, str],
    dataset: TalentDataset,
    *,
    tenants_topic: str = TENANTS_TOPIC,
    users_topic: str = USERS_TOPIC,
    tombstones: Sequence[tuple[str, str]] = (),
    timeout_s: float = 60.0,
) -> None:
    """Every snapshot keyed by its id, then the tombstones `(topic, key)`; raises unless all are delivered."""
    failures: list[str] = []

    def on_delivery(error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            failures.append(error.name())

    producer = Producer({**client_config, **_PRODUCER_CONFIG})
    records: list[tuple[str, str | None, bytes | None]] = [
        (tenants_topic, _key(item, "tenantId"), _value(item)) for item in dataset.tenants
    ]
    records += [(users_topic, _key(item, "userId"), _value(item)) for item in dataset.users]
    records += [(topic, key, None) for topic, key in tombstones]
    for topic, key, value in records:
        _produce(producer, topic, key, value, on_delivery)
    undelivered = producer.flush(timeout_s)
    if undelivered or failures:
        raise TalentTopicsError(
            f"{undelivered} records undelivered, {len(failures)} failed ({', '.join(sorted(set(failures)))})"
        )


def _produce(producer: Any, topic: str, key: str | None, value: bytes | None, on_delivery: Any) -> None:
    while True:
        try:
            producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
            break
        except BufferError:
            producer.poll(0.1)  # the local queue is full: let deliveries drain it
    producer.poll(0)


def _key(item: object, id_field: str) -> str | None:
    return str(item[id_field]) if isinstance(item, dict) and id_field in item else None


def _value(item: object) -> bytes:
    return _json_bytes(item)


def _json_bytes(value: object) -> bytes:
    """UTF-8 JSON; a value holding a lone surrogate (a hostile test item) goes out as its `\\ud800` escape,
    as a real producer would write it."""
    try:
        return json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value).encode("ascii")


# The simulated Talent's layout, not Talent's: the product reads whatever layout a cluster has (BENCHMARKS.md
# measures TopicReplay on 12 and on 3 partitions).
TALENT_PARTITIONS = 12


def create_talent_topics(
    client_config: dict[str, str],
    partitions: int = TALENT_PARTITIONS,
    *,
    tenants_topic: str = TENANTS_TOPIC,
    users_topic: str = USERS_TOPIC,
    replicas: int = 1,
    timeout_s: float = 15.0,
) -> None:
    """Both topics, compacted as Talent's are, on `replicas` nodes each (3 on a replicated cluster); a topic
    that already exists is left as it is."""
    admin = AdminClient({**client_config})
    topics = [
        NewTopic(name, partitions, replicas, config={"cleanup.policy": "compact"})
        for name in (tenants_topic, users_topic)
    ]
    futures = admin.create_topics(topics, operation_timeout=timeout_s, request_timeout=timeout_s)
    for future in futures.values():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
