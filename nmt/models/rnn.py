"""Recurrent encoder-decoder with the classic attention family.

Shapes: B batch, S source length, T target length, E embedding width, H hidden
width (the decoder's; the encoder's summed over directions), Le/Ld encoder/decoder
layers, C context width (H for every attention built here), V vocabulary.

Parts, leaves first:
    RNNEncoder                  embeddings -> (bi)GRU/LSTM -> states, final states
    ZeroBridge, LearnedBridge   final encoder states -> initial decoder state
    CellStack                   Ld stacked GRUCell/LSTMCell: one decoder step
    FixedContext                no attention: the same source summary at every step
    SourceAttention             an `attention.Attention` over the encoder states
    BahdanauDecoder             one step: context from s_{t-1}, fed into the cell
                                (with FixedContext: Cho et al. 2014's decoder, `none`)
    LuongDecoder                one step: cell first, then context from s_t, attentional state
    RNNSeq2Seq                  the `contract.Seq2Seq` model

The encoder never reads the source lengths on the host where it can help it: a
waiting host cannot run ahead of the device, and a CUDA graph (`train.cuda_graphs`)
can hold no such read, while every replay must serve other lengths than the
recording's. A GRU runs each direction of a layer as one fused call over the padded
source, the backward direction over each sentence reversed in place
(`RNNEncoder._unpacked`). An LSTM's final cell state is not among its outputs, so it
packs the source by its lengths (one fused call), or, made graph-safe
(`RNNSeq2Seq.make_graph_safe`), steps through all S positions, both directions in
one cell call a step, holding a sentence's state where it has no token
(`RNNEncoder.stepped`).

The decoder is a stack of cells stepped by hand: attention makes every
step depend on the previous one anyway, and `decode` (teacher forcing) loops over
the very step function `decode_step` uses, so the two agree exactly. Cells also
keep the state batch-first (B, Ld, H) and inter-layer dropout explicit, where
nn.GRU on length-1 inputs would want (Ld, B, H) transposes at every step.

Since that loop runs in Python, `torch.compile` compiles the step teacher forcing
loops over, not the model (`RNNSeq2Seq.compile`): compiled whole, the loop would be
unrolled, a graph per target length.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.models.attention import Attention, build_attention
from nmt.models.contract import Memory, index_select_batch

# A GRU encoder hands cuDNN one direction of nn.GRU's weights at a time (`RNNEncoder._gru`), which cuDNN
# copies into a buffer of their own at each call: a copy of one layer's weights, small beside the layer's
# work. Its warning that the module's weights should be flattened does not apply.
warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous", category=UserWarning)


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


# --------------------------------------------------------------------------- encoder


class RNNEncoder(nn.Module):
    """Embeddings, dropout, then an Le-layer (bidirectional) GRU or LSTM.

    Each direction has H / 2 units when bidirectional, so states are H wide either way.
    Sources must be right-padded with at least one real token each. nn.GRU/nn.LSTM holds
    the parameters; how they run depends on the cell, all without the lengths on the
    host but for an eager LSTM:

    - a GRU runs each direction of a layer as one fused call over the padded source
      (`_unpacked`);
    - an LSTM runs over the source packed by its lengths (one fused call), or, with
      `stepped` set, steps through all S positions (`_step_through`): one cell call a
      step for both directions of a layer, a sentence's state changing only at its own
      tokens (the forward direction's stays after its last, the backward one's stays
      zero until its last). That costs S cell calls per layer, so only recorded updates
      step (`RNNSeq2Seq.make_graph_safe`).

    Every way gives the packed states, final states and gradients, up to rounding.

    Args:
        embedding: source embedding (passed in so it can be shared).
        cell: "gru" or "lstm".
        hidden_size: H.
        layers: Le.
        bidirectional: run a backward RNN too and concatenate.
        dropout: on embeddings and between layers.
    """

    def __init__(
        self, *, embedding: nn.Embedding, cell: str, hidden_size: int, layers: int,
        bidirectional: bool, dropout: float,
    ) -> None:  # fmt: skip
        super().__init__()
        self.embedding = embedding
        self.dropout = nn.Dropout(dropout)
        self.layers, self.directions, self.lstm = layers, 2 if bidirectional else 1, cell == "lstm"
        rnn_class = nn.LSTM if self.lstm else nn.GRU
        self.rnn = rnn_class(
            embedding.embedding_dim,
            hidden_size // self.directions,
            num_layers=layers,
            batch_first=True,
            bidirectional=bidirectional,
            dropout=dropout if layers > 1 else 0.0,
        )
        self.stepped = False

    def forward(self, src: Tensor, src_pad_mask: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """src (B, S), src_pad_mask (B, S) -> states (B, S, H) (zeros at padding),
        final h (B, Le, H), final c (B, Le, H) or None (GRU)."""
        embedded = self.dropout(self.embedding(src))  # (B, S, E)
        if not self.lstm:
            return self._unpacked(embedded, ~src_pad_mask)
        if self.stepped:
            return self._step_through(embedded, ~src_pad_mask)
        lengths = (~src_pad_mask).sum(dim=1).cpu()
        packed = pack_padded_sequence(embedded, lengths, batch_first=True, enforce_sorted=False)
        output, (h, c) = self.rnn(packed)  # final states in the original batch order
        states, _ = pad_packed_sequence(output, batch_first=True, total_length=src.size(1))
        return states, self._batch_first(h), self._batch_first(c)

    def _unpacked(self, embedded: Tensor, real: Tensor) -> tuple[Tensor, Tensor, None]:
        """`forward` for a GRU: embedded (B, S, E), real (B, S) true at tokens -> what `forward` returns.

        Each direction of a layer is one fused call over the padded source. The forward direction
        reads a sentence's tokens before its padding, so its states there are packing's. The
        backward direction reads each sentence reversed in place, its tokens last to first and
        then its padding, and its states are put back in place the same way. A GRU's output is its
        state, so the final states are the outputs of each sentence's last step. (An LSTM's final
        cell state is not among its outputs.) The padding costs its share of the fused calls.
        """
        rnn, half = self.rnn, self.rnn.hidden_size  # each direction's width
        B, S, _ = embedded.shape
        lengths = real.sum(dim=1, keepdim=True)  # (B, 1)
        positions = torch.arange(S, device=real.device)
        reverse = torch.where(real, lengths - 1 - positions, positions)  # (B, S), its own inverse
        last = (lengths - 1).unsqueeze(-1).expand(B, 1, half)  # (B, 1, H / dirs)
        start = embedded.new_zeros(1, B, half)
        x, final_h = embedded, []
        for layer in range(self.layers):
            if layer > 0:  # nn.GRU's dropout between layers
                x = F.dropout(x, rnn.dropout, self.training)
            forward = self._gru(x, start, layer, "")  # (B, S, H / dirs)
            directions, finals = [forward], [forward.gather(1, last)]
            if self.directions == 2:
                backward = _at_positions(self._gru(_at_positions(x, reverse), start, layer, "_reverse"), reverse)
                directions.append(backward)
                finals.append(backward[:, :1])  # the backward direction reads position 0 last
            x = torch.cat(directions, dim=-1)  # (B, S, H): [fwd; bwd] at each position
            final_h.append(torch.cat(finals, dim=-1))  # (B, 1, H)
        return x * real.unsqueeze(-1), torch.cat(final_h, dim=1), None  # zeros at padding, as unpacking leaves

    def _gru(self, x: Tensor, start: Tensor, layer: int, suffix: str) -> Tensor:
        """One direction (`suffix` "" or "_reverse") of `layer`, one fused call: x (B, S, I) -> states (B, S, H / dirs)."""
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        weights = [getattr(self.rnn, f"{name}_l{layer}{suffix}") for name in names]
        # gru(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        return torch.gru(x, start, weights, True, 1, 0.0, self.training, False, True)[0]

    def _step_through(self, embedded: Tensor, real: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`forward` for an LSTM by steps: embedded (B, S, E), real (B, S) true at tokens -> what `forward` returns.

        Both directions of a layer take one cell call a step (`_both_directions`): step t reads
        position t forwards and position S - 1 - t backwards, in a cell twice as wide.
        """
        rnn, both = self.rnn, self.directions == 2
        B, S, _ = embedded.shape
        half = rnn.hidden_size  # each direction's width
        holds = real.unsqueeze(-1).expand(B, S, half)  # (B, S, H / dirs)
        if both:
            holds = torch.cat([holds, holds.flip(1)], dim=-1)  # (B, S, H): the backward half read from the end
        held = holds.unbind(1)  # S of (B, H)
        x, final_h, final_c = embedded, [], []
        for layer in range(self.layers):
            if layer > 0:  # nn.LSTM's dropout between layers
                x = F.dropout(x, rnn.dropout, self.training)
            weights = self._cell_weights(layer)
            steps = torch.cat([x, x.flip(1)], dim=-1) if both else x  # (B, S, dirs * I)
            h = x.new_zeros(B, self.directions * half)
            c = torch.zeros_like(h)
            states = []
            for t, inputs in enumerate(steps.unbind(1)):  # views whose gradients come back as one stack
                new_h, new_c = torch.lstm_cell(inputs, (h, c), *weights)
                c = torch.where(held[t], new_c, c)
                h = torch.where(held[t], new_h, h)  # a sentence's state changes at its own tokens only
                states.append(h)
            x = torch.stack(states, dim=1)  # (B, S, H), the backward half from the end
            if both:
                x = torch.cat([x[..., :half], x[..., half:].flip(1)], dim=-1)  # (B, S, H): [fwd; bwd] at each position
            final_h.append(h)  # (B, H): [fwd; bwd], as `_batch_first` lays packing's out
            final_c.append(c)
        states = x * real.unsqueeze(-1)  # (B, S, H): zeros at padding, as unpacking leaves them
        return states, torch.stack(final_h, dim=1), torch.stack(final_c, dim=1)

    def _cell_weights(self, layer: int) -> list[Tensor]:
        """`layer`'s input and hidden weights and biases as one LSTM cell's: the nn.LSTM parameters
        themselves with one direction, both directions' side by side with two (`_both_directions`)."""
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        forward = [getattr(self.rnn, f"{name}_l{layer}") for name in names]
        if self.directions == 1:
            return forward
        backward = [getattr(self.rnn, f"{name}_l{layer}_reverse") for name in names]
        return [_both_directions(f, b, gates=4) for f, b in zip(forward, backward, strict=True)]

    def _batch_first(self, final: Tensor) -> Tensor:
        _, B, half = final.shape  # (Le * dirs, B, H / dirs), layer-major
        final = final.view(self.layers, self.directions, B, half)  # (Le, dirs, B, H / dirs)
        final = final.permute(2, 0, 1, 3)  # (B, Le, dirs, H / dirs)
        return final.reshape(B, self.layers, self.directions * half)  # (B, Le, H): [fwd; bwd]


