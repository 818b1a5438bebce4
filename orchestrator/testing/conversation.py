"""Request bodies as the scripted model's conversation: what `script.decide` reads.

A conversation is a list of chat-style dicts, `{"role", "content", "tool_calls", "tool_call_id"}`,
where role is system/user/assistant/tool, content is text or None, and tool_calls is a list of
`{"id", "name", "arguments"}`. Chat Completions `messages` and Responses `input` items both
become one, so the two APIs count turns and see tool results the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def chat_conversation(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normalise Chat Completions `messages` into the script's conversation shape."""
    conversation: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        calls = [
            {
                "id": c.get("id"),
                "name": (c.get("function") or {}).get("name"),
                "arguments": (c.get("function") or {}).get("arguments"),
            }
            for c in m.get("tool_calls") or []
        ]
        conversation.append(
            {
                "role": "system" if role in ("system", "developer") else role,
                "content": _text(m.get("content")),
                "tool_calls": calls or None,
                "tool_call_id": m.get("tool_call_id"),
            }
        )
    return conversation


def responses_conversation(items: Any, instructions: Any = None) -> list[dict[str, Any]]:
    """Normalise a Responses `input` (and `instructions`) into the script's conversation shape.

    Consecutive function_call items are one assistant turn, and so is an assistant message
    directly followed by function_call items (that is how a reply with text and calls goes back).
    """
    conversation: list[dict[str, Any]] = []
    if instructions:
        conversation.append(_entry("system", _text(instructions)))
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items or []:
        kind = item.get("type")
        if kind == "function_call":
            call = {"id": item.get("call_id"), "name": item.get("name"), "arguments": item.get("arguments")}
            last = conversation[-1] if conversation else None
            if last is not None and last["role"] == "assistant":
                last["tool_calls"] = [*(last["tool_calls"] or []), call]
            else:
                conversation.append({**_entry("assistant", None), "tool_calls": [call]})
        elif kind == "function_call_output":
            conversation.append({**_entry("tool", _text(item.get("output"))), "tool_call_id": item.get("call_id")})
        elif kind in (None, "message") and "role" in item:
            role = item["role"]
            conversation.append(
                _entry("system" if role in ("system", "developer") else role, _text(item.get("content")))
            )
    return conversation


def _entry(role: str, content: str | None) -> dict[str, Any]:
    return {"role": role, "content": content, "tool_calls": None, "tool_call_id": None}


def _text(content: Any) -> str | None:
    """Text of a content that is a string or a list of parts (text, input_text, output_text)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return str(content)


def output_format_name(body: Mapping[str, Any]) -> str | None:
    """The schema name of a structured-output request: Chat's `response_format`, Responses' `text.format`."""
    fmt = body.get("response_format") or {}
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        return str((fmt.get("json_schema") or {}).get("name"))
    text = body.get("text") or {}
    fmt = text.get("format") if isinstance(text, Mapping) else None
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        return str(fmt.get("name"))
    return None


def last_user_text(conversation: list[dict[str, Any]]) -> str:
    """The text of the conversation's last user message ("" if none)."""
    return next((str(m.get("content") or "") for m in reversed(conversation) if m.get("role") == "user"), "")


def request_conversation(api: str, body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The conversation and the function tools of a request body of `api` ("chat" or "responses")."""
    if api == "chat":
        tools = [t["function"] for t in body.get("tools") or [] if t.get("type") == "function"]
        return chat_conversation(body.get("messages") or []), tools
    tools = [t for t in body.get("tools") or [] if t.get("type") == "function"]
    return responses_conversation(body.get("input"), body.get("instructions")), tools
