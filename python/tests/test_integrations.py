"""deepagents and LangChain end to end, without an LLM: a scripted fake chat model calls the
tools, deepagents evicts a 3 MB tool result through `SpillwayBackend` into the real store, and
the model's `read_file` of it comes back through the capped, redacted read API; `capped_tool`
and `store_tools` in a LangChain agent loop."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import spillway

pytest.importorskip("deepagents")

from deepagents import create_deep_agent  # noqa: E402
from deepagents.backends import CompositeBackend, StateBackend  # noqa: E402
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402

from spillway.deepagents import SpillwayBackend  # noqa: E402
from spillway.langchain import capped_tool, store_tools  # noqa: E402

BIG_ROWS = 120_000
SECRET = "AKIAIOSFODNN7EXAMPLE"


def big_output() -> str:
    rows = [f"row {i:06d}: checked {'x' * 8}" for i in range(BIG_ROWS)]
    rows[100_002] = f"row 100002: key {SECRET}"
    return "\n".join(rows) + "\n"


class ScriptedModel(GenericFakeChatModel):
    """A chat model that answers from a script; deepagents binds tools, which it ignores."""

    def bind_tools(self, tools, **kwargs):  # noqa: ANN001, ANN003, ARG002
        return self


def call(name: str, args: dict, id_: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": id_, "type": "tool_call"}])


def tool_messages(result: dict) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in result["messages"] if isinstance(m, ToolMessage)}


def test_deepagents_evicts_to_the_store_and_reads_back_capped(server, store: spillway.Store) -> None:
    output = big_output()
    assert len(output) > 3_000_000

    @tool
    def fetch_logs() -> str:
        """Fetch the service's logs."""
        return output

    script = iter(
        [
            call("fetch_logs", {}, "call_logs_1"),
            call("read_file", {"file_path": "/large_tool_results/call_logs_1", "offset": 100_000, "limit": 5}, "call_read_1"),
            call("ls", {"path": "/large_tool_results/"}, "call_ls_1"),
            call("grep", {"pattern": "row 100001:", "path": "/large_tool_results/"}, "call_grep_1"),
            AIMessage(content="done"),
        ]
    )
    backend = CompositeBackend(
        default=StateBackend(),
        routes={
            "/large_tool_results/": SpillwayBackend(store, labels={"app": "pytest-deepagents"}, prefix="/large_tool_results/")
        },
    )
    agent = create_deep_agent(model=ScriptedModel(messages=script), tools=[fetch_logs], backend=backend)
    result = agent.invoke(
        {"messages": [{"role": "user", "content": "look at the logs"}]},
        config={"configurable": {"thread_id": "thread-42"}},
    )
    msgs = tool_messages(result)
    evicted = str(msgs["call_logs_1"].content)
    assert len(evicted) < 100_000 and "/large_tool_results/call_logs_1" in evicted, "deepagents evicted it"
    page = str(msgs["call_read_1"].content)
    head, *rows = page.splitlines()
    assert head == "@@ lines 100001-100005 of 120000 | next offset 100005 @@", "line = offset + 1, and where to go on"
    assert rows == [f"row {n:06d}: checked xxxxxxxx" if n != 100_002 else f"row {n}: key [REDACTED:aws_access_key_id]"
                    for n in range(100_000, 100_005)], page
    assert SECRET not in page and "[REDACTED:aws_access_key_id]" in page, "reads are redacted"
    assert "row 099999" not in page and "row 100005" not in page, "the lines asked for, no more"
    assert "call_logs_1" in str(msgs["call_ls_1"].content)
    assert str(msgs["call_grep_1"].content) == "/large_tool_results/call_logs_1", "found by its content"
    # In the store, with its labels: the path as the agent saw it, the backend's own, the thread.
    refs = list(store.refs({"path": "/large_tool_results/call_logs_1"}))
    assert len(refs) == 1
    assert refs[0]["labels"] == {"path": "/large_tool_results/call_logs_1", "app": "pytest-deepagents", "thread": "thread-42"}
    assert store.get(refs[0]["digest"]).decode() == output, "the exact output is kept"


