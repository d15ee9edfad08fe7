"""Files written atomically: a crash at any moment leaves the previous good file, never half a new one.

Checkpoints, sentencepiece models, the metrics log and translations of standard
input written with `-o` all go through `write_atomic`: the data goes to a temporary
file in the target's folder, is flushed to disk and renamed over the target.
(Translations of a file go through `nmt.partial`, which a stopped run can resume.)
"""

from __future__ import annotations

import errno
import gzip
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

from nmt.errors import UserError

TMP_PREFIX = ".tmp-"
"""Name prefix of the temporary files; one left by a killed process is removed by `remove_stale_temporaries`."""


def write_atomic(path: str | Path, write: Callable[[BinaryIO], Any]) -> None:
    """Call `write(file)` on a temporary file next to `path`, sync it, and rename it to `path`.

    A crash at any moment leaves either the old file or the new one, never a mix;
    at worst a `.tmp-*` file stays behind, which `remove_stale_temporaries` deletes.
    The file keeps the mode of the one it replaces; a new one gets the mode `open()`
    would give it (0666 less the umask), not the 0600 of a temporary file, so
    colleagues on a shared filesystem can read checkpoints and models.

    Raises:
        UserError: the disk is full (the previous file is left as it was).
    """
    path = Path(path)
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o666 & ~umask()
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if disk_full(err):
            raise disk_full_error(path, "the previous file is unchanged") from None
        raise
    fsync_dir(path.parent)


def write_lines(path: str | Path, lines: Iterable[str]) -> None:
    """`lines` as a UTF-8 text file of one line each, every one ended by '\\n' (no lines: an empty file,
    not one empty line), written atomically (`write_atomic`)."""
    text = "".join(f"{line}\n" for line in lines).encode("utf-8")
    write_atomic(path, lambda f: f.write(text))


def gzip_named(path: str | Path) -> bool:
    """Whether an output file's name says it is gzip-compressed (`out.de.gz`), as `.gz` inputs are decompressed."""
    return str(path).endswith(".gz")


def write_gzip(raw: BinaryIO, write: Callable[[BinaryIO], Any]) -> None:
    """Call `write(file)` on a gzip stream into `raw`, which is left open (`write_atomic`'s file, say)."""
    with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as packed:
        write(packed)


def not_a_file(path: str | Path) -> str | None:
    """What `path` is where it exists but is no regular file to read ("a folder", "a pipe, a socket or a device");
    None for a file or nothing there, so that a message says so rather than "not found"."""
    p = Path(path)
    if p.is_dir():
        return "a folder"
    return "a pipe, a socket or a device" if p.exists() and not p.is_file() else None


def write_problem(folder: str | Path) -> str | None:
    """Why no file can be made in the existing `folder` ("Permission denied", "Read-only file system"), or None. Its
    permissions first, then a file made and removed there: permissions pass everything for root, and say nothing
    of a read-only or virtual file system such as /proc."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return os.strerror(errno.EACCES)
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        return err.strerror or str(err)
    return None


def check_folder_to_write(folder: str | Path, option: str) -> None:
    """Refuse, before any work, an output folder that could not be made or written: a file of its name, a
    file on the way to it, or a nearest existing folder that is not writable.

    Raises:
        UserError: naming `option` (the command-line option that gave the folder) and the folder.
    """
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {folder}: a file, not a folder; give a folder")
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{option} {folder}: {existing} is a file, so no folder can be made there; "
                        f"give another {option}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{option} {folder}: {existing} is not writable; give another {option}")
    # Make it and write in it, then remove the folders made here, so that a refused or failed run leaves none behind.
    made = [p for p in (path.absolute(), *path.absolute().parents) if not p.exists()]  # deepest first
    try:
        path.mkdir(parents=True, exist_ok=True)
        problem = write_problem(path)
    except OSError as err:
        problem = err.strerror
    finally:
        for p in made:
            try:
                p.rmdir()
            except OSError:
                break
    if problem:
        raise UserError(f"{option} {folder}: cannot write there ({problem}); give another {option}")


def remove_stale_temporaries(folder: str | Path) -> None:
    """Remove half-written files left in `folder` by a process killed while writing."""
    for p in Path(folder).glob(f"{TMP_PREFIX}*"):
        p.unlink(missing_ok=True)


def umask() -> int:
    """The process's umask, which new files' modes leave out (`0o666 & ~umask()`)."""
    mask = os.umask(0o022)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def disk_full_error(path: Path, kept: str) -> UserError:
    """The one line for a write of `path` that found the disk full and wrote nothing; `kept` says what is left."""
    free = shutil.disk_usage(path.parent).free
    return UserError(f"{path}: disk full ({free / 2**20:.1f} MiB free there); nothing was written and {kept}: "
                     "free some space or write elsewhere")


def disk_full(err: BaseException | None) -> bool:
    """Whether a write failed for want of space: ENOSPC/EDQUOT on the error or on any error behind it
    (torch.save raises "[enforce fail at inline_container.cc...]" with the OSError as its context)."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def fsync_dir(directory: Path) -> None:
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
