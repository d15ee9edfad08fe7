"""The drivers of `nmt translate`: a file, a pipe or a terminal in; a file or standard output out.

`translate_io` is the command: it checks the input (UTF-8, every line) before the
model runs, answers a pipe line by line as lines arrive, and prompts on a terminal
(`interactive`). An output file is never the input (`check_output`) and never half
written: from a file, the lines go through `nmt.partial`, which a stopped run resumes;
from standard input, through `write_output` (whole or not at all).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import count, islice
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from tqdm import tqdm

from nmt.data.text import (
    READ_ERRORS,
    available_lines,
    decode_lines,
    normalize_spaces,
    open_binary,
    read_problem,
)
from nmt.decode import SearchOptions
from nmt.errors import UserError, reader_may_leave
from nmt.fileio import disk_full, gzip_named, write_atomic, write_gzip, write_problem
from nmt.partial import reports_a_stop, resumable_output
from nmt.plot import plot_attention
from nmt.translate import Translation, Translator

log = logging.getLogger(__name__)

_SEARCH_FIELDS = frozenset(f.name for f in dataclasses.fields(SearchOptions))


def translate_io(translator: Translator, options: SearchOptions, *, input: str = "-", output: str = "-",
                 scores: bool = False, plot_dir: str | Path | None = None, progress: bool | None = None,
                 restart: bool = False) -> int:
    """`nmt translate`: translate `input` (a file, or "-" for standard input) into `output` ("-": standard output).

    A file (a `.gz` one decompressed) is read twice: once to check all of it (UTF-8) and count its lines before
    anything is translated, then to translate it. Standard input from a terminal is
    translated line by line as it is typed (`interactive`); from a pipe, every line is
    answered as soon as it has arrived, so `nmt translate` can serve as a helper process.

    An output file is never half written. From an input file, the lines go to
    `output.partial` as they are translated, and become `output` when all are done; a
    run that is stopped leaves them there, and the same command goes on after them
    (`nmt.partial`; `restart` discards them). From standard input, the output is
    written whole or not at all (`write_output`).

    Args:
        progress: a progress bar on stderr; None: for an input file, when stderr is a
            terminal and the log level shows information.
        restart: translate from the first line even if a stopped run left some lines.

    Returns:
        The number of lines translated by this call.

    Raises:
        UserError: an input or output that `check_io` refuses, bad input text, or a partial
            output of another input, checkpoint or search settings.
    """
    check_io(input, output)
    if input == "-" or is_stream(input):
        with contextlib.ExitStack() as opened:
            raw = sys.stdin.buffer if input == "-" else opened.enter_context(open(input, "rb"))
            name = "<stdin>" if input == "-" else input
            if output == "-":
                with _standard_output() as out:
                    return _translate_stream(translator, options, raw, name, out, scores=scores, plot_dir=plot_dir,
                                             progress=progress)
            written = 0

            def run(dst: TextIO) -> None:
                nonlocal written
                written = _translate_stream(translator, options, raw, name, dst, scores=scores, plot_dir=plot_dir,
                                            progress=progress)

            write_output(output, run)  # all or nothing: renamed over `output` once complete
            return written
    with reports_a_stop(input, output), open_binary(input) as raw:
        try:
            total = sum(1 for _ in decode_lines(raw, input))  # checks all of it before any translation
            raw.seek(0)
        except READ_ERRORS as err:  # a damaged or cut-short .gz
            raise UserError(read_problem(input, err)) from None
        show = progress if progress is not None else (
            sys.stderr.isatty() and logging.getLogger().getEffectiveLevel() <= logging.INFO)

        def translate_file(dst: TextIO, done: int = 0) -> int:
            return translate_lines(translator, islice(decode_lines(raw, input), done, None), dst, options,
                                   progress=show, total=total, first_line=done + 1, scores=scores, plot_dir=plot_dir)

        if output == "-":
            with _standard_output() as out:
                return translate_file(out)
        job = translation_job(translator, options, input=input, scores=scores)
        with resumable_output(output, job, restart=restart) as part:
            return translate_file(part.file, part.done)


@contextmanager
def _standard_output() -> Iterator[TextIO]:
    """Standard output, whose full disk (`> /dev/full`, a full file system) is one line, as for a file's, and
    whose reader going away (`| head`) is `OutputClosed`."""
    try:
        with reader_may_leave():
            yield sys.stdout
    except OSError as err:
        if disk_full(err):
            raise UserError("standard output: disk full; the translations before it were written: free some space "
                            "or write elsewhere") from None
        raise


def is_stream(path: str) -> bool:
    """Whether `path` names a pipe or a device (`-i <(zcat doc.gz)`, `/dev/stdin`): read once, as it comes, as
    standard input is; a regular file is read twice and can be resumed (`translate_io`)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _translate_stream(translator: Translator, options: SearchOptions, raw: BinaryIO, name: str, dst: TextIO, *,
                      progress: bool | None, **write: Any) -> int:
    """Standard input or another stream: line by line from a terminal (with prompts); from a pipe, each line
    answered once it has arrived, in chunks of at most the lines a file's chunk holds (`Translator.chunk_lines`), so
    that a file given as standard input is translated in a file's batches."""
    if raw is sys.stdin.buffer and sys.stdin.isatty():
        return interactive(translator, raw, dst, sys.stderr, options, name=name, **write)
    chunks = available_lines(raw, name, max_lines=translator.chunk_lines(options))
    return write_translations(translator, chunks, dst, options, flush=dst is sys.stdout, progress=bool(progress),
                              **write)


