"""Least privilege: what each job may do on the broker (`kafka acls`) and in the database (`db grants`),
written out for this configuration's names, and applied to the database."""

from __future__ import annotations

from collections.abc import Mapping

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from pin_identity.adapters.kafka import acls
from pin_identity.adapters.postgres import grants
from pin_identity.composition.connections import Connections
from pin_identity.composition.embedded_servers import EMBEDDED_DATABASE_NAME
from pin_identity.composition.failures import DATABASE_APPLY
from pin_identity.config import ConfigurationError, Settings
from pin_identity.observability.logging import first_line

# The jobs the Kafka ACL table grants rights to, each its own principal (`kafka acls`).
KAFKA_JOBS = acls.JOBS
# The jobs the database grants give a role of its own (`db grants`), the schema's owner first.
DATABASE_JOBS = (grants.OWNER, *grants.JOBS)


def kafka_acl_script(settings: Settings, principals: Mapping[str, str]) -> list[str]:
    """The `kafka-acls.sh` commands that grant each job exactly what it uses (deploy/README.md), for this
    configuration's Talent names; `principals` overrides the default principal of a job."""
    talent = acls.TalentNames(
        settings.talent_tenants_topic, settings.talent_users_topic, settings.talent_sync_group
    )
    return acls.acl_script(acls.job_grants(talent), {**acls.default_principals(), **principals})


def database_grant_script(settings: Settings, roles: Mapping[str, str], *, administrator: bool) -> list[str]:
    """The SQL that gives each job's role exactly what it uses (deploy/README.md): the schema owner's part,
    or the administrator's (`roles` overrides the default role of a job)."""
    return [statement.as_string(None) for statement in _grant_statements(settings, roles, administrator)]


def apply_database_grants(
    connections: Connections, roles: Mapping[str, str], *, administrator: bool
) -> grants.Applied:
    statements = _grant_statements(connections.settings, roles, administrator)
    try:
        return grants.apply(connections.database_conninfo, statements)
    except psycopg.errors.UndefinedObject as exc:  # a role not made yet
        advice = "apply the administrator's part first (`db grants --administrator`)"
        raise ConfigurationError(DATABASE_APPLY.format(first_line(exc), advice)) from None
    except psycopg.errors.InsufficientPrivilege as exc:
        advice = "apply it as an administrator" if administrator else "apply it as the schema's owner"
        raise ConfigurationError(DATABASE_APPLY.format(first_line(exc), advice)) from None


def _grant_statements(
    settings: Settings, roles: Mapping[str, str], administrator: bool
) -> list[sql.Composed]:
    chosen = {**grants.default_roles(), **roles}
    if not administrator:
        return grants.owner_script(grants.job_grants(), chosen)
    # Printing needs no server: the configured URL's name, else the embedded server's.
    url = settings.database_url
    database = str(conninfo_to_dict(url).get("dbname", "")) if url else EMBEDDED_DATABASE_NAME
    return grants.administrator_script(chosen, database, settings.db_idle_in_transaction_timeout_ms)
