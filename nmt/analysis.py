"""Analysis that shows what attention does: BLEU by source length, side by side for several models.

The classic finding (Cho et al., 2014; Bahdanau et al., 2015, fig. 2): a decoder
fed one fixed summary vector degrades as sentences get longer, while attention
keeps its quality. `bleu_by_length` splits a test set into equal-sized buckets
by source length and scores each bucket separately.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nmt.config import EvalConfig
from nmt.data.eval_sets import EvalSet, eval_sets
from nmt.errors import UserError
from nmt.metrics import check_tokenizer, score, with_metrics
from nmt.plot import bucket_labels, plot_attention, plot_bleu_by_length
from nmt.translate import Translator

log = logging.getLogger(__name__)

# A word of the scripts written without spaces between words: one Han character (Chinese, Japanese kanji; the
# unified ideographs, their extensions A to H and the compatibility block) or one kana.
_UNSPACED_CHARS = "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003fffd"
_WORD = re.compile(f"[{_UNSPACED_CHARS}]|[^\\s{_UNSPACED_CHARS}]+")


def word_count(text: str) -> int:
    """Words of `text`: runs of characters between spaces, where each Han character or kana counts as a word of
    its own (Chinese and Japanese write no spaces, so a whole sentence would be one run)."""
    return len(_WORD.findall(text))


def length_buckets(sources: Sequence[str], n_buckets: int) -> list[np.ndarray]:
    """Indices of `sources` in at most `n_buckets` groups by word count (`word_count`), shortest first, each of whole lengths.

    The groups are as equal in size as the lengths allow: each cut between equal-sized groups moves to the
    nearest place between two lengths, so no length is split between two buckets (which would score its
    sentences apart by their order in the file, and label neighbouring buckets "3-8" and "8-16"). Cuts that
    meet are one, so a corpus of few distinct lengths gets fewer buckets.
    """
    if n_buckets < 1:
        raise ValueError(f"n_buckets ({n_buckets}) must be at least 1")
    lengths = np.array([word_count(s) for s in sources], dtype=np.int64)
    order = np.argsort(lengths, kind="stable")
    between = np.flatnonzero(np.diff(lengths[order])) + 1  # positions where a longer length starts
    if not len(between):
        return [order] if len(order) else []
    n_buckets = min(n_buckets, len(order))  # as many as sentences already cut between every two lengths
    targets = np.arange(1, n_buckets) * len(order) / n_buckets
    cuts = between[np.abs(between[None, :] - targets[:, None]).argmin(axis=1)] if len(targets) else between[:0]
    return [chunk for chunk in np.split(order, np.unique(cuts)) if len(chunk)]


def bleu_by_length(
    sources: Sequence[str], hyps: Sequence[str], refs: Sequence[str], *, n_buckets: int = 3, cfg: EvalConfig | None = None
) -> list[dict[str, Any]]:
    """BLEU and chrF per source-length bucket: [{"words": "3-9", "sentences": n, "bleu": .., "chrf": ..}].

    Both are scored whatever `cfg.metrics` says (`nmt.metrics.with_metrics`); `cfg` gives the tokenizer and case.
    A bucket of one length is labelled as one ("10-10"); no two buckets share a length (`length_buckets`).
    """
    settings = with_metrics(cfg, besides=False)  # a bucket's row keeps these two only
    rows = []
    for idx in length_buckets(sources, n_buckets):
        lengths = [word_count(sources[i]) for i in idx]
        s = score([hyps[i] for i in idx], [refs[i] for i in idx], settings)
        rows.append({"words": f"{min(lengths)}-{max(lengths)}", "sentences": len(idx), "bleu": s["bleu"], "chrf": s["chrf"]})
    return rows


def markdown_table(results: dict[str, list[dict[str, Any]]]) -> str:
    """Models as rows, length buckets as columns (BLEU)."""
    first = next(iter(results.values()))
    head = "| model | " + " | ".join(bucket_labels(first, unit=" words")) + " |"
    lines = [head, "|" + " --- |" * (len(first) + 1)]
    for name, rows in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{r['bleu']:.1f}" for r in rows) + " |")
    return "\n".join(lines)


def name_checkpoints(specs: Sequence[str]) -> dict[str, str]:
    """{name: path} from `NAME=CKPT` or `CKPT` (named after its folder, e.g. runs/rnn/best.pt -> rnn).

    Raises:
        UserError: two checkpoints would have the same name; the message says how to name them.
    """
    named: dict[str, str] = {}
    for spec in specs:
        name, path = spec.split("=", 1) if "=" in spec else (Path(spec).parent.name or spec, spec)
        if not name.strip() or not path:
            raise UserError(f"-c {spec}: give NAME=CKPT with a name and a checkpoint, or CKPT alone")
        if name in named:
            raise UserError(f"two checkpoints are named {name!r} ({named[name]} and {path}); "
                            f"name them, e.g. -c {name}-a={named[name]} -c {name}-b={path}")
        named[name] = path
    return named


def load_translators(checkpoints: dict[str, str | Path], device: str = "auto") -> dict[str, Translator]:
    """One `Translator` per named checkpoint, each loaded once."""
    return {name: Translator.from_checkpoint(path, device=device) for name, path in checkpoints.items()}


def analyze_checkpoints(
    checkpoints: dict[str, str | Path],
    *,
    split: str | None = None,
    src: str | Path | None = None,
    ref: str | Path | None = None,
    n_buckets: int = 3,
    beam: int | None = None,
    device: str = "auto",
) -> dict[str, Any]:
    """Translate one test set with each named checkpoint and score it overall and by length (see `analyze`)."""
    result = analyze(load_translators(checkpoints, device), split=split, src=src, ref=ref, n_buckets=n_buckets,
                     beam=beam)
    del result["sources"]
    return result


def analyze(
    translators: dict[str, Translator],
    *,
    split: str | None = None,
    src: str | Path | None = None,
    ref: str | Path | None = None,
    n_buckets: int = 3,
    beam: int | None = None,
) -> dict[str, Any]:
    """Translate one test set with each model and score it overall and by length.

    The test set comes from the first model's config (`split`) or from `src`/`ref`.
    A model trained for another language pair than the set's is scored all the same,
    with a warning naming both. BLEU and chrF are scored whatever a model's `eval.metrics`
    says, and those metrics besides (`nmt.metrics.with_metrics`).

    Returns:
        {"set": name, "sources": [...], "overall": {model: scores}, "by_length": {model: bucket rows}}.
    """
    set_name, scored = choose_set(translators, split=split, src=src, ref=ref)
    return score_models(translators, set_name, scored.sources, scored.references, n_buckets=n_buckets, beam=beam)


def choose_set(translators: dict[str, Translator], *, split: str | None = None, src: str | Path | None = None,
               ref: str | Path | None = None) -> tuple[str, EvalSet]:
    """(name, set) of the set `analyze` scores: `src`/`ref`, or the first model's `split`."""
    first = next(iter(translators.values()))
    return next(iter(eval_sets(first.cfg, split=split, src=src, ref=ref).items()))