def translation_job(translator: Translator, options: SearchOptions, *, input: str | Path, scores: bool) -> dict:
    """What the output lines of translating file `input` depend on, to tell whether a partial output is this job's.

    The batch budget, the device and the attention settings are left out: they do not
    change the text (the GPU's fp32 outputs are the CPU's), a seeded sample's included:
    its draws are keyed by the line's number, which a resumed run goes on counting
    (`first_line`), so it writes what an uninterrupted run writes.
    """
    search_settings = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)
                       if f.name not in ("max_tokens", "cached", "sync_every", "attention")}
    if not isinstance(options.strategy, str):
        search_settings["strategy"] = type(options.strategy).__name__
    if options.sampling is not None:
        search_settings["sampling"] = dataclasses.asdict(options.sampling)
    return {"input": file_identity(input), "checkpoints": [file_identity(p) for p in translator.checkpoints],
            "precision": translator.precision, "search": search_settings, "scores": scores}


def file_identity(path: str | Path) -> dict[str, Any]:
    """A file's real path, size and modification time: a changed file shows in one of them."""
    st = os.stat(path)
    return {"path": os.path.realpath(path), "bytes": st.st_size, "modified_ns": st.st_mtime_ns}


def check_io(input: str, output: str, checkpoints: Sequence[str | Path] = ()) -> None:
    """Refuse a missing input file, and an output that `check_output` refuses or that is one of the
    `checkpoints` translated with; before any model loads.

    Raises:
        UserError: naming the file and what to do.
    """
    if input == "-" and sys.stdin is None:  # `nmt translate <&-`
        raise UserError("standard input is closed: give an input file with -i")
    if output == "-" and sys.stdout is None:  # `nmt translate -i doc.txt >&-`
        raise UserError("standard output is closed: give an output file with -o")
    if input != "-" and Path(input).is_dir():
        raise UserError(f"{input}: a folder, not an input file")
    if input != "-" and not Path(input).is_file() and not is_stream(input):
        raise UserError(f"{input}: input file not found")
    if input != "-" and Path(input).is_file():  # a pipe is opened once, to be read
        try:
            open(input, "rb").close()
        except OSError as err:
            raise UserError(f"{input}: cannot read the input file ({err.strerror})") from None
    if output != "-":
        check_output(output, None if input == "-" else input)  # never overwrite the input
        refuse_overwriting(output, checkpoints, "the checkpoint", "translating")


