"""Talent snapshots for tests, and applying them through the replica use case."""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from pin_identity.adapters.kafka.talent_stream import KafkaTalentStream
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.adapters.talent_wire import read_item
from pin_identity.composition import Container
from pin_identity.config import TalentSyncSettings
from pin_identity.domain.clock import Clock
from pin_identity.domain.talent import ImportStage, TalentItem
from pin_identity.jobs.talent_sync import TalentSyncJob
from pin_identity.operations.context import Context
from pin_identity.operations.ports.replica import SourceItem
from pin_identity.operations.ports.talent_sources import TalentStream
from pin_identity.operations.talent_replica import ApplyOptions, BatchOutcome, apply_snapshots
from pin_identity.simulation.simulated_talent import TalentDataset, produce_to_topics
from tests.support.phones import written_phone


@dataclass(frozen=True)
class TalentTopics:
    """Talent's two compacted topics and the consumer group that reads them."""

    tenants: str
    users: str
    group: str

    @classmethod
    def fresh(cls) -> TalentTopics:
        """Names no other test uses (the broker is shared)."""
        suffix = uuid.uuid4().hex[:10]
        return cls(f"talent.tenants.{suffix}", f"talent.users.{suffix}", f"talent-sync-{suffix}")


def tenant(
    tenant_id: UUID | None = None, *, version: int = 1, company_type: str = "Developer", **fields: Any
) -> dict[str, Any]:
    snapshot = {
        "tenantId": str(tenant_id or uuid.uuid4()),
        "version": version,
        "name": "Stroy Invest",
        "companyType": company_type,
        "taxId": "7701234567",
        "isDeleted": False,
    }
    return {**snapshot, **fields}


def user(tenant_id: str, user_id: UUID | None = None, *, version: int = 1, **fields: Any) -> dict[str, Any]:
    snapshot = {
        "userId": str(user_id or uuid.uuid4()),
        "tenantId": tenant_id,
        "version": version,
        "phone": written_phone(),
        "email": "manager@stroy.example",
        "firstName": "Иван",
        "lastName": "Петров",
        "middleName": None,
        "isDeleted": False,
    }
    return {**snapshot, **fields}


def raw(snapshot: dict[str, Any]) -> TalentItem:
    """A snapshot as a topic carries it (keyed by its id), read as the sources read it."""
    stage = ImportStage.USERS if "userId" in snapshot else ImportStage.TENANTS
    key = snapshot.get("userId", snapshot.get("tenantId"))
    return read_item(stage, str(key), snapshot)


def tombstone(stage: ImportStage, entity_id: str) -> TalentItem:
    return read_item(stage, entity_id, None)


def apply(
    container: Container,
    stage: ImportStage,
    records: list[TalentItem],
    options: ApplyOptions | None = None,
) -> BatchOutcome:
    assert all(record.stage is stage for record in records)
    with container.stores.replica_transactions() as tx:
        outcome = apply_snapshots(
            tx, [SourceItem(r) for r in records], Context.fresh(SYSTEM_CLOCK), options or ApplyOptions()
        )
        tx.commit()
    return outcome


def tenants(container: Container, *snapshots: dict[str, Any]) -> BatchOutcome:
    return apply(container, ImportStage.TENANTS, [raw(s) for s in snapshots])


def users(container: Container, *snapshots: dict[str, Any]) -> BatchOutcome:
    return apply(container, ImportStage.USERS, [raw(s) for s in snapshots])


def sync_job(
    container: Container,
    topics: TalentTopics,
    *,
    clock: Clock = SYSTEM_CLOCK,
    stream: TalentStream | None = None,
) -> TalentSyncJob:
    """The real continuous consumer on this test's topics and group."""
    return TalentSyncJob(
        stream or talent_stream(container, topics),
        container.stores.replica_transactions,
        TalentSyncSettings(poll_timeout_s=0.3, retry_base_s=1.0),
        clock=clock,
    )


def talent_stream(container: Container, topics: TalentTopics) -> KafkaTalentStream:
    return KafkaTalentStream(
        container.connections.kafka_client_config,
        tenants_topic=topics.tenants,
        users_topic=topics.users,
        overrides={"group.id": topics.group, "session.timeout.ms": 6000},
    )


def produce(container: Container, topics: TalentTopics, dataset: TalentDataset, **kwargs: Any) -> None:
    produce_to_topics(
        container.connections.kafka_client_config,
        dataset,
        tenants_topic=topics.tenants,
        users_topic=topics.users,
        **kwargs,
    )


def run_until_caught_up(job: TalentSyncJob) -> None:
    job.run(threading.Event(), once=True)


_REPLICA_COMPANIES = """
SELECT external_talent_tenant_id::text, name, company_type, status, tax_id, sync_source, replica_version
FROM identity.companies WHERE sync_source = 'TalentIdentity' ORDER BY 1"""
_REPLICA_USERS = """
SELECT u.external_talent_user_id::text, c.external_talent_tenant_id::text, u.type, u.status, u.phone, u.email,
       u.first_name, u.last_name, u.middle_name, u.contacts_managed_by, u.sync_source, u.replica_version,
       (SELECT array_agg(rd.code || '@' || oc.external_talent_tenant_id::text ORDER BY rd.code)
        FROM identity.role_assignments ra
        JOIN identity.role_definitions rd ON rd.id = ra.role_id
        JOIN identity.companies oc ON oc.id = ra.scope_organization_id
        WHERE ra.user_id = u.id AND ra.status = 'Active') AS active_roles
FROM identity.users u JOIN identity.companies c ON c.id = u.company_id
WHERE u.sync_source = 'TalentIdentity' ORDER BY 1"""


def replica_state(container: Container) -> dict[str, list[tuple[Any, ...]]]:
    """The Talent replica without generated ids and timestamps: what parity compares."""
    with container.connections.database.connection() as conn:
        return {
            "companies": conn.execute(_REPLICA_COMPANIES).fetchall(),
            "users": conn.execute(_REPLICA_USERS).fetchall(),
        }


def outbox_events(container: Container) -> list[dict[str, Any]]:
    """Unpublished events in outbox order, with generated ids replaced by Talent's and times dropped."""
    with container.connections.database.connection() as conn:
        external = dict(
            conn.execute(
                "SELECT id::text, external_talent_tenant_id::text FROM identity.companies"
                " UNION ALL SELECT id::text, external_talent_user_id::text FROM identity.users"
                " UNION ALL SELECT id::text, 'assignment' FROM identity.role_assignments"
            ).fetchall()
        )
        values = [row[0] for row in conn.execute("SELECT value FROM identity.outbox_events ORDER BY id")]
    return [_normalised(json.loads(value), external) for value in values]


def _normalised(body: dict[str, Any], external: dict[str, str]) -> dict[str, Any]:
    text = json.dumps({k: v for k, v in body.items() if k not in ("eventId", "occurredAt", "correlationId")})
    for internal, talent_id in external.items():
        text = text.replace(internal, talent_id)
    normalised: dict[str, Any] = json.loads(text)
    return normalised
