"""The config schema: one dataclass per YAML section.

Every default lives here and nowhere else. Each field is documented by the string
right under it (`nmt.config.reference` turns those into the README's table).
Each numeric field states its valid `Range` (`nmt.config.ranges`) once, in its
metadata (`num`): the loader checks it for every key it reads, naming file, key
and value, and the reference prints it. `__post_init__` checks the same ranges for
configs built in code, then the invariants that tie several fields together.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from nmt.config.ranges import MAX_LAYERS, MAX_POSITIONS, PROB, DeviceNames, check_ranges, num
from nmt.errors import shorten
from nmt.metrics import DEFAULTS, METRICS, TEXT_METRICS, TOKENIZERS, bleu_tokenizer


@dataclass
class CorpusConfig:
    """Where one split of a parallel corpus comes from."""

    kind: Literal["text", "tsv", "jsonl", "parquet", "disk", "hf"] = "text"
    """`text`: two plain-text files PATH.SRC and PATH.TGT (`.gz` allowed); `tsv`, `jsonl`, `parquet`: one file with named columns; `disk`: a dataset saved with `save_to_disk`; `hf`: a Hugging Face hub dataset, or a folder of data files (CSV, JSON lines, parquet) as `datasets.load_dataset` reads one. Training refuses a key that its kind does not read (`src_field` and `tgt_field` on `text`, `split` on all but `disk` and `hf`, `hf_config` on all but `hf`)."""
    path: list[str] | str = ""
    """File, prefix, folder or hub name (see `kind`). `$VAR`, `${VAR:-default}` and `~` are expanded; relative paths are relative to the working directory. For `text`, `tsv`, `jsonl` and `parquet`, a glob (`wmt/part-*`: for `text`, of prefixes) or a list of paths or globs reads shards one after another; a path that names a file as written is that file, `[` and all."""
    src_field: str | int | None = None
    """Column holding the source sentence; default: the source language code, or `translation.<lang>`. For `tsv`, a column number (0 is the first) reads a file without a header row."""
    tgt_field: str | int | None = None
    """Column holding the target sentence; default: the target language code, or `translation.<lang>`. A number as for `src_field` (give both as numbers)."""
    hf_config: str | None = None
    """Hub dataset configuration name (`kind: hf` only), e.g. `de-en` for wmt14."""
    split: str | None = None
    """Split to read (`kind: hf` and `disk`), e.g. `validation`. Null (the default) reads `train`: a hub dataset's or a folder's `train` split, or a saved DatasetDict's; a dataset saved as one `Dataset` has no splits and is read whole (a split given for it is refused)."""
    weight: float = num(1.0, lo=0, lo_open=True)
    """Training corpora only (`data.train` may be a list of corpus sections): how many times an epoch takes each of this corpus's pairs. 3 repeats a small in-domain corpus three times; 0.25 takes a fresh random quarter of a large one each epoch."""

    READ_BY: ClassVar[dict[str, tuple[str, ...]]] = {
        "src_field": ("tsv", "jsonl", "parquet", "disk", "hf"), "tgt_field": ("tsv", "jsonl", "parquet", "disk", "hf"),
        "split": ("disk", "hf"), "hf_config": ("hf",)}
    """The kinds that read each optional key (`nmt.data.corpus.load_pairs`); the others would leave it unused."""

    def unread_keys(self) -> list[str]:
        """The optional keys this corpus sets that its kind does not read."""
        return [key for key, kinds in self.READ_BY.items() if getattr(self, key) is not None and self.kind not in kinds]

    @property
    def paths(self) -> list[str]:
        """`path` as a list (one item unless a list was given)."""
        return list(self.path) if isinstance(self.path, list) else [self.path]

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("path: must name a file, prefix, folder or hub dataset")
        if isinstance(self.path, list):
            bad = next((p for p in self.path if not isinstance(p, str) or not p), None)
            if bad is not None:
                raise ValueError(f"path: every item of the list must be a non-empty path, not {bad!r}")
            self.path = [expand_vars(p) for p in self.path]
        elif isinstance(self.path, str):
            self.path = expand_vars(self.path)
        else:
            raise ValueError(f"path: expected a path or a list of paths, got {type(self.path).__name__}")
        check_ranges(self)
        if self.kind == "tsv" and (self.src_field is None) != (self.tgt_field is None):
            raise ValueError("src_field and tgt_field: give both or neither")
        numbers = [isinstance(f, int) and not isinstance(f, bool) for f in (self.src_field, self.tgt_field)]
        if any(numbers):
            if self.kind != "tsv":
                raise ValueError(f"src_field and tgt_field: column numbers are for kind: tsv, not {self.kind}; "
                                 "give column names")
            if not all(numbers):
                raise ValueError("src_field and tgt_field: give both as column numbers (a file without a header) "
                                 "or both as names")
            if min(self.src_field, self.tgt_field) < 0:  # type: ignore[type-var]
                raise ValueError(f"src_field and tgt_field: column numbers start at 0, not "
                                 f"{min(self.src_field, self.tgt_field)}")  # type: ignore[type-var]
            if self.src_field == self.tgt_field:
                raise ValueError(f"src_field and tgt_field: both read column {self.src_field}")


