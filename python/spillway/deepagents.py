"""A deepagents backend that keeps files in the Spillway store: shared by every worker and
process with the same store and token, retained and cleaned up by the store's TTLs.

    from deepagents.backends import CompositeBackend, StateBackend
    backend = CompositeBackend(
        default=StateBackend(),
        routes={"/large_tool_results/": SpillwayBackend(spillway.Store(), prefix="/large_tool_results/")},
    )

deepagents then evicts large tool results to the store, and ``read_file``, ``grep``, ``ls`` and
``glob`` on that prefix read them back through the capped, redacted read API. A file is a
blob with a reference labelled ``path=<its path>`` (and the backend's own labels): the path →
digest mapping lives in the store, found again through ``/v1/refs?label.path=…``, so a fresh
backend elsewhere sees the same files; the newest reference of a path is its content.
Needs ``deepagents`` (``pip install './python[deepagents]'``).
"""

from __future__ import annotations

import asyncio
import fnmatch
from typing import Any

from deepagents.backends.protocol import (
    BackendProtocol,
    DeleteResult,
    EditResult,
    FileDownloadResponse,
    FileInfo,
    FileUploadResponse,
    GlobResult,
    GrepMatch,
    GrepResult,
    LsResult,
    ReadResult,
    WriteResult,
)

from . import AsyncStore, NotFound, SpillwayError, Store

__all__ = ["SpillwayBackend"]

# A path is kept as a label value, which holds at most 256 bytes.
_MAX_PATH = 256


def _thread_id() -> str | None:
    """The LangGraph thread this call runs in, when it runs inside a graph."""
    try:
        from langgraph.config import get_config

        thread = (get_config().get("configurable") or {}).get("thread_id")
    except Exception:  # noqa: BLE001 - outside a graph there is no config
        return None
    return str(thread)[:_MAX_PATH] if thread is not None else None


