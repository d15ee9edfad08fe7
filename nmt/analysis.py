"""Analysis that shows what attention does: BLEU by source length, side by side for several models.

The classic finding (Cho et al., 2014; Bahdanau et al., 2015, fig. 2): a decoder
fed one fixed summary vector degrades as sentences get longer, while attention
keeps its quality. `bleu_by_length` splits a test set into equal-sized buckets
by source length and scores each bucket separately.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nmt.config import EvalConfig
from nmt.metrics import score


def length_buckets(sources: Sequence[str], n_buckets: int) -> list[np.ndarray]:
    """Indices of `sources` split into `n_buckets` equal-sized groups by word count, shortest first."""
    if n_buckets < 1:
        raise ValueError(f"n_buckets ({n_buckets}) must be at least 1")
    lengths = np.array([len(s.split()) for s in sources])
    order = np.argsort(lengths, kind="stable")
    return [chunk for chunk in np.array_split(order, n_buckets) if len(chunk)]


def bleu_by_length(
    sources: Sequence[str], hyps: Sequence[str], refs: Sequence[str], *, n_buckets: int = 3, cfg: EvalConfig | None = None
) -> list[dict[str, Any]]:
    """BLEU and chrF per source-length bucket: [{"words": "3-9", "sentences": n, "bleu": .., "chrf": ..}]."""
    rows = []
    for idx in length_buckets(sources, n_buckets):
        lengths = [len(sources[i].split()) for i in idx]
        s = score([hyps[i] for i in idx], [refs[i] for i in idx], cfg)
        rows.append({"words": f"{min(lengths)}-{max(lengths)}", "sentences": len(idx), "bleu": s["bleu"], "chrf": s["chrf"]})
    return rows


def plot_bleu_by_length(results: dict[str, list[dict[str, Any]]], path: str | Path, *, title: str = "") -> Path:
    """One line per model: BLEU against source-length bucket; written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for name, rows in results.items():
        ax.plot([r["words"] for r in rows], [r["bleu"] for r in rows], marker="o", label=name)
    ax.set_xlabel("source length (words)")
    ax.set_ylabel("BLEU")
    ax.set_title(title or "BLEU by source length")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def markdown_table(results: dict[str, list[dict[str, Any]]]) -> str:
    """Models as rows, length buckets as columns (BLEU)."""
    first = next(iter(results.values()))
    head = "| model | " + " | ".join(f"{r['words']} words" for r in first) + " |"
    lines = [head, "|" + " --- |" * (len(first) + 1)]
    for name, rows in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{r['bleu']:.1f}" for r in rows) + " |")
    return "\n".join(lines)


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
    """Translate one test set with each named checkpoint and score it overall and by length.

    The test set comes from the first checkpoint's config (`split`) or from `src`/`ref`.

    Returns:
        {"set": name, "overall": {model: scores}, "by_length": {model: bucket rows}}.
    """
    from nmt.evaluate import eval_sets
    from nmt.translate import Translator

    translators = {name: Translator.from_checkpoint(path, device=device) for name, path in checkpoints.items()}
    first = next(iter(translators.values()))
    sets = eval_sets(first.cfg, split=split, src=src, ref=ref)
    set_name, (sources, refs) = next(iter(sets.items()))
    overall, by_length = {}, {}
    for name, translator in translators.items():
        hyps = translator.translate(sources, beam=beam)
        overall[name] = score(hyps, refs, translator.cfg.eval)
        by_length[name] = bleu_by_length(sources, hyps, refs, n_buckets=n_buckets, cfg=translator.cfg.eval)
    return {"set": set_name, "overall": overall, "by_length": by_length}


def write_report(
    checkpoints: dict[str, str | Path],
    out_dir: str | Path,
    *,
    sentences: Sequence[int] = (0,),
    n_buckets: int = 3,
    beam: int | None = None,
    device: str = "auto",
) -> Path:
    """`out_dir/analysis.md` with BLEU overall and by length, its plot, and attention heatmaps of
    the chosen test sentences for every model side by side. Returns the markdown path.
    """
    from nmt.plot import plot_attention
    from nmt.translate import Translator

    out_dir = Path(out_dir)
    figures = out_dir / "analysis"
    figures.mkdir(parents=True, exist_ok=True)
    result = analyze_checkpoints(checkpoints, n_buckets=n_buckets, beam=beam, device=device)
    plot_bleu_by_length(result["by_length"], figures / "bleu_by_length.png",
                        title=f"BLEU by source length ({result['set']})")
    (figures / "analysis.json").write_text(__import__("json").dumps(result, indent=2) + "\n", encoding="utf-8")

    from nmt.evaluate import eval_sets

    first = Translator.from_checkpoint(next(iter(checkpoints.values())), device=device)
    sources = next(iter(eval_sets(first.cfg, split=result["set"]).values()))[0]
    chosen = [sources[i] for i in sentences if i < len(sources)]
    heatmaps: dict[str, list[str]] = {}
    for name, path in checkpoints.items():
        translator = first if path == next(iter(checkpoints.values())) else Translator.from_checkpoint(path, device=device)
        model_cfg = translator.cfg.model
        if model_cfg.type == "rnn" and model_cfg.rnn.decoder == "none":
            heatmaps[name] = ["(no attention: one fixed context vector)"] * len(chosen)
            continue
        for k, best in enumerate(t[0] for t in translator.translate_nbest(chosen, beam=beam, attention=True)):
            png = figures / f"attention_{name}_{k}.png"
            plot_attention(best.attention, best.src_tokens, [*best.tokens, "</s>"], png, title=name)
            heatmaps.setdefault(name, []).append(f"![{name}](analysis/{png.name})")

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
    ]
    for k, sentence in enumerate(chosen):
        lines += [f"Sentence {k + 1}: *{sentence}*", "", "| " + " | ".join(heatmaps) + " |",
                  "|" + " --- |" * len(heatmaps), "| " + " | ".join(h[k] for h in heatmaps.values()) + " |", ""]
    report = out_dir / "analysis.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return report
