"""What each job may do on Kafka, and nothing more: one table, rendered as the `kafka-acls` commands of
deploy/README.md (`pin-identity kafka acls`) and applied as it is by the tests, so that what is documented is
what is proven. No `*` resource and no cluster right: topics and groups by their full names, the relay's
transactional ids by the prefix every outbox's id has (migration 0006).

Topic creation is not the relay's in a least-privilege deployment: the `topic-admin` principal creates the
topics from a deploy Job (`kafka ensure-topics`), and the relay runs with
PIN_IDENTITY_OUTBOX_RELAY_CREATES_TOPICS=false, holding a missing topic's events until it exists.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# The admin package does not re-export these to a type checker (as topics.py's ConfigResource).
from confluent_kafka.admin._acl import AclBinding, AclBindingFilter, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from pin_identity.domain.events import ACCESS_TOPIC, PUBLISHED_TOPICS

# Every outbox's transactional.id starts so (identity.outbox_relay_handover.transactional_id).
TRANSACTIONAL_ID_PREFIX = "pin-identity-outbox-relay-"
# Groups our readers name but never join (partitions are assigned), whose coordinator librdkafka still
# looks for: that takes Describe on the group. (The audit's reader never does, so it needs none.)
SHOW_GROUP, IMPORT_GROUP = "pin-identity-access-show", "pin-identity-talent-import"
JOBS = ("topic-admin", "outbox-relay", "talent-sync", "talent-import", "access-reader", "serve")
_PUBLISH = ("Write", "Describe", "DescribeConfigs")
_RESOURCE_OPTIONS = {"topic": "--topic", "group": "--group", "transactional-id": "--transactional-id"}
_RESOURCE_TYPES = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactional-id": ResourceType.TRANSACTIONAL_ID,
}


@dataclass(frozen=True)
class TalentNames:
    """The Talent names a deployment may override (CONTRACTS sections 1 and 5)."""

    tenants_topic: str
    users_topic: str
    sync_group: str


@dataclass(frozen=True)
class Grant:
    """One row of the table: a job's principal may do `operations` on one resource (or a name prefix)."""

    job: str
    operations: tuple[str, ...]
    resource: str  # "topic" | "group" | "transactional-id"
    name: str
    prefixed: bool = False  # a name prefix (kafka-acls --resource-pattern-type prefixed)

    def __str__(self) -> str:
        pattern = " (prefix)" if self.prefixed else ""
        return f"{self.job}: {'+'.join(self.operations)} on {self.resource} {self.name}{pattern}"

    def bindings(self, principal: str) -> list[AclBinding]:
        pattern = ResourcePatternType.PREFIXED if self.prefixed else ResourcePatternType.LITERAL
        return [
            AclBinding(
                _RESOURCE_TYPES[self.resource],
                self.name,
                pattern,
                principal,
                "*",
                _acl_operation(operation),
                AclPermissionType.ALLOW,
            )
            for operation in self.operations
        ]

    def filters(self, principal: str) -> list[AclBindingFilter]:
        return [binding_filter(binding) for binding in self.bindings(principal)]


def binding_filter(binding: AclBinding) -> AclBindingFilter:
    """The filter that matches exactly this binding (to find it, or to delete it)."""
    return AclBindingFilter(
        binding.restype,
        binding.name,
        binding.resource_pattern_type,
        binding.principal,
        binding.host,
        binding.operation,
        binding.permission_type,
    )


def job_grants(talent: TalentNames) -> list[Grant]:
    """The whole table, job by job."""
    talent_topics = (talent.tenants_topic, talent.users_topic)
    return [
        # DescribeConfigs and AlterConfigs: ensure-topics raises an existing topic's max.message.bytes.
        *(
            Grant("topic-admin", ("Create", "Describe", "DescribeConfigs", "AlterConfigs"), "topic", topic)
            for topic in PUBLISHED_TOPICS
        ),
        # DescribeConfigs: the relay reads min.insync.replicas to say why it cannot publish (too few
        # replicas in sync).
        *(Grant("outbox-relay", _PUBLISH, "topic", topic) for topic in PUBLISHED_TOPICS),
        Grant("outbox-relay", ("Write", "Describe"), "transactional-id", TRANSACTIONAL_ID_PREFIX, True),
        *(Grant("talent-sync", ("Read",), "topic", topic) for topic in talent_topics),
        Grant("talent-sync", ("Read",), "group", talent.sync_group),
        # Read, and DescribeConfigs: the import checks that Talent's topics are compacted before it starts.
        *(Grant("talent-import", ("Read", "DescribeConfigs"), "topic", topic) for topic in talent_topics),
        Grant("talent-import", ("Describe",), "group", IMPORT_GROUP),
        # The import hands the continuous consumer's group over to where it ended (import-handover).
        Grant("talent-import", ("Read",), "group", talent.sync_group),
        Grant("access-reader", ("Read",), "topic", ACCESS_TOPIC),
        Grant("access-reader", ("Describe",), "group", SHOW_GROUP),
        # The admin API: `access show` over HTTP, talent-sync's lag on its status route, and the check of
        # Talent's topics when an operator starts a TopicReplay run (a worker's talent-import runs it).
        Grant("serve", ("Read",), "topic", ACCESS_TOPIC),
        Grant("serve", ("Describe",), "group", SHOW_GROUP),
        *(Grant("serve", ("Describe", "DescribeConfigs"), "topic", topic) for topic in talent_topics),
        Grant("serve", ("Describe",), "group", talent.sync_group),
    ]


def _acl_operation(operation: str) -> AclOperation:
    """kafka-acls' spelling (`DescribeConfigs`) as the admin API's (`DESCRIBE_CONFIGS`)."""
    return AclOperation[re.sub(r"(?<!^)(?=[A-Z])", "_", operation).upper()]


def default_principals() -> dict[str, str]:
    return {job: f"User:pin-identity-{job}" for job in JOBS}


def acl_script(grants: Sequence[Grant], principals: Mapping[str, str]) -> list[str]:
    """The `kafka-acls.sh` command of each row, job by job under a comment naming the job's principal, for
    an administrator whose login is in `admin.properties`."""
    lines: list[str] = []
    for job in JOBS:
        rows = [grant for grant in grants if grant.job == job]
        if rows:
            lines += [f"# {job}: {principals[job]}", *(_command(grant, principals[job]) for grant in rows)]
    return lines


def _command(grant: Grant, principal: str) -> str:
    words: Sequence[str] = [
        "kafka-acls.sh", "--bootstrap-server", "$KAFKA_BOOTSTRAP", "--command-config", "admin.properties",
        "--add", "--allow-principal", principal,
        *(word for operation in grant.operations for word in ("--operation", operation)),
        _RESOURCE_OPTIONS[grant.resource], grant.name,
        *(["--resource-pattern-type", "prefixed"] if grant.prefixed else []),
    ]  # fmt: skip
    return " ".join(word if word.startswith("$") else shlex.quote(word) for word in words)
