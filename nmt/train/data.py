"""The data of a training run: tokenizer, tokenized splits, and batches built in worker processes.

`prepare_run` trains the sentencepiece model once (kept in the run directory)
and tokenizes the splits (cached under `run_dir/cache`). `batch_loader` turns a
list of row-index batches into a DataLoader whose workers collate them, so the
training process only copies finished batches to the device.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from datasets import concatenate_datasets

from nmt.checkpoint import load_checkpoint, periodic_checkpoints
from nmt.config import (
    CorpusConfig,
    DataConfig,
    ExperimentConfig,
    ModelConfig,
    TrainConfig,
    config_to_dict,
)
from nmt.data.batching import TokenBatchSampler
from nmt.data.cleaning import clean_pairs
from nmt.data.collate import Batch, Padding, Rounding, collate_flat
from nmt.data.dataset import (
    IdColumns,
    available_cores,
    length_arrays,
    load_split,
    prepare_split,
)
from nmt.data.sample import draw_tokenizer_sample
from nmt.data.tokenizer import (
    PAD_ID,
    Tokenizer,
    train_tokenizer_on_files,
    warn_if_normalized,
    warn_if_unknown,
)
from nmt.errors import CheckpointError, DataError, UserError
from nmt.fileio import write_atomic

log = logging.getLogger(__name__)


@dataclass
class RunData:
    """Tokenizer and tokenized splits of one run."""

    tokenizer: Tokenizer
    train: Any  # datasets.Dataset with src_ids, tgt_ids, src_len, tgt_len: the training corpora one after another
    valid: Any
    reports: dict[str, dict[str, int]] = field(default_factory=dict)
    train_parts: list[tuple[int, float]] | None = None
    """(rows, weight) of each training corpus in `train`, in order (None: one corpus of weight 1)."""


def _read_train(spec: CorpusConfig, data: DataConfig, cache: Path) -> Any:
    """One training corpus as read (`load_pairs`); an empty one is an error here, before a tokenizer is trained."""
    pairs = load_split(spec, data, cache_dir=cache)
    if not len(pairs):
        raise DataError(f"data.train ({spec.path}): empty, no pairs to read; give a corpus that holds sentence pairs")
    return pairs


def past_positions(ds: Any, positions: int) -> Any:
    """(N,) bool: the pairs of `ds` whose source or target is longer than a model's `positions`."""
    src_lens, tgt_lens = length_arrays(ds)
    return (src_lens > positions) | (tgt_lens > positions)


def _say_pairs_past_positions(valid: Any, positions: int) -> None:
    """Warn of validation pairs longer than the model's positions: the validation loss leaves them out
    (`nmt.train.validate.within_positions`), and their translations start from a truncated source."""
    over = past_positions(valid, positions)
    if over.any():
        log.warning("data.valid: %d of its %d pairs are longer than model.transformer.max_positions (%d) subwords "
                    "on a side: the validation loss leaves them out, and they are translated from a source cut "
                    "to fit; raise max_positions to score them whole", int(over.sum()), len(over), positions)


