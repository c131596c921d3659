"""The native module: the Rust SDK (spillway-client), wrapped. See `spillway` for the package."""

from collections.abc import Iterator
from os import PathLike
from typing import Any, BinaryIO, Literal

Strategy = Literal["head", "tail", "head_tail", "numbered_lines", "reject"]
Target = "Store | LocalDir | None"

class SpillwayError(Exception):
    """A store or SDK error."""

    code: str
    """The contract's error code (`not_found`, `invalid_argument`, …; `unavailable` when the store did not answer)."""
    status: int | None
    """The HTTP status the store answered, or None when no server answered."""

class InvalidDigest(SpillwayError): ...
class InvalidArgument(SpillwayError): ...
class DigestMismatch(SpillwayError): ...
class Unauthorized(SpillwayError): ...
class Forbidden(SpillwayError): ...
class NotFound(SpillwayError): ...
class OffsetMismatch(SpillwayError): ...
class StreamClosed(SpillwayError): ...
class TooLarge(SpillwayError): ...
class StreamLimitExceeded(SpillwayError): ...
class RangeNotSatisfiable(SpillwayError): ...
class Unavailable(SpillwayError): ...
class InsufficientStorage(SpillwayError): ...
class QuotaExceeded(SpillwayError): ...
class TooManyRequests(SpillwayError): ...
class Corrupt(SpillwayError): ...

class Store:
    """A client of one store with one token; `SPILLWAY_URL` / `SPILLWAY_TOKEN` when not given."""

    def __init__(self, url: str | None = None, token: str | None = None) -> None: ...
    @property
    def url(self) -> str: ...
    def put(self, data: bytes | str, labels: dict[str, str] | None = None, ttl: int | None = None) -> dict[str, Any]:
        """Uploads `data`; answers the blob record (digest, sha256, size, lines, deduplicated, expires_at)."""
    def put_file(
        self, source: str | PathLike[str] | BinaryIO, labels: dict[str, str] | None = None, ttl: int | None = None
    ) -> dict[str, Any]:
        """Uploads a file (a path, or a file object read a chunk at a time), streamed."""
    def get(self, digest: str) -> bytes:
        """The exact bytes, verified against the digest (`blake3:…`, `sha256:…` or 64 hex)."""
    def get_file(self, digest: str, dest: str | PathLike[str] | BinaryIO) -> None:
        """Streams the bytes to a path (which appears only once verified) or a file object."""
    def read(
        self,
        digest: str,
        line: int | None = None,
        lines: int | None = None,
        offset: int | None = None,
        limit: int | None = None,
        redact: bool = False,
        tail_lines: int | None = None,
    ) -> dict[str, Any]:
        """One capped page (at most 100,000 bytes of content): by lines, by bytes, or the last
        `tail_lines` lines."""
    def grep(
        self,
        digest: str,
        pattern: str,
        ignore_case: bool = False,
        fixed: bool = False,
        before: int = 0,
        after: int = 0,
        from_line: int | None = None,
        redact: bool = False,
        max_matches: int | None = None,
    ) -> dict[str, Any]:
        """Matching lines of one output, capped; `next_line` resumes."""
    def search(
        self,
        pattern: str,
        labels: dict[str, str] | None = None,
        since: str | int | None = None,
        ignore_case: bool = False,
        fixed: bool = False,
        cursor: str | None = None,
        redact: bool = False,
        until: str | int | None = None,
        max_matches: int | None = None,
        before: int = 0,
        after: int = 0,
    ) -> dict[str, Any]:
        """Matching lines across this namespace's outputs, newest first; `next_cursor` goes on."""
    def stat(self, digest: str) -> dict[str, Any]:
        """The blob record."""
    def refs(self, labels: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
        """This namespace's references with these labels, newest first (follows the cursor)."""
    def delete(self, digest: str) -> None:
        """Drops this namespace's references to a blob (admin)."""
    def _tool(self, name: str, arguments: dict[str, Any]) -> tuple[str, Any]: ...

class LocalDir:
    """Spill to a directory (files named by content hash) instead of the store."""

    def __init__(self, path: str | PathLike[str]) -> None: ...
    @property
    def path(self) -> str: ...

def spill(
    output: bytes | str,
    target: Store | LocalDir | None = None,
    strategy: Strategy = "head_tail",
    cap: int = 100_000,
    labels: dict[str, str] | None = None,
    redact: bool = True,
) -> dict[str, Any]:
    """The receipt of one output: at most `cap` bytes shown, the rest saved within 3 s."""

def exec(
    command: str | list[str],
    target: Store | LocalDir | None = None,
    timeout: float | None = None,
    cwd: str | PathLike[str] | None = None,
    labels: dict[str, str] | None = None,
    redact: bool = True,
    stdin: str | None = None,
) -> dict[str, Any]:
    """Runs a command like an agent's shell tool: {exit_code, signal, timed_out?, stdout, stderr}.
    `stdin`: a saved output (a digest, or a stream id) fed to the command, checked as it streams."""

def resolve(
    value: Any,
    limit: int = 10_000_000,
    as_file: bool = False,
    store: Store | LocalDir | None = None,
) -> Any:
    """`value` with every reference (`{"$spillway": "blake3:…"}` or a receipt) replaced by the
    saved output's text, or a local file's path with `as_file`."""

def gate(
    results: list[str | dict[str, Any]],
    redact: bool = True,
    target: Store | LocalDir | None = None,
    budget: int = 200_000,
    keep: int = 2_000,
) -> list[str | dict[str, Any]]:
    """The per-turn gate over one turn's tool results."""

def tool_descriptions() -> dict[str, tuple[str, dict[str, Any]]]:
    """`spillway mcp`'s tools: name -> (description, input schema)."""
