"""The contract between models and everything that drives them (training, search).

Shape notation used across `nmt.models` and `nmt.decode`:
    B batch, S source length, T target length, D model width, H heads,
    Dh head width (D / H), V vocabulary size, K beam size.

A model never knows about search, losses or optimisers. Training calls
`forward`; search calls `encode` once, `init_state` once, then `decode_step`
once per output token, reordering `Memory` and `State` with `index_select`
when hypotheses are pruned or expanded. Every tensor carried in `Memory` and in
a model's `State` is batch-first, so one generic `index_select` serves all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
from torch import Tensor

T = TypeVar("T")


def index_select_batch(obj: T, order: Tensor) -> T:
    """Select batch rows `order` of every tensor inside `obj`.

    Works on tensors (dim 0), dataclasses, lists, tuples and dicts, recursively;
    anything else (ints, None) is returned as it is.
    """
    if isinstance(obj, Tensor):
        return obj.index_select(0, order)  # type: ignore[return-value]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: index_select_batch(getattr(obj, f.name), order) for f in dataclasses.fields(obj)}
        return dataclasses.replace(obj, **changes)  # type: ignore[return-value]
    if isinstance(obj, list):
        return [index_select_batch(x, order) for x in obj]  # type: ignore[return-value]
    if isinstance(obj, tuple):
        return tuple(index_select_batch(x, order) for x in obj)  # type: ignore[return-value]
    if isinstance(obj, dict):
        return {k: index_select_batch(v, order) for k, v in obj.items()}  # type: ignore[return-value]
    return obj


@dataclass
class Memory:
    """What the encoder hands to the decoder.

    Attributes:
        states: encoder outputs, (B, S, D).
        pad_mask: True at source padding, (B, S).
        extra: model-specific batch-first tensors computed once per sentence
            (e.g. an RNN encoder's final state, cross-attention keys and values).
    """

    states: Tensor
    pad_mask: Tensor
    extra: dict[str, Any] = field(default_factory=dict)

    def index_select(self, order: Tensor) -> Memory:
        return index_select_batch(self, order)


@runtime_checkable
class State(Protocol):
    """A decoder's incremental state: caches or recurrent hidden states, batch-first."""

    def index_select(self, order: Tensor) -> State: ...


@runtime_checkable
class Seq2Seq(Protocol):
    """What every `nmt` model provides.

    Attributes:
        src_vocab_size, tgt_vocab_size: vocabulary sizes.
        name: a short label for reports and logs ("transformer", "rnn/bahdanau/additive").
        max_positions: the longest sequence, in tokens (EOS or BOS included), the model
            reads or writes; None when any length works (recurrent models).
        has_attention: whether `decode_step` can return attention over the source.

    Training with `train.compile` compiles a model with its loss as one graph. A model whose
    `forward` loops over target positions in Python sets the class attribute
    `compile_by_step = True` and overrides `nn.Module.compile` to compile the step its loop
    calls, in place (`RNNSeq2Seq`): compiled whole, the loop would be unrolled, a graph per
    target length.

    Training with `train.cuda_graphs` records a whole update as a CUDA graph, which only a
    model whose training `forward` never waits for the device can be part of: such a model
    sets the attribute `graph_safe = True` (the Transformer; the RNNs, whose encoder runs over
    the padded source rather than packing it by lengths read on the host).
    """

    src_vocab_size: int
    tgt_vocab_size: int
    name: str
    max_positions: int | None
    has_attention: bool

    def select_attention(self, *, layer: int = -1, head: int | None = None) -> None:
        """Choose whose attention `decode_step` returns: a decoder layer and a head (None: their mean).

        Models with one attention distribution accept any choice and ignore it.

        Raises:
            ValueError: a layer or head the model does not have (the message gives the valid range).
        """
        ...

    def forward(self, src: Tensor, src_pad_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits: src (B, S), src_pad_mask (B, S), tgt_in (B, T) -> (B, T, V)."""
        ...

    def encode(self, src: Tensor, src_pad_mask: Tensor) -> Memory:
        """Encode a padded source batch once."""
        ...

    def decode(self, tgt_in: Tensor, memory: Memory) -> Tensor:
        """Logits for a whole target prefix without caches: tgt_in (B, T) -> (B, T, V)."""
        ...

    def init_state(self, memory: Memory, *, max_len: int | None = None) -> State:
        """The decoder state before the first target token.

        `max_len`, when given, is the most `decode_step` calls that will follow
        (the search knows it from its length limit), so a model may preallocate
        fixed-size caches; models whose state does not grow ignore it. Steps
        beyond it must still work.
        """
        ...

    def decode_step(
        self, tokens: Tensor, memory: Memory, state: State, *, need_attn: bool = False
    ) -> tuple[Tensor, State, Tensor | None]:
        """One step: tokens (B,) -> log-probabilities (B, V), new state, attention (B, S).

        The attention over source positions is returned when `need_attn` is true
        (models whose attention is free may always return it; otherwise None).
        The log-probabilities are a new tensor the caller owns: the search writes
        its constraints into it (banned tokens at -inf) rather than into a copy.
        """
        ...


def check_attention_choice(layer: int, head: int | None, *, layers: int, heads: int) -> None:
    """Raise ValueError unless `layer` indexes one of `layers` (negative from the end) and `head` one of `heads`."""
    if not -layers <= layer < layers:
        raise ValueError(f"attention layer ({layer}) must be in [{-layers}, {layers - 1}]")
    if head is not None and not 0 <= head < heads:
        raise ValueError(f"attention head ({head}) must be in [0, {heads - 1}] or None (mean)")


def count_parameters(model: torch.nn.Module) -> int:
    """Number of trainable parameters (shared ones counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
