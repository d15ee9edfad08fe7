"""Beam search's choice of hypotheses, and the GNMT scores of finished ones.

`beam_step` is the whole of beam search's decision at one step (fairseq's
`BeamSearch.step`); the loop around it lives in `nmt.decode.search`. The
penalties follow GNMT (Wu et al., 2016, "Google's Neural Machine Translation
System", section 7):

    s(Y, X) = log P(Y | X) / lp(Y) + cp(X; Y)
    lp(Y) = ((5 + |Y|) / 6) ** alpha
    cp(X; Y) = beta * sum_i log(min(sum_j a_ij, 1.0))

where a_ij is the attention of target step j on source position i. `nmt` counts
the final EOS in |Y| and in the sum over j, as it counts EOS's log-probability
in log P(Y | X).
"""

from __future__ import annotations

import torch
from torch import Tensor

_MIN_COVERAGE = 1e-10
"""Floor on a source position's total attention, so an ignored position costs a large, finite penalty."""


def beam_step(log_probs: Tensor, scores: Tensor, *, step: int = 0,
              prefix: Tensor | None = None, lines: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Keep the K best one-token extensions of K hypotheses, per sentence.

    At the first step every row holds the same prefix; the search starts rows
    1..K-1 at -inf so that only row 0 expands (fairseq expands `beam 0` only).
    Rows at -inf (finished, or never filled) are thereby never extended.

    A row's score is one number added to each of its tokens' log-probabilities,
    so the row's K best extensions are its K most probable tokens, and the
    sentence's K best are among the K x K of its rows: a top-k over each row's
    vocabulary, then over those K x K sums. The (B, K, V) sums are never formed,
    a pass over the vocabulary less per step than summing first (what fairseq does);
    the same sums, so the same choice up to the order of exactly equal scores.

    Args:
        log_probs: next-token log-probabilities, (B, K, V).
        scores: cumulative log-probabilities of the K hypotheses, (B, K).
        step, prefix, lines: unused (see `nmt.decode.options.StepFn`).

    Returns:
        scores: cumulative log-probabilities of the K best extensions, best first, (B, K).
        tokens: the token each extension appends, (B, K).
        origins: the row in 0..K-1 each extension extends, (B, K).
    """
    batch, beam, vocab = log_probs.shape
    k = min(beam, vocab)  # each row's candidates
    row_best, row_tokens = log_probs.topk(k, dim=-1)  # (B, K, k), sorted
    candidates = (scores.unsqueeze(-1) + row_best).view(batch, beam * k)  # (B, K*k)
    top_scores, top = candidates.topk(beam, dim=1)  # (B, K), sorted
    tokens = row_tokens.view(batch, beam * k).gather(1, top)  # (B, K)
    origins = torch.div(top, k, rounding_mode="floor")
    return top_scores, tokens, origins


def length_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT length penalty ((5 + |Y|) / 6) ** alpha; 1 when alpha is 0.

    Args:
        length: hypothesis length |Y|, counting its final EOS; any shape.
        alpha: exponent; 0 ranks by raw log-probability, larger values favour
            longer outputs.
    """
    return ((5 + length) / 6) ** alpha


def coverage_penalty(attention: Tensor, src_pad_mask: Tensor, beta: float) -> Tensor:
    """GNMT coverage penalty beta * sum_i log(min(sum_j a_ij, 1)), over real source positions.

    Args:
        attention: attention of each target step (EOS included), (N, T, S).
        src_pad_mask: True at source padding, (N, S); padded positions add nothing.
        beta: weight; 0 disables.

    Returns:
        The (non-positive for beta >= 0) penalty of each hypothesis, (N,).
    """
    coverage = attention.sum(dim=1).clamp(_MIN_COVERAGE, 1.0)  # (N, S)
    log_coverage = coverage.log().masked_fill(src_pad_mask, 0.0)  # (N, S)
    return beta * log_coverage.sum(dim=1)