@dataclass
class DataConfig:
    """The parallel corpus and its cleaning."""

    src_lang: str = "de"
    """Source language code: the suffix of text files and the default column name."""
    tgt_lang: str = "en"
    """Target language code."""
    train: CorpusConfig | list[CorpusConfig] | None = None
    """Training split (required): one corpus section, or a list of them, each with its `weight`."""
    valid: CorpusConfig | None = None
    """Validation split (required): loss, perplexity and BLEU during training."""
    test: dict[str, CorpusConfig] = field(default_factory=dict)
    """Named test sets for `nmt eval --split NAME` (`--split test` scores all of them). `nmt experiment` writes each one's translations to `run_dir/NAME.hyp`, a `/` in the name as `_` (`wmt14/full`: `wmt14_full.hyp`), one line per pair of the set, an empty one for a pair with an empty side, which is not scored."""
    max_len: int = num(100, lo=1)
    """Training pairs longer than this on either side are dropped, counted as the model reads them: a side's subwords plus one (the source's EOS; the target's BOS, or EOS), so at most `max_len - 1` subwords a side are kept."""
    max_ratio: float = num(3.0, lo=1, or_zero=True)
    """Training pairs whose length ratio (longer/shorter, each side's subwords plus one as for `max_len`) exceeds this are dropped; 0 disables (below 1, every pair would be dropped)."""
    num_proc: int = num(0, lo=0)
    """Processes that clean and tokenize the corpus; 0: every CPU core this process may use."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.src_lang == self.tgt_lang:
            raise ValueError(f"src_lang and tgt_lang are both {self.src_lang!r}")
        if isinstance(self.train, list) and not self.train:
            raise ValueError("train: an empty list; give one corpus section or a list of them")
        evaluated = {"valid": self.valid, **{f"test.{name}": spec for name, spec in self.test.items()}}
        for name, spec in evaluated.items():
            if spec is not None and spec.weight != 1.0:
                raise ValueError(f"{name}.weight: weights apply to training corpora only; remove it")
        stems: dict[str, str] = {}
        for name in self.test:
            if not name.strip():
                raise ValueError("test: a test set's name is empty; name it (e.g. newstest2014)")
            stem = self.set_file_stem(name)
            if stem in stems:
                raise ValueError(f"test.{name}: its translations would go to the file of test.{stems[stem]} "
                                 f"({stem}.hyp); rename one of them")
            stems[stem] = name

    @staticmethod
    def set_file_stem(name: str) -> str:
        """The file name (without suffix) of a test set's translations: its name with each `/` or `\\` as `_`,
        so that names such as `wmt14/full` make one file, not a path into a folder."""
        return name.replace("/", "_").replace("\\", "_")

    def corpora(self) -> list[tuple[str, CorpusConfig]]:
        """Every corpus section with its key path: `data.train` (`data.train[i]` in a list), `data.valid`,
        `data.test.NAME`."""
        train = self.train_corpora
        named = [(f"data.train[{i}]" if isinstance(self.train, list) else "data.train", c) for i, c in enumerate(train)]
        named += [("data.valid", self.valid)] if self.valid is not None else []
        return named + [(f"data.test.{name}", spec) for name, spec in self.test.items()]

    @property
    def train_corpora(self) -> list[CorpusConfig]:
        """The training corpora as a list (one item unless `train` is a list); empty without `train`."""
        if self.train is None:
            return []
        return list(self.train) if isinstance(self.train, list) else [self.train]


@dataclass
class TokenizerConfig:
    """sentencepiece subword model, trained once on the training split and kept in the run directory."""

    TRAINING_KEYS: ClassVar[tuple[str, ...]] = ("type", "vocab_size", "character_coverage", "max_sentences",
                                                "normalization")
    """The keys that only training a sentencepiece model reads: unused where `model` gives one."""

    type: Literal["bpe", "unigram"] = "bpe"
    """sentencepiece model type."""
    vocab_size: int = num(8000, lo=8, hi=2**31 - 1)
    """Vocabulary size (per side when `joint` is false), special symbols included."""
    joint: bool = True
    """One vocabulary for both languages (needed for `model.tie_embeddings: all`)."""
    character_coverage: float = num(1.0, lo=0.98, hi=1)
    """Share of characters covered by the vocabulary; rarer ones map to <unk>. sentencepiece takes 0.98 to 1."""
    max_sentences: int = num(1_000_000, lo=1)
    """At most this many sentence pairs train the tokenizer: all of them when there are no more, else as many drawn at random, the same for the same `train.seed`."""
    normalization: Literal["nmt_nfkc", "nfkc", "identity"] = "nmt_nfkc"
    """sentencepiece's text normalization, applied to what the model reads, so the model writes normalized text too. `nmt_nfkc` (sentencepiece's default) is Unicode NFKC: full-width forms become ASCII (Chinese `，！（１` become `,!(1`), compatibility characters plain ones (`①` `1`, Arabic presentation forms letters, half-width katakana full-width); it also makes zero-width characters (ZWNJ, as Persian and Hindi write it) spaces. `nfkc` is NFKC alone; `identity` keeps the text as it is, so that the model writes the characters its references hold (a toy en-zh model, 400 updates, whose references hold `，`: test BLEU 50.0 against 44.0 with `nmt_nfkc`, chrF 43.9 against 37.2). Training warns when the normalization changes target sentences."""
    model: str = ""
    """An existing sentencepiece model file to use instead of training one (one vocabulary for both languages: needs `joint: true`; special ids pad 0, unk 1, bos 2, eos 3, as `nmt` trains them). `train.init_from` brings its checkpoint's own models instead."""

    def __post_init__(self) -> None:
        check_ranges(self)
        self.model = expand_vars(self.model) if self.model else ""
        if self.model and not self.joint:
            raise ValueError("model: a sentencepiece model file is one vocabulary for both languages; set joint: true")


