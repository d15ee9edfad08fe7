"""The recurrent decoders with the classic attention family: one target step at a time.

Shapes: B batch, S source length, T target length, E embedding width, H hidden
width, Ld decoder layers, C context width (H for every attention built here).

Parts, leaves first:
    RNNState                    the decoder state, batch-first
    CellStack                   Ld stacked GRUCell/LSTMCell: one decoder step
    FixedContext                no attention: the same source summary at every step
    SourceAttention             an `attention.Attention` over the encoder states
    BahdanauDecoder             one step: context from s_{t-1}, fed into the cell
                                (with FixedContext: Cho et al. 2014's decoder, `none`)
    LuongDecoder                one step: cell first, then context from s_t, attentional state
    build_decoder               the decoder `RNNConfig.decoder` names

The decoder is a stack of cells stepped by hand: attention makes every
step depend on the previous one anyway, and the model's `decode` (teacher forcing)
loops over the very step function its `decode_step` uses, so the two agree exactly
(`nmt.models.rnn.RNNSeq2Seq`). Cells also keep the state batch-first (B, Ld, H) and
inter-layer dropout explicit, where nn.GRU on length-1 inputs would want (Ld, B, H)
transposes at every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nmt.models.attention import Attention, build_attention
from nmt.models.contract import Memory, index_select_batch
from nmt.models.layers import Dropout, fused_rnn_layer


@dataclass
class RNNState:
    """Decoder state, batch-first so `index_select` reorders every field.

    Attributes:
        hidden: h of every decoder layer, (B, Ld, H).
        cell: LSTM cell state c, (B, Ld, H); None for GRU.
        feed: Luong's previous attentional state h~_{t-1}, (B, H); None without input feeding.
    """

    hidden: Tensor
    cell: Tensor | None = None
    feed: Tensor | None = None

    def index_select(self, order: Tensor) -> RNNState:
        return index_select_batch(self, order)


class CellStack(nn.Module):
    """Ld stacked GRUCell or LSTMCell, dropout between layers: one time step."""

    def __init__(
        self, *, cell: str, input_size: int, hidden_size: int, layers: int, dropout: float
    ) -> None:
        super().__init__()
        self.lstm = cell == "lstm"
        cell_class = nn.LSTMCell if self.lstm else nn.GRUCell
        sizes = [input_size] + [hidden_size] * (layers - 1)
        self.cells = nn.ModuleList(cell_class(size, hidden_size) for size in sizes)
        self.dropout = Dropout(dropout)

    def forward(
        self, x: Tensor, hidden: Tensor, cell: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, I), hidden and cell (B, Ld, H) -> new hidden, new cell (None for GRU)."""
        hs, cs = [], []
        for layer, rnn in enumerate(self.cells):
            if layer > 0:
                x = self.dropout(x)
            if self.lstm:
                x, c = rnn(x, (hidden[:, layer], cell[:, layer]))  # (B, H) each
                cs.append(c)
            else:
                x = rnn(x, hidden[:, layer])  # (B, H)
            hs.append(x)
        return _layers(hs), _layers(cs) if self.lstm else None

    def over_time(self, x: Tensor, hidden: Tensor, cell: Tensor | None) -> Tensor:
        """Every step at once, where no step's input depends on an earlier step's output:
        x (B, T, I), the first hidden and cell (B, Ld, H) -> the top layer's outputs (B, T, H).

        Each layer is one fused call on its cell's own parameters (nn.GRUCell/nn.LSTMCell
        order their gates as torch.gru/torch.lstm do), so a GPU runs T steps as one kernel
        sequence instead of T launches a layer; the numbers are the steps', up to rounding.
        Dropout between layers draws its masks for all steps at once, as stepping draws them
        step by step.
        """
        for layer, rnn in enumerate(self.cells):
            if layer > 0:
                x = self.dropout(x)
            weights = [rnn.weight_ih, rnn.weight_hh, rnn.bias_ih, rnn.bias_hh]
            h0, c0 = (None if s is None else s[:, layer].unsqueeze(0).contiguous() for s in (hidden, cell))  # (1, B, H)
            x = fused_rnn_layer(x, weights, h0, c0, self.training)
        return x  # (B, T, H)


def _layers(states: list[Tensor]) -> Tensor:
    """Each layer's state (B, H) -> (B, Ld, H); one layer's as a view, since a GPU launches a copy for each
    step's stack."""
    return states[0].unsqueeze(1) if len(states) == 1 else torch.stack(states, dim=1)


