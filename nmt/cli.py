"""The `nmt` command line: parse arguments, call library functions, print results.

No logic lives here. Library modules are imported inside each command, the one
place in `nmt` that defers them: they import torch (seconds), which `nmt --help` and
a config error should not wait for. User errors (`nmt.errors.UserError`) and click's usage errors become one line on
stderr and exit status 2; other failures exit 1; `--debug` shows tracebacks.
"""

from __future__ import annotations

import codecs
import errno
import functools
import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Annotated, Optional

import typer

from nmt.errors import (
    ConfigError,
    NodeError,
    OutputClosed,
    PeerStopped,
    RelayedError,
    UserError,
    reader_may_leave,
    shorten,
)
from nmt.interrupts import signals_after_imports, stops_cleanly_on_sigterm
from nmt.launch import launched_as

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: no type hint after each flag
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Neural machine translation: train, translate, evaluate.",
)
GLOBAL_FLAGS = ("--quiet", "-q", "--debug")
"""Options of `nmt` itself that every command also accepts after its name (`main` moves them first)."""
command = functools.partial(app.command, epilog="Every command also takes -q/--quiet (only warnings and errors on "
                                                "stderr) and --debug (full tracebacks on errors).")
"""`app.command` with the epilog that names the global flags in each command's --help."""
_state = {"debug": False}


def say(text: str) -> None:
    """Write a line of a command's output to standard output. A reader that went away (`nmt eval ... | head -1`)
    ends the command quietly with status 141, as a Unix tool does, where click's own handling exits 1."""
    with reader_may_leave():
        typer.echo(text)

SetOption = Annotated[
    Optional[list[str]],
    typer.Option("--set", "-s", help="Override a config key: section.key=value (repeatable)."),
]


def _check_device(name: str) -> str:
    """`--device`: one of the devices `train.device` accepts or `cuda:N`, refused before any work starts."""
    from nmt.config.ranges import device_problem

    problem = device_problem(name)
    if problem:
        raise UserError(f"--device {shorten(repr(name), 60)}: {problem}")
    return name


def _check_tokenize(name: str | None) -> str | None:
    """`--tokenize`: a sacreBLEU tokenizer this machine can build, refused before any translation starts."""
    from nmt.metrics import TOKENIZERS, tokenizer_problem

    if name is None:
        return None
    names = [t for t in TOKENIZERS if t != "auto"]  # auto needs the target language, which --hyp files lack
    if name not in names:
        raise UserError(f"--tokenize {shorten(repr(name), 60)}: not a BLEU tokenizer; choose one of {', '.join(names)}")
    problem = tokenizer_problem(name)
    if problem:
        raise UserError(f"--tokenize {name}: {problem}")
    return name


def _check_metrics(names: str | None) -> list[str] | None:
    """`--metrics`: a comma-separated list of sacreBLEU metrics, refused before any translation starts."""
    from nmt.metrics import TEXT_METRICS

    if names is None:
        return None
    chosen = [name.strip().lower() for name in names.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in TEXT_METRICS]
    if unknown or not chosen:
        what = f"{shorten(repr(unknown[0]), 40)} is not a metric nmt eval reports" if unknown else "no metric named"
        raise UserError(f"--metrics {shorten(repr(names), 60)}: {what}; give some of {','.join(TEXT_METRICS)}, "
                        "separated by commas")
    return list(dict.fromkeys(chosen))


