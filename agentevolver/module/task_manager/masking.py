"""Hide the seed task's real query from the summariser (seed 000, chapter 2: "遮真 query").

The explorer acts in an instance created for a seed task, so the trajectory holds that task's query.
Shown to the summariser, it would come back as a "new" task (a restatement of the original, whose answer
the exploration may even contain): the synthetic set would leak the training set into itself instead of
widening it. So the message holding the query becomes :data:`MASK`, and every verbatim occurrence of
the query -- or of one of its longer lines, which an explorer tends to echo ("Implement reverse_words") --
anywhere else in the trajectory is replaced by :data:`MASK` too.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentevolver.module.task_manager.prompts import MASK
from agentevolver.schema import ChatMessage

__all__ = ["MASK", "MIN_FRAGMENT_CHARS", "mask_query", "query_fragments"]

#: Lines of the query at least this long are masked on their own as well (shorter ones are too generic:
#: masking "Example:" everywhere would garble the record).
MIN_FRAGMENT_CHARS = 24


def query_fragments(query: str) -> list[str]:
    """The texts to mask for ``query``: itself and its long lines, longest first."""
    fragments = {query.strip()}
    fragments.update(line.strip() for line in query.splitlines() if len(line.strip()) >= MIN_FRAGMENT_CHARS)
    return sorted((f for f in fragments if f), key=len, reverse=True)


def mask_query(messages: Sequence[ChatMessage], query: str | None, query_index: int | None) -> list[ChatMessage]:
    """A copy of ``messages`` with message ``query_index`` replaced by :data:`MASK` and the query masked
    wherever else it appears (content and tool-call arguments)."""
    fragments = query_fragments(query) if query else []

    def scrub(text: str) -> str:
        for fragment in fragments:
            text = text.replace(fragment, MASK)
        return text

    masked: list[ChatMessage] = []
    for index, message in enumerate(messages):
        if index == query_index:
            masked.append(message.model_copy(update={"content": MASK}))
            continue
        update: dict[str, object] = {"content": scrub(message.content)}
        if message.tool_calls:
            update["tool_calls"] = [
                call.model_copy(update={"function": call.function.model_copy(
                    update={"arguments": scrub(call.function.arguments)})})
                for call in message.tool_calls]
        masked.append(message.model_copy(update=update))
    return masked