def translate_lines(
    translator: Translator, lines: Iterable[str], out: TextIO, options: SearchOptions | None = None, *,
    chunk_size: int | None = None, **kwargs: Any,
) -> int:
    """Translate `lines`, `chunk_size` at a time (default: `Translator.chunk_lines`), writing one output
    line per input line to `out`.

    `kwargs` are those of `write_translations` and search overrides (`Translator.options`).
    Returns the number of lines written.
    """
    opts = translator.options(options, **{k: kwargs.pop(k) for k in list(kwargs) if k in _SEARCH_FIELDS})
    size = translator.chunk_lines(opts) if chunk_size is None else chunk_size
    if size < 1:
        raise UserError(f"chunk_size ({size}) must be at least 1")
    it = iter(lines)
    return write_translations(translator, iter(lambda: list(islice(it, size)), []), out, opts, **kwargs)


def write_translations(
    translator: Translator, chunks: Iterable[Sequence[str]], out: TextIO, options: SearchOptions | None = None, *,
    scores: bool = False, plot_dir: str | Path | None = None, progress: bool = False, total: int | None = None,
    flush: bool = False, first_line: int = 1, **overrides: Any,
) -> int:
    """Translate chunks of lines and write one output line per input line to `out`.

    Each output line holds the `nbest` translations, tab-separated, each preceded
    by its log-probability and a tab when `scores` is set. With `plot_dir`, the
    best translation of input line n (from 1) is drawn to `plot_dir/n.png`.

    Args:
        translator: the model.
        chunks: input lines, a chunk at a time (each chunk is translated as soon as it is read).
        out: where translations go.
        options, overrides: search settings (`Translator.options`).
        progress: show a tqdm bar on stderr (never on `out`), of `total` lines if known.
        flush: flush `out` after every line (for pipes and terminals).
        first_line: the input line number of the first line (after a resumed run's lines),
            for warnings, plot names and the progress bar (`total` counts every line).

    Returns:
        The number of lines written.
    """
    plot_path = Path(plot_dir) if plot_dir is not None else None
    if plot_path is not None:
        plot_path.mkdir(parents=True, exist_ok=True)
        overrides["attention"] = True
    stream = translator.translate_chunks(chunks, options, first_line=first_line, **overrides)
    n = 0
    with tqdm(total=total, initial=first_line - 1, unit=" lines", disable=not progress, dynamic_ncols=True) as bar:
        for n, hyps in enumerate(stream, start=1):
            out.write(format_nbest(hyps, scores=scores) + "\n")
            if flush:
                out.flush()
            if plot_path is not None and hyps[0].attention is not None:
                line = first_line + n - 1
                _plot(hyps[0], plot_path / f"{line}.png", line)
            bar.update(1)
    return n


def refuse_overwriting(output: str | Path, files: Sequence[str | Path], what: str, doing: str) -> None:
    """Refuse an `output` that is one of `files` (the same path, a symlink or a hard link to it), which the
    command reads: `what` names them in the message ("the checkpoint"), `doing` the command ("translating").

    Raises:
        UserError: naming the file and what to do.
    """
    for file in files:
        if Path(output).exists() and Path(file).exists() and Path(output).samefile(file):
            raise UserError(f"{output}: output is {what} {file}; {doing} would overwrite it, so write to another file")


