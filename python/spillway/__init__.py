"""Spillway for Python: keep big tool outputs out of an agent's context without losing them.

The same SDK as the Rust crate and the ``spillway`` CLI (this package wraps it; nothing is
re-implemented here): per-tool truncation with receipts, ``exec`` with streaming capture, the
3-second save rule, the per-turn gate, and a client of the shared store whose reads are capped
at 100,000 bytes. What a model is shown has its secrets replaced by marks unless told
``redact=False``.

    >>> import spillway
    >>> receipt = spillway.spill(huge_output)          # doctest: +SKIP
    >>> receipt["truncated"], receipt["digest"]        # doctest: +SKIP
    (True, 'blake3:9f2c…')
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ._spillway import (
    Corrupt,
    DigestMismatch,
    Forbidden,
    InsufficientStorage,
    InvalidArgument,
    InvalidDigest,
    LocalDir,
    NotFound,
    OffsetMismatch,
    QuotaExceeded,
    RangeNotSatisfiable,
    SpillwayError,
    Store,
    StreamClosed,
    StreamLimitExceeded,
    TooLarge,
    TooManyRequests,
    Unauthorized,
    Unavailable,
    exec,  # noqa: A004 - the contract's name (spillway.exec)
    gate,
    resolve,
    spill,
)

__all__ = [
    "AsyncStore",
    "Corrupt",
    "DigestMismatch",
    "Forbidden",
    "InsufficientStorage",
    "InvalidArgument",
    "InvalidDigest",
    "LocalDir",
    "NotFound",
    "OffsetMismatch",
    "QuotaExceeded",
    "RangeNotSatisfiable",
    "SpillwayError",
    "Store",
    "StreamClosed",
    "StreamLimitExceeded",
    "TooLarge",
    "TooManyRequests",
    "Unauthorized",
    "Unavailable",
    "exec",
    "gate",
    "resolve",
    "spill",
]


class AsyncStore:
    """`Store`'s methods as coroutines, for asyncio hosts (LangGraph's ``ainvoke``,
    deepagents' ``aread``). Each call runs the native client on a worker thread; the client
    releases the GIL while it waits, so calls proceed side by side."""

    def __init__(self, url: str | None = None, token: str | None = None, *, store: Store | None = None) -> None:
        self._store = store if store is not None else Store(url, token)

    @property
    def store(self) -> Store:
        """The synchronous client underneath."""
        return self._store

    @property
    def url(self) -> str:
        return self._store.url

    def __repr__(self) -> str:
        return f"AsyncStore({self._store.url!r})"

    async def put(self, data: bytes | str, labels: dict[str, str] | None = None, ttl: int | None = None) -> dict:
        return await asyncio.to_thread(self._store.put, data, labels, ttl)

    async def put_file(self, source: Any, labels: dict[str, str] | None = None, ttl: int | None = None) -> dict:
        return await asyncio.to_thread(self._store.put_file, source, labels, ttl)

    async def get(self, digest: str) -> bytes:
        return await asyncio.to_thread(self._store.get, digest)

    async def get_file(self, digest: str, dest: Any) -> None:
        return await asyncio.to_thread(self._store.get_file, digest, dest)

    async def read(self, digest: str, **kwargs: Any) -> dict:
        return await asyncio.to_thread(lambda: self._store.read(digest, **kwargs))

    async def grep(self, digest: str, pattern: str, **kwargs: Any) -> dict:
        return await asyncio.to_thread(lambda: self._store.grep(digest, pattern, **kwargs))

    async def search(self, pattern: str, **kwargs: Any) -> dict:
        return await asyncio.to_thread(lambda: self._store.search(pattern, **kwargs))

    async def stat(self, digest: str) -> dict:
        return await asyncio.to_thread(self._store.stat, digest)

    async def delete(self, digest: str) -> None:
        return await asyncio.to_thread(self._store.delete, digest)

    async def refs(self, labels: dict[str, str] | None = None) -> AsyncIterator[dict]:
        """This namespace's references, newest first; pages are fetched as they are needed."""
        it: Iterator[dict] = self._store.refs(labels)
        done = object()
        while True:
            item = await asyncio.to_thread(next, it, done)
            if item is done:
                return
            yield item  # type: ignore[misc]
