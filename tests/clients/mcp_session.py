"""One MCP session with `spillway mcp`, spoken by an independent implementation of the
protocol: the official Python SDK. It lists the tools and calls run, read and grep against a
running store, checking what the model would read. Prints `N passed, N failed`.

Usage: mcp_session.py SPILLWAY_BINARY STORE_URL TOKEN
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters, stdio_client


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def __call__(self, name, cond, detail=""):
        if cond:
            self.passed += 1
            print(f"ok   {name}")
        else:
            self.failed += 1
            print(f"FAIL {name}: {detail}")


def text_of(result):
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def session(binary, url, token, check):
    env = {**os.environ, "SPILLWAY_URL": url, "SPILLWAY_TOKEN": token}
    params = StdioServerParameters(command=binary, args=["mcp"], env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            tools = {t.name: t for t in (await s.list_tools()).tools}
            check("six tools", sorted(tools) == ["background", "grep", "read", "run", "search", "tail"], sorted(tools))
            run_schema = tools["run"].input_schema if "run" in tools else {}
            check("run takes a command", run_schema.get("required") == ["command"], run_schema)

            r = await s.call_tool("run", {"command": "seq 1 300000; echo done >&2"})
            check("run succeeds", not r.is_error, text_of(r)[:300])
            receipt = json.loads(text_of(r)) if not r.is_error else {}
            stdout = receipt.get("stdout", {})
            check("run's text is the exec JSON", stdout.get("truncated") is True and stdout.get("saved") is True, stdout)
            check("the text is sent once: no structured copy", r.structured_content is None and len(r.content) == 1, r.structured_content)
            check("stderr apart", receipt.get("stderr", {}).get("result") == "done\n", receipt.get("stderr"))
            check("the preview stays under the cap", len(stdout.get("result", "").encode()) <= 100_000)
            digest = stdout.get("digest")

            r = await s.call_tool("read", {"digest": digest, "line": 150000, "lines": 2})
            page = text_of(r)
            check("read pages the saved output", page.startswith("150000\t150000\n150001\t150001\n"), page[:200])
            check("read says where to continue", "continue with line=150002" in page, page[-200:])
            r = await s.call_tool("read", {"digest": digest})
            body = text_of(r).rsplit("\n", 1)[0]
            check("a read is at most 100,000 bytes", len(body.encode()) <= 100_000, len(body.encode()))

            r = await s.call_tool("grep", {"digest": digest, "pattern": "^1234[0-9]$", "max_matches": 2})
            rows = text_of(r)
            check("grep answers numbered rows", rows.startswith("12340: 12340\n12341: 12341\n"), rows[:200])
            check("grep says where to resume", "from_line=12342" in rows, rows)

            r = await s.call_tool("search", {"pattern": "^12345$", "labels": {"stream": "stdout"}})
            rows = text_of(r)
            check("search finds the line across saved outputs", f"{digest}:12345: 12345" in rows, rows[:300])

            # Outputs as inputs: 50,000 JSON lines saved by one run, counted by jq in the next
            # without passing through the model.
            gen = "awk 'BEGIN{for(i=0;i<50000;i++) printf \"{\\\"i\\\":%d,\\\"status\\\":%d,\\\"path\\\":\\\"/p%d\\\"}\\n\", i, (i%7==0)?500:200, i%3}'"
            r = await s.call_tool("run", {"command": gen})
            saved = json.loads(text_of(r)).get("stdout", {}) if not r.is_error else {}
            check("50,000 JSON lines saved", saved.get("total_lines") == 50_000 and saved.get("digest"), text_of(r)[:300])
            check("the hint names stdin", "stdin" in (saved.get("hint") or ""), saved.get("hint"))
            r = await s.call_tool("run", {"command": "jq -c 'select(.status == 500) | .path' | sort | uniq -c", "stdin": saved.get("digest")})
            answer = json.loads(text_of(r)) if not r.is_error else {}
            counts = answer.get("stdout", {}).get("result", "")
            expected = {f'"/p{p}"': sum(1 for i in range(0, 50_000, 7) if i % 3 == p) for p in range(3)}
            got = {line.split()[1]: int(line.split()[0]) for line in counts.splitlines() if line.strip()}
            check("run with stdin: jq over the saved output", got == expected, (counts, expected))
            check("its answer stays under the cap", len(text_of(r).encode()) <= 100_000, len(text_of(r).encode()))
            r = await s.call_tool("read", {"digest": saved.get("digest"), "tail_lines": 2})
            check("read tail_lines gives the last lines", '"i":49999' in text_of(r) and "lines 49999-50000 of 50,000" in text_of(r), text_of(r)[-300:])
            r = await s.call_tool("run", {"command": "cat", "stdin": "blake3:" + "ab" * 32})
            check("a stdin this token cannot read is an error result", r.is_error and "not_found" in text_of(r), text_of(r))

            r = await s.call_tool("read", {"digest": "blake3:not-a-digest"})
            check("a bad digest is an error result", r.is_error and "invalid digest" in text_of(r), text_of(r))


TWO_MB_EACH = "head -c 2000000 /dev/urandom | base64 -w 76; head -c 2000000 /dev/urandom | base64 -w 76 >&2"


async def host_session(binary, url, token, check, client_name, budget, extra_args=()):
    """A session announcing itself as `client_name`: `run` with 2 MB on both streams answers
    within `budget` bytes (the serialized result), the digests page the rest, no text twice."""
    from mcp import types

    env = {**os.environ, "SPILLWAY_URL": url, "SPILLWAY_TOKEN": token}
    params = StdioServerParameters(command=binary, args=["mcp", *extra_args], env=env)
    async with stdio_client(params) as (read, write):
        info = types.Implementation(name=client_name, version="1.0.0")
        async with ClientSession(read, write, client_info=info) as s:
            await s.initialize()
            r = await s.call_tool("run", {"command": TWO_MB_EACH})
            wire = len(r.model_dump_json(by_alias=True, exclude_none=True).encode())
            who = f"{client_name or 'unknown'}{' ' + ' '.join(extra_args) if extra_args else ''}"
            check(f"{who}: run's whole answer within {budget}", not r.is_error and wire <= budget, (wire, text_of(r)[:200]))
            check(f"{who}: the text once", r.structured_content is None and len(r.content) == 1)
            answer = json.loads(text_of(r)) if not r.is_error else {}
            out, err = answer.get("stdout", {}), answer.get("stderr", {})
            check(f"{who}: both streams cut head and tail, saved", all(x.get("truncated") and x.get("saved") and len(x.get("shown", [])) == 2 for x in (out, err)), (out.get("shown"), err.get("shown")))
            check(f"{who}: previews use the budget", len(out.get("result", "")) > budget // 8, len(out.get("result", "")))
            r = await s.call_tool("read", {"digest": out.get("digest"), "line": 20000})
            wire = len(r.model_dump_json(by_alias=True, exclude_none=True).encode())
            check(f"{who}: a read answer within {budget}", not r.is_error and wire <= budget and "continue with line=" in text_of(r), (wire, text_of(r)[-200:]))
            r = await s.call_tool("grep", {"digest": out.get("digest"), "pattern": "[A-Z]{3}", "max_matches": 1000})
            wire = len(r.model_dump_json(by_alias=True, exclude_none=True).encode())
            check(f"{who}: a grep answer within {budget}", not r.is_error and wire <= budget and "from_line=" in text_of(r), (wire, text_of(r)[-200:]))


def main():
    binary, url, token = sys.argv[1:4]
    check = Checks()
    try:
        asyncio.run(session(binary, url, token, check))
        for name, budget, extra in [("claude-code", 40_000, ()), ("codex-mcp-client", 9_000, ()),
                                    ("some-new-host", 100_000, ()), ("claude-code", 20_000, ("--limit", "20000"))]:
            asyncio.run(host_session(binary, url, token, check, name, budget, extra))
    except Exception as e:  # a protocol failure is a failed check, reported like the others
        check("the session completes", False, repr(e))
    print(f"{check.passed} passed, {check.failed} failed")
    sys.exit(1 if check.failed else 0)


if __name__ == "__main__":
    main()