@dataclass
class TransformerConfig:
    """Transformer encoder-decoder (Vaswani et al., 2017)."""

    d_model: int = num(512, lo=1)
    """Model width."""
    heads: int = num(8, lo=1)
    """Attention heads; must divide `d_model`."""
    encoder_layers: int = num(6, lo=1, hi=MAX_LAYERS)
    """Encoder layers."""
    decoder_layers: int = num(6, lo=1, hi=MAX_LAYERS)
    """Decoder layers."""
    ff_dim: int = num(2048, lo=1)
    """Hidden width of the position-wise feed-forward block."""
    dropout: float = num(0.1, **PROB)
    """Dropout on embeddings and on each sub-layer's output."""
    attention_dropout: float = num(0.0, **PROB)
    """Dropout on attention weights."""
    activation_dropout: float = num(0.0, **PROB)
    """Dropout inside the feed-forward block."""
    activation: Literal["relu", "gelu"] = "relu"
    """Feed-forward activation."""
    norm: Literal["pre", "post"] = "pre"
    """Layer norm before each sub-layer (pre, stabler) or after the residual sum (post, the paper's)."""
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"
    """Positional encoding."""
    max_positions: int = num(1024, lo=1, hi=MAX_POSITIONS)
    """Longest sequence the positional encoding covers, at least `data.max_len`; validation pairs longer than it are left out of the validation loss (a warning says how many), and a longer source is cut to fit when translated."""
    attention_impl: Literal["manual", "sdpa"] = "sdpa"
    """`manual`: attention written out; `sdpa`: torch's fused scaled_dot_product_attention (same maths)."""
    attention_pack: int = num(0, lo=0)
    """With `sdpa`: attend in rows of up to this many positions, several sentences side by side kept apart by a block-diagonal mask (same maths, fewer and longer rows for the fused kernels on short sentences). A row holds as many sentences as fit and divide the batch; static batch shapes (`train.batch_shapes`) take a multiple of that many, so their rows are full. Search steps are not packed; a model compiled with symbolic sizes keeps a graph per number of sentences a row. 0: a sentence a row."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.attention_pack and self.attention_impl != "sdpa":
            raise ValueError(f"attention_pack ({self.attention_pack}) needs attention_impl 'sdpa', "
                             f"not {self.attention_impl!r}: set attention_pack to 0 or attention_impl to sdpa")
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        if self.positions == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"d_model ({self.d_model}) must be even for sinusoidal positions")


@dataclass
class RNNConfig:
    """Recurrent encoder-decoder with the classic attention family."""

    cell: Literal["gru", "lstm"] = "gru"
    """Recurrent cell."""
    embed_dim: int = num(256, lo=1)
    """Embedding width."""
    hidden_size: int = num(512, lo=1)
    """Hidden state width of the decoder (and of the encoder, summed over directions)."""
    encoder_layers: int = num(1, lo=1, hi=MAX_LAYERS)
    """Encoder layers."""
    decoder_layers: int = num(1, lo=1, hi=MAX_LAYERS)
    """Decoder layers."""
    bidirectional: bool = True
    """Bidirectional encoder."""
    dropout: float = num(0.2, **PROB)
    """Dropout on embeddings, between layers and before the output layer."""
    bridge: Literal["zeros", "learned"] = "learned"
    """Decoder initial state: zeros, or a learned projection of the final encoder state."""
    decoder: Literal["none", "bahdanau", "luong"] = "luong"
    """`none`: fixed context vector fed to every step; `bahdanau`: attention from the previous state feeds the cell; `luong`: attention after the cell, tanh(W[c; s]) predicts."""
    attention: Literal["dot", "scaled_dot", "general", "additive", "cosine", "qkv", "multihead"] = "general"
    """Score function (ignored by `decoder: none`)."""
    attention_heads: int = num(4, lo=1)
    """Heads of the `multihead` score."""
    local_window: int = num(0, lo=0)
    """Luong's local-p attention: half-width D of the Gaussian window; 0 means global attention."""
    input_feeding: bool = True
    """Luong decoder: feed the previous attentional state into the cell. Without it (and with `decoder: none`), no step's input depends on the step before, and training runs the decoder's cells over all target positions at once, one fused call a layer, then attends with every query at once."""

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.bidirectional and self.hidden_size % 2:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be even for a bidirectional encoder")
        if self.attention == "multihead" and self.decoder != "none" and self.hidden_size % self.attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by attention_heads "
                             f"({self.attention_heads}) for multihead attention")


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

    @property
    def has_attention(self) -> bool:
        """Whether the model attends to the source (a Transformer, or an RNN whose decoder is not `none`), which
        the coverage penalty and attention plots read."""
        return self.type == "transformer" or self.rnn.decoder != "none"