def _at_positions(x: Tensor, positions: Tensor) -> Tensor:
    """x (B, S, D), positions (B, S) -> (B, S, D) whose [b, t] is x[b, positions[b, t]]."""
    return x.gather(1, positions.unsqueeze(-1).expand(-1, -1, x.size(-1)))


def _both_directions(forward: Tensor, backward: Tensor, gates: int) -> Tensor:
    """Two directions' cell weights (gates * h, n) or biases (gates * h,) as one cell's of twice the width.

    An LSTM cell acts on each hidden unit alone once its gates' inputs are summed, so one
    cell of 2h units whose weights are block-diagonal, the forward direction's units reading the
    first n inputs (and units) and the backward one's the last n, computes both directions at
    once. Gate by gate, the forward direction's h rows come first: the cell splits its rows
    into `gates` equal chunks, each then [fwd; bwd].
    """
    if forward.dim() == 1:
        return torch.cat([part for pair in zip(forward.chunk(gates), backward.chunk(gates)) for part in pair])
    rows, n = forward.shape[0] // gates, forward.shape[1]
    zeros = forward.new_zeros(rows, n)
    return torch.cat([torch.cat([torch.cat([f, zeros], dim=1), torch.cat([zeros, b], dim=1)])
                      for f, b in zip(forward.chunk(gates), backward.chunk(gates))])


