"""Data at scale: how long `nmt train` takes to its first update on an N-pair corpus, phase by phase.

    python bench/data_scale.py --pairs 1000000 [--work /tmp/nmt-data-scale] [--source DIR]
        [--set key=value ...] [--json out.json]

It writes an N-pair corpus outside the repository (under `--work`): Multi30k's
training set (`--source`, default $NMT_DATA or ../shared/data/multi30k) repeated,
each copy's lines prefixed with the copy number so the pairs differ, or the embedded
toy corpus repeated the same way when Multi30k is absent. Then it starts `nmt train`
twice in fresh processes, with a tiny Transformer (`train.max_steps: 1`, then 2):

    first   a new run directory: read into Arrow, train the tokenizer, tokenize, ...
    second  the same run directory: resume from the first start's checkpoint, every
            cache reused, one more update.

Each start runs the real `nmt.train.loop.train`; the phases are timed by wrapping
the functions it calls (`load_pairs`, `clean_pairs`, `draw_tokenizer_sample` (the sample, in a child
process above 32 MiB of text, `nmt.data.sample`), `train_tokenizer_on_files`, `tokenize_pairs`,
`build_sampler`, `train_step`):

    read       text files into Arrow (a cache hit on the second start)
    clean      strip and drop empty pairs
    tokenizer  draw the sample and train sentencepiece
    tokenize   encode and filter by length (all cores)
    sampler    lengths out of Arrow and the first epoch's batches
    first      seconds from the process start to the end of its first update
    RSS        peak resident memory of the training process at its first update (and
               of its largest child process: tokenizing workers, the tokenizer sample,
               sentencepiece; forked children count the pages they share with it)
    cache      the run directory's Arrow cache on disk after the start

`uptime`'s load average is printed beside each start: other work on the machine
slows every phase. The table is printed in Markdown.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # before the heavy imports: a start's time includes them

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("read", "clean", "tokenizer", "tokenize", "sampler")


# --------------------------------------------------------------------------- the corpus


def source_lines(source: Path) -> tuple[list[str], list[str], list[str], list[str], str]:
    """Training and validation sentences (German, English) of Multi30k, or of the toy corpus."""
    # the line rules, as `nmt train` reads them: only '\n' ends a line
    from nmt.data.text import read_lines as read

    if (source / "train.de.gz").is_file():
        return (read(source / "train.de.gz"), read(source / "train.en.gz"), read(source / "val.de.gz"),
                read(source / "val.en.gz"), f"Multi30k ({source})")
    toy = ROOT / "data" / "toy"  # English -> German-like; the languages only name the files here
    return (read(toy / "train.de"), read(toy / "train.en"), read(toy / "valid.de"), read(toy / "valid.en"),
            "the toy corpus")


def build_corpus(work: Path, pairs: int, source: Path) -> tuple[Path, str]:
    """`work/corpus-N/{train,valid}.{de,en}`, written once (a `done` file marks a finished one)."""
    folder = work / f"corpus-{pairs}"
    train_de, train_en, valid_de, valid_en, name = source_lines(source)
    if (folder / "done").is_file():
        return folder, name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)

    def numbered(lines: list[str]) -> Iterator[str]:
        for k in range(pairs):
            copy, i = divmod(k, len(lines))
            yield f"{copy} {lines[i]}\n"

    for lang, lines in (("de", train_de), ("en", train_en)):
        with open(folder / f"train.{lang}", "w", encoding="utf-8") as f:
            f.writelines(numbered(lines))
    for lang, lines in (("de", valid_de), ("en", valid_en)):
        (folder / f"valid.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "done").write_text(name + "\n")
    return folder, name


def config_overrides(corpus: Path, run_dir: Path, extra: list[str]) -> list[str]:
    """A tiny Transformer on the corpus; validation is loss only, so the figures are about data."""
    return [
        f"run_dir={run_dir}", "data.src_lang=de", "data.tgt_lang=en",
        f"data.train={{kind: text, path: {corpus / 'train'}}}", f"data.valid={{kind: text, path: {corpus / 'valid'}}}",
        "model.transformer.d_model=64", "model.transformer.heads=2", "model.transformer.encoder_layers=1",
        "model.transformer.decoder_layers=1", "model.transformer.ff_dim=128", "train.device=cpu",
        "train.max_tokens=2048", "train.warmup_steps=1", "train.log_every=1", "train.valid_bleu=false",
        "train.tensorboard=false", "train.valid_every=1000", *extra,
    ]


# --------------------------------------------------------------------------- one start (child process)


def child(overrides: list[str], out: Path) -> None:
    """Run `nmt train` once in this process, timing its phases; write them to `out` as JSON."""
    import nmt.data.dataset as dataset
    import nmt.train.data as data
    import nmt.train.loop as loop
    import nmt.train.setup as setup
    from nmt.config import load_config

    seconds = dict.fromkeys(PHASES, 0.0)
    rss = dict.fromkeys(PHASES, 0)  # peak RSS when the phase last ended: which phase set the peak
    first: dict[str, float] = {}

    def timed(module, name: str, phase: str) -> None:
        fn = getattr(module, name)

        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[phase] += time.perf_counter() - t
                rss[phase] = peak_rss_mb(resource.RUSAGE_SELF)

        setattr(module, name, wrapper)

    timed(dataset, "load_pairs", "read")  # every split is read through `dataset.load_split`
    for module in (data, dataset):
        timed(module, "clean_pairs", "clean")
    timed(data, "draw_tokenizer_sample", "tokenizer")  # drawing and writing the sample
    timed(data, "train_tokenizer_on_files", "tokenizer")
    timed(dataset, "tokenize_pairs", "tokenize")
    timed(setup, "build_sampler", "sampler")
    step = loop.train_step

    def first_step(*args, **kwargs):
        result = step(*args, **kwargs)
        if not first:
            first["seconds"] = time.perf_counter() - T0
            first["rss_mb"] = peak_rss_mb(resource.RUSAGE_SELF)
            first["worker_rss_mb"] = peak_rss_mb(resource.RUSAGE_CHILDREN)
        return result

    loop.train_step = first_step
    config = ROOT / "configs" / "toy_transformer.yaml"  # a base the overrides replace wholesale where it matters
    cfg = load_config(config, overrides)
    summary = loop.train(cfg)
    result = {**{k: round(v, 2) for k, v in seconds.items()}, "first": round(first.get("seconds", float("nan")), 2),
              "rss_mb": first.get("rss_mb"), "worker_rss_mb": first.get("worker_rss_mb"),
              "exit_rss_mb": peak_rss_mb(resource.RUSAGE_SELF), "rss_after_mb": rss,
              "step": summary["step"]}
    out.write_text(json.dumps(result))


def peak_rss_mb(who: int) -> int:
    return round(resource.getrusage(who).ru_maxrss / 1024)  # Linux reports KiB


# --------------------------------------------------------------------------- the driver


def start(overrides: list[str], out: Path, timeout: float) -> dict:
    load = os.getloadavg()
    cmd = [sys.executable, __file__, "--child", str(out), "--", *overrides]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"error": f"no result after {timeout:.0f} s", "load": load}
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        return {"error": f"exit {proc.returncode}:\n{tail}", "load": load}
    return {**json.loads(out.read_text()), "wall": round(time.perf_counter() - t, 1), "load": load}


def table(rows: list[tuple[int, str, dict]]) -> str:
    head = ("pairs", "start", *PHASES, "first update", "peak RSS (children)", "cache", "load avg 1/5 min")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for pairs, which, r in rows:
        load = f"{r['load'][0]:.1f} / {r['load'][1]:.1f}"
        if "error" in r:
            lines.append(f"| {pairs:,} | {which} | " + " | ".join(["-"] * len(PHASES)) + f" | {r['error'].splitlines()[0]} | - | - | {load} |")
            continue
        cells = [f"{r[p]:.1f} s" for p in PHASES]
        lines.append(f"| {pairs:,} | {which} | " + " | ".join(cells) + f" | **{r['first']:.1f} s** | "
                     f"{r['rss_mb']} MB ({r['worker_rss_mb']} MB) | {r['cache_mb']:,} MB | {load} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        rest = sys.argv[3:]
        child(rest[1:] if rest[:1] == ["--"] else rest, Path(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, nargs="+", default=[100_000], help="corpus sizes (pairs), one row pair each")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "nmt-data-scale",
                    help="where corpora and run directories go (outside the repository)")
    ap.add_argument("--source", type=Path, default=Path(os.environ.get("NMT_DATA", ROOT.parent / "shared/data/multi30k")))
    ap.add_argument("--timeout", type=float, default=3600, help="seconds one start may take")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="config override, e.g. data.num_proc=1")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    work = args.work.resolve()
    if work.is_relative_to(ROOT):
        ap.error(f"--work {work} is inside the repository; choose a folder outside it")
    rows = []
    for pairs in args.pairs:
        t = time.perf_counter()
        corpus, name = build_corpus(work, pairs, args.source)
        print(f"{pairs:,} pairs from {name} in {corpus} ({time.perf_counter() - t:.0f} s to write)", flush=True)
        run_dir = work / f"run-{pairs}"
        shutil.rmtree(run_dir, ignore_errors=True)
        for which, steps in (("first", 1), ("second", 2)):
            overrides = config_overrides(corpus, run_dir, [f"train.max_steps={steps}", *args.overrides])
            r = start(overrides, work / f"result-{pairs}-{which}.json", args.timeout)
            files = [f for f in (run_dir / "cache").rglob("*") if f.is_file()]
            r["cache_mb"], r["cache_files"] = round(sum(f.stat().st_size for f in files) / 2**20), len(files)
            rows.append((pairs, which, r))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
            if "error" in r:
                print(r["error"], file=sys.stderr)
                break
    print()
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([{"pairs": p, "start": w, **r} for p, w, r in rows], indent=1))


if __name__ == "__main__":
    main()