@dataclass
class TrainConfig:
    """Optimisation, validation, checkpointing and the hardware it runs on."""

    init_from: str = ""
    """A checkpoint whose weights, `model` and `tokenizer` sections and sentencepiece models start this run (fine-tuning, domain adaptation): the optimizer and schedule start afresh, and the run validates at step 0 to show where it starts. Values this config writes in those two sections that are not the parent's are not used, and a warning names them; another `model.type`, written, is refused. A resumed run takes its weights from its own checkpoints, but still reads this one for its `model` and `tokenizer` sections, so keep it, and keep naming it (a resume without it is refused, with its path), until the run is done."""
    seed: int = num(1234, lo=0, hi=2**32 - 1)
    """Seed for every random generator (reproducible runs; rank r of a distributed run adds r for dropout)."""
    device: str = field(default="auto", metadata={"range": DeviceNames()})
    """`auto` picks CUDA, then MPS, then CPU; `cuda:N`, one GPU by number. Under torchrun each process takes the GPU of its LOCAL_RANK, so there give `cuda` or `auto`, not a number."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Training precision. bf16 and fp16: on a copy of the weights in that precision or under autocast (`half_weights`); fp16 with a gradient scaler. On a GPU, bf16 pays for large models (Transformer-base); a model of Multi30k's size, whose eager step is bound by kernel launches rather than arithmetic, trains about as fast in fp32 (TF32 matrix products) when eager, and faster in bf16 with `train.cuda_graphs` (941k against 730k target tokens/s on an H200). A GPU without bf16 tensor cores (compute capability below 8.0: a T4, a V100) emulates bf16, and training and translation warn there: use fp16. On a CPU, bf16 pays only where the CPU multiplies bf16 matrices faster than fp32 ones, which its instruction flags do not tell: a 2-core Intel Xeon VM with AVX512-BF16 and no AMX trained the Multi30k Transformer at 0.55x fp32's speed in bf16, an AVX2-only AMD EPYC 26x slower, and a 2-core AMD EPYC with AVX512-BF16 1.46-1.73x faster, as well per update as fp32 (validation BLEU 27.57 against 27.90 after 1,000 updates); training and translation time one matrix product each way and warn where bf16's is slower. fp16 runs on a CPU but is slow."""
    half_weights: Literal["auto", True, False] = "auto"
    """With bf16 or fp16: true runs the forward and backward passes on a copy of the model in that precision while the optimizer updates the fp32 weights (checkpoints and validation keep fp32), which saves autocast's cast at every use of a weight (a third of the operations of an update: the Multi30k Transformer's dispatches 429 on a bf16 copy against 620 under autocast, and 409 in fp32 (fp16 under autocast: 630), counted on a CPU on 2026-12-02, whose dropout takes 6 or 7 operations (forward and backward) where a GPU's fused kernels take 2; `bench/train_speed.py`, ops/update); false: autocast. On the copy the residual stream and the activations between kernels are half precision too, where autocast keeps LayerNorm's and softmax's outputs and the loss in fp32. `auto`: the copy for bf16, autocast for fp16, whose range (up to 65,504) autocast guards better; fp16 on the copy is what fairseq's --fp16 does, and has not yet been timed on a GPU."""
    compile: bool = False
    """Compile the model and the loss with `torch.compile` (pays off on GPUs in long runs; the first steps are slow while it compiles); an RNN compiles its decoder step, one graph for every target length, which on an H200 ran slower than eager (a decoder whose steps run at once, `none` or `luong` without input feeding, has no step to compile and stays eager); where compiling fails, training goes on uncompiled with a warning."""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    """`torch.compile` mode with `compile: true`: `reduce-overhead` adds CUDA graphs (one per batch shape), the `max-autotune` modes search kernel configurations (long first compile). On an H200, reduce-overhead made the Multi30k Transformer's updates 1.9-2.8x faster than eager ones in fp32 (`bench/train_speed.py`; not yet timed in a whole training run)."""
    compile_dynamic: Literal["auto", True, False] = "auto"
    """With `compile: true` (without it, like `compile_mode`, it is read by nothing and any value is accepted, so that `--set train.compile=true` alone turns compiling on): true, one graph with symbolic sizes serves every batch shape; false, a graph per batch shape, each compiled for its exact sizes, which needs the bounded shapes of `batch_shapes: static` and compiles once per length bucket in the first steps; `auto`: false exactly where batch shapes are static (`batch_shapes: static`, or `auto` in `reduce-overhead` mode on CUDA). On an H200, CUDA graphs over the graph with symbolic sizes killed training with a segmentation fault in the compiled backward pass; a graph per static shape trained."""
    cuda_graphs: Literal["auto", True, False] = "auto"
    """Record each batch shape's whole update (forward, backward, clipping, the optimizer, the bf16 copy's bookkeeping) as one CUDA graph after two eager uses of that shape, then replay it with one launch, so that a small model's step is no longer bound by the host's kernel launches (`compile_mode: reduce-overhead` records the forward and backward passes only). With `accumulate` above 1, each batch shape's forward and backward pass is recorded apart, and the update's end (clipping, the optimizer) once. Needs CUDA, one process, batch shapes that are not `free` (`auto` makes them static), and no compile mode with graphs of its own (`default` and `max-autotune-no-cudagraphs` go with it). On an H200 the Multi30k Transformer's updates ran at 724,000-730,000 target tokens/s in fp32 and 937,000-941,000 in bf16 this way, against about 200,000 eager (`bench/train_speed.py --update-graphs off,on`), and a whole bf16 run with it, beside five other runs on the same GPU, reached 41.5 BLEU on test_2016_flickr in 3.3 minutes. `auto`: on where a whole run with it has been measured, a Transformer on one CUDA device with settings it can record (the training log says so, or why not); off on a CPU, under torchrun, with fp16 or autocast (which true records, not yet measured on a GPU), with free batch shapes, with a compile mode that records graphs of its own, and for the RNNs. Recorded updates run without cuDNN, whose recorded RNN kernels went wrong once validation had run cuDNN eagerly; with cuDNN off in the whole process, an RNN's recorded updates trained as its eager ones did (700 updates on an H200), and with cuDNN off in the recorded updates alone (what training does) they are not yet run on a GPU. After each validation the recorded updates check that the weights are where they were recorded, and record again if not."""
    pad_to_multiple: int = num(0, lo=0)
    """Pad batch lengths (source and target) to a multiple of this (with `length_buckets: relative`, in steps of at most this), so kernels and compiled graphs see few distinct shapes (tensor cores want multiples of 8); 0: 8 on CUDA, 1 (no extra padding) elsewhere."""
    length_buckets: Literal["auto", "multiple", "relative"] = "auto"
    """How batch lengths round up: `multiple`, to a multiple of `pad_to_multiple`; `relative`, in steps that grow with the length, at most `pad_to_multiple` (lengths below 16 as they are, then steps of 2, 4 and 8, each under an eighth of the length); `auto`: relative with static `batch_shapes` and no `compile`, else multiple. Every batch of a static shape is padded to its length bucket, so the buckets' width is what it computes for nothing: on Multi30k at 4,096 tokens, relative buckets made 89.6% of the target positions real tokens instead of 75.8%, with 20 shapes instead of 6 (`bench/batch_shapes.py`); compiling costs a compilation per shape, hence multiple there."""
    batch_shapes: Literal["auto", "static", "free"] = "auto"
    """`static`: every batch of a length bucket (lengths rounded up as `length_buckets` says) has one shape, `max_tokens // L` rows by L source and L target positions, a short batch filled with empty pairs that carry no loss, so CUDA graphs (`compile_mode: reduce-overhead`) are recorded once per bucket instead of once per distinct batch; `free`: each batch is as long as its longest pair; `auto`: static exactly when compiling in `reduce-overhead` mode on CUDA."""
    batch_order: Literal["longer", "lengths"] = "longer"
    """How an epoch's pairs are sorted before they are cut into batches: `longer`, by the longer side alone; `lengths`, by the longer side, then the source length, then the target length (each rounded as the batches' lengths are), so that the pairs of a batch share both lengths and a free batch (`batch_shapes`), as long as its longest source and its longest target, pads little (a million pairs of Multi30k's lengths in batches of 4,096 tokens: 99.6% of the target positions real instead of 92.4%, `bench/batch_shapes.py`). Batches of pairs this alike learn less per update: the Multi30k Transformer's validation loss after 500 updates was 0.10-0.13 higher in the lengths order (two seeds), 0.03-0.04 after 1,000, and on a CPU its whole run was no faster; hence `longer`, the order of every published run. Either way pairs of equal lengths come in an order shuffled afresh each epoch, and an epoch has the same number of batches, of the same sizes; static batches pad both sides to their bucket whatever the order."""
    max_tokens: int = num(4096, lo=1)
    """Token budget of one batch, per process: its rows times its longest pair's longer side, padding within the batch included. Static batch shapes count lengths as rounded up (`pad_to_multiple`, `length_buckets`); free ones count them as they are, so that short sentences keep full batches, and then hold up to (rounded length / length) times the budget in padded positions (a batch of 9-token pairs padded to 16: 1.78x), which a budget sized to a GPU's memory must leave room for."""
    accumulate: int = num(1, lo=1)
    """Batches whose gradients are summed before one update; an update sees up to `max_tokens * accumulate * processes` tokens."""
    num_workers: int = num(0, lo=0, hi=256)
    """Background processes that collate batches (0: the training process does it); on CUDA batches are pinned and copied asynchronously. Taking a batch from a worker costs the training process about 1.3 ms on a 2-core CPU, so workers pay only where building one costs more (large batches of large corpora; `bench/batch_speed.py`)."""
    max_steps: int = num(100_000, lo=0)
    """Stop after this many updates (0: no limit)."""
    max_epochs: int = num(0, lo=0)
    """Stop after this many epochs (0: no limit)."""
    max_time: float = num(0.0, lo=0)
    """Stop after this many seconds of training (0: no limit); validation and a checkpoint follow."""
    optimizer: Literal["adam", "adamw"] = "adam"
    """Optimizer (fused kernels where torch has them: CUDA, and CPU in recent versions)."""
    lr: float = num(5e-4, lo=0, lo_open=True)
    """Peak learning rate."""
    betas: tuple[float, float] = num((0.9, 0.98), **PROB)
    """Adam betas."""
    eps: float = num(1e-9, lo=0)
    """Adam epsilon."""
    weight_decay: float = num(0.0, lo=0)
    """Weight decay (decoupled with adamw)."""
    schedule: Literal["inverse_sqrt", "cosine", "linear", "constant", "plateau"] = "inverse_sqrt"
    """Learning-rate schedule after linear warm-up; cosine and linear decay towards 0 at `max_steps` (the last update, one before it, still runs at a small rate); plateau multiplies the rate by `plateau_factor` when `early_stop_metric` stops improving."""
    warmup_steps: int = num(4000, lo=0)
    """Linear warm-up steps."""
    plateau_factor: float = num(0.5, lo=0, hi=1, lo_open=True, hi_open=True)
    """`schedule: plateau`: factor applied to the learning rate at each plateau."""
    plateau_patience: int = num(2, lo=0)
    """`schedule: plateau`: validations without improvement tolerated before the rate is lowered."""
    label_smoothing: float = num(0.1, **PROB)
    """Label smoothing of the cross-entropy."""
    clip_norm: float = num(1.0, lo=0)
    """Gradient norm clipping (0 disables)."""
    max_bad_steps: int = num(10, lo=0)
    """Updates with a non-finite loss or gradient are skipped with a warning; this many in a row stop the run with an error (0: never stop)."""
    log_every: int = num(100, lo=1)
    """Steps between log lines in `metrics.jsonl` (and TensorBoard)."""
    tensorboard: bool = True
    """Also write TensorBoard event files to `run_dir/tensorboard` when the `tensorboard` package is installed
    (`pip install 'nmt[tensorboard]'`; without it, training warns and writes `metrics.jsonl` alone)."""
    valid_every: int = num(1000, lo=1)
    """Steps between validations (each writes a checkpoint); training also validates once when it ends."""
    valid_bleu: bool = True
    """Translate the validation set greedily at each validation and score it with `eval.metrics` (BLEU and the others)."""
    valid_max_sentences: int = num(0, lo=0)
    """Decode at most this many validation sentences for BLEU (0: all)."""
    early_stop_metric: Literal[tuple(METRICS)] = "bleu"
    """Metric that picks the best checkpoint (and, in `nmt experiment`, judges `averaged.pt` against it), drives early stopping and the plateau schedule (a text metric needs `valid_bleu`, else the loss is used; validation scores it besides `eval.metrics`); `loss` is the validation loss as training minimises it, label smoothing included. A run resumed with another metric than its checkpoint's, or with other settings its score reads (`eval.tokenize`, `eval.lowercase`, `data.valid`, `valid_max_sentences`, `label_smoothing` for the loss), starts its best, patience and plateau counts anew (with a warning): such scores do not compare."""
    patience: int = num(0, lo=0)
    """Stop after this many validations without improvement (0: never)."""
    save_every: int = num(0, lo=0)
    """Steps between extra checkpoints written without validation, for frequent resume points (0: only at validation)."""
    keep_last: int = num(2, lo=0)
    """Periodic checkpoints kept besides `best.pt`; 0 keeps the newest one all the same, which a stopped run resumes from. The checkpoint a run writes where it stops between `valid_every` and `save_every` steps (a signal, `max_time`, a last step off that schedule; and a fine-tuning run's `ckpt_0.pt`, the parent's weights) is kept besides these, not counted, and replaced by the run's next checkpoint once it goes on: a run stopped and resumed keeps, and averages (`average_last`), the same steps as one run straight through."""
    average_last: int = num(0, lo=0)
    """At the end of training, write `averaged.pt`: the mean weights of the last this many periodic checkpoints (0: none)."""

    def __post_init__(self) -> None:
        check_ranges(self)
        self.init_from = expand_vars(self.init_from) if self.init_from else ""
        if self.schedule in ("cosine", "linear") and self.max_steps == 0:
            raise ValueError(f"schedule {self.schedule!r} decays to max_steps, which must then be > 0")
        if self.compile and self.compile_dynamic is False and self.batch_shapes == "free":  # unread without compile
            raise ValueError("compile_dynamic false compiles a graph per batch shape, so it needs batch_shapes "
                             "static (one shape per length bucket), not free")
        if self.cuda_graphs is True:
            self._check_cuda_graphs()
        if self.average_last > self.keep_last:
            raise ValueError(f"average_last ({self.average_last}) needs keep_last >= {self.average_last} "
                             f"(now {self.keep_last}): only kept checkpoints can be averaged")

    def _check_cuda_graphs(self) -> None:
        """What `cuda_graphs: true` needs of the other settings (the device and the model are checked when
        training starts: `nmt.train.graphs.check_update_graphs`)."""
        needs = self.cuda_graphs_needs()
        if needs:
            raise ValueError(f"cuda_graphs true records one whole update per batch shape, which needs "
                             f"{'; '.join(needs)}")

    def on_half_copy(self) -> bool:
        """Whether the passes run on a copy of the model in `precision` (`half_weights`), rather than under
        autocast or in fp32."""
        if self.precision == "fp32":
            return False
        return self.half_weights is True or (self.half_weights == "auto" and self.precision == "bf16")

    def cuda_graphs_needs(self) -> list[str]:
        """What recording whole updates (`cuda_graphs`) needs of the other settings and they lack, each in a
        phrase; empty where they allow it."""
        needs = []
        if self.batch_shapes == "free":
            needs.append("batch_shapes auto or static (now free)")
        if self.compile and self.compile_mode in ("reduce-overhead", "max-autotune"):
            needs.append(f"a compile_mode without CUDA graphs of its own, default or max-autotune-no-cudagraphs "
                         f"(now {self.compile_mode})")
        return needs


