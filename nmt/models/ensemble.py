"""An ensemble of models that is itself a `contract.Seq2Seq`, so the search needs no change.

At every step each member predicts the next token and the ensemble takes the
arithmetic mean of their probabilities, computed in log space:

    log p(y | x, y_<t) = logsumexp_i(log p_i(y | x, y_<t)) - log N

This is fairseq's `EnsembleModel.forward_decoder` (sequence_generator.py) and
OpenNMT-py's `EnsembleGenerator` with raw probabilities. The mean of
probabilities is a normalised distribution, so ensemble scores are true
log-probabilities and compare with a single model's; an ensemble of N equal
models is the model itself. (The other common choice, the mean of
log-probabilities, is a renormalised geometric mean; it lets one confident
member veto a token.)

Members share one tokenizer, so they read the same source ids and write the
same target ids; `Translator.from_checkpoint` checks that before building one.
Returned attention is the mean of the members' attentions (members without
attention, such as an RNN with `decoder: none`, are left out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nmt.models.contract import Memory, State


@dataclass
class EnsembleState:
    """Each member's own decoder state, in member order."""

    members: list[State]

    def index_select(self, order: Tensor) -> EnsembleState:
        return EnsembleState(members=[s.index_select(order) for s in self.members])


class Ensemble(nn.Module):
    """N models over one vocabulary whose next-token probabilities are averaged.

    `Memory.extra["members"]` holds each member's `Memory`; `Memory.states` is an
    empty (B, S, 0) tensor, since members may differ in width.

    Args:
        members: at least one `Seq2Seq` model, all with the same vocabulary sizes.

    Raises:
        ValueError: no members, or vocabulary sizes that differ (the message lists them).
    """

    def __init__(self, *, members: list[nn.Module]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one model")
        sizes = [(m.src_vocab_size, m.tgt_vocab_size) for m in members]
        if len(set(sizes)) > 1:
            raise ValueError(f"ensemble members must share one vocabulary; (src, tgt) sizes are {sizes}")
        self.members = nn.ModuleList(members)
        self.src_vocab_size, self.tgt_vocab_size = sizes[0]
        self.name = f"ensemble of {len(members)} ({', '.join(m.name for m in members)})"
        limits = [m.max_positions for m in members if m.max_positions is not None]
        self.max_positions = min(limits) if limits else None
        self.has_attention = any(m.has_attention for m in members)

    def select_attention(self, *, layer: int = -1, head: int | None = None) -> None:
        """Every member returns the attention of `layer` and `head` (see `contract.Seq2Seq`)."""
        for member in self.members:
            member.select_attention(layer=layer, head=head)

    def forward(self, src: Tensor, src_pad_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Ensemble log-probabilities (B, T, V) of a teacher-forced target (they serve as logits)."""
        return self.decode(tgt_in, self.encode(src, src_pad_mask))

    def encode(self, src: Tensor, src_pad_mask: Tensor) -> Memory:
        """Every member encodes the source: src (B, S) -> Memory with one member Memory each."""
        members = [m.encode(src, src_pad_mask) for m in self.members]
        empty = members[0].states.new_zeros(*src.shape, 0)  # (B, S, 0)
        return Memory(states=empty, pad_mask=src_pad_mask, extra={"members": members})

    def decode(self, tgt_in: Tensor, memory: Memory) -> Tensor:
        """Without caches: tgt_in (B, T) -> ensemble log-probabilities (B, T, V).

        Log-probabilities are already normalised, so `log_softmax` of them (what
        the search applies to logits) leaves them unchanged.
        """
        log_probs = [m.decode(tgt_in, mem).float().log_softmax(dim=-1)
                     for m, mem in zip(self.members, memory.extra["members"])]
        return _mean_probs(log_probs)

    def init_state(self, memory: Memory, *, max_len: int | None = None) -> EnsembleState:
        """Each member's initial state; `max_len` is passed on (see `contract.Seq2Seq.init_state`)."""
        return EnsembleState(members=[m.init_state(mem, max_len=max_len)
                                      for m, mem in zip(self.members, memory.extra["members"])])

    def decode_step(
        self, tokens: Tensor, memory: Memory, state: EnsembleState, *, need_attn: bool = False
    ) -> tuple[Tensor, EnsembleState, Tensor | None]:
        """tokens (B,) -> mean-probability log-probabilities (B, V), new state, mean attention (B, S) or None."""
        log_probs, states, attns = [], [], []
        for model, mem, member_state in zip(self.members, memory.extra["members"], state.members):
            lp, new_state, attn = model.decode_step(tokens, mem, member_state, need_attn=need_attn)
            log_probs.append(lp.float())
            states.append(new_state)
            if attn is not None:
                attns.append(attn.float())
        attn = torch.stack(attns).mean(dim=0) if need_attn and attns else None  # (B, S)
        return _mean_probs(log_probs), EnsembleState(members=states), attn


def _mean_probs(log_probs: list[Tensor]) -> Tensor:
    """log(mean_i p_i) from log p_i, each (..., V): logsumexp over members minus log N."""
    if len(log_probs) == 1:
        return log_probs[0]
    return torch.logsumexp(torch.stack(log_probs), dim=0) - math.log(len(log_probs))