def score_models(translators: dict[str, Translator], set_name: str, sources: list[str], refs: list[str], *,
                 n_buckets: int = 3, beam: int | None = None) -> dict[str, Any]:
    """`analyze` of the set given."""
    pair = _pair(next(iter(translators.values())))
    for name, translator in translators.items():  # a tokenizer missing here stops the run before any translation
        check_tokenizer(translator.cfg.eval, name)
    overall, by_length = {}, {}
    for name, translator in translators.items():
        if _pair(translator) != pair:
            log.warning("%s translates %s but %s is a %s set (the first model's): its scores mean little",
                        name, _pair(translator), set_name, pair)
        log.info("%s: translating %d sentences of %s", name, len(sources), set_name)
        hyps = translator.translate(sources, beam=beam)
        overall[name] = score(hyps, refs, with_metrics(translator.cfg.eval))
        by_length[name] = bleu_by_length(sources, hyps, refs, n_buckets=n_buckets, cfg=translator.cfg.eval)
    return {"set": set_name, "sources": sources, "overall": overall, "by_length": by_length}


def _pair(translator: Translator) -> str:
    return f"{translator.cfg.data.src_lang}-{translator.cfg.data.tgt_lang}"


def write_report(
    checkpoints: dict[str, str | Path],
    out_dir: str | Path,
    *,
    sentences: Sequence[int] = (0,),
    split: str | None = None,
    src: str | Path | None = None,
    ref: str | Path | None = None,
    n_buckets: int = 3,
    beam: int | None = None,
    device: str = "auto",
) -> Path:
    """`out_dir/analysis.md` with BLEU overall and by length, its plot, and attention heatmaps of
    the chosen test sentences for every model side by side. Returns the markdown path.

    The test set is chosen as by `analyze` (`split`, or `src` and `ref`); each checkpoint is loaded once.
    `sentences` are numbers in the set, counted from 0, and the report and the heatmaps' files are
    labelled with them; an empty sentence gets a note instead of heatmaps.

    Raises:
        UserError: a sentence number past the end of the set (before anything is translated).
    """
    out_dir = Path(out_dir)
    translators = load_translators(checkpoints, device)
    set_name, scored = choose_set(translators, split=split, src=src, ref=ref)
    chosen = list(dict.fromkeys(sentences))
    outside = [i for i in chosen if not 0 <= i < scored.rows]
    if outside:
        raise UserError(f"--sentences {outside[0]}: {set_name} has {scored.rows} sentences, numbered 0 to "
                        f"{scored.rows - 1}; choose among those")
    figures = out_dir / "analysis"
    figures.mkdir(parents=True, exist_ok=True)
    result = score_models(translators, set_name, scored.sources, scored.references, n_buckets=n_buckets, beam=beam)
    del result["sources"]
    plot_bleu_by_length(result["by_length"], figures / "bleu_by_length.png",
                        title=f"BLEU by source length ({result['set']})")
    (figures / "analysis.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")

    sources = scored.hyp_lines(scored.sources)  # by row of the set, as `sentences` number them
    unscored = set(range(scored.rows)) - set(scored.kept)  # a pair with an empty side
    empty = [i for i in chosen if i in unscored or not sources[i].split()]
    shown = [i for i in chosen if i not in empty]
    stems = file_stems(list(translators))
    heatmaps = {name: _heatmaps(name, stems[name], translator, sources, shown, figures, beam)
                for name, translator in translators.items()}
    lines = [
        "# What attention does",
        "",
        f"Test set `{result['set']}`; written by `nmt analyze --report` (`nmt.analysis.write_report`; `make analysis`, `make analysis-multi30k`).",
        "",
        "| model | BLEU | chrF |",
        "| --- | ---: | ---: |",
        *[f"| {name} | {s['bleu']:.2f} | {s['chrf']:.2f} |" for name, s in result["overall"].items()],
        "",
        "## BLEU by source length",
        "",
        markdown_table(result["by_length"]),
        "",
        "![BLEU by source length](analysis/bleu_by_length.png)",
        "",
        "## Attention",
        "",
        "Sentences are numbered as in the test set, from 0 (`--sentences`).",
        "",
    ]
    for i in chosen:
        if i in empty:
            why = "has an empty side, so it is not scored" if i in unscored else "is empty: nothing to translate"
            lines += [f"Sentence {i} {why}, no heatmap.", ""]
            continue
        lines += [f"Sentence {i}: *{sources[i]}*", "", "| " + " | ".join(heatmaps) + " |",
                  "|" + " --- |" * len(heatmaps), "| " + " | ".join(h[i] for h in heatmaps.values()) + " |", ""]
    report = out_dir / "analysis.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return report