@dataclass
class DecodeConfig:
    """Search settings for `translate`, `eval` and validation BLEU."""

    beam: int = num(5, lo=1, hi=1000)
    """Beam size (1: greedy search). Studies of search errors go up to 1000; a larger beam is most likely a typing slip, which would cost hours and memory before anything showed it."""
    length_penalty: float = num(1.0, lo=-5, hi=5)
    """GNMT length-penalty exponent alpha: scores are divided by ((5 + len) / 6) ** alpha, len counting the final end of sentence; 0 disables. Values used in practice lie between 0.6 and 2; beyond 5 the penalty of a long output leaves fp32's range."""
    max_len_a: float = num(1.5, lo=0, hi=MAX_POSITIONS)
    """Longest output is `max_len_a * source_length + max_len_b` tokens. A Transformer's positions hold BOS and the output, so a source is cut to fit, and training refuses limits that no source fits: `2 x max_len_a + max_len_b` (a one-subword source with EOS) must be at most `model.transformer.max_positions - 1`."""
    max_len_b: int = num(10, lo=0, hi=MAX_POSITIONS)
    """See `max_len_a`."""
    min_len: int = num(0, lo=0, hi=MAX_POSITIONS)
    """No end of sentence before this many output tokens."""
    coverage_penalty: float = num(0.0, lo=0)
    """GNMT coverage-penalty weight beta (Wu et al., 2016): rewards hypotheses whose attention covers the whole source; 0 disables. It needs a model with attention: `nmt train` refuses it with `model.rnn.decoder: none`, the config's own or that of its `train.init_from` parent."""
    max_tokens: int = num(0, lo=0)
    """Token budget of one translation batch (padded source tokens times beam); 0: auto, 8000 on CPU, 128000 on a CUDA GPU. Search on a GPU is bound by kernel launches and host work per step, not arithmetic, so fewer, larger batches are faster: at beam 5, 128000 is hundreds of sentences per batch, whose caches stay under 10 GiB even for Transformer-base. A batch that runs out of CUDA memory (a smaller GPU, a larger model or beam) is translated in halves, and later batches take at most half its tokens, with a warning that names the value to set. On CPU larger batches gain nothing and cost memory."""

    def __post_init__(self) -> None:
        check_ranges(self)
        check_length_limit(self.max_len_a, self.max_len_b, self.min_len)


