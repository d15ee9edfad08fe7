"""The config schema: one dataclass per YAML section.

Every default lives here and nowhere else. Each field is documented by the string
right under it (`nmt.config.reference` turns those into the README's table);
`__post_init__` checks values that a type alone cannot.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class CorpusConfig:
    """Where one split of a parallel corpus comes from."""

    kind: Literal["text", "tsv", "jsonl", "parquet", "disk", "hf"] = "text"
    """`text`: two plain-text files PATH.SRC and PATH.TGT (`.gz` allowed); `tsv`, `jsonl`, `parquet`: one file with named columns; `disk`: a dataset saved with `save_to_disk`; `hf`: a Hugging Face hub dataset."""
    path: str = ""
    """File, prefix, folder or hub name (see `kind`). `$VAR`, `${VAR:-default}` and `~` are expanded; relative paths are relative to the working directory."""
    src_field: str | None = None
    """Column holding the source sentence; default: the source language code, or `translation.<lang>`."""
    tgt_field: str | None = None
    """Column holding the target sentence; default: the target language code, or `translation.<lang>`."""
    hf_config: str | None = None
    """Hub dataset configuration name (`kind: hf`), e.g. `de-en` for wmt14."""
    split: str | None = None
    """Split to read from a hub dataset or a saved DatasetDict, e.g. `validation`."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("path: must name a file, prefix, folder or hub dataset")
        self.path = expand_vars(self.path)
        if self.kind == "tsv" and (self.src_field is None) != (self.tgt_field is None):
            raise ValueError("src_field and tgt_field: give both or neither")


@dataclass
class DataConfig:
    """The parallel corpus and its cleaning."""

    src_lang: str = "de"
    """Source language code: the suffix of text files and the default column name."""
    tgt_lang: str = "en"
    """Target language code."""
    train: CorpusConfig | None = None
    """Training split (required)."""
    valid: CorpusConfig | None = None
    """Validation split (required): loss, perplexity and BLEU during training."""
    test: dict[str, CorpusConfig] = field(default_factory=dict)
    """Named test sets for `nmt eval --split NAME` (`--split test` scores all of them)."""
    max_len: int = 100
    """Training pairs with more subword tokens than this on either side are dropped."""
    max_ratio: float = 3.0
    """Training pairs whose token-length ratio (longer/shorter) exceeds this are dropped; 0 disables."""

    def __post_init__(self) -> None:
        if self.max_len < 1:
            raise ValueError(f"max_len ({self.max_len}) must be at least 1")
        if self.max_ratio < 0:
            raise ValueError(f"max_ratio ({self.max_ratio}) must be >= 0 (0 disables the filter)")
        if self.src_lang == self.tgt_lang:
            raise ValueError(f"src_lang and tgt_lang are both {self.src_lang!r}")


@dataclass
class TokenizerConfig:
    """sentencepiece subword model, trained once on the training split and kept in the run directory."""

    type: Literal["bpe", "unigram"] = "bpe"
    """sentencepiece model type."""
    vocab_size: int = 8000
    """Vocabulary size (per side when `joint` is false), special symbols included."""
    joint: bool = True
    """One vocabulary for both languages (needed for `model.tie_embeddings: all`)."""
    character_coverage: float = 1.0
    """Share of characters covered by the vocabulary; rarer ones map to <unk>."""
    max_sentences: int = 1_000_000
    """At most this many sentences (per side) are sampled to train the tokenizer."""

    def __post_init__(self) -> None:
        if self.vocab_size < 8:
            raise ValueError(f"vocab_size ({self.vocab_size}) must be at least 8")
        if not 0.0 < self.character_coverage <= 1.0:
            raise ValueError(f"character_coverage ({self.character_coverage}) must be in (0, 1]")


