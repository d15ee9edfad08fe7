"""Self-describing checkpoints, written atomically.

A checkpoint carries the resolved config and the sentencepiece models next to the
weights, so `translate` and `eval` need nothing else. Training state (optimizer,
scheduler, scaler, random generators, position in the data) rides along so an
interrupted run resumes exactly.

Files are written with `nmt.fileio.write_atomic`: a crash at any moment leaves
the previous good file.
"""

from __future__ import annotations

import logging
import pickle
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy 1
    from numpy.core.multiarray import _reconstruct

from nmt.config import ExperimentConfig, config_from_dict
from nmt.data.tokenizer import PAD_ID, Tokenizer
from nmt.errors import CheckpointError, ConfigError, headline
from nmt.fileio import not_a_file, write_atomic
from nmt.models import build_model

log = logging.getLogger(__name__)

FORMAT = "nmt-checkpoint-1"

_OLD_RNG_GLOBALS: list[Any] = [
    _reconstruct,
    (_reconstruct, "numpy.core.multiarray._reconstruct"),  # its name under numpy 1
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),  # numpy.dtypes.UInt32DType
]
"""The only globals `torch.load(weights_only=True)` may build beyond tensors and plain data:
checkpoints of earlier versions hold numpy's random state, `np.random.get_state()`, whose
keys are a uint32 ndarray. Newer checkpoints keep it as a tensor (`runtime.rng_states`)."""
_PERIODIC = re.compile(r"^ckpt_(\d+)\.pt$")