def _version(show: bool) -> None:
    if show:
        from nmt import __version__

        say(f"nmt {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks on errors.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only warnings and errors on stderr.")] = False,
    version: Annotated[bool, typer.Option("--version", "-V", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    _state["debug"] = debug
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # our own logs say what happened
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="[nmt] %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("datasets").setLevel(logging.WARNING)
    for library in ("datasets", "huggingface_hub"):  # each prints its records itself: not a second time as ours
        logging.getLogger(library).propagate = False


@command()
def train(
    config: Annotated[Path, typer.Argument(readable=False, help="Experiment YAML file.")],
    overrides: SetOption = None,
    restart: Annotated[bool, typer.Option("--restart", help="Start over: an earlier run in run_dir is replaced once the new one has started (a start that fails leaves it as it was).")] = False,
) -> None:
    """Train a model; continues an interrupted run in the same run_dir.

    On several GPUs or machines, launch it with torchrun, e.g.
    `torchrun --standalone --nproc_per_node 4 -m nmt train CONFIG`.
    """
    from nmt.config import load_config

    cfg = load_config(config, overrides or [], training=True)  # before torch is imported: config errors in 0.5 s
    from nmt.launch import is_main_process
    from nmt.train.loop import train as run_training
    summary = run_training(cfg, restart=restart)
    if is_main_process():  # under torchrun, one summary line
        say(json.dumps({k: v for k, v in summary.items() if k != "event"}))


@command()
@stops_cleanly_on_sigterm
def translate(
    checkpoint: Annotated[list[Path], typer.Option(
        "--checkpoint", "-c", readable=False, help="Trained checkpoint (.pt); repeat to ensemble several (mean of probabilities).")],
    input: Annotated[str, typer.Option("--input", "-i", help="Input file (.gz: decompressed), or - for standard input (a terminal: interactive).")] = "-",
    output: Annotated[str, typer.Option("--output", "-o", help="Output file (.gz: compressed), or - for standard output.")] = "-",
    beam: Annotated[Optional[int], typer.Option(help="Beam size (default: the checkpoint's decode.beam, or --nbest where larger; 1 when sampling).")] = None,
    nbest: Annotated[int, typer.Option(help="Translations per line, tab-separated.")] = 1,
    scores: Annotated[bool, typer.Option("--scores", help="Put each translation's score (log-probability over the length penalty, what n-best lists are ranked by) and a tab before it.")] = False,
    length_penalty: Annotated[Optional[float], typer.Option(help="GNMT length penalty alpha (default: the checkpoint's).")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="Token budget of one batch (padded source tokens x beam; default: the checkpoint's decode.max_tokens; 0: 8000 on a CPU, 128000 on a CUDA GPU).")] = None,
    coverage_penalty: Annotated[Optional[float], typer.Option(help="GNMT coverage penalty beta (default: the checkpoint's decode.coverage_penalty).")] = None,
    min_len: Annotated[Optional[int], typer.Option(help="No end of sentence before this many tokens (default: the checkpoint's).")] = None,
    max_len_a: Annotated[Optional[float], typer.Option(help="Longest output is a x source length + b tokens (default: the checkpoint's).")] = None,
    max_len_b: Annotated[Optional[int], typer.Option(help="See --max-len-a.")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.", callback=_check_device)] = "auto",
    precision: Annotated[str, typer.Option(help="auto (fp32), fp32, bf16 or fp16 (the weights cast to that type; bf16 1.5-2x faster on a CPU with fast bf16 products, README).")] = "auto",
    sample: Annotated[bool, typer.Option("--sample", help="Sample translations instead of searching (back-translation).")] = False,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Sample among the k most probable tokens (0: all).")] = 0,
    top_p: Annotated[float, typer.Option(help="Sample from the nucleus of probability p (1: all).")] = 1.0,
    seed: Annotated[Optional[int], typer.Option(help="Seed for reproducible sampling: a line's sample depends on the seed, its line number and text, the checkpoint, --device and --precision, not on --max-tokens, the batches, a pipe's timing or a resume.")] = None,
    attention_plot: Annotated[Optional[Path], typer.Option(help="Write an attention heatmap per line to DIR/<line>.png.")] = None,
    attention_layer: Annotated[int, typer.Option(help="Transformer decoder layer whose cross-attention is plotted (not with a coverage penalty, which scores the last layer's).")] = -1,
    attention_head: Annotated[Optional[int], typer.Option(help="Transformer head to plot (default: mean over heads).")] = None,
    progress: Annotated[Optional[bool], typer.Option(
        "--progress/--no-progress", help="Progress bar on stderr (default: for an input file, when stderr is a terminal, unless --quiet).")] = None,
    restart: Annotated[bool, typer.Option(
        "--restart", help="Translate from the first line, discarding what a stopped run left in OUTPUT.partial.")] = False,
) -> None:
    """Translate a file or standard input, one output line per input line.

    With --nbest N a line holds N translations, best first, separated by tabs;
    --scores puts each translation's score (what they are ranked by) and a tab before it.
    Places the search could not fill (an empty line has one translation) are empty, at -inf.
    Standard input from a terminal is translated line by line as it is typed.
    From -i FILE to -o OUT, a run that is stopped keeps its lines in OUT.partial and
    the same command goes on after them.
    """
    from nmt.partial import reports_a_stop

    # torch's import and the model's loading take seconds: a signal then says what it left of OUTPUT, as one later does
    with reports_a_stop(input, output):
        from nmt.checkpoint import refuse_duplicates
        from nmt.decode import Sampling
        from nmt.decode.options import check_search_flags, count_problem
        from nmt.fileio import check_folder_to_write
        from nmt.plot import require_matplotlib
        from nmt.translate import Translator
        from nmt.translate_io import check_io, translate_io

        if not sample and (temperature != 1.0 or top_k or top_p != 1.0 or seed is not None):
            raise UserError("--temperature, --top-k, --top-p and --seed need --sample")
        if attention_plot is None and (attention_layer != -1 or attention_head is not None):
            raise UserError("--attention-layer and --attention-head choose what --attention-plot draws; give "
                            "--attention-plot DIR too")
        check_search_flags(beam=beam, length_penalty=length_penalty, max_tokens=max_tokens,
                           coverage_penalty=coverage_penalty, min_len=min_len, max_len_a=max_len_a, max_len_b=max_len_b)
        if problem := count_problem(beam=beam, nbest=nbest, sampling=sample, flags=True):
            raise UserError(problem)
        try:
            sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed) if sample else None
        except ValueError as err:
            raise UserError(str(err)) from None
        check_io(input, output, checkpoint)  # a missing input or a bad output fails before the model loads
        refuse_duplicates(checkpoint, "ensemble")  # `-c A -c A` would weigh A twice against a third member
        if attention_plot is not None:
            require_matplotlib("--attention-plot")
            check_folder_to_write(attention_plot, "--attention-plot")
        translator = Translator.from_checkpoint(checkpoint, device=device, precision=precision)
        translator.set_attention(layer=attention_layer, head=attention_head)
        options = translator.options(beam=beam, nbest=nbest, length_penalty=length_penalty, max_tokens=max_tokens,
                                     sampling=sampling, coverage_penalty=coverage_penalty, min_len=min_len,
                                     max_len_a=max_len_a, max_len_b=max_len_b)
        if options.coverage_penalty > 0 and (attention_layer != -1 or attention_head is not None):
            raise UserError(f"the coverage penalty ({options.coverage_penalty:g}) scores the attention that "
                            "--attention-layer and --attention-head choose, so they would change the translations, "
                            "not only the plots: leave them out to plot the attention it scores (the last layer's, "
                            "mean of heads), or give --coverage-penalty 0")
    translate_io(translator, options, input=input, output=output, scores=scores, plot_dir=attention_plot,
                 progress=progress, restart=restart)


@command("eval")
@stops_cleanly_on_sigterm
def evaluate(
    checkpoint: Annotated[Optional[list[Path]], typer.Option(
        "--checkpoint", "-c", readable=False, help="Checkpoint to translate with; repeat to ensemble several (mean of "
                                                   "probabilities, the first's config and test sets).")] = None,
    split: Annotated[Optional[str], typer.Option(help="valid, test (all test sets; the default) or a test set's name.")] = None,
    src: Annotated[Optional[Path], typer.Option(readable=False, help="Source file to translate.")] = None,
    ref: Annotated[Optional[list[Path]], typer.Option(
        readable=False, help="Reference file; repeat it for several references of each line.")] = None,
    hyp: Annotated[Optional[Path], typer.Option(readable=False, help="Ready translations to score (no checkpoint needed).")] = None,
    beam: Annotated[Optional[int], typer.Option(help="Beam size (default: the checkpoint's decode.beam).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.", callback=_check_device)] = "auto",
    save_translations: Annotated[Optional[Path], typer.Option(
        help="Also write each set's translations to DIR/<set>.hyp.")] = None,
    tokenize: Annotated[Optional[str], typer.Option(
        help="sacreBLEU tokenizer for BLEU: 13a, intl, zh, ja-mecab, char or none (default: the checkpoint's "
             "eval.tokenize; with --hyp, 13a).", callback=_check_tokenize)] = None,
    metrics: Annotated[Optional[str], typer.Option(
        help="sacreBLEU metrics to report, separated by commas: some of bleu, chrf, ter (default: the checkpoint's "
             "eval.metrics; with --hyp, all three).", callback=_check_metrics)] = None,
) -> None:
    """Score with sacreBLEU: a checkpoint on a split or on --src/--ref, or --hyp against --ref."""
    from nmt.config import EvalConfig
    from nmt.evaluate import evaluate_checkpoint, score_files
    from nmt.fileio import check_folder_to_write
    from nmt.metrics import format_scores

    if hyp is not None:
        if not ref:
            raise UserError("--hyp needs --ref")
        unused = [flag for flag, value in (("--checkpoint", checkpoint or None), ("--src", src), ("--split", split),
                                           ("--beam", beam), ("--save-translations", save_translations))
                  if value is not None]
        if unused:
            raise UserError(f"{unused[0]} does not apply to --hyp, which scores ready translations against --ref; "
                            f"drop {unused[0]}, or translate with --checkpoint instead of --hyp")
        given = {k: v for k, v in (("tokenize", tokenize), ("metrics", metrics)) if v is not None}
        results = {str(hyp): score_files(hyp, ref, EvalConfig(**given) if given else None)}
    elif not checkpoint:
        raise UserError("give --checkpoint (with --split or --src/--ref), or --hyp with --ref")
    else:
        from nmt.checkpoint import refuse_duplicates
        from nmt.data.eval_sets import check_src_ref

        refuse_duplicates(checkpoint, "ensemble")  # `-c A -c A` would weigh A twice against a third member

        if split is not None and (src is not None or ref):
            raise UserError(f"--split {split} and --src/--ref both choose what to score; give one of them")
        check_src_ref(src, ref)  # before the checkpoint loads
        if save_translations is not None:
            check_folder_to_write(save_translations, "--save-translations")
        results = evaluate_checkpoint(checkpoint, split=split, src=src, ref=ref or None, beam=beam, device=device,
                                      save_dir=save_translations, tokenize=tokenize, metrics=metrics)
    if as_json:
        say(json.dumps(results, indent=2))
    else:
        for name, scores_ in results.items():
            say(format_scores(name, scores_))


@command()
@stops_cleanly_on_sigterm
def average(
    paths: Annotated[list[Path], typer.Argument(readable=False, help="Checkpoints to average; with --last, one run directory.")],
    output: Annotated[Optional[str], typer.Option(  # text: Path() would drop the slash of `-o folder/`
        "--output", "-o", help="Where to write the averaged checkpoint (with --last, default RUN_DIR/averaged.pt).")] = None,
    last: Annotated[Optional[int], typer.Option(
        "--last", help="Average the newest N periodic checkpoints (ckpt_<step>.pt) of the run directory given.")] = None,
) -> None:
    """Average the weights of several checkpoints of one run."""
    from nmt.checkpoint import average_checkpoints, last_checkpoints, save_checkpoint
    from nmt.translate_io import check_output, refuse_overwriting

    if last is not None:
        if last < 1:
            raise UserError(f"--last {last}: average at least 1 checkpoint (the newest N of the run directory)")
        if len(paths) != 1 or not paths[0].is_dir():
            raise UserError(f"--last {last} takes one run directory, got {' '.join(map(str, paths))}")
        checkpoints = last_checkpoints(paths[0], last, exact=True)
        output = output or paths[0] / "averaged.pt"
    else:
        checkpoints = list(paths)
        if output is None:
            raise UserError("give --output FILE (or --last N RUN_DIR)")
    check_output(output)  # before the checkpoints are read
    refuse_overwriting(output, checkpoints, "the input checkpoint", "averaging")
    save_checkpoint(average_checkpoints(checkpoints), output)
    names = " ".join(p.name for p in checkpoints)
    say(f"wrote {output} (mean of {len(checkpoints)} checkpoints: {names})" if len(checkpoints) > 1 else
        f"wrote {output} (one checkpoint, its weights as they were: {names})")


@command()
def experiment(
    config: Annotated[Path, typer.Argument(readable=False, help="Experiment YAML file.")],
    overrides: SetOption = None,
    restart: Annotated[bool, typer.Option("--restart", help="Start over: an earlier run in run_dir is replaced once the new one has started (a start that fails leaves it as it was).")] = False,
    name: Annotated[Optional[str], typer.Option(help="Experiment name (default: the config file's name).")] = None,
    results: Annotated[Path, typer.Option(help="Folder for <name>.json.")] = Path("results"),
) -> None:
    """Train (or resume), score every test set, and write results/<name>.json.

    Under torchrun (`torchrun --standalone --nproc_per_node N -m nmt experiment CONFIG`) all
    processes train and rank 0 scores.
    """
    from nmt.config import load_config
    from nmt.experiment import run_experiment
    from nmt.fileio import check_folder_to_write
    from nmt.metrics import METRICS

    cfg = load_config(config, overrides or [], training=True)
    check_folder_to_write(results, "--results")  # before training, not after it
    result = run_experiment(cfg, name or config.stem, results_dir=results, restart=restart,
                            overrides=[f"--set {o}" for o in overrides or []])
    if result is None:  # a torchrun rank other than 0: it trained, rank 0 reports
        return
    for set_name, s in result["test"].items():  # BLEU and chrF always, then what eval.metrics adds
        say(f"{result['experiment']} {set_name}: "
            + " ".join(f"{m.label} {s[m.name]:.2f}" for m in METRICS.values() if m.name in s))
    say(f"wrote {results / (result['experiment'] + '.json')}")


@command()
@stops_cleanly_on_sigterm
def analyze(
    checkpoints: Annotated[list[str], typer.Option("--checkpoint", "-c", help="NAME=CKPT or CKPT (repeatable).")],
    split: Annotated[Optional[str], typer.Option(help="Test set of the first checkpoint's config (default: its first).")] = None,
    src: Annotated[Optional[Path], typer.Option(readable=False, help="Source file instead of a split.")] = None,
    ref: Annotated[Optional[Path], typer.Option(readable=False, help="Reference file instead of a split.")] = None,
    buckets: Annotated[int, typer.Option(help="Source-length buckets: at most this many, of whole lengths, as equal in size as the lengths allow.")] = 3,
    beam: Annotated[Optional[int], typer.Option(help="Beam size (default: each checkpoint's decode.beam).")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Write a BLEU-by-length plot here (.png, .svg or .pdf).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a markdown table.")] = False,
    report: Annotated[Optional[Path], typer.Option(help="Write DIR/analysis.md with plots and attention heatmaps.")] = None,
    sentences: Annotated[Optional[str], typer.Option(help="Test sentences (0-based, comma-separated) for --report heatmaps (default: 0).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.", callback=_check_device)] = "auto",
) -> None:
    """BLEU by source length for one or more models on one test set."""
    from nmt.analysis import (
        analyze_checkpoints,
        markdown_table,
        name_checkpoints,
        plot_bleu_by_length,
        write_report,
    )
    from nmt.data.eval_sets import check_src_ref
    from nmt.decode.options import check_search_flags
    from nmt.fileio import check_folder_to_write
    from nmt.plot import PLOT_FORMATS, require_matplotlib

    if buckets < 1:  # before any translating
        raise UserError(f"--buckets ({buckets}) must be at least 1")
    check_search_flags(beam=beam)  # before any model loads, naming the option
    check_src_ref(src, [ref] if ref else [])
    if sentences is not None and report is None:
        raise UserError("--sentences chooses the heatmaps of --report; give --report DIR too")
    chosen = _sentence_numbers(sentences or "0")
    if report is not None:
        require_matplotlib("--report")
        check_folder_to_write(report, "--report")
    if plot is not None:
        require_matplotlib("--plot")
        if plot.is_dir():
            raise UserError(f"--plot {plot}: a folder; give a file name for the PNG")
        if plot.suffix.lower() not in PLOT_FORMATS:
            raise UserError(f"--plot {plot}: its suffix names the format; give a file name ending in "
                            f"{', '.join(PLOT_FORMATS)}")
        check_folder_to_write(plot.parent, "--plot")  # the plot makes its folder
    named = name_checkpoints(checkpoints)
    if report is not None:
        path = write_report(named, report, sentences=chosen, split=split, src=src, ref=ref, n_buckets=buckets,
                            beam=beam, device=device)
        say(f"wrote {path}")
        return
    result = analyze_checkpoints(named, split=split, src=src, ref=ref,
                                 n_buckets=buckets, beam=beam, device=device)
    if plot is not None:
        plot_bleu_by_length(result["by_length"], plot, title=f"BLEU by source length ({result['set']})")
    if as_json:
        say(json.dumps(result, indent=2))
    else:
        say(f"{result['set']}: overall " + ", ".join(f"{k} {v['bleu']:.2f}" for k, v in result["overall"].items()))
        say(markdown_table(result["by_length"]))


@command()
@stops_cleanly_on_sigterm
def export(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", readable=False, help="Transformer checkpoint (.pt).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to create for the exported model.")],
    format: Annotated[str, typer.Option("--format", help="Target: ctranslate2.")] = "ctranslate2",
    quantization: Annotated[Optional[str], typer.Option(
        help="Weight type, e.g. int8 or float16 (default: float32, as trained).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an earlier export in the output folder.")] = False,
) -> None:
    """Export a Transformer for CTranslate2, with its sentencepiece model(s) beside it."""
    from nmt.export import export_checkpoint

    path = export_checkpoint(checkpoint, output, format=format, quantization=quantization, force=force)
    say(f"wrote {path} ({format}); translate with ctranslate2.Translator({str(path)!r})")


@command()
def serve(
    checkpoint: Annotated[list[Path], typer.Option(
        "--checkpoint", "-c", readable=False, help="Trained checkpoint (.pt); repeat to ensemble several.")],
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0, or :: for IPv6 too: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free one).")] = 8080,
    beam: Annotated[Optional[int], typer.Option(help="Default beam size, 1 to 64 (default: the checkpoint's decode.beam).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.", callback=_check_device)] = "auto",
) -> None:
    """Serve translations over HTTP: POST /translate {"text": [...]}, GET /health."""
    from nmt.serve import serve as run_server

    if not 0 <= port <= 65535:
        raise UserError(f"--port {port}: a port is a number from 0 to 65535 (0: any free one)")
    run_server(checkpoint, host=host, port=port, beam=beam, device=device)


@command("config-reference")
def config_reference() -> None:
    """Print every config key with its default and meaning (markdown)."""
    from nmt.config import reference_markdown

    say(reference_markdown())


def _sentence_numbers(text: str) -> list[int]:
    """`--sentences` ("0,4,7") as numbers, each a sentence of the test set counted from 0."""
    numbers = [item.strip() for item in text.split(",") if item.strip()]
    bad = next((item for item in numbers if not (item.isascii() and item.isdigit())), None)
    if bad is not None:
        raise UserError(f"--sentences {text!r}: {bad!r} is not a sentence number (0-based, comma-separated: 0,4,7)")
    return [int(item) for item in numbers]


def hoist_global_flags(args: list[str]) -> list[str]:
    """`args` with `--quiet`, `-q` and `--debug` moved before the command name, wherever they were
    (`nmt train CONFIG --quiet` as `nmt --quiet train CONFIG`); nothing after a `--` moves."""
    end = args.index("--") if "--" in args else len(args)
    flags = [a for a in args[:end] if a in GLOBAL_FLAGS]
    return [*flags, *(a for a in args[:end] if a not in GLOBAL_FLAGS), *args[end:]]


def check_no_empty_argument(args: list[str]) -> None:
    """Refuse an empty argument (`-o "$OUT"` with OUT unset), naming its option. A path option would take it as
    `.`, typer's reading of an empty path, and write into the working directory (`--results`, `--report`,
    `--save-translations`), or an option say something of `.`; `serve --host ''` would listen on every interface.

    Raises:
        UserError: naming the option (or the argument's place) of the first empty argument.
    """
    end = args.index("--") if "--" in args else len(args)
    for i, arg in enumerate(args[:end]):
        if arg.startswith("--") and arg.endswith("=") and len(arg) > 3:
            where = f"{arg[:-1]} ''"
        elif arg == "" and i > 0 and args[i - 1].startswith("-"):
            where = f"{args[i - 1]} ''"
        elif arg == "":
            where = f"the argument after {shorten(args[i - 1], 40)}" if i > 0 else "the first argument"
        else:
            continue
        raise UserError(f"{where}: an empty value (a shell variable that is not set?); give the file, folder or "
                        "value meant ('.' for the working directory)")


def check_short_options(args: list[str]) -> None:
    """Refuse a short option joined to its value by '=' (`-o=out.txt`): click, as getopt, takes what follows the
    letter as the value, so `-o=out.txt` would write a file named `=out.txt`, and `-c=a.pt` look for `=a.pt`.

    Raises:
        UserError: naming the argument and how to write it.
    """
    end = args.index("--") if "--" in args else len(args)
    for arg in args[:end]:
        if len(arg) > 3 and arg[0] == "-" and arg[1].isalpha() and arg[2] == "=":
            raise UserError(f"{shorten(arg, 60)}: a short option's value follows it after a space, so this one "
                            f"would be {shorten(arg[2:], 40)!r}; write {arg[:2]} {shorten(arg[3:], 40)}")


def check_repeated_options(args: list[str]) -> None:
    """Refuse an option of one value given twice (`translate -i a.txt -i b.txt`, `export -c A -c B`): click keeps
    the last and drops the first without a word. Repeatable options (`-c` of translate, `--set`) and flags pass.

    Raises:
        UserError: naming the option, how often it came, and its values.
    """
    end = args.index("--") if "--" in args else len(args)
    words = [a for a in args[:end] if a not in GLOBAL_FLAGS]
    sub = getattr(typer.main.get_command(app), "commands", {}).get(words[0]) if words else None
    if sub is None:
        return
    takes_value = {o: p for p in sub.params if p.param_type_name == "option" and not p.is_flag and not p.count
                   for o in (*p.opts, *p.secondary_opts)}
    given: dict[str, list[str]] = {}
    i = 1
    while i < len(words):
        name, joined, value = words[i].partition("=")
        option = takes_value.get(name if words[i].startswith("--") else words[i][:2])
        if option is not None:
            if not joined and (name.startswith("--") or len(name) == 2):  # `-o out.txt`, `--out out.txt`
                value, i = (words[i + 1] if i + 1 < len(words) else ""), i + 1
            elif not name.startswith("--"):  # `-oout.txt`
                value = words[i][2:]
            if not option.multiple:
                given.setdefault(max(option.opts, key=len), []).append(value)
        i += 1
    for option, values in given.items():
        if len(values) > 1:
            shown = ", ".join(shorten(repr(v), 100) for v in values)
            raise UserError(f"{option} given {len(values)} times ({shown}); it takes one value: give it once")


def _printed_by_another_process(err: UserError) -> bool:
    """Under torchrun, whether another process prints `err`, so that N processes do not print one line N times:
    rank 0's error relayed to the ranks that waited for it, and a config error or one of the node's devices
    (`NodeError`), which every process of a node meets and its local rank 0 prints."""
    if isinstance(err, RelayedError):
        return True
    size, _, local = launched_as()
    return isinstance(err, ConfigError | NodeError) and size > 1 and local != 0


# How long a process that leaves its error to another one, or met another one's failure, waits for torchrun to stop it
# (`_wait_to_be_stopped`).
SILENT_EXIT_WAIT_S = 10.0


def _wait_to_be_stopped() -> None:
    """Let the process that prints the error exit first. torchrun stops every process once one of them exits:
    had a silent one exited first, the one that prints could be stopped before its line was out (seen under
    load: no line at all). torchrun's SIGTERM ends this wait at once, so it costs nothing where the printing
    process exits; under a launcher that stops no one, a silent process exits `SILENT_EXIT_WAIT_S` later.
    A process whose peer stopped (`PeerStopped`) waits too: it meets the loss as that peer leaves the group,
    before the peer has exited, and torchrun reports whichever exits first as the run's root cause."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(SILENT_EXIT_WAIT_S)


_ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
"""click's base of usage errors: click's own under older typer, typer's copy of click since."""


def main() -> None:
    """Console entry point: run the app, turning errors into one line and an exit status."""
    try:
        with signals_after_imports():  # Ctrl-C while torch imports: stop once it has, not with a half-made module
            _run_app()
    except KeyboardInterrupt:  # Ctrl-C outside the command (held back by an import, it came as an error was
        sys.exit(130)  # printed): the status Ctrl-C gives within it, not a traceback


def standard_streams() -> None:
    """Write text to standard output in UTF-8, as to files, whatever the locale: in a Latin-1 locale `nmt translate >
    out.txt` wrote a file that `nmt eval` then refused as invalid UTF-8. With standard error closed (`2>&-`, as some
    schedulers start jobs) its messages and progress bars go nowhere, where each write failed and the command with it."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (the process's, until it exits)
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    if codecs.lookup(encoding).name != "utf-8" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(encoding="utf-8")


def _run_app() -> None:
    from nmt.heap import keep_freed_memory
    from nmt.train.faults import Interrupted

    keep_freed_memory()  # before any tensor: a CPU step's memory is reused, not faulted in anew
    standard_streams()
    try:
        # Not standalone: click's usage errors come here, to be one line like the library's own.
        check_no_empty_argument(sys.argv[1:])
        check_short_options(sys.argv[1:])
        check_repeated_options(sys.argv[1:])
        status = app(args=hoist_global_flags(sys.argv[1:]), prog_name="nmt", standalone_mode=False)
        sys.exit(status if isinstance(status, int) else 0)  # a `typer.Exit(code)`, `--help` and ^C (130) return it
    except _ClickException as err:
        if type(err).__name__ == "NoArgsIsHelpError":  # `nmt` alone: its help, as click prints it
            err.show()
        else:  # an unknown command or option, a value of the wrong type, a missing argument
            ctx = getattr(err, "ctx", None)
            help_ = f" (see '{ctx.command_path} -h')" if ctx is not None else ""
            typer.echo(f"nmt: error: {' '.join(err.format_message().split())}{help_}", err=True)
        sys.exit(err.exit_code)
    except typer.Abort:  # end of input at a prompt
        typer.echo("nmt: aborted", err=True)
        sys.exit(1)
    except UserError as err:
        if _state["debug"]:
            traceback.print_exc()
        if _printed_by_another_process(err):
            _wait_to_be_stopped()
        else:
            typer.echo(f"nmt: error: {err}", err=True)
        sys.exit(err.exit_code)
    except PeerStopped as err:  # under torchrun: the process that stopped first prints why
        if _state["debug"]:
            traceback.print_exc()
        typer.echo(f"nmt: error: {err}", err=True)
        _wait_to_be_stopped()  # so that torchrun reports that process, not this one, as the first to fail
        sys.exit(err.exit_code)
    except OutputClosed as err:  # `nmt translate ... | head`: the reader has what it wanted
        sys.exit(err.exit_code)
    except Interrupted as err:  # SIGINT or SIGTERM in training or before it (elsewhere typer exits 130 itself)
        if launched_as()[1] == 0:  # under torchrun, every rank stops with the same news
            typer.echo(f"nmt: {err}", err=True)
        sys.exit(err.exit_code)
    except UnicodeDecodeError as err:
        if _state["debug"]:
            raise
        typer.echo(f"nmt: error: input is not valid UTF-8 ({err.reason} at byte {err.start})", err=True)
        sys.exit(2)
    except Exception as err:  # a runtime failure, not the user's input
        if _state["debug"]:
            raise
        if isinstance(err, OSError) and err.errno == errno.ENAMETOOLONG:  # a path given (any option, config, corpus)
            named = isinstance(err.filename, str | bytes | os.PathLike)
            where = shorten(os.fsdecode(err.filename)) if named else "a path given"
            typer.echo(f"nmt: error: {where}: too long for the file system (a name in a path may have at most "
                       f"255 bytes on most); give a shorter one", err=True)
            sys.exit(2)
        typer.echo(f"nmt: error: {type(err).__name__}: {err} (run with --debug for the traceback)", err=True)
        sys.exit(1)
