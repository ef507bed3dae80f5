"""``self_clip``: full history until the window nears its limit, then an LLM archives the old turns.

Before every generation the next context is rendered as in ``linear``. When it would exceed
``clip_threshold`` of ``max_model_len`` (or of ``max_response_len`` for the response part), the turns
before the last ``keep_last_turns`` are sent to the ``context_clipper`` LLM role, which answers with a
markdown summary; the context becomes: opening messages, the summary (author ``memory``), the kept turns
(exact ids) and their observations. Later clips summarise the previous summary plus the newly archived
turns, so nothing is archived twice.

What is trained: between two clips the context only grows, so those turns share one sample exactly like
``linear``; a clip rewrites history, so the next turn starts a new sample whose prompt is the clipped
context (kept turns in it are history, not trained again). Every generation is trained once.

If the clipper fails or answers nothing, the archived turns are replaced by a one-line note instead (the
episode goes on; the failure is logged and counted in ``metrics()["clip_failures"]``).
"""

from __future__ import annotations

import logging
from typing import Any

from agentevolver.errors import ConfigError
from agentevolver.module.context_manager.base import ContextManager
from agentevolver.module.context_manager.messages import Author, ContextMessage
from agentevolver.module.context_manager.registry import register_context_manager
from agentevolver.module.context_manager.render import RenderedContext
from agentevolver.module.context_manager.text import observation_text
from agentevolver.schema.message import ChatMessage

logger = logging.getLogger(__name__)

__all__ = ["SUMMARY_HEADER", "SelfClipContextManager"]

#: First line of the archive message the model reads in place of the archived turns.
SUMMARY_HEADER = "Summary of the earlier part of this episode (archived to save context):"


@register_context_manager("self_clip")
class SelfClipContextManager(ContextManager):
    """Linear history, archived into an LLM-written summary whenever the threshold is crossed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.llm is None or not callable(getattr(self.llm, "chat", None)):
            raise ConfigError("context_template self_clip needs an LLM for the context_clipper role "
                              "(an object with chat(messages) -> result.text, e.g. LLMClient.for_role)")
        self._summary: str | None = None
        self._archived = 0  # turns[:_archived] live only in the summary

    @property
    def summary(self) -> str | None:
        """The current archive summary (None before the first clip)."""
        return self._summary

    def build_context(self) -> list[ContextMessage]:
        """Opening messages, the archive summary if any, then the turns not archived (exact ids)."""
        items = list(self.initial)
        if self._summary is not None:
            content = f"{SUMMARY_HEADER}\n\n{self._summary}"
            items.append(ContextMessage(ChatMessage(role="user", content=content), Author.MEMORY))
        for turn in self.turns[self._archived:]:
            items.append(turn.assistant)
            items += [obs for obs in turn.observations if obs.in_context]
        return items

    def next_context(self) -> RenderedContext:
        """The linear context, archived first when it crosses the threshold (at most once per step)."""
        rendered = super().next_context()
        if not self.turns or not self._over_threshold(rendered):
            return rendered
        upto = len(self.turns) - self.config.keep_last_turns
        if upto <= self._archived:
            logger.info("self_clip: context over the threshold but nothing left to archive (keep_last_turns=%d)",
                        self.config.keep_last_turns)
            return rendered
        self._summary = self._archive(self._archived, upto)
        self._archived = upto
        clipped = super().next_context()
        logger.info("self_clip: archived turns up to step %d; context %d -> %d tokens",
                    self.turns[upto - 1].assistant.step, len(rendered.ids), len(clipped.ids))
        return clipped

    def _over_threshold(self, rendered: RenderedContext) -> bool:
        """True when ``rendered`` exceeds the threshold share of the window or of the response cap."""
        share = self.config.clip_threshold
        if len(rendered.ids) > share * self.config.max_model_len:
            return True
        cap = self.config.max_response_len
        if cap is None:
            return False
        timeline = self._timelines[-1]
        extends = timeline.is_prefix_of(rendered.ids)
        response = len(rendered.ids) - len(timeline.prompt_ids) if extends else 0
        return response > share * cap

    def _archive(self, start: int, end: int) -> str:
        """Ask the clipper LLM to summarise the previous summary plus ``turns[start:end]``."""
        self._stats["clip_calls"] += 1
        try:
            reply = self.llm.chat(self._clipper_messages(start, end))
            text = (getattr(reply, "text", None) or "").strip()
        except Exception as err:  # any clipper failure degrades to a note; it never ends the episode
            logger.warning("self_clip: the context clipper failed (%s); archived turns replaced by a note", err)
            text = ""
        if not text:
            self._stats["clip_failures"] += 1
            previous = f"{self._summary}\n\n" if self._summary else ""
            text = f"{previous}({end - start} earlier steps were removed to save context.)"
        return text

    def _clipper_messages(self, start: int, end: int) -> list[dict[str, str]]:
        """The archivist's prompt: the task, the previous summary, and the turns to archive as markdown."""
        # Injected experience is left out: an archive that paraphrased it would survive stripping.
        task = "\n\n".join(m.content for m in self.initial
                           if m.role != "system" and m.author is not Author.EXPERIENCE)
        parts = [f"# Task\n{task}"]
        if self._summary:
            parts.append(f"# Summary so far\n{self._summary}")
        steps = [
            f"## Step {turn.assistant.step}\n### Agent\n{turn.assistant.content}\n"
            f"### Environment\n{observation_text(turn.observations)}"
            for turn in self.turns[start:end]
        ]
        parts.append("# Steps to archive\n" + "\n\n".join(steps))
        return [
            {"role": "system", "content": self.config.clipper_prompt},
            {"role": "user", "content": "\n\n".join(parts)},
        ]