@dataclass
class TransformerConfig:
    """Transformer encoder-decoder (Vaswani et al., 2017)."""

    d_model: int = 512
    """Model width."""
    heads: int = 8
    """Attention heads; must divide `d_model`."""
    encoder_layers: int = 6
    """Encoder layers."""
    decoder_layers: int = 6
    """Decoder layers."""
    ff_dim: int = 2048
    """Hidden width of the position-wise feed-forward block."""
    dropout: float = 0.1
    """Dropout on embeddings and on each sub-layer's output."""
    attention_dropout: float = 0.0
    """Dropout on attention weights."""
    activation_dropout: float = 0.0
    """Dropout inside the feed-forward block."""
    activation: Literal["relu", "gelu"] = "relu"
    """Feed-forward activation."""
    norm: Literal["pre", "post"] = "pre"
    """Layer norm before each sub-layer (pre, stabler) or after the residual sum (post, the paper's)."""
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"
    """Positional encoding."""
    max_positions: int = 1024
    """Longest sequence the positional encoding covers."""
    attention_impl: Literal["manual", "sdpa"] = "sdpa"
    """`manual`: attention written out; `sdpa`: torch's fused scaled_dot_product_attention (same maths)."""

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        for name in ("encoder_layers", "decoder_layers", "ff_dim", "max_positions"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be at least 1")
        _check_dropout(self, "dropout", "attention_dropout", "activation_dropout")


@dataclass
class RNNConfig:
    """Recurrent encoder-decoder with the classic attention family."""

    cell: Literal["gru", "lstm"] = "gru"
    """Recurrent cell."""
    embed_dim: int = 256
    """Embedding width."""
    hidden_size: int = 512
    """Hidden state width of the decoder (and of the encoder, summed over directions)."""
    encoder_layers: int = 1
    """Encoder layers."""
    decoder_layers: int = 1
    """Decoder layers."""
    bidirectional: bool = True
    """Bidirectional encoder."""
    dropout: float = 0.2
    """Dropout on embeddings, between layers and before the output layer."""
    bridge: Literal["zeros", "learned"] = "learned"
    """Decoder initial state: zeros, or a learned projection of the final encoder state."""
    decoder: Literal["none", "bahdanau", "luong"] = "luong"
    """`none`: fixed context vector fed to every step; `bahdanau`: attention from the previous state feeds the cell; `luong`: attention after the cell, tanh(W[c; s]) predicts."""
    attention: Literal["dot", "scaled_dot", "general", "additive", "cosine", "qkv", "multihead"] = "general"
    """Score function (ignored by `decoder: none`)."""
    attention_heads: int = 4
    """Heads of the `multihead` score."""
    local_window: int = 0
    """Luong's local-p attention: half-width D of the Gaussian window; 0 means global attention."""
    input_feeding: bool = True
    """Luong decoder: feed the previous attentional state into the cell."""

    def __post_init__(self) -> None:
        for name in ("embed_dim", "hidden_size", "encoder_layers", "decoder_layers", "attention_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be at least 1")
        if self.local_window < 0:
            raise ValueError(f"local_window ({self.local_window}) must be >= 0")
        if self.bidirectional and self.hidden_size % 2:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be even for a bidirectional encoder")
        _check_dropout(self, "dropout")


@dataclass
class ModelConfig:
    """Which architecture, and its sizes."""

    type: Literal["transformer", "rnn"] = "transformer"
    """Architecture; the matching sub-section below is used."""
    tie_embeddings: Literal["none", "decoder", "all"] = "decoder"
    """Share the target embedding with the output layer (`decoder`), and with the source embedding too (`all`, needs `tokenizer.joint`)."""
    transformer: TransformerConfig = field(default_factory=TransformerConfig)
    """Transformer sizes (`type: transformer`)."""
    rnn: RNNConfig = field(default_factory=RNNConfig)
    """RNN sizes (`type: rnn`)."""


@dataclass
class TrainConfig:
    """Optimisation, validation, checkpointing and the hardware it runs on."""

    seed: int = 1234
    """Seed for every random generator (reproducible runs; rank r of a distributed run adds r for dropout)."""
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    """`auto` picks CUDA, then MPS, then CPU. Under torchrun each process takes the GPU of its LOCAL_RANK."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Autocast precision; fp16 adds a gradient scaler. On CPU prefer bf16: fp16 runs there but is slow."""
    compile: bool = False
    """Compile the model and the loss with `torch.compile` (pays off on GPUs in long runs; the first steps are slow while it compiles); where compiling fails, training goes on uncompiled with a warning."""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    """`torch.compile` mode with `compile: true`: `reduce-overhead` adds CUDA graphs (one per batch shape), the `max-autotune` modes search kernel configurations (long first compile)."""
    pad_to_multiple: int = 0
    """Pad batch lengths (source and target) to a multiple of this, so kernels and compiled graphs see few distinct shapes (tensor cores want multiples of 8); 0: 8 on CUDA, 1 (no extra padding) elsewhere."""
    max_tokens: int = 4096
    """Token budget of one batch (padding included, the longer side counted), per process."""
    accumulate: int = 1
    """Batches whose gradients are summed before one update; an update sees up to `max_tokens * accumulate * processes` tokens."""
    num_workers: int = 0
    """Background processes that collate batches (0: the training process does it); on CUDA batches are pinned and copied asynchronously."""
    max_steps: int = 100_000
    """Stop after this many updates (0: no limit)."""
    max_epochs: int = 0
    """Stop after this many epochs (0: no limit)."""
    max_time: float = 0.0
    """Stop after this many seconds of training (0: no limit); validation and a checkpoint follow."""
    optimizer: Literal["adam", "adamw"] = "adam"
    """Optimizer (fused kernels where torch has them: CUDA, and CPU in recent versions)."""
    lr: float = 5e-4
    """Peak learning rate."""
    betas: tuple[float, float] = (0.9, 0.98)
    """Adam betas."""
    eps: float = 1e-9
    """Adam epsilon."""
    weight_decay: float = 0.0
    """Weight decay (decoupled with adamw)."""
    schedule: Literal["inverse_sqrt", "cosine", "linear", "constant", "plateau"] = "inverse_sqrt"
    """Learning-rate schedule after linear warm-up; cosine and linear decay to 0 at `max_steps`; plateau multiplies the rate by `plateau_factor` when `early_stop_metric` stops improving."""
    warmup_steps: int = 4000
    """Linear warm-up steps."""
    plateau_factor: float = 0.5
    """`schedule: plateau`: factor applied to the learning rate at each plateau."""
    plateau_patience: int = 2
    """`schedule: plateau`: validations without improvement tolerated before the rate is lowered."""
    label_smoothing: float = 0.1
    """Label smoothing of the cross-entropy."""
    clip_norm: float = 1.0
    """Gradient norm clipping (0 disables)."""
    max_bad_steps: int = 10
    """Updates with a non-finite loss or gradient are skipped with a warning; this many in a row stop the run with an error (0: never stop)."""
    log_every: int = 100
    """Steps between log lines in `metrics.jsonl` (and TensorBoard)."""
    tensorboard: bool = True
    """Also write TensorBoard event files to `run_dir/tensorboard` when the `tensorboard` package is installed."""
    valid_every: int = 1000
    """Steps between validations (each writes a checkpoint); training also validates once when it ends."""
    valid_bleu: bool = True
    """Compute greedy BLEU on the validation set at each validation."""
    valid_max_sentences: int = 0
    """Decode at most this many validation sentences for BLEU (0: all)."""
    early_stop_metric: Literal["bleu", "loss"] = "bleu"
    """Metric that picks the best checkpoint, drives early stopping and the plateau schedule."""
    patience: int = 0
    """Stop after this many validations without improvement (0: never)."""
    save_every: int = 0
    """Steps between extra checkpoints written without validation, for frequent resume points (0: only at validation)."""
    keep_last: int = 2
    """Periodic checkpoints kept besides `best.pt`."""
    average_last: int = 0
    """At the end of training, write `averaged.pt`: the mean weights of the last this many periodic checkpoints (0: none)."""

    def __post_init__(self) -> None:
        for name in ("max_tokens", "accumulate", "log_every", "valid_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be at least 1")
        for name in ("max_steps", "max_epochs", "max_time", "warmup_steps", "patience", "keep_last", "clip_norm",
                     "weight_decay", "num_workers", "save_every", "average_last", "plateau_patience", "max_bad_steps",
                     "pad_to_multiple"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 0")
        if self.lr <= 0:
            raise ValueError(f"lr ({self.lr}) must be positive")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing ({self.label_smoothing}) must be in [0, 1)")
        if self.schedule in ("cosine", "linear") and self.max_steps == 0:
            raise ValueError(f"schedule {self.schedule!r} decays to max_steps, which must then be > 0")
        if not 0.0 < self.plateau_factor < 1.0:
            raise ValueError(f"plateau_factor ({self.plateau_factor}) must be in (0, 1)")
        if self.average_last > self.keep_last:
            raise ValueError(f"average_last ({self.average_last}) needs keep_last >= {self.average_last} "
                             f"(now {self.keep_last}): only kept checkpoints can be averaged")


@dataclass
class DecodeConfig:
    """Search settings for `translate`, `eval` and validation BLEU."""

    beam: int = 5
    """Beam size (1: greedy search)."""
    length_penalty: float = 1.0
    """GNMT length-penalty exponent alpha: scores are divided by ((5 + len) / 6) ** alpha; 0 disables."""
    max_len_a: float = 1.5
    """Longest output is `max_len_a * source_length + max_len_b` tokens."""
    max_len_b: int = 10
    """See `max_len_a`."""
    max_tokens: int = 0
    """Token budget of one translation batch (padded source tokens times beam); 0: auto, 8000 on CPU, 128000 on a CUDA GPU. Search on a GPU is bound by kernel launches and host work per step, not arithmetic, so fewer, larger batches are faster: at beam 5, 128000 is hundreds of sentences per batch, whose caches stay under 10 GiB even for Transformer-base. On CPU larger batches gain nothing and cost memory."""

    def __post_init__(self) -> None:
        if self.beam < 1:
            raise ValueError(f"beam ({self.beam}) must be at least 1")
        if self.max_len_a < 0 or self.max_len_b < 0 or self.max_len_a == self.max_len_b == 0:
            raise ValueError("max_len_a and max_len_b must be >= 0 and not both 0")
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be >= 0 (0: auto)")


@dataclass
class EvalConfig:
    """sacreBLEU settings."""

    tokenize: Literal["13a", "intl", "zh", "ja-mecab", "char", "none"] = "13a"
    """sacreBLEU tokenizer for BLEU."""
    lowercase: bool = False
    """Case-insensitive BLEU."""


@dataclass
class ExperimentConfig:
    """One experiment: everything `nmt train` needs, and what checkpoints carry."""

    run_dir: str = "runs/default"
    """Where the tokenizer, checkpoints, logs and the resolved config are written."""
    data: DataConfig = field(default_factory=DataConfig)
    """The corpus."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """Subword model."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Architecture."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Training loop."""
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    """Search."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Scoring."""

    def __post_init__(self) -> None:
        if self.model.tie_embeddings == "all" and not self.tokenizer.joint:
            raise ValueError("model.tie_embeddings 'all' needs tokenizer.joint: true (one shared vocabulary)")


_VAR = re.compile(r"\$\{(\w+):-([^}]*)\}")


def expand_vars(text: str) -> str:
    """Expand `${VAR:-default}` (shell style), then `$VAR`/`${VAR}` and a leading `~`."""
    text = _VAR.sub(lambda m: os.environ.get(m.group(1)) or m.group(2), text)
    return os.path.expanduser(os.path.expandvars(text))


def _check_dropout(obj: Any, *names: str) -> None:
    for name in names:
        p = getattr(obj, name)
        if not 0.0 <= p < 1.0:
            raise ValueError(f"{name} ({p}) must be in [0, 1)")


