"""The `nmt` command line: parse arguments, call library functions, print results.

No logic lives here. User errors (`nmt.errors.UserError`) become one line on
stderr and exit status 2; other failures exit 1; `--debug` shows tracebacks.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from nmt.errors import UserError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Neural machine translation: train, translate, evaluate.",
)
_state = {"debug": False}

SetOption = Annotated[
    Optional[list[str]],
    typer.Option("--set", "-s", help="Override a config key: section.key=value (repeatable)."),
]


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks on errors.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors on stderr.")] = False,
) -> None:
    _state["debug"] = debug
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # our own logs say what happened
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="[nmt] %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("datasets").setLevel(logging.WARNING)


@app.command()
def train(
    config: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
    overrides: SetOption = None,
    restart: Annotated[bool, typer.Option("--restart", help="Discard an earlier run in run_dir and start over.")] = False,
) -> None:
    """Train a model; continues an interrupted run in the same run_dir."""
    from nmt.config import load_config
    from nmt.train.loop import train as run_training

    cfg = load_config(config, overrides or [])
    summary = run_training(cfg, restart=restart)
    typer.echo(json.dumps({k: v for k, v in summary.items() if k != "event"}))


@app.command()
def translate(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help="Trained checkpoint (.pt).")],
    input: Annotated[str, typer.Option("--input", "-i", help="Input file, or - for standard input.")] = "-",
    output: Annotated[str, typer.Option("--output", "-o", help="Output file, or - for standard output.")] = "-",
    beam: Annotated[Optional[int], typer.Option(help="Beam size (default: the checkpoint's decode.beam).")] = None,
    nbest: Annotated[int, typer.Option(help="Hypotheses per line, tab-separated with --scores.")] = 1,
    scores: Annotated[bool, typer.Option("--scores", help="Prefix each output with its score and a tab.")] = False,
    max_tokens: Annotated[Optional[int], typer.Option(help="Token budget of one batch.")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or mps.")] = "auto",
) -> None:
    """Translate a file or standard input, one output line per input line."""
    from nmt.translate import Translator

    translator = Translator.from_checkpoint(checkpoint, device=device)
    src = sys.stdin if input == "-" else _open_text(input)
    dst = sys.stdout if output == "-" else open(output, "w", encoding="utf-8")
    try:
        if nbest == 1 and not scores:
            for line in translator.translate_stream(src, beam=beam, max_tokens=max_tokens):
                dst.write(line + "\n")
                dst.flush() if dst is sys.stdout else None
        else:
            lines = [line.rstrip("\r\n") for line in src]
            for hyps in translator.translate_nbest(lines, beam=beam or max(nbest, translator.cfg.decode.beam),
                                                   nbest=nbest, max_tokens=max_tokens):
                fields = [f"{h.score:.4f}\t{h.text}" if scores else h.text for h in hyps]
                dst.write("\t".join(fields) + "\n")
    finally:
        if dst is not sys.stdout:
            dst.close()


@app.command("eval")
def evaluate(
    checkpoint: Annotated[Optional[Path], typer.Option("--checkpoint", "-c", help="Checkpoint to translate with.")] = None,
    split: Annotated[Optional[str], typer.Option(help="valid, test (all test sets) or a test set's name.")] = None,
    src: Annotated[Optional[Path], typer.Option(help="Source file to translate.")] = None,
    ref: Annotated[Optional[Path], typer.Option(help="Reference file.")] = None,
    hyp: Annotated[Optional[Path], typer.Option(help="Ready translations to score (no checkpoint needed).")] = None,
    beam: Annotated[Optional[int], typer.Option(help="Beam size (default: the checkpoint's decode.beam).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or mps.")] = "auto",
) -> None:
    """Score with sacreBLEU: a checkpoint on a split or on --src/--ref, or --hyp against --ref."""
    from nmt.evaluate import evaluate_checkpoint, format_scores, read_lines, score

    if hyp is not None:
        if ref is None:
            raise UserError("--hyp needs --ref")
        results = {str(hyp): score(read_lines(hyp), read_lines(ref))}
    elif checkpoint is None:
        raise UserError("give --checkpoint (with --split or --src/--ref), or --hyp with --ref")
    else:
        results = evaluate_checkpoint(checkpoint, split=split, src=src, ref=ref, beam=beam, device=device)
    if as_json:
        typer.echo(json.dumps(results, indent=2))
    else:
        for name, scores_ in results.items():
            typer.echo(format_scores(name, scores_))


@app.command()
def average(
    checkpoints: Annotated[list[Path], typer.Argument(help="Checkpoints to average.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the averaged checkpoint.")],
) -> None:
    """Average the weights of several checkpoints of one run."""
    from nmt.train.checkpoint import average_checkpoints, save_checkpoint

    save_checkpoint(average_checkpoints(list(checkpoints)), output)
    typer.echo(f"wrote {output} (mean of {len(checkpoints)} checkpoints)")


@app.command("config-reference")
def config_reference() -> None:
    """Print every config key with its default and meaning (markdown)."""
    from nmt.config import reference_markdown

    typer.echo(reference_markdown())


def _open_text(path: str):
    if not Path(path).is_file():
        raise UserError(f"{path}: input file not found")
    return open(path, encoding="utf-8", errors="strict", newline=None)


def main() -> None:
    """Console entry point: run the app, turning errors into one line and an exit status."""
    try:
        app()
    except UserError as err:
        if _state["debug"]:
            raise
        typer.echo(f"nmt: error: {err}", err=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        typer.echo("nmt: interrupted", err=True)
        sys.exit(130)
    except UnicodeDecodeError as err:
        if _state["debug"]:
            raise
        typer.echo(f"nmt: error: input is not valid UTF-8 ({err.reason} at byte {err.start})", err=True)
        sys.exit(2)
    except Exception as err:  # a runtime failure, not the user's input
        if _state["debug"]:
            raise
        typer.echo(f"nmt: error: {type(err).__name__}: {err} (run with --debug for the traceback)", err=True)
        sys.exit(1)
