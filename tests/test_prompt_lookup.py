"""Prompt-lookup drafting (agentevolver/backends/cpu/prompt_lookup.py): a row's draft is what followed the latest
earlier occurrence of its tail, the longest n-gram first, kept current as tokens are appended."""

from __future__ import annotations

import pytest

from agentevolver.backends.cpu.prompt_lookup import PromptLookup


def test_the_draft_continues_the_latest_earlier_occurrence_of_the_tail() -> None:
    lookup = PromptLookup([5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 4, 1, 2])
    # tail (1, 2): its latest completed occurrence is at 6-7, followed by 3, 7, 8, ...
    assert lookup.propose(3) == [3, 7, 8]
    lookup.extend([3])
    # tail (1, 2, 3): latest earlier occurrence 6-8, followed by 7, 8, 4 (not the first one's 9, 9)
    assert lookup.propose(4) == [7, 8, 4, 1]


def test_the_longest_ngram_wins_and_shorter_ones_are_the_fallback() -> None:
    lookup = PromptLookup([1, 2, 3, 4, 9, 2, 3, 5, 7, 2, 3], ngram_sizes=(2, 3))
    assert lookup.ngram_sizes == (3, 2)
    # (7, 2, 3) never occurred before; (2, 3) did, last at 5-6 -> 5, 7
    assert lookup.propose(2) == [5, 7]
    lookup = PromptLookup([1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3])
    assert lookup.propose(2) == [4, 9]  # (1, 2, 3) beats the more recent (2, 3)


def test_no_earlier_occurrence_gives_no_draft_and_a_draft_stops_at_the_end() -> None:
    assert PromptLookup([1, 2, 3, 4]).propose(5) == []
    assert PromptLookup([]).propose(5) == []
    assert PromptLookup([1, 2, 1, 2]).propose(5) == [1, 2]  # continues into the tail itself, then ends
    assert PromptLookup([1, 2, 1, 2]).propose(0) == []


def test_appending_one_token_at_a_time_equals_building_at_once() -> None:
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5]
    grown = PromptLookup(tokens[:3])
    for index in range(3, len(tokens)):
        grown.extend([tokens[index]])
        assert grown.propose(4) == PromptLookup(tokens[:index + 1]).propose(4)
    assert len(grown) == len(tokens)


def test_bad_ngram_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="ngram_sizes"):
        PromptLookup([1, 2], ngram_sizes=(0,))
    with pytest.raises(ValueError, match="ngram_sizes"):
        PromptLookup([1, 2], ngram_sizes=())
