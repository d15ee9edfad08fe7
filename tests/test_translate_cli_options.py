"""`nmt translate` as users drive it: a pipe answered line by line, and the decoding settings reachable from the CLI."""

from __future__ import annotations

import dataclasses
import os
import select
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from nmt.cli import app
from nmt.decode import CHUNK_LINES, Sampling
from nmt.translate import Translator
from nmt.translate_io import translate_io
from tests import test_translate

checkpoints = test_translate.checkpoints  # the fixture: randomly initialised tiny models
sources = test_translate.sources  # eight lines of the toy test set
runner = CliRunner()
LINES = ["the dog runs .", "a cat sleeps on the red mat .", "two men walk ."]


def read_line(stream, timeout: float) -> str | None:
    """One line from `stream` (a pipe), or None if none arrives within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    data = b""
    while time.monotonic() < deadline:
        if select.select([stream], [], [], 0.05)[0]:
            chunk = os.read(stream.fileno(), 1)
            if not chunk:
                return None
            data += chunk
            if chunk == b"\n":
                return data.decode()
    return None


def test_a_pipe_is_answered_line_by_line_without_more_input(checkpoints):
    """Each line written to stdin comes back before the next is sent and before stdin closes."""
    ckpt = str(checkpoints["transformer"])
    expected = Translator.from_checkpoint(ckpt, device="cpu").translate(LINES, beam=1)
    proc = subprocess.Popen([sys.executable, "-m", "nmt", "--quiet", "translate", "-c", ckpt, "--beam", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for line, want in zip(LINES, expected):
            proc.stdin.write((line + "\n").encode())
            proc.stdin.flush()
            got = read_line(proc.stdout, timeout=60)
            assert got == want + "\n", (line, got, proc.stderr.read1() if proc.poll() is not None else "")
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_a_seed_draws_the_same_samples_from_a_file_given_by_name_or_as_standard_input(checkpoints, small_corpus,
                                                                                         tmp_path, monkeypatch):
    """`nmt translate -i FILE --sample --seed 1` and `nmt translate --sample --seed 1 < FILE`: the same samples,
    even with another --max-tokens. A file by name is cut every `Translator.chunk_lines` (8,000 lines on the CPU
    at beam 1), standard input into chunks of at most as many, also where a read of 64 KiB ends, and here of
    2,000 (`CHUNK_LINES`) by the smaller budget: other batches, which drew other samples for nearly every line
    while a seed's draws followed the batches."""
    tr = Translator.from_checkpoint(str(checkpoints["transformer"]), device="cpu")
    options = tr.options(sampling=Sampling(seed=1), max_len_a=0.0, max_len_b=3)
    smaller = dataclasses.replace(options, max_tokens=300)
    assert tr.chunk_lines(options) > CHUNK_LINES == tr.chunk_lines(smaller)
    lines = (small_corpus / "train.en").read_text(encoding="utf-8").splitlines()
    src = tmp_path / "mono.en"
    src.write_text("\n".join((lines * 7)[:2600]) + "\n", encoding="utf-8")  # 2,600 lines, 120 KiB
    translate_io(tr, options, input=str(src), output=str(tmp_path / "by_name.de"))
    with open(src, encoding="utf-8") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        translate_io(tr, smaller, input="-", output=str(tmp_path / "from_stdin.de"))
    by_name = (tmp_path / "by_name.de").read_text(encoding="utf-8").splitlines()
    assert len(by_name) == 2600 and len(set(by_name)) > 100  # samples, not one repeated translation
    assert (tmp_path / "from_stdin.de").read_text(encoding="utf-8").splitlines() == by_name