def save_checkpoint(payload: dict[str, Any], path: str | Path) -> None:
    """Atomically write `payload` (plus a format tag) to `path`."""
    write_atomic(path, lambda f: torch.save({"format": FORMAT, **payload}, f))


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint`.

    Raises:
        CheckpointError: the file is missing, truncated, or not an `nmt` checkpoint.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path}: is a folder, not a checkpoint; give a .pt file in it (e.g. best.pt)")
    if kind := not_a_file(path):
        raise CheckpointError(f"{path}: {kind}, not a checkpoint file")
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    if not_torch := _not_a_torch_file(path):
        raise CheckpointError(f"{path}: not a checkpoint: {not_torch}")
    try:
        with torch.serialization.safe_globals(_OLD_RNG_GLOBALS):
            payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises several types for damaged files
        if isinstance(err, pickle.UnpicklingError) and "Weights only load failed" in str(err):
            # weights_only met a class or function it does not allow: refused before anything of it ran
            found = re.search(r"GLOBAL (\S+)|got <class '([^']+)'>", str(err))
            what = f" ({found.group(1) or found.group(2)})" if found else ""
            raise CheckpointError(f"{path}: not an nmt checkpoint: it holds Python objects{what}, not only tensors "
                                  "and plain data; refused unread, since loading them could run code") from None
        raise CheckpointError(f"{path}: cannot read checkpoint (truncated or not a torch file: {err})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else None
        what = f"format {found!r}" if found else f"a {type(payload).__name__} without a 'format' entry"
        raise CheckpointError(f"{path}: not an nmt checkpoint (expected format {FORMAT!r}, found {what})")
    return payload


def _not_a_torch_file(path: Path) -> str | None:
    """What `path` is where its first bytes say it is no torch file (a zip archive, or an old torch file's
    pickle), else None: a Git LFS pointer or a web page saved under a checkpoint's name is named so, where
    torch's own error spoke of Python objects or gave a number."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if not head:
        return "an empty file (an interrupted copy?)"
    if head.startswith(b"PK\x03\x04") or head.startswith(b"\x80\x02"):  # torch.save's zip, or its legacy pickle
        return None
    if head.startswith(b"\x80") and len(head) > 1:  # Python's pickle.dump (protocol 3 and up), not torch.save
        return f"a Python pickle (protocol {head[1]}), not a file torch.save wrote"
    if head.startswith(b"version https://git-lfs.github.com/spec/"):
        return "a Git LFS pointer, not the file it stands for; fetch the file (git lfs pull)"
    text = head.lstrip().lower()
    if text.startswith((b"<!doctype html", b"<html")):
        return "a web page, not a torch file (a download that fetched a page instead of the file?)"
    return "not a torch file (it starts with neither a zip archive's nor a pickle's bytes)"


def periodic_step(path: str | Path) -> int | None:
    """The step of a periodic checkpoint's name (`ckpt_<step>.pt`), or None for another name."""
    m = _PERIODIC.match(Path(path).name)
    return int(m.group(1)) if m else None


def periodic_checkpoints(run_dir: str | Path) -> list[Path]:
    """`ckpt_<step>.pt` files in `run_dir`, oldest first."""
    found = [(step, p) for p in Path(run_dir).glob("ckpt_*.pt") if (step := periodic_step(p)) is not None]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = periodic_checkpoints(run_dir)
    return found[-1] if found else None


def last_checkpoints(run_dir: str | Path, n: int, *, exact: bool = False) -> list[Path]:
    """The newest `n` periodic checkpoints of `run_dir` (fewer if it has fewer), oldest first.

    Raises:
        CheckpointError: `run_dir` holds none, or fewer than `n` when `exact`.
    """
    found = periodic_checkpoints(run_dir)
    if not found or (exact and len(found) < n):
        raise CheckpointError(f"{run_dir}: {len(found)} periodic checkpoints (ckpt_<step>.pt), {n} wanted; "
                              f"train.keep_last sets how many a run keeps")
    return found[-n:] if n > 0 else []


def prune_checkpoints(run_dir: str | Path, keep_last: int, *, spare: Path | None = None) -> None:
    """Delete all but the newest `keep_last` periodic checkpoints (best.pt is separate).

    `spare`, a checkpoint written off the save schedule (where training stopped), is kept and not
    counted, so that it takes no scheduled checkpoint's place; it is then the newest one that
    `keep_last: 0` keeps all the same.
    """
    found = [p for p in periodic_checkpoints(run_dir) if spare is None or p.name != spare.name]
    keep = keep_last if spare is not None else max(keep_last, 1)
    for p in found[: max(0, len(found) - keep)]:
        p.unlink(missing_ok=True)


def average_checkpoints(paths: list[str | Path]) -> dict[str, Any]:
    """The first checkpoint with its model weights replaced by the mean over all `paths`, and the progress
    of the last (the newest, where `paths` run oldest first: the step the average stands for).

    Each checkpoint is checked against the first before its weights are added: the
    same `model` config, the same sentencepiece models and the same parameter
    shapes. A file given twice is refused, since it would silently count double.
    Checkpoints of one model whose weights differ in layout (a run resumed by a newer
    nmt, whose model merged parameters the older one kept apart) are averaged in this
    version's layout, each upgraded as loading it into the model does.

    Raises:
        CheckpointError: no paths, a path given twice, or a checkpoint that does not fit the first.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    refuse_duplicates(paths, "average")
    try:
        return _average(paths, upgrade=False)
    except _LayoutsDiffer:
        return _average(paths, upgrade=True)


class _LayoutsDiffer(Exception):
    """Two checkpoints of one model hold its weights in different layouts."""


def _average(paths: list[str | Path], *, upgrade: bool) -> dict[str, Any]:
    """`average_checkpoints`, with every checkpoint's weights in this version's layout if `upgrade`.

    Raises:
        _LayoutsDiffer: not `upgrade`, and two checkpoints of one model name different parameters.
    """
    def load(path: str | Path) -> dict[str, Any]:
        payload = load_checkpoint(path)
        _check_weights(payload, path)
        if upgrade:
            model, _, _ = model_from_checkpoint(payload, source=path)
            payload = {**payload, "model": model.state_dict()}
        # what an average carries: the optimizer's moments (twice the weights, with Adam) need not stay in memory
        return {k: payload[k] for k in ("config", "tokenizer", "progress", "parameters", "model") if k in payload}

    first = last = load(paths[0])
    sums = {k: v.double().clone() if v.is_floating_point() else v for k, v in first["model"].items()}
    for path in paths[1:]:
        payload = last = load(path)
        if (not upgrade and payload["model"].keys() != first["model"].keys()
                and payload.get("config", {}).get("model") == first.get("config", {}).get("model")
                and payload.get("tokenizer") == first.get("tokenizer")):
            raise _LayoutsDiffer
        check_averageable(first, payload, first_path=paths[0], path=path)
        state = payload["model"]
        for k, v in state.items():
            if v.is_floating_point():
                sums[k] += v.double()
    model = {k: (v / len(paths)).to(first["model"][k].dtype) if v.is_floating_point() else v for k, v in sums.items()}
    keep = ("config", "tokenizer", "parameters")
    return {**{k: first[k] for k in keep if k in first}, **({"progress": last["progress"]} if "progress" in last else {}),
            "model": model, "averaged": [str(p) for p in paths]}


def check_averageable(first: dict[str, Any], other: dict[str, Any], *, first_path: str | Path, path: str | Path) -> None:
    """Refuse to average `other` (read from `path`) with `first` unless they are one model.

    Raises:
        CheckpointError: naming both files and the first thing that differs.
    """
    where = f"{first_path} and {path}"  # in the order of each difference's "A vs B"
    difference = first_difference(first.get("config", {}).get("model"), other.get("config", {}).get("model"), "model")
    if difference:
        raise CheckpointError(f"{where}: different model configs ({difference}); "
                              "only checkpoints of one model can be averaged")
    if first.get("tokenizer") != other.get("tokenizer"):
        raise CheckpointError(f"{where}: different sentencepiece models; only checkpoints of one run can be averaged")
    # a joint vocabulary is the same for both directions of a language pair: only the configs tell them apart
    pairs = [tuple(c.get("config", {}).get("data", {}).get(k) for k in ("src_lang", "tgt_lang")) for c in (first, other)]
    if pairs[0] != pairs[1]:
        (a, b), (c, d) = pairs
        raise CheckpointError(f"{where}: translate {a}->{b} vs {c}->{d} (data.src_lang and data.tgt_lang); only "
                              "checkpoints of one direction can be averaged")
    mine, theirs = first["model"], other["model"]
    if mine.keys() != theirs.keys():
        extra = sorted(theirs.keys() - mine.keys()) or sorted(mine.keys() - theirs.keys())
        raise CheckpointError(f"{where}: different parameters (such as {extra[0]!r}); cannot average")
    for k, v in theirs.items():
        if v.shape != mine[k].shape:
            raise CheckpointError(f"{where}: {k} has shape {tuple(mine[k].shape)} vs {tuple(v.shape)}; cannot average")


def first_difference(a: Any, b: Any, key: str) -> str | None:
    """`"key.path: A vs B"` for the first place where the plain data `a` and `b` differ, else None; a `type`
    key first, as the sections of the other types differ only because the types do."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(a.keys() | b.keys(), key=lambda k: (k != "type", str(k))):
            found = first_difference(a.get(k), b.get(k), f"{key}.{k}")
            if found:
                return found
        return None
    return None if a == b else f"{key}: {a!r} vs {b!r}"


def refuse_duplicates(paths: Sequence[str | Path], use: str) -> None:
    """Refuse a checkpoint given twice (by another name, a link to it included), which would count double in the
    `use` ("average", "ensemble").

    Raises:
        CheckpointError: naming both names.
    """
    seen: dict[object, Path] = {}  # each path by what it is: its file (device, inode), else its resolved name
    for path in map(Path, paths):
        try:
            st = path.stat()
            keys: list[object] = [(st.st_dev, st.st_ino), path.resolve()]
        except OSError:  # missing: loading it says so
            keys = [path.resolve()]
        earlier = next((seen[k] for k in keys if k in seen), None)
        if earlier is not None:
            raise CheckpointError(f"{path}: given twice (also as {earlier}); it would count double in the {use}")
        seen.update(dict.fromkeys(keys, path))


_SET_ASIDE = {
    "decode": "its decode section is set aside, and the default search settings apply (give yours on the command line)",
    "eval": "its eval section is set aside, and scores use the default eval settings",
}


def stored_config(raw: Any, source: str | Path) -> ExperimentConfig:
    """A checkpoint's config. A `decode` or `eval` section this version refuses (a range narrowed since the
    checkpoint was written) gives way to the defaults, with a warning: search and scoring settings are not
    part of the model, and refusing the whole checkpoint for them would leave it unusable. (An
    `eval.tokenize` whose extra is not installed here is no refusal: the model translates, and scoring
    says what to install.)

    Raises:
        ConfigError: anything else in the config that this version refuses.
    """
    where = f"{source}: stored config"
    try:
        return config_from_dict(raw, source=where)
    except ConfigError as err:
        if not isinstance(raw, dict):
            raise
        for aside in (("decode",), ("eval",), ("decode", "eval")):  # the fewest sections set aside
            if not all(raw.get(k) for k in aside):
                continue
            try:
                cfg = config_from_dict({**raw, **{k: {} for k in aside}}, source=where)
            except ConfigError:
                continue
            log.warning("%s; %s", err, "; ".join(_SET_ASIDE[k] for k in aside))
            return cfg
        raise


def _check_weights(payload: dict[str, Any], source: str | Path) -> None:
    """Refuse a checkpoint whose `model` entry is missing or is not weights by name.

    Raises:
        CheckpointError: naming `source` and what the entry is.
    """
    weights = payload.get("model")
    if "model" not in payload:
        raise CheckpointError(f"{source}: incompatible checkpoint: it has no 'model' entry")
    if not isinstance(weights, Mapping) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        what = type(weights).__name__ if not isinstance(weights, Mapping) else "a mapping of more than tensors"
        raise CheckpointError(f"{source}: its 'model' entry is {what}, not the weights by name nmt saves")


def model_from_checkpoint(payload: dict[str, Any], device: torch.device | str = "cpu", *, source: str | Path = "checkpoint"):
    """Rebuild (model, tokenizer, config) from a checkpoint payload alone.

    Raises:
        CheckpointError: the stored config or weights do not fit this version of nmt.
    """
    try:
        cfg = stored_config(payload["config"], source)
        tokenizer = Tokenizer.from_state(payload["tokenizer"])
    except KeyError as err:
        raise CheckpointError(f"{source}: incompatible checkpoint: it has no {err.args[0]!r} entry") from None
    except ConfigError as err:
        raise CheckpointError(f"{err} (a checkpoint of another nmt version?)") from None
    except (TypeError, AttributeError, ValueError, RuntimeError) as err:  # sentencepiece's own errors included
        raise CheckpointError(f"{source}: its 'tokenizer' entry is not the sentencepiece models nmt saves "
                              f"({type(err).__name__}: {headline(err)[:200]})") from None
    _check_weights(payload, source)
    model = build_model(
        cfg.model, src_vocab_size=tokenizer.src_vocab_size, tgt_vocab_size=tokenizer.tgt_vocab_size, pad_id=PAD_ID
    )
    try:
        model.load_state_dict(payload["model"])
    except KeyError as err:
        raise CheckpointError(f"{source}: incompatible checkpoint: it has no {err.args[0]!r} entry") from None
    except RuntimeError as err:  # torch lists every mismatch, one per line after a heading
        details = [line.strip() for line in str(err).strip().splitlines()[1:]] or [str(err)]
        more = f"; and {len(details) - 1} more" if len(details) > 1 else ""
        raise CheckpointError(
            f"{source}: weights do not fit the model its config describes: {details[0][:300].rstrip('.')}{more}"
        ) from None
    return model.to(device), tokenizer, cfg
