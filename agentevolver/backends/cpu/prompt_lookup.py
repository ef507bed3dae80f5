"""Draft tokens for a row from its own context: the tokens that followed the last earlier occurrence of its tail.

Why: on a 2-core CPU a decode step of SmolLM2-135M is bound by reading the weights (a pass over every linear
layer took the same ~45 ms for 1 to 32 rows, docs/benchmarks.md), so checking several tokens of a row in one
forward pass costs little more than generating one. An agent's responses repeat their context: a tool call's
JSON opening, the expression copied from the question, the demonstrations' answer line. Prompt-lookup drafting
proposes, for a row whose last ``n`` tokens occurred earlier in its prompt or response, the ``k`` tokens that
followed that occurrence (the longest ``n`` of :attr:`PromptLookup.ngram_sizes` that has one). No draft model,
nothing learned; a wrong draft costs only the positions it wasted.

:class:`PromptLookup` keeps an index from each n-gram to the position after its latest occurrence, updated as
tokens are appended, so a proposal is a dictionary lookup. bench/prompt_lookup.py replays recorded episodes
through it to measure how many tokens a verifying pass would yield.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["PromptLookup"]


class PromptLookup:
    """A row's tokens and, per n-gram size, where each n-gram's latest *completed* occurrence continues.

    Args:
        tokens: the context so far (prompt, then whatever was generated or observed).
        ngram_sizes: n-gram lengths tried, longest first (a longer match is a more specific one).
    """

    def __init__(self, tokens: Iterable[int] = (), ngram_sizes: Sequence[int] = (3, 2)) -> None:
        sizes = tuple(int(n) for n in ngram_sizes)
        if not sizes or min(sizes) < 1:
            raise ValueError(f"ngram_sizes must be positive lengths; got {tuple(ngram_sizes)!r}")
        self.ngram_sizes = tuple(sorted(set(sizes), reverse=True))
        self.tokens: list[int] = []
        # n -> n-gram -> the index of the token that followed its latest occurrence
        self._next: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.ngram_sizes}
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens``; every n-gram that now has a following token points at it."""
        for token in tokens:
            position = len(self.tokens)
            for n, index in self._next.items():
                if position >= n:
                    index[tuple(self.tokens[position - n:position])] = position
            self.tokens.append(int(token))

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the context's tail (the longest
        n-gram size that has one); empty when none occurred before."""
        if k < 1:
            return []
        for n in self.ngram_sizes:
            if len(self.tokens) < n:
                continue
            start = self._next[n].get(tuple(self.tokens[-n:]))
            if start is not None:
                return self.tokens[start:start + k]
        return []

    def __len__(self) -> int:
        return len(self.tokens)
