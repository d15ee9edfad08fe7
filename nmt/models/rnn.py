"""Recurrent encoder-decoder with the classic attention family: the model.

Shapes: B batch, S source length, T target length, E embedding width, H hidden
width (the decoder's; the encoder's summed over directions), Le/Ld encoder/decoder
layers, V vocabulary.

Parts, leaves first:
    RNNEncoder                  embeddings -> (bi)GRU/LSTM -> states, final states (`rnn_encoder`)
    ZeroBridge, LearnedBridge   final encoder states -> initial decoder state (here)
    BahdanauDecoder,            one decoder step over the encoder states: its cells and
      LuongDecoder              attention (`rnn_decoder`, built by `build_decoder`)
    RNNSeq2Seq                  the `contract.Seq2Seq` model (here)

Since the decoder steps in a Python loop, `torch.compile` compiles the step teacher
forcing loops over, not the model (`RNNSeq2Seq.compile`): compiled whole, the loop
would be unrolled, a graph per target length.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn

from nmt.models.contract import Memory
from nmt.models.layers import Dropout
from nmt.models.rnn_decoder import BahdanauDecoder, LuongDecoder, RNNState, build_decoder
from nmt.models.rnn_encoder import RNNEncoder

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


# --------------------------------------------------------------------------- model


def _decoder_step(
    decoder: BahdanauDecoder | LuongDecoder, embedded: Tensor, memory: Memory, state: RNNState
) -> tuple[Tensor, RNNState, Tensor | None]:
    """`decoder`'s step; `RNNSeq2Seq.compile` compiles this function, which takes the decoder as an
    argument, so that a copy of a compiled model (`copy.deepcopy` shares functions) steps its own."""
    return decoder(embedded, memory, state)


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
