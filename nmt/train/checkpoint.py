"""Self-describing checkpoints, written atomically.

A checkpoint carries the resolved config and the sentencepiece models next to the
weights, so `translate` and `eval` need nothing else. Training state (optimizer,
scheduler, scaler, random generators, position in the data) rides along so an
interrupted run resumes exactly.

Files are written to a temporary name in the same folder, flushed to disk and
renamed over the target: a crash at any moment leaves the previous good file.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

from nmt.errors import CheckpointError

FORMAT = "nmt-checkpoint-1"
_PERIODIC = re.compile(r"^ckpt_(\d+)\.pt$")
TMP_PREFIX = ".tmp-"


def save_checkpoint(payload: dict[str, Any], path: str | Path) -> None:
    """Atomically write `payload` (plus a format tag) to `path`."""
    write_atomic(path, lambda f: torch.save({"format": FORMAT, **payload}, f))


def write_atomic(path: str | Path, write: Callable[[BinaryIO], Any]) -> None:
    """Call `write(file)` on a temporary file next to `path`, sync it, and rename it to `path`.

    A crash at any moment leaves either the old file or the new one, never a mix;
    at worst a `.tmp-*` file stays behind, which `remove_stale_temporaries` deletes.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint`.

    Raises:
        CheckpointError: the file is missing, truncated, or not an `nmt` checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as err:  # torch raises several types for damaged files
        raise CheckpointError(f"{path}: cannot read checkpoint (truncated or not a torch file: {err})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else None
        what = f"format {found!r}" if found else f"a {type(payload).__name__} without a 'format' entry"
        raise CheckpointError(f"{path}: not an nmt checkpoint (expected format {FORMAT!r}, found {what})")
    return payload


def periodic_checkpoints(run_dir: str | Path) -> list[Path]:
    """`ckpt_<step>.pt` files in `run_dir`, oldest first."""
    found = []
    for p in Path(run_dir).glob("ckpt_*.pt"):
        m = _PERIODIC.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
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


def prune_checkpoints(run_dir: str | Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` periodic checkpoints (best.pt is separate)."""
    found = periodic_checkpoints(run_dir)
    for p in found[: max(0, len(found) - max(keep_last, 1))]:
        p.unlink(missing_ok=True)


def remove_stale_temporaries(run_dir: str | Path) -> None:
    """Remove half-written files left by a process killed while saving."""
    for p in Path(run_dir).glob(f"{TMP_PREFIX}*"):
        p.unlink(missing_ok=True)


def average_checkpoints(paths: list[str | Path]) -> dict[str, Any]:
    """The first checkpoint with its model weights replaced by the mean over all `paths`."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    first = load_checkpoint(paths[0])
    sums = {k: v.double().clone() if v.is_floating_point() else v for k, v in first["model"].items()}
    for path in paths[1:]:
        state = load_checkpoint(path)["model"]
        if state.keys() != sums.keys():
            raise CheckpointError(f"{path}: different parameters from {paths[0]}; cannot average")
        for k, v in state.items():
            if v.is_floating_point():
                sums[k] += v.double()
    model = {k: (v / len(paths)).to(first["model"][k].dtype) if v.is_floating_point() else v for k, v in sums.items()}
    keep = ("config", "tokenizer", "progress", "parameters")
    return {**{k: first[k] for k in keep if k in first}, "model": model, "averaged": [str(p) for p in paths]}


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def model_from_checkpoint(payload: dict[str, Any], device: torch.device | str = "cpu", *, source: str | Path = "checkpoint"):
    """Rebuild (model, tokenizer, config) from a checkpoint payload alone.

    Raises:
        CheckpointError: the stored config or weights do not fit this version of nmt.
    """
    from nmt.config import config_from_dict
    from nmt.data.tokenizer import PAD_ID, Tokenizer
    from nmt.errors import ConfigError
    from nmt.models import build_model

    try:
        cfg = config_from_dict(payload["config"], source=f"{source}: stored config")
        tokenizer = Tokenizer.from_state(payload["tokenizer"])
    except KeyError as err:
        raise CheckpointError(f"{source}: incompatible checkpoint: it has no {err.args[0]!r} entry") from None
    except ConfigError as err:
        raise CheckpointError(f"{err} (a checkpoint of another nmt version?)") from None
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
