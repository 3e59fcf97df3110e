"""No input stops a Talent pipeline: whatever a topic or the API carries (any bytes, any JSON, any depth, any
number, any string) is either a valid snapshot, applied, or quarantined with IDENTITY_SYNC_INVALID_PAYLOAD.

The property runs each path's own decoding (a topic record for the consumer and TopicReplay, an API page for
ApiPull) and the shared apply logic on real PostgreSQL; the consumer path runs the real TalentSyncJob, whose
offsets must always advance. `HOSTILE_EXAMPLES=2000` runs it longer.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.adapters.talent_wire import api_item, decode_page, topic_item
from pin_identity.composition import Container
from pin_identity.composition.stores import Stores
from pin_identity.config import TalentSyncSettings
from pin_identity.domain.talent import ImportStage, ItemResult, SyncErrorCode, TalentItem
from pin_identity.jobs.talent_sync import TalentSyncJob
from pin_identity.operations.context import Context
from pin_identity.operations.ports.replica import SourceItem
from pin_identity.operations.ports.talent_sources import TalentRecord
from pin_identity.operations.talent_replica import ApplyOptions, apply_snapshots
from tests.support import talent
from tests.support.memory_talent import MemoryStream

EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "150"))

# Values that broke a pipeline once, and anything JSON or bytes can hold besides.
POISON_TEXTS = [
    '{"tenantId": "KEY", "version": NaN}',
    '{"tenantId": "KEY", "version": 1, "name": Infinity}',
    '{"tenantId": "KEY", "version": 1e999}',
    '{"tenantId": "KEY", "version": ' + "9" * 5000 + "}",
    '{"tenantId": "KEY", "version": 99999999999999999999999, "name": "x", "companyType": "Bank"}',
    '{"tenantId": "KEY", "version": 1, "name": "\\ud800", "companyType": "Developer"}',
    '{"tenantId": "KEY", "version": 1, "name": "a\\u0000b", "companyType": "Developer"}',
    '{"tenantId": "KEY", "version": 1, "name": "' + "N" * 5000 + '", "companyType": "Developer"}',
    '{"tenantId": "KEY", "deep": ' + "[" * 50_000 + "]" * 50_000 + "}",
    '{"tenantId": "KEY", "deep": ' + "[" * 30 + "]" * 30 + "}",
]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@dataclass
class Item:
    """One record as it travels: its bytes, and whether it is a valid snapshot (applied) or not."""

    key: str
    text: bytes
    valid: bool
    json_text: bool = True  # a complete JSON text (NaN and such included): it can stand inside a page


def _valid(tenant_id: str) -> Item:
    snapshot = talent.tenant(uuid.UUID(tenant_id))
    return Item(tenant_id, json.dumps(snapshot, ensure_ascii=False).encode(), True)


@st.composite
def items(draw: st.DrawFn) -> Item:
    key = str(uuid.uuid4())
    kind = draw(st.sampled_from(["valid", "poison", "json", "bytes"]))
    if kind == "valid":
        return _valid(key)
    if kind == "poison":
        return Item(key, draw(st.sampled_from(POISON_TEXTS)).replace("KEY", key).encode(), False)
    if kind == "json":
        value = draw(JSON_VALUES)
        return Item(key, json.dumps(value).encode(), False)
    return Item(key, draw(st.binary(max_size=64)), False, json_text=False)


def _quarantined(container: Container, keys: Sequence[str]) -> dict[str, str]:
    with container.connections.database.connection() as conn:
        rows = conn.execute(
            "SELECT external_id::text, error_code FROM identity.talent_import_failed_items"
            " WHERE external_id = ANY(%s::uuid[])",
            (list(keys),),
        ).fetchall()
    return dict(rows)


def _applied(container: Container, keys: Sequence[str]) -> set[str]:
    with container.connections.database.connection() as conn:
        rows = conn.execute(
            "SELECT external_talent_tenant_id::text FROM identity.companies"
            " WHERE external_talent_tenant_id = ANY(%s::uuid[])",
            (list(keys),),
        ).fetchall()
    return {row[0] for row in rows}


def _check(container: Container, batch: list[Item], quarantined_before: int | None = None) -> None:
    """Valid items applied, the others quarantined: by their key, or (an API item that is not an object
    has no readable id) by how many rows the quarantine gained."""
    valid = [item.key for item in batch if item.valid]
    invalid = [item.key for item in batch if not item.valid]
    assert _applied(container, [item.key for item in batch]) == set(valid)
    if quarantined_before is None:
        quarantined = _quarantined(container, invalid)
        assert set(quarantined) == set(invalid)
        assert set(quarantined.values()) <= {SyncErrorCode.INVALID_PAYLOAD.value}
    else:
        assert _quarantine_size(container) - quarantined_before == len(invalid)
    with (
        container.connections.database.connection() as conn
    ):  # every stored payload is valid JSON PostgreSQL keeps
        conn.execute("SELECT payload::text FROM identity.talent_import_failed_items").fetchall()


def _quarantine_size(container: Container) -> int:
    with container.connections.database.connection() as conn:
        row = conn.execute("SELECT count(*) FROM identity.talent_import_failed_items").fetchone()
    return int(row[0]) if row else 0


HOSTILE = settings(
    max_examples=EXAMPLES,
    deadline=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@HOSTILE
@given(batch=st.lists(items(), min_size=1, max_size=12))
def test_a_topic_record_is_applied_or_quarantined_whatever_it_holds(
    container: Container, batch: list[Item]
) -> None:
    """TopicReplay (and the consumer) decode a record's value on its own."""
    _apply(container, [topic_item(ImportStage.TENANTS, item.key, item.text) for item in batch])
    _check(container, batch)