class FixedContext(nn.Module):
    """No attention (`decoder: none`): every step gets the same source summary.

    The summary is the top encoder layer's final state, directions concatenated
    (Cho et al., 2014, sec. 2.2: c conditions every decoder step; Sutskever et al.,
    2014 only initialise the decoder with it, which `bridge: learned` also does).
    There are no attention weights, so it returns None rather than a made-up
    uniform distribution. It lives here, not in attention.py, because it reads
    `Memory`, not keys.
    """

    def __init__(self, *, context_dim: int) -> None:
        super().__init__()
        self.context_dim = context_dim

    def precompute(self, states: Tensor) -> dict[str, Tensor]:
        return {}

    def forward(self, query: Tensor, memory: Memory) -> tuple[Tensor, None]:
        """query (B, H) is unused -> context (B, H), None."""
        return memory.extra["summary"], None


class SourceAttention(nn.Module):
    """One query per step over the encoder states (keys = values = states)."""

    def __init__(self, *, attention: Attention) -> None:
        super().__init__()
        self.attention = attention
        self.context_dim = attention.context_dim

    def precompute(self, states: Tensor) -> dict[str, Tensor]:
        """Key and value projections, once per sentence: (B, heads, S, .) each."""
        keys, values = self.attention.prepare(states, states)
        return {"attn_keys": keys, "attn_values": values}

    def forward(self, query: Tensor, memory: Memory) -> tuple[Tensor, Tensor]:
        """query (B, Dq) -> context (B, C), weights (B, S)."""
        context, weights = self.over_time(query.unsqueeze(1), memory)  # (B, 1, C), (B, 1, S)
        return context.squeeze(1), weights.squeeze(1)

    def over_time(self, queries: Tensor, memory: Memory) -> tuple[Tensor, Tensor]:
        """queries (B, T, Dq) -> contexts (B, T, C), weights (B, T, S)."""
        extra = memory.extra
        return self.attention.attend(queries, extra["attn_keys"], extra["attn_values"], memory.pad_mask)


class BahdanauDecoder(nn.Module):
    """Context before the cell (Bahdanau et al., 2015, eq. 4-6 and appendix A.2.2).

        c_t = attend(s_{t-1}, h)            (FixedContext: c_t = c for all t)
        s_t = cell([E y_{t-1}; c_t], s_{t-1})
        o_t = tanh(W_o [s_t; c_t; E y_{t-1}] + b_o)

    o_t is a deep output layer conditioned on all three inputs of eq. 4; tanh
    replaces the paper's maxout, a simplification. With a fixed context (`decoder:
    none`) no step's input depends on an earlier step: `over_time` runs them all at once.
    """

    def __init__(
        self, *, context: FixedContext | SourceAttention, cells: CellStack, embed_dim: int,
        hidden_size: int,
    ) -> None:  # fmt: skip
        super().__init__()
        self.context, self.cells = context, cells
        self.readout = nn.Linear(hidden_size + context.context_dim + embed_dim, hidden_size)

    def start(self, hidden: Tensor, cell: Tensor | None) -> RNNState:
        return RNNState(hidden=hidden, cell=cell)

    def forward(
        self, embedded: Tensor, memory: Memory, state: RNNState
    ) -> tuple[Tensor, RNNState, Tensor | None]:
        """One step: embedded (B, E) -> output (B, H), new state, attention (B, S) or None."""
        context, attn = self.context(state.hidden[:, -1], memory)  # (B, C), (B, S)
        hidden, cell = self.cells(torch.cat([embedded, context], dim=-1), state.hidden, state.cell)
        readout_in = torch.cat([hidden[:, -1], context, embedded], dim=-1)  # (B, H + C + E)
        output = torch.tanh(self.readout(readout_in))  # (B, H)
        return output, RNNState(hidden=hidden, cell=cell), attn

    @property
    def steps_at_once(self) -> bool:
        """Whether `over_time` can run teacher forcing's steps at once: with a fixed context."""
        return isinstance(self.context, FixedContext)

    def over_time(self, embedded: Tensor, memory: Memory, state: RNNState) -> Tensor:
        """Every step of teacher forcing at once (`steps_at_once`): embedded (B, T, E) -> outputs (B, T, H)."""
        context, _ = self.context(state.hidden[:, -1], memory)  # (B, C): the same at every step
        context = context.unsqueeze(1).expand(-1, embedded.size(1), -1)  # (B, T, C)
        top = self.cells.over_time(torch.cat([embedded, context], dim=-1), state.hidden, state.cell)  # (B, T, H)
        return torch.tanh(self.readout(torch.cat([top, context, embedded], dim=-1)))  # (B, T, H)