def prepare_run(cfg: ExperimentConfig, run_dir: Path, *, tokenizer: Tokenizer | None = None,
                prepared: bool = False) -> RunData:
    """Load and clean the corpus, train (or reuse) the tokenizer, tokenize and filter the splits.

    `tokenizer`, when given, is used instead of training one (`nmt.train.start`). `cfg` is a config that
    trains (`ExperimentConfig.training_problem`, which `build_run` and `load_config(training=True)` check).
    `prepared`: another process (rank 0 of a torchrun job) has prepared the run directory, and `tokenizer`
    is the one it chose. It is used as it is, and the run directory's sentencepiece files are left alone:
    on another node they may not show yet, and a process that judged them itself (`_run_tokenizer`) could
    find them made otherwise (its working directory makes other absolute corpus paths) and train its own
    over them.

    Raises:
        UserError: bad data, or a run directory whose tokenizer is not `tokenizer`.
    """
    data = cfg.data
    cache = run_dir / "cache"
    num_proc = data.num_proc or available_cores()
    # Read the validation split first: a bad file fails in seconds, not after the tokenizer is trained. The test
    # sets too, which training does not use: a mistyped one is found now, not by `nmt eval` after the run.
    for spec in [data.valid] + ([] if prepared else list(data.test.values())):
        load_split(spec, data, cache_dir=cache)
    corpora = data.train_corpora
    if prepared:
        if tokenizer is None:
            raise ValueError("prepare_run: prepared=True needs the tokenizer the run directory was prepared with")
    else:
        tokenizer = _prepare_tokenizer(cfg, run_dir, tokenizer, cache=cache, num_proc=num_proc)
    parts = [prepare_split(spec, data, tokenizer, cache_dir=cache, train=True, num_proc=num_proc) for spec in corpora]
    train = _one_after_another([split for split, _ in parts])
    reports = {"train": {key: sum(report[key] for _, report in parts) for key in parts[0][1]}}
    if len(parts) > 1:
        reports.update({f"train[{i}]": report for i, (_, report) in enumerate(parts)})
    valid, reports["valid"] = prepare_split(data.valid, data, tokenizer, cache_dir=cache, train=False,
                                            num_proc=num_proc)
    if cfg.model.type == "transformer":
        _say_pairs_past_positions(valid, cfg.model.transformer.max_positions)
    weighted = [(len(split), spec.weight) for (split, _), spec in zip(parts, corpora)]
    _check_epoch_size(weighted, [where for where, _ in data.corpora()])
    return RunData(tokenizer, train, valid, reports, train_parts=weighted)


MAX_EPOCH_PAIRS = 10**9
"""The most pairs the training corpora's weights may make an epoch of: its row list takes 8 bytes a pair."""


def _check_epoch_size(weighted: list[tuple[int, float]], names: list[str]) -> None:
    """Refuse weights that make an epoch too large to list (a mistyped `weight: 99999999999`), before the first one
    is drawn; `names` are the corpora's key paths, `data.train` or `data.train[i]`, in order."""
    pairs = sum(rows * weight for rows, weight in weighted)
    if pairs <= MAX_EPOCH_PAIRS:
        return
    i = max(range(len(weighted)), key=lambda k: weighted[k][0] * weighted[k][1])
    rows, weight = weighted[i]
    raise DataError(f"{names[i]}.weight ({weight:g}) takes its {rows} pairs {weight:g} times an epoch, which would "
                    f"hold {pairs:.3g} pairs, more than the {MAX_EPOCH_PAIRS:,} an epoch may; lower the weight")