def file_stems(names: Sequence[str]) -> dict[str, str]:
    """{model name: the part of its figures' file names}: the name where it is a plain file name (letters,
    digits, `_`, `-`, `.`), else that of its place (`model2`), since a name may hold `/` (a folder that does not
    exist), spaces (which a markdown image link cannot hold) or anything else; each one its own."""
    stems: dict[str, str] = {}
    for k, name in enumerate(names, 1):
        plain = re.fullmatch(r"[\w-][\w.-]*", name) is not None
        stem = name if plain else f"model{k}"
        while stem in stems.values():
            stem += "_"
        stems[name] = stem
    return stems


def _heatmaps(name: str, stem: str, translator: Translator, sources: Sequence[str], numbers: Sequence[int],
              figures: Path, beam: int | None) -> dict[int, str]:
    """{sentence number: the markdown cell of `name`'s heatmap of that sentence}; the PNGs are written to `figures`,
    named after `stem` (`file_stems`)."""
    if not translator.model.has_attention:
        return dict.fromkeys(numbers, "(no attention: one fixed context vector)")
    cells = {}
    nbest = translator.translate_nbest([sources[i] for i in numbers], beam=beam, attention=True)
    for i, best in zip(numbers, (t[0] for t in nbest)):
        if best.attention is None:  # the search found no translation with a finite score
            cells[i] = "(no translation: no heatmap)"
            continue
        png = figures / f"attention_{stem}_{i}.png"
        plot_attention(best.attention, best.src_tokens, [*best.tokens, "</s>"], png, title=f"{name}, sentence {i}")
        alt = re.sub(r"([\\\[\]])", r"\\\1", name)  # a bracket of the name would end the image's text
        cells[i] = f"![{alt}](analysis/{png.name})"
    return cells