def check_length_limit(max_len_a: float, max_len_b: int, min_len: int = 0) -> None:
    """Refuse a length limit of 0 for every source, and a `min_len` above the limit of every source: the limit
    wins, so every output would stop there (`DecodeConfig`, `SearchOptions`)."""
    if max_len_a == max_len_b == 0:
        raise ValueError("max_len_a and max_len_b are both 0: no output could be produced")
    if max_len_a == 0 and min_len > max_len_b:
        raise ValueError(f"min_len ({min_len}) is above the longest output that max_len_a 0 and max_len_b "
                         f"({max_len_b}) allow, so every output would stop at {max_len_b} tokens; lower min_len or "
                         "raise max_len_b")


LENGTH_ROUNDING = 1e-6
"""Added to a * S + b before its floor (`longest_output`), so that a length limit is not cut short by binary
fractions: a user's 1.15 is 1.149999... in binary, and 1.15 * 100 must give 115, not 114."""


def longest_output(src_len: float, max_len_a: float, max_len_b: int) -> int:
    """The most output tokens (EOS excluded) of a source of `src_len` subwords and EOS: floor(a * S + b)."""
    return math.floor(max_len_a * src_len + max_len_b + LENGTH_ROUNDING)


def longest_source(positions: int, max_len_a: float, max_len_b: int) -> int:
    """The longest source (subwords and EOS) that a model of `positions` positions takes when an output may be
    `longest_output` tokens long: the search feeds BOS and those tokens, at positions 0 .. floor(a * S + b).
    Below 2 (one subword and EOS) where no source fits."""
    if max_len_b > positions - 1:
        return 0
    if max_len_a <= 0:
        return positions
    longest = min(positions, math.ceil((positions - max_len_b) / max_len_a))  # at most one above the answer
    while longest > 0 and longest_output(longest, max_len_a, max_len_b) > positions - 1:  # as the search rounds
        longest -= 1
    return longest


