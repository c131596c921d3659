"""Claude Agent SDK integration: a ``PostToolUse`` hook that replaces an oversized tool output
with its receipt (the full output saved to the shared store), and the store's readers as an
in-process SDK MCP server.

Needs ``claude-agent-sdk`` (``pip install './python[claude-agent-sdk]'``).

    >>> options = ClaudeAgentOptions(                                       # doctest: +SKIP
    ...     hooks={"PostToolUse": [spill_hook(store)]},
    ...     mcp_servers={"spillway": store_server(store)},
    ... )
"""

from __future__ import annotations

import asyncio
from typing import Any

from claude_agent_sdk import HookMatcher, SdkMcpTool, ToolAnnotations, create_sdk_mcp_server

from ._cap import RECEIPT_ROOM, capped, store_tool_specs

__all__ = ["spill_hook", "store_server"]


def _capped_blocks(blocks: list[Any], cap: int, strategy: str, store: Any, labels: dict[str, str]) -> list[Any] | None:
    """An MCP result's content blocks with their text capped as one output, or None when it
    goes through as it is. Blocks that are not text (images) are kept."""
    texts = [b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    if not texts:
        return None
    shown, changed = capped("".join(texts), cap, strategy, store, labels)
    if not changed:
        return None
    others = [b for b in blocks if not (isinstance(b, dict) and b.get("type") == "text")]
    return [{"type": "text", "text": shown}, *others]


def _capped_fields(resp: dict[str, Any], cap: int, strategy: str, store: Any, labels: dict[str, str]) -> dict[str, Any] | None:
    """A built-in tool's output (`Bash`: ``stdout``, ``stderr``, …) with each long text field
    capped apart, the small ones first, so that together they stay within `cap`; None when
    nothing changes."""
    fields = sorted((k for k, v in resp.items() if isinstance(v, str)), key=lambda k: len(resp[k]))
    left, out, changed = max(cap - RECEIPT_ROOM, RECEIPT_ROOM), dict(resp), False
    for n, key in enumerate(fields):
        share = max(RECEIPT_ROOM, left // (len(fields) - n))
        shown, differs = capped(resp[key], share, strategy, store, {**labels, "field": key[:64]})
        out[key], changed = shown, changed or differs
        left -= len(shown.encode())
    return out if changed else None


def _updated(resp: Any, cap: int, strategy: str, store: Any, labels: dict[str, str]) -> Any | None:
    """What the model should get instead of `resp`, or None when it goes through untouched."""
    if isinstance(resp, str):
        shown, changed = capped(resp, cap, strategy, store, labels)
        return shown if changed else None
    if isinstance(resp, list):
        return _capped_blocks(resp, cap, strategy, store, labels)
    if isinstance(resp, dict) and isinstance(resp.get("content"), list):
        blocks = _capped_blocks(resp["content"], cap, strategy, store, labels)
        return None if blocks is None else {**resp, "content": blocks}
    if isinstance(resp, dict):
        return _capped_fields(resp, cap, strategy, store, labels)
    shown, changed = capped(resp, cap, strategy, store, labels)
    return shown if changed else None


def spill_hook(store: Any, cap: int = 100_000, strategy: str = "head_tail", matcher: str | None = None) -> HookMatcher:
    """A ``HookMatcher`` for ``ClaudeAgentOptions(hooks={"PostToolUse": [...]})``: a tool output
    over `cap` bytes (MCP tools' text blocks, a built-in tool's text fields) is saved to `store`
    (a `Store`, a `LocalDir`, or ``None``: ``SPILLWAY_URL``, else ``./.outputs``) and replaced by
    its receipt, at most `cap` bytes as the model reads it; an output that fits goes through
    untouched unless it holds secrets (then they are marked). `matcher` narrows the tools (a
    name or ``A|B``; all by default). A store that is down gives a receipt saying not saved."""

    async def spillway(input_data: dict[str, Any], _tool_use_id: str | None, _context: Any) -> dict[str, Any]:
        if input_data.get("hook_event_name") != "PostToolUse":
            return {}
        name = str(input_data.get("tool_name", "tool"))
        labels = {"tool": name[:256], "via": "claude-agent-sdk"}
        new = await asyncio.to_thread(_updated, input_data.get("tool_response"), cap, strategy, store, labels)
        if new is None:
            return {}
        out: dict[str, Any] = {"hookEventName": "PostToolUse", "updatedToolOutput": new}
        if name.startswith("mcp__"):
            out["updatedMCPToolOutput"] = new
        return {"hookSpecificOutput": out}

    return HookMatcher(matcher=matcher, hooks=[spillway])


def store_server(store: Any, name: str = "spillway") -> Any:
    """``read``, ``grep`` and ``search`` over `store` as an in-process SDK MCP server (pass it in
    ``ClaudeAgentOptions(mcp_servers={"spillway": store_server(store)})``); always redacted, at
    most 100,000 bytes an answer, with the words `spillway mcp` gives them."""
    tools = []
    for tool_name, description, schema, call in store_tool_specs(store):

        async def handler(args: dict[str, Any], _call: Any = call) -> dict[str, Any]:
            text = await asyncio.to_thread(_call, args)
            return {"content": [{"type": "text", "text": text}], "is_error": text.startswith("error (")}

        # An answer is at most 100,000 bytes: kept inline by the host, not moved to a file of its own.
        hints = ToolAnnotations(readOnlyHint=True, maxResultSizeChars=100_000)
        tools.append(
            SdkMcpTool(name=tool_name, description=description, input_schema=schema, handler=handler, annotations=hints)
        )
    return create_sdk_mcp_server(name, tools=tools)
