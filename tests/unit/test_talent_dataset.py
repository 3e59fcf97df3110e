"""The simulated Talent dataset: deterministic, in Talent's format, with poison only when asked for."""

from __future__ import annotations

import re
import uuid
from collections import Counter

import pytest

from pin_identity.domain.phone import InvalidPhoneError, normalize_phone
from pin_identity.simulation.simulated_talent import UNKNOWN_COMPANY_TYPE, UNPARSEABLE_PHONE, generate_dataset

TENANT_KEYS = {"tenantId", "version", "name", "companyType", "taxId", "isDeleted"}
USER_KEYS = {
    "userId",
    "tenantId",
    "version",
    "phone",
    "email",
    "firstName",
    "lastName",
    "middleName",
    "isDeleted",
}


def test_the_same_seed_gives_the_same_dataset() -> None:
    assert generate_dataset(20, 200, seed=3) == generate_dataset(20, 200, seed=3)
    assert generate_dataset(20, 200, seed=3) != generate_dataset(20, 200, seed=4)


def test_snapshots_follow_the_contract_format() -> None:
    dataset = generate_dataset(30, 300)

    for tenant in dataset.tenants:
        assert set(tenant) == TENANT_KEYS
        assert uuid.UUID(tenant["tenantId"]).version == 4
        assert 1 <= tenant["version"] <= 3
        assert tenant["companyType"] in {"Developer", "Agency", "Bank"}
        assert tenant["taxId"] is None or (len(tenant["taxId"]) == 10 and tenant["taxId"].isdigit())
        assert tenant["isDeleted"] is False
    tenant_ids = {tenant["tenantId"] for tenant in dataset.tenants}
    for user in dataset.users:
        assert set(user) == USER_KEYS
        assert user["tenantId"] in tenant_ids
        assert 1 <= user["version"] <= 3
        assert user["isDeleted"] is False


def test_phones_are_written_in_mixed_forms_and_unique_once_normalised() -> None:
    dataset = generate_dataset(10, 2_000)

    phones = [normalize_phone(user["phone"]) for user in dataset.users]

    assert len(set(phones)) == len(phones)
    assert all(phone.startswith("+79") for phone in phones)
    forms = {re.sub(r"\d", "d", user["phone"]) for user in dataset.users}
    assert forms == {"+d (ddd) ddd-dd-dd", "d ddd ddd dd dd", "+ddddddddddd", "dddddddddd"}


def test_emails_and_ids_are_unique() -> None:
    dataset = generate_dataset(50, 2_000)

    emails = [user["email"] for user in dataset.users if user["email"] is not None]
    assert len(set(emails)) == len(emails)
    assert len({user["userId"] for user in dataset.users}) == len(dataset.users)
    assert len({tenant["tenantId"] for tenant in dataset.tenants}) == len(dataset.tenants)


def test_a_clean_dataset_has_no_poison() -> None:
    dataset = generate_dataset(10, 100)

    assert dataset.poison_tenant_ids == set()
    assert dataset.poison_user_ids == set()
    assert all(tenant["companyType"] != UNKNOWN_COMPANY_TYPE for tenant in dataset.tenants)


def test_poison_is_added_to_the_clean_dataset() -> None:
    clean = generate_dataset(10, 100)
    poisoned = generate_dataset(10, 100, poison=True)

    assert poisoned.tenants[:10] == clean.tenants
    assert poisoned.users[:100] == clean.users
    assert {tenant["tenantId"] for tenant in poisoned.tenants[10:]} == poisoned.poison_tenant_ids
    assert {user["userId"] for user in poisoned.users[100:]} == poisoned.poison_user_ids
    assert len(poisoned.poison_tenant_ids) == 1
    assert len(poisoned.poison_user_ids) == 3


def test_each_poison_user_has_exactly_one_fault() -> None:
    dataset = generate_dataset(10, 100, poison=True)
    poison = [user for user in dataset.users if user["userId"] in dataset.poison_user_ids]
    (cooperative,) = [tenant for tenant in dataset.tenants if tenant["tenantId"] in dataset.poison_tenant_ids]
    clean_phones = Counter(
        normalize_phone(user["phone"])
        for user in dataset.users
        if user["userId"] not in dataset.poison_user_ids
    )

    duplicate, unparseable, orphan = poison

    assert cooperative["companyType"] == UNKNOWN_COMPANY_TYPE
    assert normalize_phone(duplicate["phone"]) == normalize_phone(dataset.users[0]["phone"])
    assert duplicate["phone"] != dataset.users[0]["phone"]
    assert unparseable["phone"] == UNPARSEABLE_PHONE
    with pytest.raises(InvalidPhoneError):
        normalize_phone(unparseable["phone"])
    assert orphan["tenantId"] == cooperative["tenantId"]
    assert normalize_phone(orphan["phone"]) not in clean_phones


def test_users_need_a_tenant() -> None:
    with pytest.raises(ValueError, match="tenant"):
        generate_dataset(0, 5)
    assert generate_dataset(0, 0).users == []
