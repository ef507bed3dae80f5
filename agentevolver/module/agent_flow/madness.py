"""Repetition ("madness") detection on generated token ids.

Small policies under RL drift into loops ("the the the ...", a tool call repeated until the budget runs
out). The reference system scored such episodes -1 so the policy is pushed away from them quickly (seed
000, chapter 5: ``compute_madness``). Here a generation is "mad" when it is long enough and most of its
n-grams are repeats: ``1 - distinct_ngrams / ngrams >= max_repeat_ratio``. Counting on token ids (not
text) keeps it cheap, tokenizer-independent and exactly about what the policy produced.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["is_mad", "repeat_ratio"]


def repeat_ratio(token_ids: Sequence[int], ngram_size: int) -> float:
    """Share of the ``ngram_size``-grams of ``token_ids`` that repeat an earlier one (0.0 for short input)."""
    if ngram_size < 1:
        raise ValueError(f"ngram_size must be >= 1; got {ngram_size}")
    total = len(token_ids) - ngram_size + 1
    if total <= 1:
        return 0.0
    grams = {tuple(token_ids[i : i + ngram_size]) for i in range(total)}
    return 1.0 - len(grams) / total


def is_mad(token_ids: Sequence[int], *, ngram_size: int, min_tokens: int, max_repeat_ratio: float) -> bool:
    """True when a generation of at least ``min_tokens`` tokens is mostly repeated n-grams."""
    return len(token_ids) >= min_tokens and repeat_ratio(token_ids, ngram_size) >= max_repeat_ratio
