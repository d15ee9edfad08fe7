"""The recurrent encoder: embeddings, then an Le-layer (bidirectional) GRU or LSTM over the source.

Shapes: B batch, S source length, E embedding width, H hidden width (summed over
directions), Le encoder layers.

On CUDA the encoder never reads the source lengths on the host: a host that waits
cannot run ahead of the device, and a CUDA graph (`train.cuda_graphs`) can hold no such
read while every replay must serve other lengths than the recording's. Each direction
of a layer is one fused call over the padded source, the backward one over each
sentence reversed in place; off CUDA (on a CPU, where the lengths are) it packs
(`RNNEncoder`). The model that uses it is `nmt.models.rnn.RNNSeq2Seq`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nmt.models.layers import Dropout, apply_dropout, fused_rnn_layer

# The encoder hands cuDNN one direction of nn.GRU/nn.LSTM's weights at a time (`RNNEncoder._run`), which cuDNN
# copies into a buffer of their own at each call: a copy of one layer's weights, small beside the layer's
# work. Its warning that the module's weights should be flattened does not apply.
warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous",
                        category=UserWarning)


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
        return fused_rnn_layer(x, self._weights(layer, suffix), zeros, zeros if self.lstm else None, self.training)

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


def _at_positions(x: Tensor, positions: Tensor) -> Tensor:
    """x (B, S, D), positions (B, S) -> (B, S, D) whose [b, t] is x[b, positions[b, t]]."""
    return x.gather(1, positions.unsqueeze(-1).expand(-1, -1, x.size(-1)))