@dataclass
class EvalConfig:
    """sacreBLEU settings."""

    tokenize: Literal[TOKENIZERS] = DEFAULTS.tokenize
    """sacreBLEU tokenizer for BLEU. `auto`: sacreBLEU's choice for `data.tgt_lang`, `zh` for Chinese (`zh`, `zh-TW`, `zho_Hans`, `cmn`, ...) and `ja-mecab` for Japanese (`ja`, `jpn_Jpan`; it needs `pip install 'sacrebleu[ja]'`), else `13a`, which takes a whole sentence of a language written without spaces for one word. A config decides it as it loads, so checkpoints hold the tokenizer used; the scores' signatures name it (`tok:zh`). With `zh` and `ja-mecab`, TER splits Chinese and Japanese characters too (sacreBLEU's `asian_support`, `asian:yes` in its signature), where it took a sentence for one word."""
    lowercase: bool = DEFAULTS.lowercase
    """Case-insensitive scores."""
    metrics: list[Literal[TEXT_METRICS]] = field(default_factory=lambda: list(DEFAULTS.metrics))
    """sacreBLEU metrics that `nmt eval` and validation report (`nmt.metrics.METRICS`). `nmt experiment` and `nmt analyze` always score BLEU and chrF, which their tables, plots and choice of checkpoint are built on, and these besides."""

    def __post_init__(self) -> None:
        if not self.metrics:
            raise ValueError("metrics is empty: name at least one of " + ", ".join(TEXT_METRICS))


