"""Typed experiment configuration: one dataclass per YAML section, strict loading.

Every default lives here and nowhere else. Each field is documented by the string
right under it; `reference_markdown()` turns those into the README's config table.
`load_config` rejects unknown keys (with a "did you mean" suggestion), checks
types and enums, and names the file and dotted key path of anything wrong.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from nmt.errors import ConfigError

# --------------------------------------------------------------------------- sections


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
    """Compile the model with `torch.compile` (pays off on GPUs in long runs); where compiling fails, training goes on uncompiled with a warning."""
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
                     "weight_decay", "num_workers", "save_every", "average_last", "plateau_patience", "max_bad_steps"):
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
    max_tokens: int = 8000
    """Token budget of one translation batch (source tokens times beam)."""

    def __post_init__(self) -> None:
        if self.beam < 1:
            raise ValueError(f"beam ({self.beam}) must be at least 1")
        if self.max_len_a < 0 or self.max_len_b < 0 or self.max_len_a == self.max_len_b == 0:
            raise ValueError("max_len_a and max_len_b must be >= 0 and not both 0")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be at least 1")


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


# --------------------------------------------------------------------------- loading


def load_config(path: str | Path, overrides: typing.Sequence[str] = ()) -> ExperimentConfig:
    """Read a YAML file, apply `section.key=value` overrides, and validate.

    Raises:
        ConfigError: missing file, YAML syntax error, unknown key, wrong type or
            value; the message names the file (or the `--set` item) and the
            dotted key path.
    """
    path = Path(path)
    if not path.is_file():
        resolved = "" if path.is_absolute() else f" (resolved to {path.resolve()})"
        raise ConfigError(f"{path}: config file not found{resolved}")
    data = path.read_bytes()
    try:
        raw = yaml.safe_load(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ConfigError(f"{path}: line {line}: not UTF-8 text ({err.reason}); save the file as UTF-8") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: {_yaml_problem(err)}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(raw).__name__}")
    return config_from_dict(apply_overrides(raw, overrides), source=str(path))


def _yaml_problem(err: yaml.YAMLError) -> str:
    """`line L, column C: YAML syntax error: PROBLEM (CONTEXT that starts at line L', column C')`."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and start is not None and mark is not None and (start.line, start.column) != (mark.line, mark.column):
        problem += f" ({context} that starts at line {start.line + 1}, column {start.column + 1})"
    if "\\t" in problem or "\t" in problem:
        problem += "; indent with spaces, not tabs"
    return f"{where}YAML syntax error: {problem}"


def apply_overrides(raw: dict[str, Any], overrides: typing.Sequence[str]) -> dict[str, Any]:
    """Return a copy of `raw` with each `a.b.c=value` set (value parsed as YAML).

    Raises:
        ConfigError: an item without `=`, a key that no config section has, or a
            value of the wrong type; the message names the `--set` item.
    """
    import copy

    raw = copy.deepcopy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        parts = key.strip().split(".")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        _check_override(item, parts, value)
        node = raw
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {'.'.join(parts[: i + 1])} is not a section")
            node = child
        node[parts[-1]] = value
    return raw


def _check_override(item: str, parts: list[str], value: Any) -> None:
    """Check one override against the schema, so a mistake names the `--set` item, not the file."""
    where = f"--set {item!r}"
    tp: Any = ExperimentConfig
    for i, part in enumerate(parts):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) in (typing.Union, types.UnionType) and inner:
            tp = inner[0]
        if typing.get_origin(tp) is dict:  # data.test.NAME: any name
            tp = typing.get_args(tp)[1]
            continue
        if not dataclasses.is_dataclass(tp):
            raise ConfigError(f"{where}: {'.'.join(parts[:i])} is a value, not a section")
        names = [f.name for f in dataclasses.fields(tp)]
        if part not in names:
            raise ConfigError(f"{where}: unknown key {'.'.join(parts[: i + 1])!r}{_suggest(part, names)}")
        tp = typing.get_type_hints(tp)[part]
    _convert(tp, value, ".".join(parts), where)


def _suggest(key: Any, names: list[str]) -> str:
    close = difflib.get_close_matches(str(key), names, n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(names)}"


def config_from_dict(raw: dict[str, Any], source: str = "<config>") -> ExperimentConfig:
    """Build a validated `ExperimentConfig` from plain data (YAML or a checkpoint)."""
    return _build(ExperimentConfig, raw, "", source)


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Plain data (lists for tuples) suitable for YAML, JSON and checkpoints."""

    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x

    return plain(dataclasses.asdict(cfg))


def save_config(cfg: ExperimentConfig, path: str | Path) -> None:
    """Write the resolved config as YAML."""
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), encoding="utf-8")


def _build(cls: type, raw: Any, keypath: str, source: str) -> Any:
    where = f"{source}: {keypath or 'top level'}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {_describe(raw)}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        if key not in names:
            raise ConfigError(f"{source}: unknown key {_join(keypath, key)!r}{_suggest(key, names)}")
        kwargs[key] = _convert(hints[key], value, _join(keypath, key), source)
    try:
        return cls(**kwargs)
    except ValueError as err:
        msg = str(err)
        # Messages name their field first ("d_model (100) must ..."): prefix the section path.
        raise ConfigError(f"{source}: {keypath + ': ' if keypath else ''}{msg}") from None


def _convert(tp: Any, value: Any, keypath: str, source: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, keypath, source)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value if value is not None else {}, keypath, source)
    if origin is Literal:
        if value not in args:
            close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            choices = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{source}: {keypath}: {value!r} is not one of {choices}{hint}")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {keypath}: expected a mapping, got {_describe(value)}")
        return {str(k): _convert(args[1], v, f"{keypath}.{k}", source) for k, v in value.items()}
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{source}: {keypath}: expected a list of {len(args)} numbers, got {_describe(value)}")
        return tuple(_convert(a, v, f"{keypath}[{i}]", source) for i, (a, v) in enumerate(zip(args, value)))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML 1.1 reads "1e-4" as a string
            return float(value)
        except ValueError:
            pass
    if tp in (int, float, str, bool) and (type(value) is not tp):
        raise ConfigError(f"{source}: {keypath}: expected {tp.__name__}, got {_describe(value)}")
    return value


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}" if value is not None else "nothing (null)"


def _join(keypath: str, key: Any) -> str:
    return f"{keypath}.{key}" if keypath else str(key)


# --------------------------------------------------------------------------- reference


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a config dataclass."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())  # type: ignore[union-attr]
    return docs


def reference_markdown() -> str:
    """A markdown table of every config key, its default and its meaning."""
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]

    def walk(cls: type, prefix: str) -> None:
        docs = field_docs(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = _join(prefix, f.name)
            tp = hints[f.name]
            inner = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
            if dataclasses.is_dataclass(tp) and f.default_factory is not dataclasses.MISSING:
                walk(tp, key)
                continue
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = None
            if isinstance(default, tuple):
                default = list(default)
            shown = "(required)" if default is None and dataclasses.is_dataclass(inner[0]) else f"`{yaml.safe_dump(default, default_flow_style=True).strip().removesuffix('...').strip()}`"
            lines.append(f"| `{key}` | {shown} | {docs.get(f.name, '')} |")

    walk(ExperimentConfig, "")
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference_markdown())
