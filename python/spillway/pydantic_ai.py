"""Pydantic AI integration: a toolset wrapper that turns oversized tool returns into receipts
(any toolset: function tools, MCP servers), and the store's readers as a toolset.

Needs ``pydantic-ai`` (``pip install './python[pydantic-ai]'``).

    >>> agent = Agent(model, toolsets=[SpillwayToolset(my_tools, store), store_toolset(store)])  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.tools import Tool
from pydantic_ai.toolsets import FunctionToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from ._cap import capped, store_tool_specs

__all__ = ["SpillwayToolset", "store_toolset"]


@dataclass
class SpillwayToolset(WrapperToolset[Any]):
    """Wraps any toolset (``SpillwayToolset(inner, store, cap=…)``): a tool return over `cap`
    bytes is saved to `store` (a `Store`, a `LocalDir`, or ``None``: ``SPILLWAY_URL``, else
    ``./.outputs``) and the model gets its receipt, as JSON, at most `cap` bytes; a return that
    fits goes through (its secrets marked). A store that is down gives a receipt saying not
    saved, never an exception in the run."""

    store: Any = None
    cap: int = 100_000
    strategy: str = "head_tail"

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]) -> Any:
        out = await super().call_tool(name, tool_args, ctx, tool)
        labels = {"tool": name[:256], "via": "pydantic-ai"}
        shown, changed = await asyncio.to_thread(capped, out, self.cap, self.strategy, self.store, labels)
        return shown if changed else out


def store_toolset(store: Any) -> FunctionToolset[Any]:
    """``read``, ``grep`` and ``search`` over `store` as a toolset, with the words `spillway mcp`
    gives them; always redacted (they feed a model), at most 100,000 bytes an answer."""
    tools = []
    for name, description, schema, call in store_tool_specs(store):

        async def run(_call: Any = call, **kwargs: Any) -> str:
            return await asyncio.to_thread(_call, kwargs)

        tools.append(Tool.from_schema(run, name=name, description=description, json_schema=schema))
    return FunctionToolset(tools)
