"""What every framework adapter shows a model of one tool output: the output itself when it
fits (secrets marked), else its receipt — as JSON, escapes included, within the cap."""

from __future__ import annotations

import json
from typing import Any

from ._spillway import spill

# Room kept under the cap for the receipt's other fields (digest, hint, sizes).
RECEIPT_ROOM = 4096


def as_text(out: Any) -> str:
    """A tool's return value as the text a model would read."""
    if isinstance(out, str):
        return out
    if isinstance(out, bytes):
        return out.decode("utf-8", errors="replace")
    content = getattr(out, "content", None)
    if isinstance(content, str):
        return content
    try:
        return json.dumps(out, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(out)


def _escape_growth(text: str, cap: int) -> int:
    """How much JSON escaping adds to the parts of `text` a preview of `cap` bytes can show (its
    head and its tail): what the first cut leaves room for, so that one upload usually does."""
    window = text if len(text) <= 2 * cap else text[:cap] + text[-cap:]
    return len(json.dumps(window, ensure_ascii=False).encode()) - len(window.encode()) - 2


def capped(out: Any, cap: int, strategy: str, target: Any, labels: dict[str, str]) -> tuple[str, bool]:
    """What the model reads of `out`, and whether it differs from the output: the output itself
    when it fits (secrets marked: then it differs), else the receipt as JSON, at most `cap`
    bytes. A store that is down gives a receipt that says the output was not saved."""
    text = as_text(out)
    if len(text.encode()) <= cap:
        receipt = spill(text, target=target, strategy=strategy, cap=cap, labels=labels)
        if not receipt["truncated"]:
            return receipt["result"], bool(receipt.get("redactions"))
    # Cut once with room for the escapes: the output is uploaded once, not once per try.
    preview_cap = max(RECEIPT_ROOM, cap - RECEIPT_ROOM - _escape_growth(text, cap))
    while True:
        receipt = spill(text, target=target, strategy=strategy, cap=preview_cap, labels=labels)
        body = json.dumps(receipt, ensure_ascii=False)
        size = len(body.encode())
        if size <= cap or preview_cap <= RECEIPT_ROOM:
            return body, True
        preview_cap = max(RECEIPT_ROOM, preview_cap - (size - cap) - 256)


def store_tool_specs(store: Any) -> list[tuple[str, str, dict[str, Any], Any]]:
    """The store's readers as any framework declares a tool: `(name, description, input JSON
    schema, call)` for ``read``, ``grep`` and ``search``, with `spillway mcp`'s words; `call`
    takes the arguments (a dict) and answers the text the model reads — always redacted, and a
    store error as text the model can act on, never an exception in the agent's loop."""
    from ._spillway import SpillwayError, tool_descriptions

    sync = getattr(store, "store", store)  # an AsyncStore's client, or the Store itself
    described = tool_descriptions()
    specs = []
    for name in ("read", "grep", "search"):
        description, schema = described[name]

        def call(arguments: dict[str, Any], _name: str = name) -> str:
            try:
                return sync._tool(_name, dict(arguments or {}))[0]
            except SpillwayError as e:
                return f"error ({getattr(e, 'code', 'error')}): {e}"

        specs.append((name, description, schema, call))
    return specs
