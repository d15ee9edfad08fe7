"""Greedy search's choice: the most probable next token.

Greedy search is the search loop of `nmt.decode.search` with one hypothesis per
sentence (K = 1) and this step. It agrees with `beam_step` at K = 1 (tested),
but needs no top-k over the vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor


def greedy_step(log_probs: Tensor, scores: Tensor, *, step: int = 0,
                prefix: Tensor | None = None, lines: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Extend each hypothesis with its most probable next token.

    Args:
        log_probs: next-token log-probabilities, (B, 1, V).
        scores: cumulative log-probabilities, (B, 1).
        step, prefix, lines: unused (see `nmt.decode.options.StepFn`).

    Returns:
        scores: the extended cumulative log-probabilities, (B, 1).
        tokens: the chosen tokens, (B, 1).
        origins: zeros (each hypothesis extends itself), (B, 1).
    """
    best, tokens = log_probs.max(dim=-1)  # (B, 1)
    return scores + best, tokens, torch.zeros_like(tokens)