@HOSTILE
@given(batch=st.lists(items(), min_size=1, max_size=12))
def test_an_api_page_item_is_applied_or_quarantined_whatever_it_holds(
    container: Container, batch: list[Item]
) -> None:
    """ApiPull gets a page of JSON texts (NaN, huge numbers and deep nesting included). Bytes that are no JSON
    text at all would break the page itself (a page failure the run retries), so they travel as strings."""
    texts = [item.text if item.json_text else json.dumps(item.text.hex()).encode() for item in batch]
    page = decode_page(b'{"items": [' + b", ".join(texts) + b'], "nextCursor": null}')
    items = [api_item(ImportStage.TENANTS, value) for value in page["items"]]
    before = _quarantine_size(container)
    _apply(container, items)
    _check(container, batch, quarantined_before=before)


def _apply(container: Container, items: list[TalentItem]) -> None:
    with container.stores.replica_transactions() as tx:
        outcome = apply_snapshots(
            tx, [SourceItem(item) for item in items], Context.fresh(SYSTEM_CLOCK), ApplyOptions()
        )
        tx.commit()
    assert all(o.result in (ItemResult.APPLIED, ItemResult.FAILED) for o in outcome.outcomes)


@HOSTILE
@given(batch=st.lists(items(), min_size=1, max_size=12))
def test_the_consumer_applies_or_quarantines_every_record_and_its_offsets_advance(
    container: Container, stores: Stores, batch: list[Item]
) -> None:
    records = [
        TalentRecord("tenants", 0, offset, topic_item(ImportStage.TENANTS, item.key.encode(), item.text))
        for offset, item in enumerate(batch)
    ]
    stream = MemoryStream(records)
    job = TalentSyncJob(stream, stores.replica_transactions, TalentSyncSettings(), clock=SYSTEM_CLOCK)
    job.step()
    assert stream.committed == list(range(len(batch)))
    _check(container, batch)


def test_quarantined_payloads_are_valid_json_with_what_postgresql_refuses_replaced(
    container: Container, database_url: str
) -> None:
    key = str(uuid.uuid4())
    text = '{"tenantId": "KEY", "version": 1, "name": "\\ud800 a\\u0000b", "note": "\\udfff"}'.replace(
        "KEY", key
    )
    _apply(container, [topic_item(ImportStage.TENANTS, key, text.encode())])
    with psycopg.connect(database_url) as conn:
        [(payload,)] = conn.execute(
            "SELECT payload FROM identity.talent_import_failed_items WHERE external_id = %s", (key,)
        ).fetchall()
    assert payload["name"] == "\ufffd a\ufffdb" and payload["note"] == "\ufffd"
