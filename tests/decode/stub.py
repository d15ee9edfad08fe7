"""A model whose next-token probabilities are written by hand (fairseq's test style).

`StubModel` implements the `Seq2Seq` contract over a Python function
`probs(cond, prefix) -> list[float]` of the source's first token (`cond`, so
sentences of one batch can behave differently) and the output so far (`prefix`,
BOS excluded). Its state is the prefix fed so far, so a search that reorders the
state wrongly sees wrong distributions. Attention, when given, depends on the
token just fed: `attention[token]` over source positions, renormalised over the
unpadded ones.

Target vocabulary of the tests: 0 PAD, 1 UNK, 2 BOS, 3 EOS, 4 "a", 5 "b".
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.data.tokenizer import BOS_ID, EOS_ID
from nmt.models.contract import Memory, index_select_batch

A, B = 4, 5
V = 6

ProbFn = Callable[[int, tuple[int, ...]], Sequence[float]]


def dist(**probs: float) -> list[float]:
    """A distribution over the test vocabulary from named probabilities: dist(a=.6, eos=.4)."""
    ids = {"unk": 1, "eos": EOS_ID, "a": A, "b": B}
    out = [0.0] * V
    for name, p in probs.items():
        out[ids[name]] = p
    return out


def table(rules: dict[tuple[int, ...], list[float]], default: list[float] | None = None) -> ProbFn:
    """A ProbFn from {prefix: distribution}; unlisted prefixes get `default` (EOS for sure)."""
    fallback = default if default is not None else dist(eos=1.0)
    return lambda cond, prefix: rules.get(prefix, fallback)


def random_table(seed: int, tokens: Sequence[int] = (1, EOS_ID, A, B)) -> ProbFn:
    """A fixed random distribution for every (cond, prefix), over `tokens` only."""

    def probs(cond: int, prefix: tuple[int, ...]) -> list[float]:
        rng = random.Random(hash((seed, cond, prefix)))
        out = [0.0] * V
        for t in tokens:
            out[t] = rng.random() + 0.05
        return out

    return probs


@dataclass
class StubState:
    prefix: Tensor  # (N, t) tokens fed so far, BOS first

    def index_select(self, order: Tensor) -> StubState:
        return index_select_batch(self, order)


class StubModel:
    """The contract over a hand-written probability function.

    Attributes:
        calls: rows N of each `decode_step` / `decode` call, to see work shrink.
    """

    src_vocab_size = 16
    tgt_vocab_size = V

    def __init__(self, probs: ProbFn, *, attention: Tensor | None = None) -> None:
        self.probs = probs
        self.attention = attention  # (V, S_max) or None
        self.calls: list[int] = []

    def encode(self, src: Tensor, src_pad_mask: Tensor) -> Memory:
        states = src.float().unsqueeze(-1)  # (B, S, 1)
        return Memory(states=states, pad_mask=src_pad_mask, extra={"cond": src[:, 0].clone()})

    def init_state(self, memory: Memory, *, max_len: int | None = None) -> StubState:
        rows = memory.states.size(0)
        return StubState(prefix=torch.empty(rows, 0, dtype=torch.long, device=memory.states.device))

    def _log_probs(self, cond: Tensor, prefix: Tensor) -> Tensor:
        """cond (N,), prefix (N, t) BOS first -> (N, V), on cond's device (computed on the CPU)."""
        rows = []
        for c, p in zip(cond.tolist(), prefix.tolist(), strict=True):
            assert p[0] == BOS_ID, p
            probs = torch.tensor(self.probs(c, tuple(p[1:])), dtype=torch.float)
            rows.append((probs / probs.sum()).log())
        return torch.stack(rows).to(cond.device)

    def decode_step(self, tokens: Tensor, memory: Memory, state: StubState, *, need_attn: bool = False):
        self.calls.append(tokens.size(0))
        prefix = torch.cat([state.prefix, tokens.unsqueeze(1)], dim=1)  # (N, t + 1)
        log_probs = self._log_probs(memory.extra["cond"], prefix)
        attn = None
        if self.attention is not None and need_attn:
            S = memory.pad_mask.size(1)
            weights = self.attention[tokens, :S].masked_fill(memory.pad_mask, 0.0)  # (N, S)
            attn = weights / weights.sum(dim=1, keepdim=True)
        return log_probs, StubState(prefix=prefix), attn

    def decode(self, tgt_in: Tensor, memory: Memory) -> Tensor:
        self.calls.append(tgt_in.size(0))
        steps = [self._log_probs(memory.extra["cond"], tgt_in[:, : t + 1]) for t in range(tgt_in.size(1))]
        return torch.stack(steps, dim=1)  # (N, T, V): log-probabilities are valid logits

    def forward(self, src: Tensor, src_pad_mask: Tensor, tgt_in: Tensor) -> Tensor:
        return self.decode(tgt_in, self.encode(src, src_pad_mask))


def batch(*sources: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Right-padded source batch (B, S) and its pad mask from lists of source ids (all > 0)."""
    S = max(len(s) for s in sources)
    src = torch.zeros(len(sources), S, dtype=torch.long)
    for i, s in enumerate(sources):
        src[i, : len(s)] = torch.tensor(s)
    return src, src.eq(0)


def log(p: float) -> float:
    return math.log(p)