# --------------------------------------------------------------------------- bridges


class ZeroBridge(nn.Module):
    """The decoder starts from zeros."""

    def __init__(self, *, decoder_layers: int, lstm: bool) -> None:
        super().__init__()
        self.decoder_layers, self.lstm = decoder_layers, lstm

    def forward(self, final_h: Tensor, final_c: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """final_h (B, Le, H) -> h0 (B, Ld, H), c0 (B, Ld, H) or None."""
        B, _, H = final_h.shape
        zeros = final_h.new_zeros(B, self.decoder_layers, H)  # (B, Ld, H)
        return zeros, zeros.clone() if self.lstm else None


class LearnedBridge(nn.Module):
    """s_0 = tanh(W_s h_enc + b): Bahdanau et al. (2015), appendix A.2.2, per layer.

    Layers are aligned from the top: decoder layer l starts from encoder layer
    max(0, Le - Ld + l), so the top decoder layer always sees the top encoder
    layer (the most abstract summary), equal depths map one to one, and extra
    lower decoder layers reuse encoder layer 0. Each decoder layer has its own
    projection; for an LSTM, c gets projections of its own from the encoder's c.
    """

    def __init__(
        self, *, encoder_layers: int, decoder_layers: int, hidden_size: int, lstm: bool
    ) -> None:
        super().__init__()
        offset, H = encoder_layers - decoder_layers, hidden_size
        self.sources = [max(0, offset + layer) for layer in range(decoder_layers)]
        self.h_proj = nn.ModuleList(nn.Linear(H, H) for _ in self.sources)
        self.c_proj = nn.ModuleList(nn.Linear(H, H) for _ in self.sources) if lstm else None

    def _project(self, projections: nn.ModuleList, final: Tensor) -> Tensor:
        layers = [torch.tanh(proj(final[:, src])) for proj, src in zip(projections, self.sources)]
        return torch.stack(layers, dim=1)  # (B, Ld, H)

    def forward(self, final_h: Tensor, final_c: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """final_h, final_c (B, Le, H) -> h0 (B, Ld, H), c0 (B, Ld, H) or None."""
        if self.c_proj is None or final_c is None:
            return self._project(self.h_proj, final_h), None
        return self._project(self.h_proj, final_h), self._project(self.c_proj, final_c)


# --------------------------------------------------------------------------- decoder parts


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
        self.dropout = nn.Dropout(dropout)

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
        return torch.stack(hs, dim=1), torch.stack(cs, dim=1) if self.lstm else None


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
        extra = memory.extra
        context, weights = self.attention.attend(
            query.unsqueeze(1), extra["attn_keys"], extra["attn_values"], memory.pad_mask
        )  # (B, 1, C), (B, 1, S)
        return context.squeeze(1), weights.squeeze(1)


class BahdanauDecoder(nn.Module):
    """Context before the cell (Bahdanau et al., 2015, eq. 4-6 and appendix A.2.2).

        c_t = attend(s_{t-1}, h)            (FixedContext: c_t = c for all t)
        s_t = cell([E y_{t-1}; c_t], s_{t-1})
        o_t = tanh(W_o [s_t; c_t; E y_{t-1}] + b_o)

    o_t is a deep output layer conditioned on all three inputs of eq. 4; tanh
    replaces the paper's maxout, a simplification.
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


class LuongDecoder(nn.Module):
    """Cell first, then attention (Luong et al., 2015, sec. 3 and 3.3).

        s_t = cell([E y_{t-1}; h~_{t-1}], s_{t-1})     (h~_{t-1} only with input feeding)
        c_t = attend(s_t, h)
        h~_t = tanh(W_c [c_t; s_t])                      (eq. 5)

    h~_t predicts y_t (eq. 6). Input feeding (sec. 3.3) tells the cell where it
    attended before; h~_0 = 0.
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


# --------------------------------------------------------------------------- model


def _decoder_step(
    decoder: BahdanauDecoder | LuongDecoder, embedded: Tensor, memory: Memory, state: RNNState
) -> tuple[Tensor, RNNState, Tensor | None]:
    """`decoder`'s step; `RNNSeq2Seq.compile` compiles this function, which takes the decoder as an
    argument, so that a copy of a compiled model (`copy.deepcopy` shares functions) steps its own."""
    return decoder(embedded, memory, state)


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


class RNNSeq2Seq(nn.Module):
    """Attentional RNN encoder-decoder implementing `contract.Seq2Seq`.

    Arguments mirror `config.RNNConfig` (defaults live there only) plus the
    vocabulary and `config.ModelConfig.tie_embeddings`: "decoder" shares the target
    embedding with the output layer (Press & Wolf, 2017), "all" the source
    embedding too (one vocabulary). Decoder outputs are H wide, so a tied model
    with H != E projects them to E (no bias) before the output layer, and its
    embeddings start from N(0, 1/E) so the first logits are O(1).

    Raises:
        ValueError: unknown cell, bridge, decoder or tying; odd H with a
            bidirectional encoder; "all" across two vocabularies; invalid attention.
    """

    compile_by_step = True  # see `compile` and `contract.Seq2Seq`
    _teacher_step = None  # the compiled decoder step, once `compile` has run
    graph_safe = False  # an LSTM's, until `make_graph_safe`: see `contract.Seq2Seq`

    def __init__(
        self, *, src_vocab_size: int, tgt_vocab_size: int, pad_id: int, cell: str, embed_dim: int,
        hidden_size: int, encoder_layers: int, decoder_layers: int, bidirectional: bool,
        dropout: float, bridge: str, decoder: str, attention: str, attention_heads: int,
        local_window: int, input_feeding: bool, tie_embeddings: str,
    ) -> None:  # fmt: skip
        super().__init__()
        if cell not in ("gru", "lstm"):
            raise ValueError(f"cell {cell!r} must be 'gru' or 'lstm'")
        if bidirectional and hidden_size % 2:
            raise ValueError(f"hidden_size ({hidden_size}) must be even when bidirectional")
        if tie_embeddings not in ("none", "decoder", "all"):
            raise ValueError(f"tie_embeddings {tie_embeddings!r} is not 'none', 'decoder' or 'all'")
        if tie_embeddings == "all" and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                f"tie_embeddings 'all' needs one vocabulary: src_vocab_size ({src_vocab_size}) "
                f"!= tgt_vocab_size ({tgt_vocab_size})"
            )
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.pad_id = pad_id
        E, H, tied, lstm = embed_dim, hidden_size, tie_embeddings != "none", cell == "lstm"
        self.graph_safe = not lstm  # a GRU encoder never reads the lengths on the host (`RNNEncoder`)

        src_embed = nn.Embedding(src_vocab_size, E, padding_idx=pad_id)
        self.encoder = RNNEncoder(
            embedding=src_embed, cell=cell, hidden_size=H, layers=encoder_layers,
            bidirectional=bidirectional, dropout=dropout,
        )  # fmt: skip
        if tie_embeddings == "all":
            self.tgt_embed = src_embed
        else:
            self.tgt_embed = nn.Embedding(tgt_vocab_size, E, padding_idx=pad_id)
        match bridge:
            case "zeros":
                self.bridge: nn.Module = ZeroBridge(decoder_layers=decoder_layers, lstm=lstm)
            case "learned":
                self.bridge = LearnedBridge(
                    encoder_layers=encoder_layers, decoder_layers=decoder_layers,
                    hidden_size=H, lstm=lstm,
                )  # fmt: skip
            case _:
                raise ValueError(f"bridge {bridge!r} must be 'zeros' or 'learned'")
        self.decoder = build_decoder(
            decoder, cell=cell, embed_dim=E, hidden_size=H, layers=decoder_layers, dropout=dropout,
            attention=attention, attention_heads=attention_heads, local_window=local_window,
            input_feeding=input_feeding,
        )  # fmt: skip
        self.name = "rnn/none" if decoder == "none" else f"rnn/{decoder}/{attention}"
        self.max_positions, self.has_attention = None, decoder != "none"
        self.dropout = nn.Dropout(dropout)
        self.pre_output = nn.Linear(H, E, bias=False) if tied and H != E else nn.Identity()
        self.output = nn.Linear(E if tied else H, tgt_vocab_size)
        if tied:
            with torch.no_grad():
                nn.init.normal_(self.tgt_embed.weight, std=E**-0.5)
                self.tgt_embed.weight[pad_id].zero_()
            self.output.weight = self.tgt_embed.weight  # (V, E), one Parameter

    def forward(self, src: Tensor, src_pad_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing: src (B, S), src_pad_mask (B, S), tgt_in (B, T) -> logits (B, T, V)."""
        return self.decode(tgt_in, self.encode(src, src_pad_mask))

    def select_attention(self, *, layer: int = -1, head: int | None = None) -> None:
        """The decoder has one attention distribution: any choice returns it."""

    def compile(self, *args, **kwargs) -> None:
        """Compile the decoder step teacher forcing loops over (`torch.compile`'s arguments), not `forward`.

        `forward` loops over target positions in Python: compiled whole, the loop is
        unrolled into one graph per target length, each compiled anew (minutes for a
        model of Multi30k's size) until dynamo's recompile limit leaves the other
        lengths uncompiled. The step is one graph for every length, or two: the first
        step's state may carry no gradient (a zero bridge, Luong's zero input feed)
        where the later ones' do. It serves `forward` and `decode`, what training runs;
        search (`decode_step`) keeps the eager step, as validation and translation run
        every model uncompiled. The encoder stays eager: it is a fused call per layer (and
        direction, for a GRU) already. Parameter names do not change.
        """
        self._teacher_step = torch.compile(_decoder_step, *args, **kwargs)  # a function, not a submodule

    def make_graph_safe(self) -> None:
        """Let `train.cuda_graphs` record this model's updates: an LSTM encoder steps through every position
        (`RNNEncoder.stepped`) instead of packing the source by lengths read on the host. The results are
        the same, up to rounding; the parameters and checkpoints too. A GRU model is graph-safe as built."""
        self.encoder.stepped = self.encoder.lstm
        self.graph_safe = True

    def encode(self, src: Tensor, src_pad_mask: Tensor) -> Memory:
        """src (B, S), src_pad_mask (B, S) -> Memory(states (B, S, H), pad_mask, extra).

        extra holds "final_h" (B, Le, H), "final_c" (B, Le, H) for an LSTM, "summary"
        (B, H) (the top layer's final state) and, with attention, the per-sentence
        "attn_keys" and "attn_values" (B, heads, S, .) from `Attention.prepare`.
        """
        states, final_h, final_c = self.encoder(src, src_pad_mask)
        extra = {"final_h": final_h, "summary": final_h[:, -1]}
        if final_c is not None:
            extra["final_c"] = final_c
        extra |= self.decoder.context.precompute(states)
        return Memory(states=states, pad_mask=src_pad_mask, extra=extra)

    def init_state(self, memory: Memory, *, max_len: int | None = None) -> RNNState:
        """The bridged decoder state before the first target token.

        `max_len` is ignored: a recurrent state has the same size at every step.
        """
        hidden, cell = self.bridge(memory.extra["final_h"], memory.extra.get("final_c"))
        return self.decoder.start(hidden, cell)

    def decode(self, tgt_in: Tensor, memory: Memory) -> Tensor:
        """tgt_in (B, T) -> logits (B, T, V), looping over the step `decode_step` uses."""
        state = self.init_state(memory)
        embedded = self.dropout(self.tgt_embed(tgt_in))  # (B, T, E)
        step = self.decoder if self._teacher_step is None else partial(self._teacher_step, self.decoder)
        outputs = []
        for inputs in embedded.unbind(1):  # views whose gradients come back as one stack, not T full-size sums
            output, state, _ = step(inputs, memory, state)
            outputs.append(output)
        return self._logits(torch.stack(outputs, dim=1))  # (B, T, V)

    def decode_step(
        self, tokens: Tensor, memory: Memory, state: RNNState, *, need_attn: bool = False
    ) -> tuple[Tensor, RNNState, Tensor | None]:
        """tokens (B,) -> float32 log-probabilities (B, V), new state, attention (B, S).

        The attention costs nothing extra, so it is returned whatever `need_attn`
        says; it is None for `decoder: none`, which has no attention weights.
        """
        output, state, attn = self.decoder(self.dropout(self.tgt_embed(tokens)), memory, state)
        return self._logits(output).float().log_softmax(dim=-1), state, attn

    def _logits(self, output: Tensor) -> Tensor:
        return self.output(self.pre_output(self.dropout(output)))  # (..., V)
