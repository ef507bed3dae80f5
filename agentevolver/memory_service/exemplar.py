"""Exemplars: solved episodes kept whole as worked examples, next to the LLM-distilled advice.

Why a second kind of experience: a small policy cannot use advice. With SmolLM2-135M on calc, retrieved
advice cut rollout success from 20.8% to 0% (the model continues the injected block instead of solving the
task), while in-context demonstrations - worked examples in the environment's own form - lift the same model
from ~0% to ~35% (docs/self_navigating.md). A solved past episode is such a worked example, and storing it
needs no LLM at all.

An exemplar is an ordinary ReMe task memory (so listing, dump/load, copy and export keep working and a ReMe
client sees a normal memory): ``when_to_use`` is the task's text (what retrieval compares the new task's
text with), ``content`` is the episode as readable text (:func:`render_exemplar`: what listings and a ReMe
client's ``answer`` show), and ``metadata`` holds ``kind: "exemplar"``, the episode's messages, its score and
task id. The trainer injects the *messages*, as chat turns rendered by the policy's own chat template
(:func:`agentevolver.module.exp_manager.retriever.exemplar_turns`), never the text.
Memories without ``metadata.kind`` are advice; the kinds themselves are part of the wire contract
(:mod:`agentevolver.schema.memory_wire`).

Import-light (pydantic only): tests and tools import this without torch or faiss.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agentevolver.schema.message import ChatMessage, ToolCall

__all__ = ["episode_messages", "format_exemplars", "render_exemplar"]


def episode_messages(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The part of a trajectory that makes the worked example: its task message and every turn after it.

    System messages are left out (they are the environment's, and the new episode has its own). The task is
    the last user message before the first assistant turn, so a trajectory sent as ``[system, task,
    assistant, tool, assistant]`` (ReMe's form) keeps ``[task, assistant, tool, assistant]``. A trajectory
    whose opening messages hold demonstrations must be sent without them (the trainer sends each episode
    from its task message on, :func:`agentevolver.module.exp_manager.summarizer.trajectories_from_records`).
    """
    chat = [m for m in messages if m.role != "system"]
    first_assistant = next((i for i, m in enumerate(chat) if m.role == "assistant"), len(chat))
    task = next((i for i in range(first_assistant - 1, -1, -1) if chat[i].role == "user"), 0)
    return chat[task:]


def _tool_call_text(call: ToolCall) -> str:
    """A tool call as ChatML/hermes chat templates (SmolLM2, Qwen2.5/3) show it to the model."""
    try:
        arguments: Any = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        arguments = call.function.arguments
    body = json.dumps({"name": call.function.name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return f"{text[:head]} [... {len(text) - limit} characters cut ...] {text[-(limit - head):]}"


def _turn(message: ChatMessage, max_message_chars: int) -> tuple[str, str]:
    """``(role shown, text shown)`` of one message, as the chat template renders that turn."""
    content = message.content.strip()
    if message.role == "tool":  # templates show a tool result as a user turn wrapped in <tool_response>
        return "user", f"<tool_response>\n{_cut(content, max_message_chars)}\n</tool_response>"
    parts = [_cut(content, max_message_chars)] if content else []
    if message.role == "assistant" and "<tool_call>" not in content:  # generated text already holds its calls
        parts += [_tool_call_text(call) for call in message.tool_calls or []]
    return message.role, "\n".join(parts)


def render_exemplar(messages: Sequence[ChatMessage], *, max_message_chars: int = 2000) -> str:
    """A solved episode in the form of the environment's demonstrations, as one block of readable text.

    The environments open an episode with worked examples as real chat turns (calc: user question,
    assistant ``<tool_call>``, the tool's ``<tool_response>``, assistant ``FINAL ANSWER``), and the chat
    template shows each turn as ``<|im_start|>role\\n<text><|im_end|>``. As text (a listing, a ReMe
    client's answer) turn markers cannot appear, so each turn becomes ``role: <text>`` with exactly the text
    the template shows for it: the assistant's
    generated text (its tool calls as generated, or rendered like the template when the message only has
    ``tool_calls``), tool results as ``<tool_response>`` blocks. One message longer than
    ``max_message_chars`` keeps its head and tail.
    """
    lines = []
    for message in episode_messages(messages):
        role, text = _turn(message, max_message_chars)
        if text:
            lines.append(f"{role}: {text}")
    return "\n".join(lines)


def format_exemplars(memories: Sequence[Any]) -> str:
    """Retrieved exemplars as the text to inject: their contents, most similar first, with no header.

    No "Experience 1 (applies when: ...)" framing as advice gets. This is the ``answer`` of a retrieval for
    clients that read text; the trainer reads each memory's messages instead.
    """
    return "\n\n".join(memory.content for memory in memories)