def _prepare_tokenizer(cfg: ExperimentConfig, run_dir: Path, given: Tokenizer | None, *, cache: Path,
                       num_proc: int) -> Tokenizer:
    """The run's tokenizer, saved in `run_dir`: the one there if this start keeps it (`_run_tokenizer`), else
    `given`, else one trained on the training corpora.

    Raises:
        UserError: bad data, or a run directory whose tokenizer is not `given`.
    """
    data, corpora = cfg.data, cfg.data.train_corpora
    tokenizer = _run_tokenizer(cfg, run_dir, given=given is not None, cache=cache)
    if given is not None and tokenizer is not None and given.to_state() != tokenizer.to_state():
        raise UserError(f"run_dir {run_dir}: holds other sentencepiece models than train.init_from or "
                        "tokenizer.model gives; choose a new run_dir")
    if tokenizer is None and given is not None:
        tokenizer = given
        _check_given_tokenizer(cfg, given, cache=cache)
        tokenizer.save(run_dir)
        _write_tokenizer_record(cfg, run_dir, given=True)
    if tokenizer is None:
        # the tokenizer learns from every training corpus as it is, unweighted
        read = [_read_train(spec, data, cache) for spec in corpora]
        raw = _one_after_another([clean_pairs(pairs, num_proc=num_proc)[0] for pairs in read])
        with tempfile.TemporaryDirectory(prefix="nmt-spm-") as folder:
            src_file, tgt_file = draw_tokenizer_sample(raw, cfg.tokenizer.max_sentences, seed=cfg.train.seed,
                                                       folder=Path(folder))
            paths = ", ".join(str(spec.path) for spec in corpora)
            tokenizer = train_tokenizer_on_files(cfg.tokenizer, src_file, tgt_file, where=f"data.train ({paths})")
        tokenizer.save(run_dir)
        _write_tokenizer_record(cfg, run_dir, given=False, read=[pairs._fingerprint for pairs in read])
        log.info("trained sentencepiece: %d source / %d target pieces", tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    return tokenizer


GIVEN_TOKENIZER_SAMPLE = 10_000
"""Pairs of each training corpus (its first) that a tokenizer brought from elsewhere is checked against."""


def _check_given_tokenizer(cfg: ExperimentConfig, tokenizer: Tokenizer, *, cache: Path) -> None:
    """Warn when the tokenizer of `tokenizer.model` or `train.init_from`, made from other text, maps characters of
    the training corpora to <unk> (`warn_if_unknown`) or normalizes their target sentences (`warn_if_normalized`),
    as training one here warns of its own normalization."""
    if cfg.train.init_from:
        given = f"train.init_from: {cfg.train.init_from}"
        unknown_advice = normalized_advice = "fine-tuning keeps the parent's sentencepiece models"
    else:
        given = f"tokenizer.model: {cfg.tokenizer.model}"
        unknown_advice = ("use a sentencepiece model trained on text of both languages, or leave tokenizer.model "
                          "empty to train one")
        normalized_advice = ("use a sentencepiece model trained with --normalization_rule_name=identity to keep the "
                             "text as it is")
    for spec in cfg.data.train_corpora:
        where = f"data.train ({spec.path})"
        pairs = _read_train(spec, cfg.data, cache)
        sample, _ = clean_pairs(pairs.select(range(min(len(pairs), GIVEN_TOKENIZER_SAMPLE))))
        warn_if_unknown(tokenizer, sample["src"], sample["tgt"], given=given, where=where, advice=unknown_advice)
        warn_if_normalized(tokenizer.tgt, sample["tgt"], f"{given}: its normalization, on {where},",
                           normalized_advice)


TOKENIZER_RECORD = "spm.json"
"""Beside a run's sentencepiece models: what they were trained on, or that they were given (`_tokenizer_record`)."""


def _tokenizer_record(cfg: ExperimentConfig, *, given: bool, read: list[str] | None = None) -> dict[str, Any]:
    """What decides the run's tokenizer: the tokenizer section and, for one trained here, the corpora it learns
    from (local paths made absolute; weights left out, since it learns from every corpus unweighted), what
    they held (`read`: the fingerprint of each as read, which their files' sizes and times, or a dataset's
    content, decide, so that files corrected in place, or a glob that matches one more, count as other
    corpora) and the seed of its sample; for one given (`train.init_from`, `tokenizer.model`), where it came
    from."""
    if given:
        return {"given": cfg.train.init_from or cfg.tokenizer.model}
    corpora = [{**config_to_dict(spec), "weight": None,
                "path": [p if spec.kind == "hf" else os.path.abspath(p) for p in spec.paths]}
               for spec in cfg.data.train_corpora]
    return {"tokenizer": config_to_dict(cfg.tokenizer), "langs": [cfg.data.src_lang, cfg.data.tgt_lang],
            "train": corpora, "read": read, "seed": cfg.train.seed}


def _write_tokenizer_record(cfg: ExperimentConfig, run_dir: Path, *, given: bool,
                            read: list[str] | None = None) -> None:
    record = json.dumps(_tokenizer_record(cfg, given=given, read=read), indent=1).encode()
    write_atomic(run_dir / TOKENIZER_RECORD, lambda f: f.write(record))


def _restored_tokenizer(cfg: ExperimentConfig, run_dir: Path) -> Tokenizer:
    """The sentencepiece models of a run whose files of them are missing, saved back from its newest readable
    checkpoint, which carries them.

    Raises:
        DataError: no checkpoint of the run can be read.
    """
    names = ["spm.model"] if cfg.tokenizer.joint else ["spm.src.model", "spm.tgt.model"]
    missing = " and ".join(name for name in names if not (run_dir / name).is_file())
    for path in [*reversed(periodic_checkpoints(run_dir)), run_dir / "best.pt"]:
        try:
            state = load_checkpoint(path).get("tokenizer")
        except CheckpointError:
            continue
        if isinstance(state, dict):
            tokenizer = Tokenizer.from_state(state)
            tokenizer.save(run_dir)
            log.warning("%s: %s missing; restored the run's sentencepiece models from %s, which carries them",
                        run_dir, missing, path.name)
            return tokenizer
    raise DataError(f"{run_dir}: its checkpoints were trained with the sentencepiece model{'s' * (len(names) - 1)} "
                    f"{' and '.join(names)} there, and {missing} is missing, nor does a readable checkpoint carry "
                    "them: restore it, or start the run over with --restart")


def _run_tokenizer(cfg: ExperimentConfig, run_dir: Path, *, given: bool, cache: Path) -> Tokenizer | None:
    """The run directory's tokenizer, if this start is to keep it.

    A run that has checkpoints keeps its tokenizer, whatever the config now says: resuming refuses a changed
    tokenizer section (`check_same_model`), and may go on with other corpora; one whose tokenizer files are gone
    takes them back from its checkpoints (`_restored_tokenizer`), never a new one. Without a checkpoint the
    tokenizer is the leftover of a start that failed or was stopped before its first checkpoint, and is kept
    only when it was made exactly as this start would make it (`TOKENIZER_RECORD`); otherwise this start
    makes its own, so that a corrected config (another `tokenizer.vocab_size`, another corpus, a corpus file
    corrected in place) is not trained with the models of the mistaken one.
    """
    tokenizer = Tokenizer.load(run_dir)
    trained = bool(periodic_checkpoints(run_dir)) or (run_dir / "best.pt").exists()
    if tokenizer is None and trained and not given:  # a new one, made now, would not be the one the weights know
        return _restored_tokenizer(cfg, run_dir)
    if tokenizer is None or trained:
        return tokenizer
    try:
        record = json.loads((run_dir / TOKENIZER_RECORD).read_bytes())
    except (OSError, ValueError):
        record = None
    read = None if given else [_read_train(spec, cfg.data, cache)._fingerprint for spec in cfg.data.train_corpora]
    if record == _tokenizer_record(cfg, given=given, read=read):
        log.info("%s: keeping the sentencepiece model an earlier start of this run trained", run_dir)
        return tokenizer
    for path in [*run_dir.glob("spm*.model"), run_dir / TOKENIZER_RECORD]:
        path.unlink(missing_ok=True)
    if not given:
        log.info("%s: an earlier start that made no checkpoint left a tokenizer made otherwise; training a new one",
                 run_dir)
    return None


def _one_after_another(splits: list[Any]) -> Any:
    """One `Dataset` of the rows of `splits` in order (memory-mapped tables are chained, not copied)."""
    return splits[0] if len(splits) == 1 else concatenate_datasets(splits)


def build_sampler(ds, *, max_tokens: int, shuffle: bool, seed: int, rank: int = 0, world_size: int = 1,
                  parts: Sequence[tuple[int, float]] | None = None, rounding: Rounding = Rounding(),
                  order: Literal["longer", "lengths"] = "longer") -> TokenBatchSampler:
    """The token-budget sampler over a tokenized split, its lengths read straight from Arrow (`length_arrays`);
    `parts` weights the corpora the split is made of (`RunData.train_parts`); lengths count as `rounding`
    rounds them up (`Padding.sampler_rounding`); `order` is `train.batch_order`."""
    src_lens, tgt_lens = length_arrays(ds)
    return TokenBatchSampler(src_lens=src_lens, tgt_lens=tgt_lens, max_tokens=max_tokens, shuffle=shuffle, seed=seed,
                             rank=rank, world_size=world_size, parts=parts, rounding=rounding, order=order)


def batch_padding(tc: TrainConfig, device: torch.device, model: ModelConfig | None = None) -> Padding:
    """How training batches are padded on `device`, the `auto` settings resolved; static shapes fill whole
    attention rows where `model` is a Transformer with `attention_pack` (`Padding.pack`).

    `train.batch_shapes` auto means static where CUDA graphs are recorded (`train.cuda_graphs` true,
    which training makes of auto where it applies, or compiled in `reduce-overhead` mode), on CUDA: a
    graph is recorded for each distinct batch shape, and static shapes leave one per length bucket.

    `train.pad_to_multiple` 0 means 8 on CUDA (tensor-core tiles, few shapes), 1 elsewhere.
    `train.length_buckets` auto means relative steps (`Rounding`) with static shapes and no
    `train.compile`: every batch of a static shape is padded to its bucket's length, so the
    buckets' width is what its computation wastes (on Multi30k at 4,096 tokens, 75.8% of the target
    positions computed were real tokens with lengths rounded to a multiple of 8, 89.6% in relative
    steps, for 20 shapes instead of 6: `bench/batch_shapes.py`). Compiling makes each shape cost a
    compilation, so it keeps the coarse buckets, as free shapes do, which pad each batch only to its
    own longest pair.
    """
    multiple = tc.pad_to_multiple or (8 if device.type == "cuda" else 1)
    graphs = tc.cuda_graphs is True or (tc.compile and tc.compile_mode == "reduce-overhead")
    static = tc.batch_shapes == "static" or (tc.batch_shapes == "auto" and graphs and device.type == "cuda")
    relative = multiple > 1 and (tc.length_buckets == "relative"
                                 or (tc.length_buckets == "auto" and static and not tc.compile))
    pack = model.transformer.attention_pack if model is not None and model.type == "transformer" else 0
    return Padding(multiple=multiple, fill_tokens=tc.max_tokens if static else 0, relative=relative,
                   pack=pack if static else 0)


def padding_problem(cfg: ExperimentConfig, device: torch.device) -> str | None:
    """Why a Transformer's batches, padded as `batch_padding` pads them on `device`, could be longer than its
    positions hold, or None: a pair of `data.max_len` tokens is padded to its length bucket."""
    if cfg.model.type != "transformer":
        return None
    positions, max_len, multiple = cfg.model.transformer.max_positions, cfg.data.max_len, cfg.train.pad_to_multiple
    longest = int(batch_padding(cfg.train, device).rounding(max_len))
    if longest <= positions:
        return None
    given = f"train.pad_to_multiple ({multiple})" if multiple else f"train.pad_to_multiple (0: 8 on {device.type})"
    return (f"{given} pads a batch of data.max_len ({max_len}) tokens to {longest} positions, more than "
            f"model.transformer.max_positions ({positions}) holds; lower pad_to_multiple, or raise max_positions "
            f"to {longest}")


def collated_batches(ds, batch_lists: Sequence[list[int]], *, padding: Padding = Padding()) -> Iterator[Batch]:
    """Collated batches for lists of row indices, in this process (ids gathered straight from Arrow)."""
    ids = IdColumns(ds)
    for indices in batch_lists:
        yield collate_flat(*ids.gather(indices), indices, pad_id=PAD_ID, padding=padding)


class _EpochBatches(torch.utils.data.Dataset):
    """Item i is the collated batch of `batch_lists[i]`, so DataLoader workers can build batches."""

    def __init__(self, ds, batch_lists: Sequence[list[int]], padding: Padding) -> None:
        self.ids, self.batch_lists, self.padding = IdColumns(ds), batch_lists, padding

    def __len__(self) -> int:
        return len(self.batch_lists)

    def __getitem__(self, i: int) -> Batch:
        indices = self.batch_lists[i]
        return collate_flat(*self.ids.gather(indices), indices, pad_id=PAD_ID, padding=self.padding)


def batch_loader(ds, batch_lists: Sequence[list[int]], *, num_workers: int = 0, pin_memory: bool = False,
                 padding: Padding = Padding()):
    """A DataLoader yielding the batches in order, built by `num_workers` processes (0: this one)."""
    return torch.utils.data.DataLoader(
        _EpochBatches(ds, batch_lists, padding), batch_size=None, shuffle=False, num_workers=num_workers,
        pin_memory=pin_memory, prefetch_factor=4 if num_workers else None,
        generator=torch.Generator(),  # the loader then draws no seed from the global generator: exact resume
        worker_init_fn=_ignore_interrupts,
    )


def _ignore_interrupts(worker_id: int) -> None:
    """Ctrl-C reaches every process of the terminal's group, and SIGTERM every process of a torchrun worker's
    group (torchrun stops a worker with `killpg`; Slurm's scancel signals every process of the job): workers
    leave both to the training process, which saves a checkpoint and then shuts them down. A worker killed
    by the signal would instead fail the training process's next batch, with no checkpoint. (A worker whose
    training process is gone stops by itself: the DataLoader's workers watch their parent.)"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


