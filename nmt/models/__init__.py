"""Model construction: one `match` over the architecture named in the config."""

from __future__ import annotations

from torch import nn

from nmt.config import ModelConfig
from nmt.models.contract import Memory, Seq2Seq, State, count_parameters
from nmt.models.rnn import RNNSeq2Seq
from nmt.models.transformer import Transformer

__all__ = ["Memory", "Seq2Seq", "State", "build_model", "count_parameters"]


def build_model(cfg: ModelConfig, *, src_vocab_size: int, tgt_vocab_size: int, pad_id: int) -> nn.Module:
    """The model `cfg` describes, randomly initialised."""
    vocab = {"src_vocab_size": src_vocab_size, "tgt_vocab_size": tgt_vocab_size, "pad_id": pad_id}
    match cfg.type:
        case "transformer":
            t = cfg.transformer
            return Transformer(
                **vocab,
                d_model=t.d_model,
                heads=t.heads,
                encoder_layers=t.encoder_layers,
                decoder_layers=t.decoder_layers,
                ff_dim=t.ff_dim,
                dropout=t.dropout,
                attention_dropout=t.attention_dropout,
                activation_dropout=t.activation_dropout,
                activation=t.activation,
                norm=t.norm,
                positions=t.positions,
                max_positions=t.max_positions,
                attention_impl=t.attention_impl,
                attention_pack=t.attention_pack,
                tie_embeddings=cfg.tie_embeddings,
            )
        case "rnn":
            r = cfg.rnn
            return RNNSeq2Seq(
                **vocab,
                cell=r.cell,
                embed_dim=r.embed_dim,
                hidden_size=r.hidden_size,
                encoder_layers=r.encoder_layers,
                decoder_layers=r.decoder_layers,
                bidirectional=r.bidirectional,
                dropout=r.dropout,
                bridge=r.bridge,
                decoder=r.decoder,
                attention=r.attention,
                attention_heads=r.attention_heads,
                local_window=r.local_window,
                input_feeding=r.input_feeding,
                tie_embeddings=cfg.tie_embeddings,
            )
        case _:
            raise ValueError(f"model.type {cfg.type!r} is not 'transformer' or 'rnn'")
