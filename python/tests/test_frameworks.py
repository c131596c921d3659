"""The OpenAI Agents SDK, the Claude Agent SDK and Pydantic AI, each driven by its own test
doubles (no network model) against the real server: a tool returns 3 MB, the model's next input
holds the receipt (at most the cap, JSON included), and the store's readers page the rest."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import spillway

SECRET = "AKIAIOSFODNN7EXAMPLE"


def big_output(rows: int = 100_000) -> str:
    """About 3 MB of numbered rows, one of which holds an AWS key."""
    lines = [f"row {i:06d}: checked {'x' * 12}" for i in range(rows)]
    if rows > 77_777:
        lines[77_777] = f"row 077777: key {SECRET}"
    return "\n".join(lines) + "\n"


def receipt_in(text: str, cap: int = 100_000) -> dict[str, Any]:
    assert len(text.encode()) <= cap, len(text.encode())
    receipt = json.loads(text)
    assert receipt["truncated"] and receipt["saved"] and receipt["digest"].startswith("blake3:"), receipt
    assert SECRET not in text
    return receipt


# ------------------------------------------------------------------ OpenAI Agents SDK


def test_openai_agents_guardrail_filter_and_readers(store: spillway.Store) -> None:
    pytest.importorskip("agents")
    from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    from spillway.openai_agents import spill_filter, spill_guardrail, store_tools

    set_tracing_disabled(True)  # no model provider here to export traces to
    output = big_output()

    @function_tool(tool_output_guardrails=[spill_guardrail(store)])
    def dump_table() -> str:
        """Dump the whole table."""
        return output

    def tool_outputs(call: Any) -> dict[str, str]:
        items = call.input if isinstance(call.input, list) else []
        return {i["call_id"]: i["output"] for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"}

    seen: dict[str, str] = {}

    def read_it(call: Any) -> list[Any]:
        seen.update(tool_outputs(call))
        digest = json.loads(seen["c1"])["digest"]
        return [function_call("read", {"digest": digest, "line": 77_778, "lines": 2}, call_id="c2")]

    def done(call: Any) -> list[Any]:
        seen.update(tool_outputs(call))
        return [assistant_message("done")]

    model = ScriptedModel([[function_call("dump_table", {}, call_id="c1")], ModelStep.respond(read_it), ModelStep.respond(done)])
    agent = Agent(name="ops", model=model, tools=[dump_table, *store_tools(store)])
    result = Runner.run_sync(agent, "dump it", run_config=RunConfig(call_model_input_filter=spill_filter(store)))
    assert result.final_output == "done"
    receipt = receipt_in(seen["c1"])
    assert receipt["total_size"] == len(output) and output not in seen["c1"]
    assert "row 077777: key [REDACTED:aws_access_key_id]" in seen["c2"] and "continue with line=77780" in seen["c2"]


def test_openai_agents_filter_gates_a_turn_over_its_budget(store: spillway.Store) -> None:
    pytest.importorskip("agents")
    from agents.run_config import CallModelData, ModelInputData

    from spillway.openai_agents import spill_filter

    many = [{"type": "function_call_output", "call_id": f"c{i}", "output": f"{i}: " + "y" * 60_000} for i in range(5)]
    items = [{"role": "user", "content": "go"}, *many]
    data = CallModelData(model_data=ModelInputData(input=items, instructions=None), agent=None, context=None)
    out = asyncio.run(spill_filter(store)(data)).input
    assert out[0] == items[0]
    total = sum(len(i["output"].encode()) for i in out[1:])
    assert total <= 200_000, total
    degraded = [i for i in out[1:] if i["output"] != items[out.index(i)]["output"]]
    assert degraded and all("blake3:" in i["output"] for i in degraded)


# ------------------------------------------------------------------ Claude Agent SDK


def post_tool_use(name: str, response: Any) -> dict[str, Any]:
    return {
        "hook_event_name": "PostToolUse",
        "session_id": "s-1",
        "transcript_path": "/tmp/t.jsonl",
        "cwd": "/tmp",
        "tool_name": name,
        "tool_input": {},
        "tool_response": response,
        "tool_use_id": "toolu_1",
    }


def test_claude_agent_sdk_hook_replaces_big_outputs_only(store: spillway.Store) -> None:
    pytest.importorskip("claude_agent_sdk")
    from spillway.claude_agent_sdk import spill_hook

    matcher = spill_hook(store)
    hook = matcher.hooks[0]
    big = [{"type": "text", "text": big_output()}]
    out = asyncio.run(hook(post_tool_use("mcp__db__dump", big), "toolu_1", None))
    specific = out["hookSpecificOutput"]
    assert specific["hookEventName"] == "PostToolUse"
    blocks = specific["updatedMCPToolOutput"]
    assert specific["updatedToolOutput"] == blocks and blocks[0]["type"] == "text"
    receipt = receipt_in(blocks[0]["text"])
    page = store.read(receipt["digest"], line=77_778, lines=1, redact=True)
    assert "[REDACTED:aws_access_key_id]" in page["content"]
    assert asyncio.run(hook(post_tool_use("mcp__db__small", [{"type": "text", "text": "z" * 10_000}]), "t", None)) == {}
    # A built-in tool's shape stays its own: stdout capped, stderr as it was.
    bash = {"stdout": big_output(), "stderr": "warning: slow\n", "interrupted": False, "isImage": False}
    out = asyncio.run(hook(post_tool_use("Bash", bash), "t", None))["hookSpecificOutput"]["updatedToolOutput"]
    assert out["stderr"] == "warning: slow\n" and out["interrupted"] is False
    assert len(json.dumps(out).encode()) <= 100_000 + 200
    receipt_in(out["stdout"])


def test_claude_agent_sdk_store_server_through_the_sdk_bridge(store: spillway.Store) -> None:
    pytest.importorskip("claude_agent_sdk")
    from claude_agent_sdk._internal.sdk_mcp_bridge import SdkMcpBridge

    from spillway.claude_agent_sdk import store_server

    log = store.put(big_output())
    config = store_server(store)

    async def session() -> list[dict[str, Any]]:
        bridge = SdkMcpBridge("spillway", config["instance"])
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
        answers = [await bridge.handle({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})]
        await bridge.handle({"jsonrpc": "2.0", "method": "notifications/initialized"})
        answers.append(await bridge.handle({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        args = {"digest": log["digest"], "line": 77_778, "lines": 1}
        call = {"name": "read", "arguments": args}
        answers.append(await bridge.handle({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": call}))
        missing = {"name": "read", "arguments": {"digest": "blake3:" + "ab" * 32}}
        answers.append(await bridge.handle({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": missing}))
        await bridge.aclose()
        return answers

    _, listed, read, missing = asyncio.run(session())
    assert sorted(t["name"] for t in listed["result"]["tools"]) == ["grep", "read", "search"]
    text = read["result"]["content"][0]["text"]
    assert "77778\trow 077777: key [REDACTED:aws_access_key_id]" in text and SECRET not in text
    assert missing["result"]["isError"] and "not_found" in missing["result"]["content"][0]["text"]


# ------------------------------------------------------------------ Pydantic AI


def test_pydantic_ai_toolset_wraps_returns_and_reads_back(store: spillway.Store) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.toolsets import FunctionToolset

    from spillway.pydantic_ai import SpillwayToolset, store_toolset

    output = big_output()
    inner = FunctionToolset()

    @inner.tool_plain
    def dump_table() -> str:
        """Dump the whole table."""
        return output

    @inner.tool_plain
    def small() -> str:
        """A short answer."""
        return "fine"

    returns: dict[str, str] = {}

    def model(messages: list[Any], _info: Any) -> ModelResponse:
        for m in messages:
            for p in getattr(m, "parts", []):
                if isinstance(p, ToolReturnPart):
                    returns[p.tool_call_id] = p.content if isinstance(p.content, str) else json.dumps(p.content)
        if not returns:
            return ModelResponse(parts=[ToolCallPart("dump_table", {}, tool_call_id="c1"), ToolCallPart("small", {}, tool_call_id="c0")])
        if "c2" not in returns:
            digest = json.loads(returns["c1"])["digest"]
            return ModelResponse(parts=[ToolCallPart("read", {"digest": digest, "line": 77_778, "lines": 1}, tool_call_id="c2")])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), toolsets=[SpillwayToolset(inner, store), store_toolset(store)])
    assert agent.run_sync("dump it").output == "done"
    receipt_in(returns["c1"])
    assert returns["c0"] == "fine"
    assert "row 077777: key [REDACTED:aws_access_key_id]" in returns["c2"]


# ------------------------------------------------------------------ a store that is down


def test_a_store_that_is_down_gives_each_adapter_a_not_saved_receipt(closed_port: str) -> None:
    down = spillway.Store(closed_port, "token")
    output = big_output(20_000)
    if pytest.importorskip("agents"):
        from spillway.openai_agents import spill_guardrail

        class Data:
            context = type("Ctx", (), {"tool_name": "dump"})()
            agent = None

        Data.output = output
        got = asyncio.run(spill_guardrail(down).guardrail_function(Data()))
        receipt = json.loads(got.behavior["message"])
        assert receipt["saved"] is False and "NOT saved" in receipt["hint"]
    if pytest.importorskip("claude_agent_sdk"):
        from spillway.claude_agent_sdk import spill_hook

        out = asyncio.run(spill_hook(down).hooks[0](post_tool_use("mcp__x__y", output), "t", None))
        assert json.loads(out["hookSpecificOutput"]["updatedToolOutput"])["saved"] is False
    if pytest.importorskip("pydantic_ai"):
        from spillway._cap import capped

        shown, changed = capped(output, 100_000, "head_tail", down, {"tool": "x"})
        assert changed and json.loads(shown)["saved"] is False
