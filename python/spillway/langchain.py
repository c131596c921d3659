"""LangChain integration: cap any tool's output with a receipt for the rest, and give a model
the store's readers (``read``, ``grep``, ``search``) as tools.

Needs ``langchain-core`` (``pip install './python[langchain]'``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

from . import AsyncStore, SpillwayError, Store, resolve
from ._cap import capped
from ._spillway import tool_descriptions

__all__ = ["capped_tool", "store_tools"]

def _capped(out: Any, cap: int, strategy: str, target: Any, labels: dict[str, str]) -> str:
    """What the model reads of `out`: the output itself when it fits (secrets marked), else the
    receipt, as JSON, within `cap` bytes."""
    return capped(out, cap, strategy, target, labels)[0]


class _CappedTool(BaseTool):
    """A tool whose answers stay under a cap, with a receipt for the rest, and whose arguments
    may name saved outputs (references, resolved before the tool runs)."""

    inner: BaseTool
    cap: int = 100_000
    strategy: str = "head_tail"
    target: Any = None
    input_limit: int = 10_000_000

    def _labels(self) -> dict[str, str]:
        return {"tool": self.inner.name[:256]}

    def _input(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The call's input, every reference in it replaced by the output it names."""
        kwargs.pop("run_manager", None)
        value = kwargs if kwargs else (args[0] if args else {})
        return resolve(value, limit=self.input_limit, store=self.target)

    def _run(self, *args: Any, **kwargs: Any) -> str:
        try:
            value = self._input(args, kwargs)
        except SpillwayError as e:
            return f"error ({getattr(e, 'code', 'error')}): a reference in the arguments could not be used: {e}"
        out = self.inner.invoke(value)
        return _capped(out, self.cap, self.strategy, self.target, self._labels())

    async def _arun(self, *args: Any, **kwargs: Any) -> str:
        try:
            value = await asyncio.to_thread(self._input, args, kwargs)
        except SpillwayError as e:
            return f"error ({getattr(e, 'code', 'error')}): a reference in the arguments could not be used: {e}"
        out = await self.inner.ainvoke(value)
        return await asyncio.to_thread(_capped, out, self.cap, self.strategy, self.target, self._labels())


# What a model may pass where a value is expected: a saved output, named by its digest.
_REFERENCE_SCHEMA = {
    "type": "object",
    "description": "a saved output instead of the value: {\"$spillway\": \"blake3:…\"} (a receipt's digest)",
    "properties": {"$spillway": {"type": "string"}},
    "required": ["$spillway"],
}


def _accepting_references(tool: BaseTool) -> Any:
    """`tool`'s argument schema (JSON) with each argument also taking a reference; the wrapped
    tool validates what the references resolve to against its own schema."""
    try:
        from langchain_core.utils.function_calling import convert_to_openai_tool

        params = dict(convert_to_openai_tool(tool)["function"]["parameters"])
    except Exception:  # noqa: BLE001 - a schema we cannot read stays as it is
        return tool.args_schema
    props = params.get("properties") or {}
    params["properties"] = {k: {"anyOf": [v, _REFERENCE_SCHEMA]} for k, v in props.items()}
    return params


def capped_tool(
    tool: BaseTool, cap: int = 100_000, strategy: str = "head_tail", target: Any = None, input_limit: int = 10_000_000
) -> BaseTool:
    """Wraps any LangChain tool so that what it returns to the model stays within `cap` bytes:
    an output that fits comes back as it is (secrets marked); a longer one comes back as a
    receipt — the preview `strategy` cuts (``head``, ``tail``, ``head_tail``,
    ``numbered_lines``, ``reject``) and the digest of the full output, saved to `target` (a
    `Store`, a `LocalDir`, or ``None``: ``SPILLWAY_URL`` when set, else ``./.outputs``).

    Its arguments may name saved outputs instead of holding them: ``{"$spillway": "blake3:…"}``
    (or a receipt) anywhere in them is replaced by the output's text before `tool` runs, up to
    `input_limit` bytes each (`spillway.resolve`); the model passes "the output of step 3" on
    without reading it.

    Inside deepagents, which moves tool results of more than about 80,000 characters to its
    own files, pass a lower cap (say 60,000) so that Spillway's receipt is what the model gets.
    """
    return _CappedTool(
        name=tool.name,
        description=tool.description,
        args_schema=_accepting_references(tool),
        inner=tool,
        cap=cap,
        strategy=strategy,
        target=target,
        input_limit=input_limit,
    )


def store_tools(store: Store | AsyncStore) -> list[BaseTool]:
    """The store's readers as tools for a model: ``read`` (a capped page of a saved output),
    ``grep`` (matching lines of one output) and ``search`` (matching lines across every output,
    narrowed by labels and time), with the descriptions `spillway mcp` gives them. Everything
    they show is redacted: they feed a model."""
    sync = store.store if isinstance(store, AsyncStore) else store
    described = tool_descriptions()
    tools: list[BaseTool] = []
    for name in ("read", "grep", "search"):
        description, schema = described[name]

        def call(_name: str = name, **kwargs: Any) -> str:
            return sync._tool(_name, kwargs)[0]

        async def acall(_name: str = name, **kwargs: Any) -> str:
            return (await asyncio.to_thread(sync._tool, _name, kwargs))[0]

        tools.append(
            StructuredTool.from_function(
                func=call, coroutine=acall, name=name, description=description, args_schema=schema
            )
        )
    return tools
