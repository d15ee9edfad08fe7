"""Where a new run starts: another run's checkpoint (fine-tuning) or an existing sentencepiece model.

`train.init_from: CHECKPOINT` takes the checkpoint's weights, its `model` and
`tokenizer` sections and its sentencepiece models, so the new run continues the
same network on new data; the optimizer and schedule start afresh.
`tokenizer.model: FILE` brings a sentencepiece model trained elsewhere instead
of training one on the corpus.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nmt.checkpoint import load_checkpoint
from nmt.config import ExperimentConfig, config_from_dict
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from nmt.errors import CheckpointError, ConfigError


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
            or the parent model cannot take this config's data (its position table is shorter than data.max_len).
    """
    if cfg.train.init_from:
        return _from_checkpoint(cfg, Path(cfg.train.init_from))
    if cfg.tokenizer.model:
        return Start(cfg, tokenizer=_sentencepiece_file(Path(cfg.tokenizer.model)))
    return Start(cfg)


def _from_checkpoint(cfg: ExperimentConfig, path: Path) -> Start:
    payload = load_checkpoint(path)
    where = f"train.init_from: {path}"
    try:
        parent = config_from_dict(payload["config"], source=f"{path}: stored config")
        tokenizer = Tokenizer.from_state(payload["tokenizer"])
        weights: dict[str, Any] = payload["model"]
    except KeyError as err:
        raise CheckpointError(f"{where}: incompatible checkpoint: it has no {err.args[0]!r} entry") from None
    except ConfigError as err:
        raise CheckpointError(f"{where}: {err} (a checkpoint of another nmt version?)") from None
    try:
        cfg = dataclasses.replace(cfg, model=parent.model, tokenizer=parent.tokenizer)
    except ValueError as err:
        raise ConfigError(f"{where}: the parent model does not fit this config: {err}") from None
    return Start(cfg, tokenizer=tokenizer, weights=weights)


def _sentencepiece_file(path: Path) -> Tokenizer:
    where = f"tokenizer.model: {path}"
    if not path.is_file():
        raise ConfigError(f"{where}: file not found")
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
