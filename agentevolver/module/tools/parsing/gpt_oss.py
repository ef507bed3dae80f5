"""``gpt-oss``: OpenAI's harmony format (gpt-oss-20b / -120b), as verl's ``gpt-oss`` parser names it.

A harmony completion is a sequence of messages; the prompt already ends with ``<|start|>assistant``, so the
first one starts at its channel::

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

A message with a recipient (``to=functions.NAME``, in the header before or after the channel) is a tool
call whose body is the JSON arguments; ``analysis`` messages are reasoning and are dropped; the bodies of
``final`` and recipient-less ``commentary`` messages are the content. A message may end with ``<|end|>``,
``<|call|>``, ``<|return|>`` or the end of the text (the decoder may have dropped a trailing stop token).
Unlike verl's parser, a call whose arguments are not a JSON object is reported, not dropped, and a call in
the first message (no ``<|start|>`` of its own) is found too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agentevolver.module.tools.parsing.base import ParsedAction, ToolCallParser, ToolSchema, register_parser
from agentevolver.module.tools.parsing.blocks import join_content
from agentevolver.module.tools.parsing.values import json_object
from agentevolver.schema.message import ToolCall, ToolFunction

__all__ = ["GptOssParser"]

START, MESSAGE, CHANNEL = "<|start|>", "<|message|>", "<|channel|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_END = re.compile("|".join(re.escape(end) for end in _ENDS))
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")
_MARKUP = re.compile(r"<\|[a-z_]+\|>")
_HINT = ("write <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>"
         "{...JSON arguments...}<|call|>")


@register_parser("gpt-oss")
class GptOssParser(ToolCallParser):
    """Parse harmony messages: calls from messages with a recipient, content from the final channel."""

    stop_tokens = ("<|call|>",)

    def extract(self, text: str, tools: Sequence[ToolSchema] | None = None) -> ParsedAction:
        """See the module docstring; ``tools`` is not needed (arguments are JSON)."""
        if MESSAGE not in text and CHANNEL not in text:
            return ParsedAction(content=text.strip())
        pieces: list[str] = []
        action = ParsedAction()
        for number, segment in enumerate(text.split(START)):
            header, marker, rest = segment.partition(MESSAGE)
            if not marker:  # text outside any message (or a bare role name before a header)
                stray = _MARKUP.sub("", segment).strip()
                if stray and stray != "assistant":
                    pieces.append(stray)
                continue
            end = _END.search(rest)
            body, after = (rest[: end.start()], rest[end.end() :]) if end else (rest, "")
            if after.strip():
                pieces.append(_MARKUP.sub("", after).strip())
            recipient = _RECIPIENT.search(header)
            if recipient is None:
                channel = _CHANNEL.search(header)
                if channel is None or channel.group(1) != "analysis":
                    pieces.append(body.strip())
                continue
            result = self._call(recipient.group(1), body, f"harmony message {number + 1}")
            if isinstance(result, str):
                action.errors.append(result)
            else:
                action.tool_calls.append(result)
        action.content = join_content(pieces)
        return action

    @staticmethod
    def _call(recipient: str, body: str, where: str) -> ToolCall | str:
        name = recipient.removeprefix("functions.")
        if not name:
            return f"{where}: empty tool name after to=functions.; {_HINT}"
        arguments = json_object(body, f"{where} (to={recipient})", _HINT)
        if isinstance(arguments, str):
            return arguments
        return ToolCall(function=ToolFunction(name=name, arguments=arguments))
