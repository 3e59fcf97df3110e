"""An Apache Kafka as a security team runs it: clients on a SASL_SSL listener (the test's own CA,
SCRAM-SHA-512 credentials), the KRaft StandardAuthorizer, and nothing allowed that no ACL allows. The test's
own set-up (credentials, ACLs, topics) goes through the broker's internal loopback listener, whose principal
(ANONYMOUS) is the one super user: no job's client ever uses it."""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import (
    AclBinding,
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from pin_identity.adapters.kafka.acls import JOBS, Grant, TalentNames, binding_filter, job_grants
from pin_identity.adapters.kafka.embedded_kafka import (
    HOST,
    QuorumNode,
    launch_node,
    stop_broker,
    wait_node_ready,
)
from pin_identity.config import Settings
from pin_identity.simulation.simulated_talent import create_talent_topics, generate_dataset, produce_to_topics
from tests.support.certificates import KEYSTORE_PASSWORD, ServerCertificate, make_server_certificate
from tests.support.talent import TalentTopics
from tests.support.waiting import wait_until

SCRAM = "SCRAM-SHA-512"


def secured_properties(certificate: ServerCertificate) -> dict[str, str]:
    """Overrides of the embedded broker's properties: its client listener becomes SASL_SSL."""
    client = "listener.name.client"
    return {
        "listener.security.protocol.map": "CLIENT:SASL_SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "sasl.enabled.mechanisms": SCRAM,
        f"{client}.sasl.enabled.mechanisms": SCRAM,
        f"{client}.scram-sha-512.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
        "required;",
        f"{client}.ssl.keystore.type": "PKCS12",
        f"{client}.ssl.keystore.location": str(certificate.keystore),
        f"{client}.ssl.keystore.password": KEYSTORE_PASSWORD,
        f"{client}.ssl.key.password": KEYSTORE_PASSWORD,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": "User:ANONYMOUS",
    }


@dataclass(frozen=True)
class Principal:
    name: str
    password: str

    @property
    def user(self) -> str:
        return f"User:{self.name}"


@dataclass
class SecuredKafka:
    node: QuorumNode
    ca: Path
    pid: int

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.node.port}"

    @property
    def admin_config(self) -> dict[str, str]:
        """The test's set-up only: the internal listener, super user."""
        return {"bootstrap.servers": f"{HOST}:{self.node.internal_port}"}

    def client_properties(self, principal: Principal) -> dict[str, str]:
        """What a job's PIN_IDENTITY_KAFKA_CONFIG holds (the bootstrap servers apart)."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM,
            "sasl.username": principal.name,
            "sasl.password": principal.password,
            "ssl.ca.location": str(self.ca),
        }

    def client_config(self, principal: Principal) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap, **self.client_properties(principal)}

    def principal(self, name: str) -> Principal:
        """A SCRAM user of its own, with a random password, known to the broker once this returns."""
        principal = Principal(name, secrets.token_urlsafe(18))
        upsertion = UserScramCredentialUpsertion(
            name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), principal.password.encode()
        )
        admin = AdminClient(self.admin_config)
        for future in admin.alter_user_scram_credentials([upsertion]).values():
            future.result(timeout=30)
        return principal

    def grant(self, grants: Iterable[Grant], principal: Principal) -> None:
        self._apply([binding for grant in grants for binding in grant.bindings(principal.user)])

    def revoke(self, grant: Grant, principal: Principal) -> None:
        admin = AdminClient(self.admin_config)
        for future in admin.delete_acls(grant.filters(principal.user)).values():
            future.result(timeout=30)
        self._wait_bindings(grant.bindings(principal.user), present=False)

    def _apply(self, bindings: list[AclBinding]) -> None:
        admin = AdminClient(self.admin_config)
        for future in admin.create_acls(bindings).values():
            future.result(timeout=30)
        self._wait_bindings(bindings, present=True)

    def _wait_bindings(self, bindings: list[AclBinding], *, present: bool) -> None:
        """Until the authorizer shows them (or no longer): it applies metadata records asynchronously."""
        admin = AdminClient(self.admin_config)

        def shown() -> bool:
            found = [admin.describe_acls(binding_filter(binding)).result(timeout=10) for binding in bindings]
            return all(bool(each) == present for each in found)

        wait_until(shown, f"the broker {'has' if present else 'dropped'} the ACLs", timeout_s=30)


class JobLogins:
    """One test's principals, one per job, each granted its rows of the ACL table (all but `without`); a
    job's settings carry its login as a properties file (PIN_IDENTITY_KAFKA_CONFIG_FILE) whose password is
    another file."""

    def __init__(self, broker: SecuredKafka, folder: Path, talent: TalentNames):
        self.broker, self._folder, self.talent = broker, folder, talent
        folder.mkdir(exist_ok=True)
        self._suffix = secrets.token_hex(4)

    def login(self, base: Settings, job: str, *, without: Grant | None = None) -> tuple[Settings, Principal]:
        assert job in JOBS
        principal = self.broker.principal(f"{job}-{self._suffix}")
        rows = [row for row in job_grants(self.talent) if row.job == job and row != without]
        self.broker.grant(rows, principal)
        password = self._folder / f"{job}.password"
        password.write_text(principal.password + "\n")
        properties = {**self.broker.client_properties(principal), "sasl.password": f"${{file:{password}}}"}
        config = self._folder / f"{job}.properties"
        config.write_text("".join(f"{name}={value}\n" for name, value in properties.items()))
        settings = base.model_copy(
            update={
                "kafka_bootstrap_servers": self.broker.bootstrap,
                "kafka_config_file": config,
                "outbox_relay_creates_topics": False,
                "talent_tenants_topic": self.talent.tenants_topic,
                "talent_users_topic": self.talent.users_topic,
                "talent_sync_group": self.talent.sync_group,
            }
        )
        return settings, principal


def talent_topics_of_their_own(broker: SecuredKafka, users: int) -> TalentNames:
    """Talent's topics for one test, created and filled by Talent's side (the set-up's super user)."""
    topics = TalentTopics.fresh()
    create_talent_topics(broker.admin_config, 3, tenants_topic=topics.tenants, users_topic=topics.users)
    dataset = generate_dataset(4, users)
    produce_to_topics(broker.admin_config, dataset, tenants_topic=topics.tenants, users_topic=topics.users)
    return TalentNames(topics.tenants, topics.users, topics.group)


@contextmanager
def secured_kafka(home: Path) -> Iterator[SecuredKafka]:
    certificate = make_server_certificate(home / "tls")
    node = QuorumNode.on_free_ports(1)
    process = launch_node(home, node, overrides=secured_properties(certificate))
    try:
        wait_node_ready(process, node.port, home / "broker.log")
        yield SecuredKafka(node, certificate.ca, process.pid)
    finally:
        stop_broker(process.pid)
