"""Where a new run starts: another run's checkpoint (fine-tuning) or an existing sentencepiece model.

`train.init_from: CHECKPOINT` takes the checkpoint's weights, its `model` and
`tokenizer` sections and its sentencepiece models, so the new run continues the
same network on new data; the optimizer and schedule start afresh.
`tokenizer.model: FILE` brings a sentencepiece model trained elsewhere instead
of training one on the corpus.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nmt.checkpoint import load_checkpoint, model_from_checkpoint
from nmt.config import ExperimentConfig, TokenizerConfig, config_to_dict
from nmt.data.textfiles import path_hint
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from nmt.errors import CheckpointError, ConfigError
from nmt.fileio import not_a_file
from nmt.launch import is_main_process

log = logging.getLogger(__name__)


@dataclass
class Start:
    """What a new run begins with.

    Attributes:
        cfg: the run's config; with `init_from`, its model and tokenizer sections are the parent's.
        tokenizer: sentencepiece models to use instead of training them (None: train).
        weights: model state to start from (None: random initialisation).
    """

    cfg: ExperimentConfig
    tokenizer: Tokenizer | None = None
    weights: dict[str, torch.Tensor] | None = None


def starting_point(cfg: ExperimentConfig) -> Start:
    """The config, tokenizer and weights a run of `cfg` starts from (see the module docstring).

    Raises:
        CheckpointError: `train.init_from` is missing or not an nmt checkpoint.
        ConfigError: `tokenizer.model` is missing or not a compatible sentencepiece model,
            or the parent model cannot take this config's data (its position table is shorter than data.max_len)
            or search (a coverage penalty without attention, output lengths beyond its positions).
    """
    if cfg.train.init_from:
        return _from_checkpoint(cfg, Path(cfg.train.init_from))
    if cfg.tokenizer.model:
        tokenizer = _sentencepiece_file(Path(cfg.tokenizer.model))
        default = TokenizerConfig()
        unused = [f"tokenizer.{key}: {getattr(cfg.tokenizer, key)!r}" for key in TokenizerConfig.TRAINING_KEYS
                  if getattr(cfg.tokenizer, key) != getattr(default, key)]
        if unused and is_main_process():
            log.warning("tokenizer.model: %s (%d pieces) is the tokenizer, so %s %s not used", cfg.tokenizer.model,
                        tokenizer.src_vocab_size, "; ".join(unused), "is" if len(unused) == 1 else "are")
        return Start(cfg, tokenizer=tokenizer)
    return Start(cfg)


def _from_checkpoint(cfg: ExperimentConfig, path: Path) -> Start:
    where = f"train.init_from: {path}"
    try:
        payload = load_checkpoint(path)
    except CheckpointError as err:  # "PATH: checkpoint not found" alone did not say which setting named PATH
        hint = "" if path.exists() else path_hint(str(path))  # an unset variable, or the working directory
        raise CheckpointError(f"train.init_from: {err}{hint}") from None
    # the parent's model rebuilt now: weights that do not fit its config are named before any data is read,
    # and its search and scoring settings, which fine-tuning does not take, may be of another nmt version
    model, tokenizer, parent = model_from_checkpoint(payload, "cpu", source=where)
    weights: dict[str, Any] = model.state_dict()
    del model
    if cfg.written is not None and "model.type" in cfg.written and cfg.model.type != parent.model.type:
        raise ConfigError(f"{where}: the parent's model.type is {parent.model.type!r}, and this config's "
                          f"{cfg.model.type!r}; fine-tuning goes on with the parent's model: remove model.type, or "
                          f"choose a parent of that type")
    unused = [*_set_aside("model", cfg.model, parent.model, cfg.written),
              *_set_aside("tokenizer", cfg.tokenizer, parent.tokenizer, cfg.written)]
    if unused and is_main_process():  # every rank reads the parent; one says so
        log.warning("%s: the model and tokenizer are the parent's, so this config's %s %s not used", where,
                    "; ".join(unused), "is" if len(unused) == 1 else "are")
    pair, parents = (cfg.data.src_lang, cfg.data.tgt_lang), (parent.data.src_lang, parent.data.tgt_lang)
    if pair != parents and is_main_process():  # another pair or direction may be meant (a related language); said
        log.warning("%s translates %s-%s, this config %s-%s: the parent's encoder learned to read %s and its decoder "
                    "to write %s; if that is not meant, set data.src_lang and data.tgt_lang or choose another "
                    "parent", where, *parents, *pair, parents[0], parents[1])
    if cfg.decode.coverage_penalty > 0 and not parent.model.has_attention:
        raise ConfigError(f"{where}: decode.coverage_penalty ({cfg.decode.coverage_penalty:g}) needs attention "
                          f"weights, and the parent model has no attention (its model.rnn.decoder is 'none'): set "
                          "decode.coverage_penalty to 0, or fine-tune a model with attention")
    try:
        cfg = dataclasses.replace(cfg, model=parent.model, tokenizer=parent.tokenizer)
    except ValueError as err:
        raise ConfigError(f"{where}: the parent model does not fit this config: {err}") from None
    problem = cfg.training_problem()  # those the parent's model decides (decode lengths against its positions)
    if problem is not None:
        raise ConfigError(f"{where}: the parent model does not fit this config: {problem}")
    return Start(cfg, tokenizer=tokenizer, weights=weights)


def _set_aside(section: str, given: Any, parent: Any, written: frozenset[str] | None = None) -> list[str]:
    """`section.key: value (the parent's: value)` for each key that the config sets to a value other than the
    parent's: a setting fine-tuning leaves unused. A key counts as set where the config's source wrote it
    (`written`, its default value included); where that is unknown, where its value is not the default.
    (Keys left out are not named: a fine-tuning config may leave the section out.)"""
    default = type(given)()

    def walk(mine: dict, theirs: dict, base: dict, prefix: str) -> list[str]:
        out = []
        for key, value in mine.items():
            path = f"{prefix}.{key}"
            if isinstance(value, dict):
                out += walk(value, theirs[key], base[key], path)
            elif value != theirs[key] and (path in written if written is not None else value != base[key]):
                out.append(f"{path}: {value!r} (the parent's: {theirs[key]!r})")
        return out

    return walk(config_to_dict(given), config_to_dict(parent), config_to_dict(default), section)


def _sentencepiece_file(path: Path) -> Tokenizer:
    where = f"tokenizer.model: {path}"
    if kind := not_a_file(path):
        raise ConfigError(f"{where}: {kind}, not a sentencepiece model file")
    if not path.is_file():
        raise ConfigError(f"{where}: file not found{path_hint(str(path))}")
    try:
        tokenizer = Tokenizer(src_model=path.read_bytes())
    except (RuntimeError, OSError) as err:
        raise ConfigError(f"{where}: not a sentencepiece model ({str(err).strip()[:200]})") from None
    spm = tokenizer.src
    found = {"pad": spm.pad_id(), "unk": spm.unk_id(), "bos": spm.bos_id(), "eos": spm.eos_id()}
    wanted = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}
    if found != wanted:
        ids = ", ".join(f"{k} {v}" for k, v in found.items())
        raise ConfigError(f"{where}: special ids are {ids}, but nmt needs pad 0, unk 1, bos 2, eos 3; train it with "
                          "--pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3, or leave tokenizer.model empty to train one")
    return tokenizer