def test_a_fresh_backend_in_another_process_sees_the_same_files(server, store: spillway.Store) -> None:
    SpillwayBackend(store, labels={"app": "shared-files"}).write("/notes/plan.md", "step 1\nstep 2\nstep 3\n")
    code = textwrap.dedent(
        f"""
        import json, spillway
        from spillway.deepagents import SpillwayBackend
        b = SpillwayBackend(spillway.Store({server.url!r}, {server.token!r}), labels={{"app": "shared-files"}})
        r = b.read("/notes/plan.md", offset=1, limit=1)
        print(json.dumps({{"content": r.file_data["content"], "start": r.start_line, "next": r.next_offset,
                           "ls": [e["path"] for e in b.ls("/notes").entries]}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    got = json.loads(out.stdout)
    assert got == {"content": "step 2\n", "start": 2, "next": 2, "ls": ["/notes/plan.md"]}


def test_the_backend_reads_writes_and_edits_like_a_filesystem(store: spillway.Store) -> None:
    b = SpillwayBackend(store, labels={"app": "fs-like"})
    assert b.write("/a.txt", "one\ntwo\nthree\n").path == "/a.txt"
    r = b.read("/a.txt")
    assert (r.file_data["content"], r.start_line, r.end_line, r.total_lines, r.next_offset) == ("one\ntwo\nthree\n", 1, 3, 3, None)
    assert b.read("/a.txt", offset=9).error.startswith("Line offset 9 exceeds")
    assert b.read("/missing.txt").error == "File '/missing.txt' not found"
    assert b.read("/a.txt", limit=0).no_lines_requested
    assert b.edit("/a.txt", "two", "2").occurrences == 1
    assert b.read("/a.txt").file_data["content"] == "one\n2\nthree\n", "the newest content of a path wins"
    assert b.edit("/a.txt", "absent", "x").error
    assert [m["path"] for m in b.glob("*.txt").matches] == ["/a.txt"]
    assert b.download_files(["/a.txt", "/b.txt"])[1].error == "file_not_found"
    assert b.upload_files([("/b.txt", b"bee\n")])[0].error is None and b.read("/b.txt").file_data["content"] == "bee\n"
    g = b.grep("three", path="/")
    assert [(m["path"], m["line"]) for m in g.matches] == [("/a.txt", 3)]


def test_capped_tool_and_store_tools_in_an_agent_loop(store: spillway.Store) -> None:
    from langchain.agents import create_agent

    output = big_output()

    @tool
    def dump_table() -> str:
        """Dump the whole table."""
        return output

    uploads_before = len(list(store.refs({"tool": "dump_table"})))
    capped = capped_tool(dump_table, cap=20_000, target=store)
    readers = store_tools(store)
    assert [t.name for t in readers] == ["read", "grep", "search"]
    assert "100,000 bytes" in readers[0].description
    script = iter(
        [
            call("dump_table", {}, "call_dump"),
            AIMessage(content="", tool_calls=[]),  # placeholder, replaced below once the digest is known
        ]
    )
    # Run the first step, read the receipt, then let the model read a page of it by digest.
    agent = create_agent(model=ScriptedModel(messages=script), tools=[capped, *readers])
    first = agent.invoke({"messages": [{"role": "user", "content": "dump it"}]})
    receipt = json.loads(str(tool_messages(first)["call_dump"].content))
    assert receipt["truncated"] and receipt["saved"] and len(json.dumps(receipt).encode()) <= 20_000
    digest = receipt["digest"]
    assert len(list(store.refs({"tool": "dump_table"}))) == uploads_before + 1, "one upload per call"
    script2 = iter(
        [
            call("read", {"digest": digest, "line": 100_003, "lines": 2}, "call_read"),
            call("grep", {"digest": digest, "pattern": "AKIA"}, "call_probe"),
            call("search", {"pattern": "row 100002", "labels": {"tool": "dump_table"}}, "call_search"),
            AIMessage(content="done"),
        ]
    )
    agent = create_agent(model=ScriptedModel(messages=script2), tools=[capped, *readers])
    second = tool_messages(agent.invoke({"messages": [{"role": "user", "content": "read it"}]}))
    page = str(second["call_read"].content)
    assert "row 100002: key [REDACTED:aws_access_key_id]" in page and SECRET not in page
    assert "continue with line=100005" in page
    assert "no matches" in str(second["call_probe"].content), "no pattern probes a secret"
    found = str(second["call_search"].content)
    assert f"{digest}:100003: row 100002" in found, found


def test_a_model_passes_a_saved_output_to_a_tool_by_reference(store: spillway.Store) -> None:
    from langchain.agents import create_agent

    log = store.put("".join(f"event {i} {'ERROR' if i % 10 == 0 else 'ok'}\n" for i in range(200_000)))

    @tool
    def count_errors(text: str) -> str:
        """Count the lines of `text` that say ERROR."""
        return str(sum("ERROR" in line for line in text.splitlines()))

    capped = capped_tool(count_errors, target=store)
    assert "$spillway" in json.dumps(capped.tool_call_schema if isinstance(capped.tool_call_schema, dict) else capped.args)
    script = iter(
        [
            call("count_errors", {"text": {"$spillway": log["digest"]}}, "call_ref"),
            call("count_errors", {"text": {"$spillway": "blake3:" + "ab" * 32}}, "call_missing"),
            call("count_errors", {"text": "one ERROR\ntwo\n"}, "call_plain"),
            AIMessage(content="done"),
        ]
    )
    agent = create_agent(model=ScriptedModel(messages=script), tools=[capped])
    got = tool_messages(agent.invoke({"messages": [{"role": "user", "content": "count"}]}))
    assert str(got["call_ref"].content) == "20000", "the tool got the whole output, not the model's words"
    assert "not_found" in str(got["call_missing"].content)
    assert str(got["call_plain"].content) == "1"