@dataclass
class ExperimentConfig:
    """One experiment: everything `nmt train` needs, and what checkpoints carry."""

    written: ClassVar[frozenset[str] | None] = None
    """The key paths (`model.transformer.dropout`) its source wrote, file and `--set` alike, where it was read
    from one (`config_from_dict` sets them on the instance); None where unknown. Fine-tuning names the keys
    written for a model it does not take, those written with their default value too."""

    run_dir: str = "runs/default"
    """Where the tokenizer, checkpoints, logs and the resolved config are written. `$VAR`, `${VAR:-default}` and `~` are expanded, as in corpus paths."""
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
        self.run_dir = expand_vars(self.run_dir)
        self.eval.tokenize = bleu_tokenizer(self.eval.tokenize, self.data.tgt_lang)
        if self.model.tie_embeddings == "all" and not self.tokenizer.joint:
            raise ValueError("model.tie_embeddings 'all' needs tokenizer.joint: true (one shared vocabulary)")
        positions, max_len = self.model.transformer.max_positions, self.data.max_len
        if self.model.type == "transformer" and positions < max_len:
            raise ValueError(f"model.transformer.max_positions ({positions}) must be at least data.max_len "
                             f"({max_len}): training sequences are up to max_len tokens long")

    def training_problem(self) -> str | None:
        """What keeps this config from training, or None. (A config can be valid without training: a
        checkpoint's config translates without corpora, and those checkpoints trained before `nmt train`
        refused a coverage penalty without attention translate with the penalty left out.)"""
        if not self.run_dir.strip():  # else the run's files land among the working directory's own
            return f"run_dir: {self.run_dir!r} names no folder; give one (`.` for the working directory)"
        unset = unset_vars(self.run_dir)
        if unset:  # else the run would go to a folder named `$NAME` in the working directory
            return (f"run_dir: {shorten(repr(self.run_dir))}: environment variable {unset[0]} is not set; set it, "
                    f"or give a default as ${{{unset[0]}:-DEFAULT}}")
        if self.run_dir.startswith("~"):  # `~name/...` of no user on this machine: else a folder named `~name`
            user = self.run_dir[1:].split("/", 1)[0]
            return (f"run_dir: {shorten(repr(self.run_dir))}: {'no home folder' if not user else f'no user {user!r}'} "
                    f"to expand {'~' + user} to; give a path without it")
        for name in ("train", "valid"):
            if getattr(self.data, name) is None:
                return f"data.{name}: required for training (a corpus section with kind and path)"
        for where, spec in self.data.corpora():
            for key in spec.unread_keys():
                kinds = CorpusConfig.READ_BY[key]
                return (f"{where}.{key}: kind {spec.kind} does not read {key} ({key} is for kind "
                        f"{', '.join(kinds[:-1]) + ' and ' if len(kinds) > 1 else ''}{kinds[-1]}); remove it, or give "
                        "the kind that reads it")
        for name in self.data.test:
            if self.data.set_file_stem(name) == "valid":
                return (f"data.test.{name}: `nmt eval --split valid` and its translations file (valid.hyp) name "
                        "data.valid; rename the test set")
        positions, d = self.model.transformer.max_positions, self.decode
        if self.model.type == "transformer" and longest_source(positions, d.max_len_a, d.max_len_b) < 2:
            return (f"decode.max_len_a ({d.max_len_a:g}) and decode.max_len_b ({d.max_len_b}) allow outputs of more "
                    f"than the {positions - 1} tokens that model.transformer.max_positions ({positions}) holds, even "
                    f"from a one-subword source (2 positions with EOS), so validation could translate nothing: lower "
                    f"them so that 2 x max_len_a + max_len_b is at most {positions - 1}, or raise max_positions")
        if not self.model.has_attention and self.decode.coverage_penalty > 0:
            return (f"decode.coverage_penalty ({self.decode.coverage_penalty:g}) needs attention, which "
                    "model.rnn.decoder 'none' has not: set decode.coverage_penalty to 0 or choose the bahdanau "
                    "or luong decoder")
        return None


_VAR = re.compile(r"\$\{(\w+):-([^}]*)\}")


_LEFT = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def unset_vars(expanded: str) -> list[str]:
    """The variables that `expand_vars` left in `expanded` as they were written, since they are not set."""
    names = [m.group(1) or m.group(2) for m in _LEFT.finditer(expanded)]
    return [name for name in names if name not in os.environ]


def expand_vars(text: str) -> str:
    """Expand `${VAR:-default}` (shell style), then `$VAR`/`${VAR}` and a leading `~`."""
    text = _VAR.sub(lambda m: os.environ.get(m.group(1)) or m.group(2), text)
    return os.path.expanduser(os.path.expandvars(text))
