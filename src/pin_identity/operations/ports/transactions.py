"""What every store transaction shares: commit, and the factory that opens one per `with` block."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, TypeVar

T_co = TypeVar("T_co", covariant=True)


class Transaction(Protocol):
    """One open transaction; nothing is visible to others until commit()."""

    def commit(self) -> None: ...


class Transactions(Protocol[T_co]):
    """Opens a transaction; leaving the block without commit() rolls it back."""

    def __call__(self) -> AbstractContextManager[T_co]: ...
