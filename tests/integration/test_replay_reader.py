"""TopicReplay's reader on the embedded broker: a consumer kept positioned where its last page ended, so that
the next page of a partition comes from what it fetched meanwhile, and repositioned for any other page."""

from __future__ import annotations

import json
import uuid

from pin_identity.adapters.kafka.replay_source import TopicReplaySource
from pin_identity.domain.import_run import PlannedPage
from pin_identity.domain.talent import ImportStage
from pin_identity.simulation.simulated_talent import (
    TalentDataset,
    create_talent_topics,
    generate_dataset,
    produce_to_topics,
)
from tests.support.brokers import ProxiedBroker
from tests.support.talent import TalentTopics


def _serve_users(bootstrap: str, topics: TalentTopics, users: int) -> None:
    dataset = generate_dataset(1, users, seed=11)
    produce_to_topics(
        {"bootstrap.servers": bootstrap},
        TalentDataset([], dataset.users),
        tenants_topic=topics.tenants,
        users_topic=topics.users,
    )


def _reader(bootstrap: str, topics: TalentTopics) -> TopicReplaySource:
    return TopicReplaySource(
        {"bootstrap.servers": bootstrap}, tenants_topic=topics.tenants, users_topic=topics.users
    )


def _users_of(source: TopicReplaySource, page: PlannedPage) -> list[uuid.UUID | None]:
    return [item.talent_id for item in source.read(ImportStage.USERS, page.cursor, 8, None)]


def test_pages_read_in_any_order_hold_exactly_their_ranges(broker: str, talent_topics: TalentTopics) -> None:
    _serve_users(broker, talent_topics, 90)
    source = _reader(broker, talent_topics)
    try:
        pages = source.plan(ImportStage.USERS, None, 0, 8, None).pages
        in_order = {page.page_no: _users_of(source, page) for page in pages}
        # The same offsets in another partition, every other page, then the rest, then the first few again:
        # the next range of the same partition, ranges further on and back, pages read twice.
        by_partition = [[p for p in pages if json.loads(p.cursor or "{}")["partition"] == n] for n in (0, 1)]
        (a_first, a_second, *_), (b_first, b_second, *_) = by_partition
        scrambled = [a_first, b_second, b_first, a_second, *pages[1::2], *pages[::2], *pages[:3]]
        read_again = [(page.page_no, _users_of(source, page)) for page in scrambled]
    finally:
        source.close()
    everyone = [user for users in in_order.values() for user in users]
    assert len(everyone) == len(set(everyone)) == 90
    for page in pages:
        planned = json.loads(page.cursor or "{}")
        assert len(in_order[page.page_no]) == planned["end"] - planned["start"]
    for page_no, users in read_again:
        assert users == in_order[page_no], f"page {page_no} read out of order differs"


def test_the_next_page_of_a_partition_comes_from_what_the_reader_fetched_meanwhile(
    proxied_broker: ProxiedBroker,
) -> None:
    bootstrap, proxy = proxied_broker.bootstrap, proxied_broker.proxy
    topics = TalentTopics("talent.tenants.reader", "talent.users.reader", "talent-sync-reader")
    create_talent_topics(
        {"bootstrap.servers": bootstrap}, 1, tenants_topic=topics.tenants, users_topic=topics.users
    )
    _serve_users(bootstrap, topics, 16)
    reference, source = _reader(bootstrap, topics), _reader(bootstrap, topics)
    try:
        first, second = reference.plan(ImportStage.USERS, None, 0, 8, None).pages
        expected = _users_of(reference, second)
        assert len(_users_of(source, first)) == 8
        # The broker is out of reach from here on: the second page can only come from what the reader's
        # consumer fetched past the first one (one fetch response holds the whole small partition).
        proxy.stall()
        assert _users_of(source, second) == expected
    finally:
        proxy.restore()
        reference.close()
        source.close()
