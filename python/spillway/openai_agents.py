"""OpenAI Agents SDK integration: a tool output guardrail that saves an oversized output and
hands the model its receipt, a model-input filter that applies the per-turn gate, and the
store's readers as function tools.

Needs ``openai-agents`` (``pip install './python[openai-agents]'``).

    >>> from agents import Agent, RunConfig, function_tool                 # doctest: +SKIP
    >>> guard = spill_guardrail(store)
    >>> agent = Agent(name="ops", tools=[function_tool(fetch_logs, tool_output_guardrails=[guard]),
    ...                                  *store_tools(store)])
    >>> Runner.run(agent, "why did it fail?", run_config=RunConfig(call_model_input_filter=spill_filter(store)))
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents import FunctionTool, ToolGuardrailFunctionOutput, ToolOutputGuardrail, tool_output_guardrail
from agents.run_config import CallModelData, ModelInputData

from ._cap import capped, store_tool_specs
from ._spillway import gate

__all__ = ["spill_filter", "spill_guardrail", "store_tools"]


def spill_guardrail(store: Any, cap: int = 100_000, strategy: str = "head_tail") -> ToolOutputGuardrail[Any]:
    """A tool output guardrail (pass it in a function tool's ``tool_output_guardrails``): an
    output over `cap` bytes is saved to `store` (a `Store`, a `LocalDir`, or ``None``:
    ``SPILLWAY_URL``, else ``./.outputs``) and the model gets the receipt instead — as JSON,
    escapes included, at most `cap` bytes; the `strategy` cuts its preview. One that fits goes
    through (its secrets marked). A store that is down gives a receipt that says not saved."""

    @tool_output_guardrail(name="spillway")
    async def spillway(data: Any) -> ToolGuardrailFunctionOutput:
        labels = {"tool": str(getattr(data.context, "tool_name", "tool"))[:256], "via": "openai-agents"}
        shown, changed = await asyncio.to_thread(capped, data.output, cap, strategy, store, labels)
        if not changed:
            return ToolGuardrailFunctionOutput.allow()
        return ToolGuardrailFunctionOutput.reject_content(shown, output_info={"spillway": "capped"})

    return spillway


def _turn_start(items: list[Any]) -> int:
    """Where this turn's tool results begin: after the last item that is not a tool call or
    its output (the model's last message, or the user's)."""
    start = len(items)
    while start > 0:
        kind = items[start - 1].get("type") if isinstance(items[start - 1], dict) else None
        if kind not in ("function_call", "function_call_output"):
            break
        start -= 1
    return start


def spill_filter(store: Any, budget: int = 200_000) -> Any:
    """A ``RunConfig(call_model_input_filter=…)``: before each model call, the new tool results
    of the turn (the ``function_call_output`` items after the last message) pass the per-turn
    gate — when together they are over `budget` bytes, the largest keep a head and a tail and
    a location, saved to `store`. Receipts already there are reused, not saved again."""

    async def spillway_gate(data: CallModelData[Any]) -> ModelInputData:
        items = list(data.model_data.input)
        start = _turn_start(items)
        at = [i for i in range(start, len(items)) if items[i].get("type") == "function_call_output"]
        outputs = [items[i].get("output") for i in at]
        if not at or not all(isinstance(o, str) for o in outputs):
            return data.model_data
        results: list[Any] = []
        for o in outputs:
            try:
                parsed = json.loads(o)
            except ValueError:
                parsed = None
            results.append(parsed if isinstance(parsed, dict) and "truncated" in parsed else o)
        gated = await asyncio.to_thread(gate, results, True, store, budget)
        for i, before, after in zip(at, results, gated, strict=True):
            if after != before:
                items[i] = {**items[i], "output": after if isinstance(after, str) else json.dumps(after, ensure_ascii=False)}
        return ModelInputData(input=items, instructions=data.model_data.instructions)

    return spillway_gate


def store_tools(store: Any) -> list[FunctionTool]:
    """``read``, ``grep`` and ``search`` over `store` as function tools, with the words `spillway
    mcp` gives them; always redacted (they feed a model), at most 100,000 bytes an answer."""
    tools = []
    for name, description, schema, call in store_tool_specs(store):

        async def invoke(_ctx: Any, arguments: str, _call: Any = call) -> str:
            try:
                args = json.loads(arguments or "{}")
            except ValueError as e:
                return f"error (invalid_argument): the arguments are not JSON: {e}"
            return await asyncio.to_thread(_call, args)

        tools.append(
            FunctionTool(
                name=name,
                description=description,
                params_json_schema=schema,
                on_invoke_tool=invoke,
                strict_json_schema=False,
            )
        )
    return tools
