"""Prompt-lookup (n-gram) drafting: find the most recent earlier occurrence of
the sequence's last n tokens (longest n first) and propose the tokens that
followed it. No model, no state; vLLM's `NgramProposer` does the same."""

from __future__ import annotations

from collections.abc import Sequence


def propose_ngram(tokens: Sequence[int], num_drafts: int, max_n: int = 3,
                  min_n: int = 1) -> list[int]:
    if num_drafts <= 0:
        return []
    L = len(tokens)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = list(tokens[L - n:])
        for i in range(L - n - 1, -1, -1):          # the most recent match first
            if list(tokens[i:i + n]) == suffix:
                follow = list(tokens[i + n:i + n + num_drafts])
                if follow:
                    return follow
    return []
