"""Transformer encoder-decoder written out (Vaswani et al., 2017, "Attention Is All You Need").

The model: its incremental decoding state, then `Transformer`, which assembles the
encoder and decoder stacks of `nmt.models.transformer_layers` (whose attention is
`nmt.models.multihead`) and implements the `nmt.models.contract.Seq2Seq` contract.

Shapes: B batch, S source length, T target length, D model width, H heads,
Dh = D / H, V vocabulary size. Masks are boolean with True = ignore
(`nmt.models.masks`), broadcastable to the scores (B, H, Tq, Tk).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from nmt.models.contract import Memory, check_attention_choice
from nmt.models.layers import Embedding, FeedForward, LearnedPositions, SinusoidalPositions
from nmt.models.multihead import KV, MultiHeadAttention
from nmt.models.transformer_layers import Decoder, DecoderLayer, Encoder, EncoderLayer


@dataclass
class TransformerState:
    """Incremental decoding state, every tensor batch-first.

    Attributes:
        self_kv: per decoder layer, self-attention keys and values: either exactly the
            t positions so far (B0, H, t, Dh), or buffers (B0, H, L, Dh) preallocated for
            L positions of which the first t are filled (see `Transformer.init_state`).
            (The cross-attention keys and values live in `Memory.extra`, see `encode`.)
        step: t, the number of tokens decoded so far (the next token's position).
        order: the rows (B,) of `self_kv` that the state's B hypotheses continue, or None
            (B = B0, in order): a reorder not yet taken, see `index_select`.
    """

    self_kv: list[KV]
    step: int
    order: Tensor | None = None

    def index_select(self, order: Tensor) -> TransformerState:
        """Keep (and repeat) hypotheses `order` (B',): caches are reordered, not recomputed.

        The caches are not copied here but by the next `decode_step`, which takes the rows as it
        extends them (`DecoderLayer.forward`, `transformer_layers._grown`: one copy of a grown cache a
        step, where a reorder and then a concatenation made two); of preallocated buffers it takes only
        the t filled positions, into new buffers of the same length whose later positions are left
        unwritten (each step writes its position before it reads it). Reorders in a row compose into one.
        """
        rows = order if self.order is None else self.order.index_select(0, order)
        return TransformerState(self_kv=self.self_kv, step=self.step, order=rows)


class Transformer(nn.Module):
    """Transformer encoder-decoder (Vaswani et al., 2017) implementing `nmt.models.contract.Seq2Seq`.

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes.
        pad_id: padding id (its embedding row is zero).
        d_model, heads, encoder_layers, decoder_layers, ff_dim: sizes.
        dropout: on embeddings plus positions and on each sub-layer output.
        attention_dropout: on attention weights.
        activation_dropout: inside the feed-forward block.
        activation: "relu" or "gelu".
        norm: "post" (the paper's) or "pre" (Xiong et al., 2020; adds a final LayerNorm to each stack).
        positions: "sinusoidal" or "learned".
        max_positions: longest source or target sequence.
        attention_impl: "manual" or "sdpa".
        attention_pack: with "sdpa", attend in rows of up to this many positions that hold
            several sentences side by side, kept apart by a block-diagonal bias (0: a sentence a
            row). Search steps attend sentence by sentence either way.
        tie_embeddings: "none"; "decoder" shares the target embedding with the
            output projection (Press & Wolf, 2017); "all" also shares it with the
            source embedding (one Parameter; needs one vocabulary).

    Attributes:
        attn_layer, attn_head: whose cross-attention `decode_step` returns: a
            decoder layer index (default -1, the last) and a head (None: the mean over heads).

    Raises:
        ValueError: an invalid size, option or combination; the message shows the values.
    """

    graph_safe = True  # its training forward never waits for the device: `train.cuda_graphs` can record it

    def __init__(
        self,
        *,
        src_vocab_size: int, tgt_vocab_size: int, pad_id: int,
        d_model: int, heads: int, encoder_layers: int, decoder_layers: int, ff_dim: int,
        dropout: float, attention_dropout: float, activation_dropout: float,
        activation: str, norm: str, positions: str, max_positions: int,
        attention_impl: str, tie_embeddings: str, attention_pack: int = 0,
    ) -> None:
        super().__init__()
        for name, value, choices in (
            ("norm", norm, ("pre", "post")),
            ("positions", positions, ("sinusoidal", "learned")),
            ("tie_embeddings", tie_embeddings, ("none", "decoder", "all")),
        ):
            if value not in choices:
                raise ValueError(f"{name} ({value!r}) must be one of {choices}")
        if tie_embeddings == "all" and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                f"tie_embeddings 'all' needs one vocabulary: src_vocab_size ({src_vocab_size}) "
                f"!= tgt_vocab_size ({tgt_vocab_size})"
            )
        if attention_pack < 0:
            raise ValueError(f"attention_pack ({attention_pack}) must be >= 0")
        if encoder_layers < 1 or decoder_layers < 1:
            raise ValueError(f"encoder_layers ({encoder_layers}), decoder_layers ({decoder_layers}) must be >= 1")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout ({dropout}) must be in [0, 1)")
        self.src_vocab_size, self.tgt_vocab_size, self.pad_id = src_vocab_size, tgt_vocab_size, pad_id
        self.attn_layer: int = -1
        self.attn_head: int | None = None
        self.name, self.max_positions, self.has_attention = "transformer", max_positions, True
        self._heads = heads
        pre_norm = norm == "pre"
        Positions = SinusoidalPositions if positions == "sinusoidal" else LearnedPositions

        def mha(*, self_attention: bool) -> MultiHeadAttention:
            return MultiHeadAttention(d_model=d_model, heads=heads, impl=attention_impl,
                                      attention_dropout=attention_dropout, self_attention=self_attention)

        def ffn() -> FeedForward:
            return FeedForward(d_model=d_model, ff_dim=ff_dim, activation=activation, activation_dropout=activation_dropout)

        common = {"dropout": dropout, "pre_norm": pre_norm}
        src_embed = Embedding(vocab_size=src_vocab_size, d_model=d_model, pad_id=pad_id)
        tgt_embed = Embedding(vocab_size=tgt_vocab_size, d_model=d_model, pad_id=pad_id)
        self.encoder = Encoder(
            embed=src_embed,
            positions=Positions(d_model=d_model, max_positions=max_positions),
            layers=[
                EncoderLayer(self_attn=mha(self_attention=True), feed_forward=ffn(), **common)
                for _ in range(encoder_layers)
            ],
            pack=attention_pack,
            **common,
        )
        self.decoder = Decoder(
            embed=tgt_embed,
            positions=Positions(d_model=d_model, max_positions=max_positions),
            layers=[
                DecoderLayer(self_attn=mha(self_attention=True), cross_attn=mha(self_attention=False),
                             feed_forward=ffn(), **common)
                for _ in range(decoder_layers)
            ],
            pack=attention_pack,
            **common,
        )
        self.output = nn.Linear(d_model, tgt_vocab_size, bias=False)
        # Untied, the output matrix is initialised like an embedding (as in fairseq).
        nn.init.normal_(self.output.weight, mean=0.0, std=d_model**-0.5)
        if tie_embeddings in ("decoder", "all"):
            self.output.weight = tgt_embed.weight
        if tie_embeddings == "all":
            src_embed.weight = tgt_embed.weight

    def forward(self, src: Tensor, src_pad_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits: src (B, S), src_pad_mask (B, S), tgt_in (B, T) -> (B, T, V)."""
        return self.decode(tgt_in, self.encode(src, src_pad_mask))

    def select_attention(self, *, layer: int = -1, head: int | None = None) -> None:
        """Return the cross-attention of decoder layer `layer` and head `head` (None: the mean over heads).

        Raises:
            ValueError: a layer or head outside the model.
        """
        check_attention_choice(layer, head, layers=len(self.decoder.layers), heads=self._heads)
        self.attn_layer, self.attn_head = layer, head

    def encode(self, src: Tensor, src_pad_mask: Tensor) -> Memory:
        """src (B, S), src_pad_mask (B, S) True at padding -> Memory with states (B, S, D).

        extra["cross_kv"] holds every decoder layer's cross-attention keys and values
        (B, H, S, Dh): they depend on the source alone, so they are computed once per
        sentence and travel with the memory, which search reorders only when sentences
        finish, never when hypotheses of one sentence change places. extra["bias"] is the
        source padding as the encoder's layers attended with it (`attention_bias`, or None on
        the manual path); the cross-attention of every decoder step reuses it.
        """
        states, bias = self.encoder(src, src_pad_mask)
        return Memory(states=states, pad_mask=src_pad_mask,
                      extra={"cross_kv": self.decoder.project_memory(states), "bias": bias})

    def decode(self, tgt_in: Tensor, memory: Memory) -> Tensor:
        """Logits of a whole target prefix, causally masked, no cache: tgt_in (B, T) -> (B, T, V)."""
        states, _, _ = self.decoder(tgt_in, memory.extra["cross_kv"], memory.pad_mask,
                                    memory_bias=memory.extra["bias"])
        return self.output(states)

    def init_state(self, memory: Memory, *, max_len: int | None = None) -> TransformerState:
        """Empty self-attention caches, one per decoder layer.

        Args:
            memory: from `encode`.
            max_len: the most positions `decode_step` will be called for. Given, each
                layer's keys and values are preallocated (B, H, max_len, Dh) and every
                step writes its position in place: one shape for the whole search, no
                reallocation. None: the caches grow by one position per step
                (concatenation; for callers that do not know the length). Either way
                the results are the same, and steps beyond max_len still work (they grow).
        """
        k, _ = memory.extra["cross_kv"][0]
        B, H, _, Dh = k.shape
        L = 0 if max_len is None else max_len
        # new_zeros takes the projections' dtype: bf16 buffers under bf16 autocast, as project_kv writes.
        return TransformerState(self_kv=[(k.new_zeros(B, H, L, Dh), k.new_zeros(B, H, L, Dh))  # (B, H, L, Dh)
                                         for _ in self.decoder.layers], step=0)

    def decode_step(
        self, tokens: Tensor, memory: Memory, state: TransformerState, *, need_attn: bool = False
    ) -> tuple[Tensor, TransformerState, Tensor | None]:
        """One new token per hypothesis at position `state.step`.

        Args:
            tokens: the previous output token of each hypothesis (B,).
            memory: from `encode`, reordered like `state`.
            state: from `init_state` or the previous step. Grown caches are not modified.
                Preallocated buffers are shared with the new state and written at position
                `state.step` only, which `state` itself never reads, so `state` stays valid;
                but two steps from one state share that position: `index_select` before
                branching (a step after it writes into copies), as search does.
            need_attn: also return cross-attention weights (see `attn_layer`, `attn_head`).

        Returns:
            Log-probabilities (B, V) in float32, the new state, and the weights (B, S) or None.
        """
        attn_layer = self.attn_layer if need_attn else None
        states, self_kv, attn = self.decoder(  # states (B, 1, D)
            tokens[:, None], memory.extra["cross_kv"], memory.pad_mask, past=state.self_kv, start=state.step,
            attn_layer=attn_layer, memory_bias=memory.extra["bias"], order=state.order,
        )
        log_probs = self.output(states[:, -1]).float().log_softmax(dim=-1)  # (B, V)
        if attn is not None:
            attn = attn[:, :, -1]  # (B, H, S)
            attn = attn.mean(dim=1) if self.attn_head is None else attn[:, self.attn_head]  # (B, S)
        new_state = TransformerState(self_kv=self_kv, step=state.step + 1)
        return log_probs, new_state, attn
