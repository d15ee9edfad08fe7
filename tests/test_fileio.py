"""Atomic writes: the file modes they leave (the umask's, as `open()` gives), through the library and `nmt train`."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from nmt.data.text import read_lines
from nmt.errors import UserError
from nmt.fileio import check_folder_to_write, write_atomic, write_lines


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_gets_the_mode_open_would_give_it(tmp_path):
    for mask in (0o022, 0o027, 0o077):
        with umask(mask):
            path = tmp_path / f"new-{mask:o}.bin"
            write_atomic(path, lambda f: f.write(b"data"))
            plain = tmp_path / f"plain-{mask:o}.bin"
            plain.write_bytes(b"data")
        assert mode(path) == mode(plain) == 0o666 & ~mask
        assert path.read_bytes() == b"data"


def test_a_replaced_file_keeps_its_mode(tmp_path):
    path = tmp_path / "kept.txt"
    path.write_bytes(b"old")
    path.chmod(0o640)
    with umask(0o022):
        write_atomic(path, lambda f: f.write(b"new"))
    assert mode(path) == 0o640 and path.read_bytes() == b"new"


def test_checkpoints_and_sentencepiece_models_follow_the_umask(tiny_config_file, tmp_path):
    """Colleagues on a shared filesystem read what `nmt train` wrote, as far as the umask allows."""
    proc = subprocess.run([sys.executable, "-m", "nmt", "--quiet", "train", str(tiny_config_file),
                           "--set", "train.max_steps=2", "--set", "train.valid_bleu=false"],
                          capture_output=True, text=True, preexec_fn=lambda: os.umask(0o027))
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "run"
    written = [run / "best.pt", run / "ckpt_2.pt", run / "spm.model", run / "config.yaml"]
    assert {p.name: mode(p) for p in written} == {p.name: 0o640 for p in written}


def test_a_file_of_lines_ends_each_with_a_newline_and_of_no_lines_is_empty(tmp_path):
    """The translations `nmt eval` and `nmt experiment` write: no lines is an empty file, not one empty line."""
    write_lines(tmp_path / "none.hyp", [])
    assert (tmp_path / "none.hyp").read_bytes() == b"" and read_lines(tmp_path / "none.hyp") == []
    write_lines(tmp_path / "some.hyp", ["ein Hund", "", "grün"])
    assert (tmp_path / "some.hyp").read_bytes() == "ein Hund\n\ngrün\n".encode()
    assert read_lines(tmp_path / "some.hyp") == ["ein Hund", "", "grün"]


def test_check_folder_to_write_leaves_no_folder_and_refuses_where_nothing_can_be_made(tmp_path):
    # Root passes every permission check: `nmt experiment --results /proc/x` trained, then failed to write its
    # results with "FileNotFoundError" and exit 1.
    check_folder_to_write(tmp_path / "a" / "b", "--results")
    assert list(tmp_path.iterdir()) == []  # the probe's folders are gone again
    (tmp_path / "kept").mkdir()
    check_folder_to_write(tmp_path / "kept", "--results")
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]
    with pytest.raises(UserError, match=r"^--results /proc/nmt-x: .*; give another --results$"):
        check_folder_to_write("/proc/nmt-x", "--results")
