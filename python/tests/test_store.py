"""`spillway.Store` and `AsyncStore` against the real server: every method, and the contract's
errors as `SpillwayError` subclasses with `.code` and `.status`."""

from __future__ import annotations

import asyncio
import hashlib
import io
import subprocess
import sys
import textwrap

import pytest

import spillway

SECRET = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"


def test_put_get_stat_and_the_record(store: spillway.Store) -> None:
    rec = store.put(b"hello\nworld\n", labels={"tool": "pytest"}, ttl=600)
    assert rec["digest"].startswith("blake3:") and rec["sha256"] == "sha256:" + hashlib.sha256(b"hello\nworld\n").hexdigest()
    assert (rec["size"], rec["lines"], rec["deduplicated"]) == (12, 2, False)
    assert store.put("hello\nworld\n")["deduplicated"] is True, "a str is its UTF-8 bytes"
    assert store.get(rec["digest"]) == b"hello\nworld\n"
    assert store.get(rec["sha256"]) == b"hello\nworld\n", "by SHA-256 too"
    assert store.get(rec["digest"].removeprefix("blake3:")) == b"hello\nworld\n", "bare hex, as b3sum prints it"
    assert store.stat(rec["digest"])["size"] == 12


def test_files_stream_both_ways(store: spillway.Store, tmp_path) -> None:
    data = b"".join(b"line %d\n" % i for i in range(300_000))
    src = tmp_path / "in.log"
    src.write_bytes(data)
    by_path = store.put_file(src, labels={"file": "in.log"})
    by_object = store.put_file(io.BytesIO(data))
    assert by_path["digest"] == by_object["digest"] and by_path["size"] == len(data)
    out = tmp_path / "out.log"
    store.get_file(by_path["digest"], out)
    assert out.read_bytes() == data
    sink = io.BytesIO()
    store.get_file(by_path["digest"], sink)
    assert sink.getvalue() == data


def test_reads_greps_and_searches(store: spillway.Store) -> None:
    text = "".join(f"line {i}\n" for i in range(1, 5001)) + f"GITHUB_TOKEN={SECRET}\n"
    d = store.put(text, labels={"session": "py-reads"})["digest"]
    page = store.read(d, line=4999, lines=2)
    assert (page["content"], page["next_line"], page["start_line"]) == ("line 4999\nline 5000\n", 5001, 4999)
    page = store.read(d, offset=0, limit=7)
    assert (page["content"], page["next_offset"]) == ("line 1\n", 7)
    assert SECRET in store.read(d, line=5001)["content"], "an SRE reads the exact bytes"
    marked = store.read(d, line=5001, redact=True)
    assert marked["content"] == "GITHUB_TOKEN=[REDACTED:github_token]\n" and marked["redactions"] == 1
    found = store.grep(d, r"^line 4{3,4}$", before=1)
    assert [m["line"] for m in found["matches"]] == [444, 4444] and found["matches"][0]["before"][0]["line"] == 443
    assert store.grep(d, "ghp_", redact=True)["matches"] == [], "no pattern probes a secret"
    hits = store.search("line 4444", labels={"session": "py-reads"}, fixed=True)
    assert [(m["digest"], m["line"]) for m in hits["matches"]] == [(d, 4444)]
    assert hits["matches"][0]["labels"] == {"session": "py-reads"}


def test_refs_follow_the_cursor(store: spillway.Store) -> None:
    for i in range(1203):
        store.put(f"ref {i}\n", labels={"batch": "refs-walk"})
    refs = list(store.refs({"batch": "refs-walk"}))
    assert len(refs) == 1203 and len({r["digest"] for r in refs}) == 1203, "past a page of 1,000"
    assert refs[0]["created_at"] >= refs[-1]["created_at"], "newest first"
    assert list(store.refs({"batch": "nothing-here"})) == []


def test_errors_carry_the_contracts_code_and_status(server, store: spillway.Store, closed_port: str) -> None:
    missing = "blake3:" + "0" * 64
    with pytest.raises(spillway.NotFound) as e:
        store.get(missing)
    assert (e.value.code, e.value.status) == ("not_found", 404)
    assert isinstance(e.value, spillway.SpillwayError)
    with pytest.raises(spillway.InvalidDigest) as e:
        store.stat("blake3:nope")
    assert e.value.code == "invalid_digest"
    d = store.put("x\n")["digest"]
    with pytest.raises(spillway.InvalidArgument) as e:
        store.grep(d, "(")
    assert (e.value.code, e.value.status) == ("invalid_argument", 400)
    assert "pattern" in str(e.value)
    with pytest.raises(spillway.RangeNotSatisfiable):
        store.read(d, line=99)
    with pytest.raises(spillway.Unauthorized) as e:
        spillway.Store(server.url, "spw_" + "0" * 64).stat(d)
    assert e.value.status == 401
    agent = spillway.Store(server.url, server.token_for("default", "read", redacted=True))
    with pytest.raises(spillway.Forbidden) as e:
        agent.get(d)
    assert (e.value.status, "redacted text only" in str(e.value)) == (403, True)
    assert agent.read(d, redact=False)["redactions"] == 0, "a redacted token reads marks whatever it asks"
    with pytest.raises(spillway.Unavailable) as e:
        spillway.Store(closed_port, "t").stat(d)
    assert (e.value.code, e.value.status) == ("unavailable", None)
    with pytest.raises(spillway.InvalidArgument):
        store.read(d, line=1, offset=0)


def test_async_store_has_the_same_methods(store: spillway.Store) -> None:
    async def go() -> None:
        a = spillway.AsyncStore(store.url, store=store)
        rec = await a.put("async\nlines\n", labels={"via": "async"})
        page, found = await asyncio.gather(a.read(rec["digest"], line=2), a.grep(rec["digest"], "async"))
        assert page["content"] == "lines\n" and found["matches"][0]["line"] == 1
        assert (await a.get(rec["digest"])) == b"async\nlines\n"
        assert [r["digest"] async for r in a.refs({"via": "async"})] == [rec["digest"]]
        assert (await a.search("lines", labels={"via": "async"}))["matches"][0]["digest"] == rec["digest"]

    asyncio.run(go())


def test_a_second_process_reads_what_the_first_stored(server, store: spillway.Store) -> None:
    d = store.put("shared across processes\n", labels={"shared": "yes"})["digest"]
    code = textwrap.dedent(
        f"""
        import spillway
        s = spillway.Store({server.url!r}, {server.token!r})
        assert s.get({d!r}) == b"shared across processes\\n"
        print(next(iter(s.refs({{"shared": "yes"}})))["digest"])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == d