class SpillwayBackend(BackendProtocol):
    """deepagents' `BackendProtocol` over a Spillway store. Reads are redacted (they feed a
    model); writes store the exact content."""

    def __init__(
        self, store: Store | AsyncStore, labels: dict[str, str] | None = None, ttl: int | None = None, prefix: str = ""
    ) -> None:
        """`prefix`: the route this backend serves in a ``CompositeBackend`` (say
        ``"/large_tool_results/"``), which hands it paths with the route taken off; the labels
        then carry the path the agent saw (``path=/large_tool_results/t1``), so that ``spillway
        refs --label path=…`` finds what the agent named."""
        self.store: Store = store.store if isinstance(store, AsyncStore) else store
        self.labels = dict(labels or {})
        self.ttl = ttl
        self.prefix = prefix.rstrip("/")

    def _label(self, path: str) -> str:
        """The `path` label of a backend path."""
        return self.prefix + path

    def _path(self, label: str | None) -> str | None:
        """The backend path a `path` label names, or None when it is not under the prefix."""
        if label is None or not label.startswith(self.prefix + "/"):
            return None
        return label[len(self.prefix) :]

    # ------------------------------------------------------------------ paths and digests

    def _refs(self, path: str | None = None) -> list[dict]:
        labels = dict(self.labels)
        if path is not None:
            labels["path"] = self._label(path)
        return list(self.store.refs(labels))

    def _digest(self, path: str) -> str | None:
        """The digest of `path`'s newest content, or None."""
        if len(self._label(path).encode()) > _MAX_PATH:
            return None
        for ref in self.store.refs({**self.labels, "path": self._label(path)}):
            return ref["digest"]
        return None

    def _files(self) -> dict[str, dict]:
        """Every path of this backend with its newest reference."""
        files: dict[str, dict] = {}
        for ref in self._refs():
            path = self._path(ref["labels"].get("path"))
            if path is not None and path not in files:
                files[path] = ref
        return files

    @staticmethod
    def _info(path: str, ref: dict) -> FileInfo:
        return FileInfo(path=path, is_dir=False, size=ref["size"], modified_at=ref["created_at"])

    # ------------------------------------------------------------------ reads

    def ls(self, path: str) -> LsResult:
        base = path.rstrip("/") + "/"
        entries: list[FileInfo] = []
        dirs: set[str] = set()
        for p, ref in sorted(self._files().items()):
            if not p.startswith(base):
                continue
            rest = p[len(base) :]
            if "/" in rest:
                dirs.add(base + rest.split("/", 1)[0] + "/")
            else:
                entries.append(self._info(p, ref))
        entries.extend(FileInfo(path=d, is_dir=True) for d in sorted(dirs))
        return LsResult(entries=entries)

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        offset, limit = max(int(offset), 0), max(int(limit), 0)
        digest = self._digest(file_path)
        if digest is None:
            return ReadResult(error=f"File '{file_path}' not found")
        if limit == 0:
            return ReadResult(file_data={"content": "", "encoding": "utf-8"}, no_lines_requested=True)
        try:
            page = self.store.read(digest, line=offset + 1, lines=limit, redact=True)
        except SpillwayError as e:
            if getattr(e, "code", None) == "range_not_satisfiable":
                total = self.store.stat(digest)["lines"]
                return ReadResult(error=f"Line offset {offset} exceeds file length ({total} lines)")
            return ReadResult(error=str(e))
        total = page["total_lines"]
        if total == 0 or (page["length"] == 0 and page["eof"]):
            if total == 0:
                return ReadResult(file_data={"content": "", "encoding": "utf-8"})
            return ReadResult(error=f"Line offset {offset} exceeds file length ({total} lines)")
        end_line = page["end_line"]
        # A page cut inside one very long line ends before it does: the next read goes on
        # from the line after it (deepagents reads whole lines).
        more = page["next_line"] is not None or page["next_offset"] is not None
        return ReadResult(
            file_data={"content": page["content"], "encoding": "utf-8"},
            total_lines=max(total, end_line),
            start_line=page["start_line"],
            end_line=end_line,
            next_offset=end_line if more and end_line < total else None,
        )

    def grep(self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None) -> GrepResult:
        base = (path or "/").rstrip("/") + "/"
        matches: list[GrepMatch] = []
        cursor = None
        try:
            # A path's content is its newest reference's: older versions are not its file.
            current = {p: ref["digest"] for p, ref in self._files().items()}
            while True:
                found = self.store.search(pattern, labels=self.labels or None, fixed=True, cursor=cursor, redact=True)
                for m in found["matches"]:
                    p = self._path(m["labels"].get("path"))
                    if p is None or current.get(p) != m["digest"] or not p.startswith(base):
                        continue
                    if glob and not _glob_match(p, glob, base):
                        continue
                    if max_count is not None and len(matches) >= max_count:
                        return GrepResult(matches=matches, truncated=True)
                    matches.append(GrepMatch(path=p, line=m["line"], text=m["text"]))
                cursor = found["next_cursor"]
                if cursor is None:
                    return GrepResult(matches=matches)
        except SpillwayError as e:
            return GrepResult(error=str(e), matches=matches or None)

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        base = (path or "/").rstrip("/") + "/"
        found = [self._info(p, ref) for p, ref in sorted(self._files().items()) if p.startswith(base) and _glob_match(p, pattern, base)]
        return GlobResult(matches=found)

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        out = []
        for p in paths:
            digest = self._digest(p)
            if digest is None:
                out.append(FileDownloadResponse(path=p, error="file_not_found"))
                continue
            out.append(FileDownloadResponse(path=p, content=self._redacted_text(digest).encode()))
        return out

    def _redacted_text(self, digest: str) -> str:
        """The whole content as a model may see it: redacted pages, one after the other."""
        parts, line, offset = [], 1, None
        while True:
            if offset is None:
                page = self.store.read(digest, line=line, redact=True)
            else:
                page = self.store.read(digest, offset=offset, redact=True)
            parts.append(page["content"])
            if page["next_line"] is not None:
                line, offset = page["next_line"], None
            elif page["next_offset"] is not None:
                offset = page["next_offset"]
            else:
                return "".join(parts)

    # ------------------------------------------------------------------ writes

    def _put(self, path: str, content: str | bytes) -> str:
        if not path.startswith("/") or len(self._label(path).encode()) > _MAX_PATH:
            raise ValueError(f"a path starts with / and has at most {_MAX_PATH} bytes: {path!r}")
        labels = {**self.labels, "path": self._label(path)}
        thread = _thread_id()
        if thread is not None and "thread" not in labels:
            labels["thread"] = thread
        return self.store.put(content, labels=labels, ttl=self.ttl)["digest"]

    def write(self, file_path: str, content: str) -> WriteResult:
        try:
            self._put(file_path, content)
        except (SpillwayError, ValueError) as e:
            return WriteResult(error=str(e))
        return WriteResult(path=file_path)

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:  # noqa: FBT001, FBT002
        digest = self._digest(file_path)
        if digest is None:
            return EditResult(error=f"Error: File '{file_path}' not found")
        try:
            text = self.store.get(digest).decode("utf-8", errors="replace")
        except SpillwayError as e:
            return EditResult(error=str(e))
        count = text.count(old_string)
        if count == 0:
            return EditResult(error=f"Error: String not found in file: '{old_string}'")
        if count > 1 and not replace_all:
            return EditResult(error=f"Error: String '{old_string}' appears {count} times in file. Use replace_all=True to replace all instances, or provide a more specific string with surrounding context.")
        new = text.replace(old_string, new_string) if replace_all else text.replace(old_string, new_string, 1)
        result = self.write(file_path, new)
        if result.error:
            return EditResult(error=result.error)
        return EditResult(path=file_path, occurrences=count if replace_all else 1)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        out = []
        for p, data in files:
            try:
                self._put(p, data)
                out.append(FileUploadResponse(path=p))
            except ValueError:
                out.append(FileUploadResponse(path=p, error="invalid_path"))
            except SpillwayError as e:
                out.append(FileUploadResponse(path=p, error="permission_denied" if getattr(e, "status", None) == 403 else str(e)))
        return out

    def delete(self, file_path: str) -> DeleteResult:
        paths = [(r, self._path(r["labels"].get("path")) or "") for r in self._refs()]
        refs = [r for r, p in paths if p == file_path or p.startswith(file_path.rstrip("/") + "/")]
        if not refs:
            return DeleteResult(error=f"Error: '{file_path}' not found")
        try:
            for digest in {r["digest"] for r in refs}:
                self.store.delete(digest)
        except NotFound:
            pass
        except SpillwayError as e:
            return DeleteResult(error=str(e))
        return DeleteResult(path=file_path)

    # ------------------------------------------------------------------ async: the same, off the loop

    async def als(self, path: str) -> LsResult:
        return await asyncio.to_thread(self.ls, path)

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return await asyncio.to_thread(self.read, file_path, offset, limit)

    async def agrep(self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None) -> GrepResult:
        return await asyncio.to_thread(lambda: self.grep(pattern, path, glob, max_count=max_count))

    async def aglob(self, pattern: str, path: str | None = None) -> GlobResult:
        return await asyncio.to_thread(self.glob, pattern, path)

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        return await asyncio.to_thread(self.write, file_path, content)

    async def aedit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:  # noqa: FBT001, FBT002
        return await asyncio.to_thread(self.edit, file_path, old_string, new_string, replace_all)

    async def adelete(self, file_path: str) -> DeleteResult:
        return await asyncio.to_thread(self.delete, file_path)

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return await asyncio.to_thread(self.upload_files, files)

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return await asyncio.to_thread(self.download_files, paths)


def _glob_match(path: str, pattern: str, base: str) -> bool:
    """deepagents' glob rules, for the flat names deepagents writes: a pattern without `/`
    matches the file name at any depth, one with `/` the path under `base`."""
    rel = path[len(base) :] if path.startswith(base) else path.lstrip("/")
    if "/" not in pattern.strip("/"):
        return fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], pattern.lstrip("/"))
    return fnmatch.fnmatchcase(rel, pattern.lstrip("/").replace("**/", "*"))