def check_output(output: str | Path, input: str | Path | None = None) -> None:
    """Refuse an output file that is the input file, or that cannot be created.

    Called before the model loads, so a mistake costs no time. `input` None means
    standard input, checked too when it is redirected from a file.

    Raises:
        UserError: `output` is `input` (same path, a symlink or a hard link to it), a folder,
            or in a folder that does not exist or is not writable.
    """
    path = Path(output)
    if path.is_dir() or str(output).endswith(os.sep):  # `-o new/` named a folder, and would have made a file "new"
        raise UserError(f"{output}: output is a folder; give a file name")
    if is_stream(str(output)):  # written beside and renamed over, a pipe would be replaced, its reader left waiting
        raise UserError(f"{output}: output is a pipe or a device; write to standard output instead (leave out -o "
                        "and redirect it)")
    folder = Path(os.path.realpath(path)).parent
    if not folder.is_dir():
        raise UserError(f"{output}: output folder {folder} does not exist; create it or choose another -o")
    problem = write_problem(folder)
    if problem:
        raise UserError(f"{output}: output folder {folder} cannot be written ({problem}); choose another -o")
    if not path.exists():
        return
    out_stat = path.stat()
    if input is not None:
        if not Path(input).exists():
            return
        in_stat, name = Path(input).stat(), str(input)
    else:
        try:
            in_stat, name = os.fstat(0), "standard input"  # `< doc.txt -o doc.txt`
        except OSError:  # no standard input at all
            return
        if not stat.S_ISREG(in_stat.st_mode):
            return
    if (in_stat.st_dev, in_stat.st_ino) == (out_stat.st_dev, out_stat.st_ino):
        raise UserError(f"{output}: output is the same file as the input {name}; "
                        "translating would overwrite it, so write to another file")


def write_output(output: str | Path, write: Callable[[TextIO], object]) -> None:
    """Call `write(text_file)` on a temporary file beside `output`, then rename it over `output`.

    An error or Ctrl-C removes the temporary file and leaves an existing `output`
    as it was: never a half-written file. A symlink is followed, so its target is
    replaced, and its mode kept (`write_atomic`).
    """
    path = Path(os.path.realpath(output))

    def write_text(raw) -> None:
        text = io.TextIOWrapper(raw, encoding="utf-8")
        write(text)
        text.flush()
        text.detach()  # `write_atomic` still syncs and closes `raw`

    if gzip_named(path):  # `-o out.gz` is compressed, as `-i in.gz` is decompressed
        write_atomic(path, lambda raw: write_gzip(raw, write_text))
    else:
        write_atomic(path, write_text)


def format_nbest(hyps: Sequence[Translation], *, scores: bool = False) -> str:
    """One output line: the translations tab-separated, each after its score with `scores`.

    The score is the one hypotheses are ranked by (`Translation.score`: the log-probability
    over the GNMT length penalty), so the printed scores decrease along the line.
    """
    texts = [normalize_spaces(h.text) for h in hyps]  # tabs part the n-best list, so a translation holds none
    if scores:
        return "\t".join(f"{h.score:.4f}\t{t}" for h, t in zip(hyps, texts))
    return "\t".join(texts)


PROMPT = "> "


def interactive(translator: Translator, stdin: BinaryIO, out: TextIO, prompt_to: TextIO,
                options: SearchOptions | None = None, *, name: str = "<stdin>", **kwargs: Any) -> int:
    """Prompt on `prompt_to`, translate each line as it is typed onto `out`, until end of input.

    `stdin` is read as bytes and decoded as a pipe's lines are, so that a line that is not
    UTF-8 stops with the same one line (naming `name` and the line), where a text stream
    would hand on surrogates that the tokenizer cannot take. `kwargs` are those of
    `write_translations`. Returns the number of lines.
    """

    def typed() -> Iterator[list[str]]:
        for number in count(1):
            prompt_to.write(PROMPT)
            prompt_to.flush()
            raw = stdin.readline()
            if not raw:
                prompt_to.write("\n")
                return
            yield list(decode_lines([raw], name, first=number))

    return write_translations(translator, typed(), out, options, flush=True, **kwargs)


def _plot(hyp: Translation, path: Path, line: int) -> None:
    plot_attention(hyp.attention, hyp.src_tokens, [*hyp.tokens, "</s>"], path,
                   title=f"line {line}  log P = {hyp.log_prob:.2f}")
