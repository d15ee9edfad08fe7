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

On CUDA the encoder never reads the source lengths on the host: a host that waits
cannot run ahead of the device, and a CUDA graph (`train.cuda_graphs`) can hold no such
read while every replay must serve other lengths than the recording's. Each direction
of a layer is one fused call over the padded source, the backward one over each
sentence reversed in place; off CUDA (on a CPU, where the lengths are) it packs
(`RNNEncoder`).

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
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.models.attention import Attention, build_attention
from nmt.models.contract import Memory, index_select_batch
from nmt.models.layers import Dropout, apply_dropout

# The encoder hands cuDNN one direction of nn.GRU/nn.LSTM's weights at a time (`RNNEncoder._run`), which cuDNN
# copies into a buffer of their own at each call: a copy of one layer's weights, small beside the layer's
# work. Its warning that the module's weights should be flattened does not apply.
warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous",
                        category=UserWarning)


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
    the parameters. Packing the source by its lengths skips the padding, but needs the
    lengths on the host: free on a CPU, where they are, but on a CUDA GPU the host would wait
    for the device at every batch, and a CUDA graph (`train.cuda_graphs`) can hold no such
    read while every replay must serve other lengths than the recording's. So on CUDA
    (`_unpacked`) each direction of a layer is one fused call of cuDNN over the padded source:

    - the forward direction reads a sentence's tokens before its padding, so its states
      there are the ones packing would give;
    - the backward direction reads each sentence reversed in place (its tokens last to
      first, then its padding), and its states are put back in place the same way;
    - the final states are the states at each sentence's last step. A GRU's state is its
      output; an LSTM's cell state is not among its outputs, and `_final_cells` rebuilds
      it from them, at the cost of three quarters of the LSTM's matrix products again.

    Off CUDA the encoder packs (`_packed`), unless `pack_off_cuda` is unset (the tests run a
    GPU's way on a CPU too). The two ways give the same numbers, up to rounding.

    An LSTM encoder returns the final cell states of `cell_layers` only, the layers its model's
    bridge reads: on CUDA each is a rebuild, which the others would cost for nothing (a learned
    bridge to one decoder layer reads the top encoder layer's, a zero bridge none).

    Args:
        embedding: source embedding (passed in so it can be shared).
        cell: "gru" or "lstm".
        hidden_size: H.
        layers: Le.
        bidirectional: run a backward RNN too and concatenate.
        dropout: on embeddings and between layers.
        cell_layers: an LSTM's layers whose final cell states `forward` returns, in this
            order (default: every layer). Ignored for a GRU.

    Raises:
        ValueError: a cell layer outside 0..Le-1, or not in increasing order.
    """

    def __init__(
        self, *, embedding: nn.Embedding, cell: str, hidden_size: int, layers: int,
        bidirectional: bool, dropout: float, cell_layers: Sequence[int] | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.embedding = embedding
        self.dropout = Dropout(dropout)
        self.layers, self.directions, self.lstm = layers, 2 if bidirectional else 1, cell == "lstm"
        self.cell_layers = tuple(range(layers)) if cell_layers is None else tuple(cell_layers)
        if list(self.cell_layers) != sorted(set(self.cell_layers) & set(range(layers))):
            raise ValueError(f"cell_layers {self.cell_layers} must be increasing layers of 0..{layers - 1}")
        rnn_class = nn.LSTM if self.lstm else nn.GRU
        self.rnn = rnn_class(
            embedding.embedding_dim,
            hidden_size // self.directions,
            num_layers=layers,
            batch_first=True,
            bidirectional=bidirectional,
            dropout=dropout if layers > 1 else 0.0,
        )
        self.pack_off_cuda = True

    def forward(self, src: Tensor, src_pad_mask: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """src (B, S), src_pad_mask (B, S) -> states (B, S, H) (zeros at padding), final h
        (B, Le, H), final c (B, Lc, H) of the Lc `cell_layers` or None (a GRU, or no cell
        layers); [fwd; bwd] halves."""
        x = self.dropout(self.embedding(src))  # (B, S, E)
        if self.pack_off_cuda and src.device.type != "cuda":
            return self._packed(x, ~src_pad_mask)
        return self._unpacked(x, ~src_pad_mask)

    def _packed(self, x: Tensor, real: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """`forward` over the source packed by its lengths: x (B, S, E), real (B, S) true at tokens."""
        packed = pack_padded_sequence(x, real.sum(dim=1).cpu(), batch_first=True, enforce_sorted=False)
        output, final = self.rnn(packed)  # final states in the original batch order
        states, _ = pad_packed_sequence(output, batch_first=True, total_length=x.size(1))
        h, c = final if self.lstm else (final, None)
        if c is None or not self.cell_layers:
            return states, self._batch_first(h), None
        return states, self._batch_first(h), self._batch_first(c)[:, list(self.cell_layers)]

    def _batch_first(self, final: Tensor) -> Tensor:
        _, B, half = final.shape  # (Le * dirs, B, H / dirs), layer-major
        final = final.view(self.layers, self.directions, B, half)  # (Le, dirs, B, H / dirs)
        final = final.permute(2, 0, 1, 3)  # (B, Le, dirs, H / dirs)
        return final.reshape(B, self.layers, self.directions * half)  # (B, Le, H): [fwd; bwd]

    def _unpacked(self, x: Tensor, real: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """`forward` with no length read on the host: x (B, S, E), real (B, S) true at tokens, in
        either direction's reading order, as each reads its tokens first."""
        B, S, _ = x.shape
        lengths = real.sum(dim=1, keepdim=True)  # (B, 1)
        positions = torch.arange(S, device=x.device)
        reverse = torch.where(real, lengths - 1 - positions, positions)  # (B, S), its own inverse
        last = (lengths - 1).unsqueeze(-1).expand(B, 1, self.rnn.hidden_size)  # (B, 1, H / dirs)
        final_h, final_c = [], []
        for layer in range(self.layers):
            if layer > 0:  # nn.GRU/nn.LSTM's dropout between layers
                x = apply_dropout(x, self.rnn.dropout, self.training)
            inputs = [x] if self.directions == 1 else [x, _at_positions(x, reverse)]  # in each one's reading order
            outputs = [self._run(xs, layer, suffix) for xs, suffix in zip(inputs, ("", "_reverse"))]
            final_h.append(torch.cat([out.gather(1, last) for out in outputs], dim=-1))  # (B, 1, H)
            if self.lstm and layer in self.cell_layers:
                final_c.append(self._final_cells(layer, inputs, outputs, real))  # (B, H)
            in_place = [outputs[0], *(_at_positions(out, reverse) for out in outputs[1:])]  # backward's put back
            x = torch.cat(in_place, dim=-1)  # (B, S, H)
        states = x * real.unsqueeze(-1)  # zeros at padding, as unpacking leaves them
        return states, torch.cat(final_h, dim=1), torch.stack(final_c, dim=1) if final_c else None

    def _weights(self, layer: int, suffix: str) -> list[Tensor]:
        """One direction's (`suffix` "" or "_reverse") parameters of `layer`: w_ih, w_hh, b_ih, b_hh."""
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        return [getattr(self.rnn, f"{name}_l{layer}{suffix}") for name in names]

    def _run(self, x: Tensor, layer: int, suffix: str) -> Tensor:
        """One direction of `layer`, one fused call from zero states: x (B, S, I) -> outputs (B, S, H / dirs)."""
        zeros = x.new_zeros(1, x.size(0), self.rnn.hidden_size)
        return _fused_layer(x, self._weights(layer, suffix), zeros, zeros if self.lstm else None, self.training)

    def _final_cells(self, layer: int, inputs: list[Tensor], outputs: list[Tensor], real: Tensor) -> Tensor:
        """An LSTM layer's cell states after each sentence's last token, (B, H), rebuilt from its outputs.

        The gates at step t are a function of x_t and h_{t-1}, both known once the fused calls
        have run: one matrix product gives every step's input, forget and candidate gates. Then
        c_t = f_t * c_{t-1} + i_t * g_t from c_{-1} = 0 sums to c_T = sum_k i_k g_k prod_{k<j<=T} f_j,
        the products taken in log space (running sums of log f, in fp64 so that the difference of
        two long sums keeps its digits): a few operations whatever the length, where stepping
        takes a multiply-add a step. Where a sentence has no token, f = 1 and i * g = 0. Those
        are the cell states the fused calls computed, as functions of the parameters too, so their
        gradients are the LSTM's.
        """
        half = self.rnn.hidden_size
        wide = torch.promote_types(outputs[0].dtype, torch.float32)  # fp32 for bf16 and fp16; fp64 stays
        log_forget, update = [], []
        for x, out, suffix in zip(inputs, outputs, ("", "_reverse")):
            w_ih, w_hh, b_ih, b_hh = (w[: 3 * half] for w in self._weights(layer, suffix))  # i, f, g (not o)
            previous = F.pad(out[:, :-1], (0, 0, 1, 0))  # (B, S, H / dirs): h_{t-1}, zeros before the first
            gates = F.linear(x, w_ih, b_ih) + F.linear(previous, w_hh, b_hh)  # (B, S, 3 H / dirs)
            i, f, g = gates.to(wide).chunk(3, dim=-1)  # the sum in fp32 at least, as fused kernels keep c
            log_forget.append(F.logsigmoid(f))
            update.append(torch.sigmoid(i) * torch.tanh(g))
        held = real.unsqueeze(-1)  # (B, S, 1)
        log_forget = torch.where(held, torch.cat(log_forget, dim=-1), 0.0)  # (B, S, H): both directions
        update = torch.where(held, torch.cat(update, dim=-1), 0.0)
        running = log_forget.double().cumsum(dim=1)  # (B, S, H): log prod_{j<=t} f_j
        decay = torch.exp(running[:, -1:] - running).to(wide)  # prod_{t<j<=T} f_j, at most 1
        return (update * decay).sum(dim=1).to(outputs[0].dtype)


def _fused_layer(x: Tensor, weights: list[Tensor], h0: Tensor, c0: Tensor | None, training: bool) -> Tensor:
    """One layer and direction of a GRU, or of an LSTM (with `c0`), as one fused call from the states h0
    (and c0), (1, B, H): x (B, T, I) -> outputs (B, T, H). `weights`: w_ih, w_hh, b_ih, b_hh."""
    # gru/lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    if c0 is not None:
        return torch.lstm(x, (h0, c0), weights, True, 1, 0.0, training, False, True)[0]
    return torch.gru(x, h0, weights, True, 1, 0.0, training, False, True)[0]


def _at_positions(x: Tensor, positions: Tensor) -> Tensor:
    """x (B, S, D), positions (B, S) -> (B, S, D) whose [b, t] is x[b, positions[b, t]]."""
    return x.gather(1, positions.unsqueeze(-1).expand(-1, -1, x.size(-1)))


# --------------------------------------------------------------------------- bridges


def bridge_sources(encoder_layers: int, decoder_layers: int) -> list[int]:
    """The encoder layer each decoder layer starts from with a learned bridge (`LearnedBridge`)."""
    return [max(0, encoder_layers - decoder_layers + layer) for layer in range(decoder_layers)]


def bridge_cell_layers(encoder_layers: int, decoder_layers: int) -> list[int]:
    """The encoder layers whose final cell states a learned bridge reads, each once, in increasing order:
    what the encoder's final c holds (`RNNEncoder.cell_layers`)."""
    return sorted(set(bridge_sources(encoder_layers, decoder_layers)))


class ZeroBridge(nn.Module):
    """The decoder starts from zeros."""

    def __init__(self, *, decoder_layers: int, lstm: bool) -> None:
        super().__init__()
        self.decoder_layers, self.lstm = decoder_layers, lstm

    def forward(self, final_h: Tensor, final_c: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """final_h (B, Le, H) -> h0 (B, Ld, H), c0 (B, Ld, H) or None; final_c is not read."""
        B, _, H = final_h.shape
        zeros = final_h.new_zeros(B, self.decoder_layers, H)  # (B, Ld, H)
        return zeros, zeros.clone() if self.lstm else None


class LearnedBridge(nn.Module):
    """s_0 = tanh(W_s h_enc + b): Bahdanau et al. (2015), appendix A.2.2, per layer.

    Layers are aligned from the top: decoder layer l starts from encoder layer
    max(0, Le - Ld + l), so the top decoder layer always sees the top encoder
    layer (the most abstract summary), equal depths map one to one, and extra
    lower decoder layers reuse encoder layer 0. Each decoder layer has its own
    projection; for an LSTM, c gets projections of its own from the encoder's c, of which
    the encoder gives the layers decoder layers start from only (`RNNEncoder.cell_layers`).
    """

    def __init__(
        self, *, encoder_layers: int, decoder_layers: int, hidden_size: int, lstm: bool
    ) -> None:
        super().__init__()
        H = hidden_size
        self.sources = bridge_sources(encoder_layers, decoder_layers)
        cell_layers = bridge_cell_layers(encoder_layers, decoder_layers)  # what the encoder's final c holds
        self.cell_sources = [cell_layers.index(src) for src in self.sources]
        self.h_proj = nn.ModuleList(nn.Linear(H, H) for _ in self.sources)
        self.c_proj = nn.ModuleList(nn.Linear(H, H) for _ in self.sources) if lstm else None

    @staticmethod
    def _project(projections: nn.ModuleList, final: Tensor, sources: list[int]) -> Tensor:
        layers = [torch.tanh(proj(final[:, src])) for proj, src in zip(projections, sources)]
        return torch.stack(layers, dim=1)  # (B, Ld, H)

    def forward(self, final_h: Tensor, final_c: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """final_h (B, Le, H), final_c (B, Lc, H) of the Lc layers decoder layers start from
        (in increasing order) or None -> h0 (B, Ld, H), c0 (B, Ld, H) or None."""
        h0 = self._project(self.h_proj, final_h, self.sources)
        if self.c_proj is None or final_c is None:
            return h0, None
        return h0, self._project(self.c_proj, final_c, self.cell_sources)


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
            x = _fused_layer(x, weights, h0, c0, self.training)
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
    graph_safe = True  # its training forward never waits for the device (`RNNEncoder`; `contract.Seq2Seq`)

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

        if bridge not in ("zeros", "learned"):
            raise ValueError(f"bridge {bridge!r} must be 'zeros' or 'learned'")
        # the encoder layers whose final cell states the bridge reads (the bridge is built after the
        # encoder, so that the parameters draw their initial values in the same order as ever)
        cell_layers = bridge_cell_layers(encoder_layers, decoder_layers) if bridge == "learned" else []
        src_embed = nn.Embedding(src_vocab_size, E, padding_idx=pad_id)
        self.encoder = RNNEncoder(
            embedding=src_embed, cell=cell, hidden_size=H, layers=encoder_layers,
            bidirectional=bidirectional, dropout=dropout, cell_layers=cell_layers,
        )  # fmt: skip
        if tie_embeddings == "all":
            self.tgt_embed = src_embed
        else:
            self.tgt_embed = nn.Embedding(tgt_vocab_size, E, padding_idx=pad_id)
        if bridge == "zeros":
            self.bridge: nn.Module = ZeroBridge(decoder_layers=decoder_layers, lstm=lstm)
        else:
            self.bridge = LearnedBridge(
                encoder_layers=encoder_layers, decoder_layers=decoder_layers, hidden_size=H, lstm=lstm,
            )  # fmt: skip
        self.decoder = build_decoder(
            decoder, cell=cell, embed_dim=E, hidden_size=H, layers=decoder_layers, dropout=dropout,
            attention=attention, attention_heads=attention_heads, local_window=local_window,
            input_feeding=input_feeding,
        )  # fmt: skip
        self.name = "rnn/none" if decoder == "none" else f"rnn/{decoder}/{attention}"
        self.max_positions, self.has_attention = None, decoder != "none"
        self.dropout = Dropout(dropout)
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
        every model uncompiled. The encoder stays eager: it is a fused call per layer and
        direction already, and so is a decoder whose steps run at once (`steps_at_once`: no
        attention, or Luong's without input feeding), which is then left uncompiled. Parameter
        names do not change.
        """
        if not self.decoder.steps_at_once:
            self._teacher_step = torch.compile(_decoder_step, *args, **kwargs)  # a function, not a submodule

    def encode(self, src: Tensor, src_pad_mask: Tensor) -> Memory:
        """src (B, S), src_pad_mask (B, S) -> Memory(states (B, S, H), pad_mask, extra).

        extra holds "final_h" (B, Le, H), for an LSTM "final_c" (B, Lc, H) of the encoder
        layers the bridge reads (`RNNEncoder.cell_layers`; absent where it reads none), "summary"
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
        """tgt_in (B, T) -> logits (B, T, V), looping over the step `decode_step` uses, or with every
        step at once where no step's input depends on an earlier one's output (`steps_at_once`)."""
        state = self.init_state(memory)
        embedded = self.dropout(self.tgt_embed(tgt_in))  # (B, T, E)
        if self.decoder.steps_at_once:  # no attention, or Luong's without input feeding
            return self._logits(self.decoder.over_time(embedded, memory, state))  # (B, T, V)
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
