"""Sampling's choice: draw the next token (for back-translation and diverse outputs).

Temperature, then top-k (Fan et al., 2018), then nucleus top-p filtering
(Holtzman et al., 2020) shape the distribution that is sampled from; the
hypothesis keeps the model's own log-probability of what was drawn, so
`Hypothesis.log_prob` means the same under every strategy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from nmt.decode.counter_random import random_seed, uniform


@dataclass(frozen=True)
class Sampling:
    """How to sample.

    Attributes:
        temperature: divides the log-probabilities; < 1 sharpens, > 1 flattens.
        top_k: sample among the k most probable tokens only; 0 disables.
        top_p: sample among the smallest set of most probable tokens whose
            probability reaches p (the nucleus); 1 disables.
        seed: the draws' seed: a line's sample is a function of the seed, the
            line's number, its log-probabilities and the output position alone
            (`sample_step`), whatever batch it is drawn in. None: a seed drawn
            from torch's global generator, once per search (per `Translator` call).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.temperature < math.inf:
            raise ValueError(f"temperature ({self.temperature}) must be a finite number > 0")
        if self.top_k < 0:
            raise ValueError(f"top_k ({self.top_k}) must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p ({self.top_p}) must be in (0, 1]")


def filter_logits(logits: Tensor, *, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Set to -inf the tokens outside the top k and outside the nucleus.

    Args:
        logits: unnormalised log-probabilities, (..., V).
        top_k: keep the k largest (ties with the k-th are kept too); 0 keeps all.
        top_p: keep the most probable tokens until their probability reaches
            top_p (the most probable token is always kept); 1 keeps all.

    Returns:
        The filtered logits, (..., V).
    """
    if 0 < top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (..., V)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # (..., V) mass of strictly better tokens
        outside_sorted = mass_before >= top_p  # (..., V), in sorted order
        outside = torch.zeros_like(outside_sorted).scatter(-1, order, outside_sorted)
        logits = logits.masked_fill(outside, float("-inf"))
    return logits


def sample_step(
    log_probs: Tensor,
    scores: Tensor,
    *,
    sampling: Sampling,
    seed: int,
    step: int = 0,
    prefix: Tensor | None = None,
    lines: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Draw each hypothesis's next token from the filtered distribution.

    The draw of a row is a pure function of (seed, its line, step) and its own
    log-probabilities (`nmt.decode.counter_random.uniform`): not of the batch it
    is in, the rows beside it or the draws before it.

    It is the inverse of the distribution function: with the tokens' filtered
    weights w_v = exp(logit_v) (the largest 1) and their running sums
    W_v = w_0 + ... + w_v, the token drawn with uniform u is the first v with
    W_v > u * W_{V-1}, which is v with probability w_v / W_{V-1} = softmax(logits)_v.
    The sums are float64, so a token's probability is off by at most V * 2**-53
    of the total, and one of weight 0 (filtered out) is never drawn. One number per
    row, where an exponential race (Gumbel-max) needs one per token: V times fewer
    hashes, which cost more than the running sum.

    Args:
        log_probs: next-token log-probabilities, (B, 1, V).
        scores: cumulative log-probabilities, (B, 1).
        sampling: temperature and filters.
        seed: the draws' seed (`make_sample_step` resolves `sampling.seed`).
        step: the output position, the same for a row in any batch.
        prefix: unused (see `nmt.decode.options.StepFn`).
        lines: the input line of each sentence, (B,) int64; None: 0 .. B-1.

    Returns:
        scores: cumulative model log-probabilities including the drawn token, (B, 1).
        tokens: the drawn tokens, (B, 1).
        origins: zeros (each hypothesis extends itself), (B, 1).
    """
    batch, beam, vocab = log_probs.shape
    if lines is None:
        lines = torch.arange(batch, device=log_probs.device)
    # Shifted by each row's best first, which the softmax ignores, so that a tiny temperature makes the best
    # token 0 and the rest -inf, where it made every value -inf and the softmax NaN.
    best = log_probs.amax(dim=-1, keepdim=True)  # (B, K, 1)
    best = best.masked_fill(best.isinf(), 0.0)  # a row of -inf stays one
    logits = filter_logits((log_probs - best) / sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    running = logits.view(batch * beam, vocab).exp().cumsum(dim=-1, dtype=torch.float64)  # (B*K, V) W_v
    u = uniform(seed, lines.repeat_interleave(beam), step)  # (B*K,)
    target = (u * running[:, -1]).unsqueeze(1)  # (B*K, 1) below the total: u < 1 - 2**-49
    # A row of weight 0 (all -inf: an empty row) finds no token; it takes the last, and stays at -inf.
    tokens = torch.searchsorted(running, target, right=True).clamp_(max=vocab - 1).view(batch, beam)  # (B, K)
    picked = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (B, K)
    return scores + picked, tokens, torch.zeros_like(tokens)


def make_sample_step(sampling: Sampling) -> Callable[..., tuple[Tensor, Tensor, Tensor]]:
    """`sample_step` bound to `sampling` and its seed; without one, to a seed drawn now from torch's
    global generator (so `torch.manual_seed` repeats it), the same for every batch the step draws."""
    seed = random_seed() if sampling.seed is None else sampling.seed
    return partial(sample_step, sampling=sampling, seed=seed)