def test_length_limits_and_minimum_length_from_the_command_line(checkpoints, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("\n".join(LINES) + "\n")
    ckpt = str(checkpoints["transformer"])
    tokenizer = Translator.from_checkpoint(ckpt, device="cpu").tokenizer

    def pieces(*options: str) -> list[int]:
        result = runner.invoke(app, ["--quiet", "translate", "-c", ckpt, "-i", str(src), "--beam", "2", *options])
        assert result.exit_code == 0, result.output
        return [len(tokenizer.encode_tgt([line])[0]) for line in result.stdout.splitlines()]

    assert max(pieces("--max-len-a", "0", "--max-len-b", "2")) <= 2
    assert min(pieces("--min-len", "6", "--max-len-a", "0", "--max-len-b", "9")) >= 6


def test_coverage_penalty_changes_the_ranking_and_needs_attention(checkpoints, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("\n".join(LINES) + "\n")
    tr = Translator.from_checkpoint(str(checkpoints["transformer"]), device="cpu")
    plain = tr.translate_nbest(LINES, beam=3, nbest=3)
    covered = tr.translate_nbest(LINES, beam=3, nbest=3, coverage_penalty=2.0)
    assert [[h.score for h in s] for s in plain] != [[h.score for h in s] for s in covered]
    result = runner.invoke(app, ["translate", "-c", str(checkpoints["transformer"]), "-i", str(src),
                                 "--coverage-penalty", "2.0", "--beam", "3"])
    assert result.exit_code == 0, result.output


def test_coverage_penalty_is_the_gnmt_formula_over_each_hypothesis_whole_attention(checkpoints, small_corpus):
    """The search keeps each row's running coverage, not every step's attention (which it copied whole at every
    step: O(T^2 S) a sentence): the scores equal GNMT's penalty computed here from the attention that
    `attention=True` returns, and the translations those of the search that keeps the whole history."""
    import math

    tr = Translator.from_checkpoint(str(checkpoints["rnn"]), device="cpu")
    lines = (small_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:12]
    options = dict(beam=4, nbest=3, coverage_penalty=0.7, length_penalty=0.6, max_len_a=1.5, max_len_b=4)
    running = tr.translate_nbest(lines, **options)
    whole = tr.translate_nbest(lines, attention=True, **options)
    assert [[h.text for h in n] for n in running] == [[h.text for h in n] for n in whole]
    for h in (h for n in whole for h in n):
        coverage = h.attention.double().sum(dim=0)  # (S,): the steps' weights on each source position, EOS's too
        penalty = 0.7 * sum(math.log(min(max(c, 1e-30), 1.0)) for c in coverage.tolist())
        expected = h.log_prob / ((5 + len(h.tokens) + 1) / 6) ** 0.6 + penalty
        assert h.score == pytest.approx(expected, abs=1e-3)
    assert [h.score for n in running for h in n] == pytest.approx([h.score for n in whole for h in n], abs=1e-4)


def test_sampling_with_nbest_names_nbest_not_a_beam_the_user_never_set(checkpoints, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("the dog .\n")
    result = subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", str(checkpoints["transformer"]),
                             "-i", str(src), "--sample", "--nbest", "2"], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip() == ("nmt: error: --sample draws one translation per line; "
                                     "--nbest (2) must be 1"), result.stderr


def test_printed_nbest_scores_are_the_ranking_scores():
    """Ranking divides by the length penalty, so a longer hypothesis can rank first with a lower
    log-probability; the printed scores follow the ranking."""
    from nmt.decode.beam import length_penalty
    from nmt.translate import Translation
    from nmt.translate_io import format_nbest

    lengths, log_probs = (9, 3), (-6.0, -5.0)  # the longer one: less probable, better per token
    hyps = [Translation(text=f"h{n}", score=lp / length_penalty(n + 1, 1.0), log_prob=lp, tokens=["x"] * n,
                        src_tokens=[]) for n, lp in zip(lengths, log_probs)]
    hyps.sort(key=lambda h: -h.score)
    assert [h.text for h in hyps] == ["h9", "h3"]
    fields = format_nbest(hyps, scores=True).split("\t")
    assert fields[1::2] == ["h9", "h3"]
    assert [float(x) for x in fields[0::2]] == [round(h.score, 4) for h in hyps]
    assert float(fields[0]) > float(fields[2])


def test_a_file_translated_without_a_terminal_writes_no_progress_frames(checkpoints, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("\n".join(LINES) + "\n")
    proc = subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", str(checkpoints["transformer"]),
                           "-i", str(src), "--beam", "1"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr and len(proc.stdout.splitlines()) == len(LINES)