class LuongDecoder(nn.Module):
    """Cell first, then attention (Luong et al., 2015, sec. 3 and 3.3).

        s_t = cell([E y_{t-1}; h~_{t-1}], s_{t-1})     (h~_{t-1} only with input feeding)
        c_t = attend(s_t, h)
        h~_t = tanh(W_c [c_t; s_t])                      (eq. 5)

    h~_t predicts y_t (eq. 6). Input feeding (sec. 3.3) tells the cell where it
    attended before; h~_0 = 0. Without it no step's input depends on an earlier step:
    `over_time` runs the cell over all of them at once, then attends with every query at once.
    """

    def __init__(
        self, *, context: SourceAttention, cells: CellStack, hidden_size: int, input_feeding: bool
    ) -> None:
        super().__init__()
        self.context, self.cells = context, cells
        self.hidden_size, self.input_feeding = hidden_size, input_feeding
        self.W_c = nn.Linear(context.context_dim + hidden_size, hidden_size, bias=False)

    def start(self, hidden: Tensor, cell: Tensor | None) -> RNNState:
        feed = hidden.new_zeros(hidden.size(0), self.hidden_size) if self.input_feeding else None
        return RNNState(hidden=hidden, cell=cell, feed=feed)

    def forward(
        self, embedded: Tensor, memory: Memory, state: RNNState
    ) -> tuple[Tensor, RNNState, Tensor]:
        """One step: embedded (B, E) -> output h~_t (B, H), new state, attention (B, S)."""
        x = torch.cat([embedded, state.feed], dim=-1) if state.feed is not None else embedded
        hidden, cell = self.cells(x, state.hidden, state.cell)
        top = hidden[:, -1]  # (B, H)
        context, attn = self.context(top, memory)  # (B, C), (B, S)
        output = torch.tanh(self.W_c(torch.cat([context, top], dim=-1)))  # (B, H)
        feed = output if self.input_feeding else None
        return output, RNNState(hidden=hidden, cell=cell, feed=feed), attn

    @property
    def steps_at_once(self) -> bool:
        """Whether `over_time` can run teacher forcing's steps at once: without input feeding."""
        return not self.input_feeding

    def over_time(self, embedded: Tensor, memory: Memory, state: RNNState) -> Tensor:
        """Every step of teacher forcing at once (`steps_at_once`): embedded (B, T, E) -> outputs (B, T, H)."""
        top = self.cells.over_time(embedded, state.hidden, state.cell)  # (B, T, H)
        context, _ = self.context.over_time(top, memory)  # (B, T, C)
        return torch.tanh(self.W_c(torch.cat([context, top], dim=-1)))  # (B, T, H)


def build_decoder(
    kind: str, *, cell: str, embed_dim: int, hidden_size: int, layers: int, dropout: float,
    attention: str, attention_heads: int, local_window: int, input_feeding: bool,
) -> BahdanauDecoder | LuongDecoder:  # fmt: skip
    """The decoder `kind` names: "none", "bahdanau" or "luong" (see `RNNConfig.decoder`).

    Raises:
        ValueError: an unknown kind, or an invalid attention (see `build_attention`).
    """
    E, H = embed_dim, hidden_size

    def cells(input_size: int) -> CellStack:
        return CellStack(
            cell=cell, input_size=input_size, hidden_size=H, layers=layers, dropout=dropout
        )

    def source_attention() -> SourceAttention:
        return SourceAttention(
            attention=build_attention(
                attention, query_dim=H, key_dim=H, heads=attention_heads, local_window=local_window
            )
        )

    match kind:
        case "none":
            return BahdanauDecoder(
                context=FixedContext(context_dim=H), cells=cells(E + H), embed_dim=E, hidden_size=H
            )
        case "bahdanau":
            context = source_attention()
            return BahdanauDecoder(
                context=context, cells=cells(E + context.context_dim), embed_dim=E, hidden_size=H
            )
        case "luong":
            cell_input = E + H if input_feeding else E
            return LuongDecoder(
                context=source_attention(), cells=cells(cell_input), hidden_size=H,
                input_feeding=input_feeding,
            )  # fmt: skip
        case _:
            raise ValueError(f"decoder {kind!r} must be 'none', 'bahdanau' or 'luong'")
