"""A representation of a state's many requests: the same tuple, updated in place.

Abstracted away: nothing. `State.requests` is a tuple of `Request` values,
and `State.with_request` gives a new state with one record replaced.
Written with tuples, each replacement copies the tuple, so a transition
that touches every request of a batch costs the batch times the requests
(a trace's thousands). Here a long tuple is a version of a `RequestStore`
(as pool_store.py does for the block pool): a list holding the newest
version's records; replacing a record of the newest version changes the
list in place and gives the old version an undo record. Every version reads
as the tuple it stands for (indexing, length, iteration, equality and hash
with tuples); an older version rebuilds its tuple when first read, and a
replacement in it starts a new store. States with fewer than
`STORE_MIN_REQUESTS` requests (the explicit-state search's) keep tuples;
tests/test_pool_store.py runs both representations side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Iterator

STORE_MIN_REQUESTS = 64


class RequestStore:
    __slots__ = ("items", "current")

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = list(items)
        self.current: Requests | None = None


class Requests(Sequence):
    """A version of a RequestStore: reads as the tuple of its records."""

    __slots__ = ("_store", "_undo", "_next", "_tuple")

    def __init__(self, store: RequestStore) -> None:
        self._store = store
        self._undo: tuple[int, Any] | None = None
        self._next: Requests | None = None
        self._tuple: tuple | None = None
        store.current = self

    def as_tuple(self) -> tuple:
        if self._tuple is None:
            chain, version = [], self
            while version._store.current is not version:
                chain.append(version)
                version = version._next  # type: ignore[assignment]
            items = list(version._store.items)
            for older in reversed(chain):
                r, old = older._undo  # type: ignore[misc]
                items[r] = old
            self._tuple = tuple(items)
        return self._tuple

    def __getitem__(self, index):  # type: ignore[override]
        if self._store.current is self and not isinstance(index, slice):
            return self._store.items[index]
        return self.as_tuple()[index]

    def __len__(self) -> int:
        return len(self._store.items)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.as_tuple())       # a snapshot: the store may change while one iterates

    def __reversed__(self) -> Iterator[Any]:
        return reversed(self.as_tuple())

    def __contains__(self, value: object) -> bool:
        return value in self.as_tuple()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (tuple, Requests)):
            return self.as_tuple() == (other.as_tuple() if isinstance(other, Requests) else other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(self.as_tuple())

    def __repr__(self) -> str:
        return repr(self.as_tuple())

    def __add__(self, other: tuple) -> tuple:
        return self.as_tuple() + other


def replaced(requests: Sequence[Any], r: int, request: Any) -> Sequence[Any]:
    """`requests` with record r replaced: a tuple for short ones, else the
    newest version of a store (in place when `requests` is its newest)."""
    if isinstance(requests, Requests):
        store = requests._store
        if store.current is not requests:
            store = RequestStore(requests.as_tuple())
    elif len(requests) >= STORE_MIN_REQUESTS:
        store = RequestStore(requests)
    else:
        return requests[:r] + (request,) + requests[r + 1:]  # type: ignore[operator]
    old = store.items[r]
    store.items[r] = request
    newer = Requests(store)
    if isinstance(requests, Requests):
        requests._undo, requests._next = (r, old), newer
    return newer


def settle(state: Any) -> None:
    """Give `state` its requests as a plain tuple (the same value), for a
    checker about to read many of them: tuple indexing costs less than a
    store version's. The next replacement starts a new store."""
    requests = state.__dict__.get("requests")
    if isinstance(requests, Requests):
        object.__setattr__(state, "requests", requests.as_tuple())
