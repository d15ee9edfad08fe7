"""Figures: attention heatmaps (one PNG per sentence, source subwords across, target subwords
down) and BLEU by source length for several models.

matplotlib is the optional `plot` extra (`pip install 'nmt[plot]'`; `make
install` includes it) and is imported only when a plot is drawn. The figure is
drawn on an Agg canvas of its own, never through `pyplot`, so plotting neither
changes the caller's matplotlib backend nor keeps figures alive.

The image size follows from the token counts alone (`figure_size`), never from
a "tight" bounding box, so it is predictable: 0.3 inch per token plus fixed
margins for the labels, the colour bar and the title, at `DPI` dots per inch.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from nmt.errors import UserError

log = logging.getLogger(__name__)

DPI = 100
"""Resolution of the written PNGs."""
_CELL = 0.3  # inches per token
_LEFT, _RIGHT = 1.6, 1.0  # inches: target labels; colour bar
_TOP, _BOTTOM = 1.4, 0.4  # inches: source labels (rotated); title


def figure_size(n_src: int, n_tgt: int) -> tuple[float, float]:
    """(width, height) in inches of the plot of an (n_tgt, n_src) attention matrix."""
    return _LEFT + _CELL * n_src + _RIGHT, _TOP + _CELL * n_tgt + _BOTTOM


def image_size(n_src: int, n_tgt: int) -> tuple[int, int]:
    """(width, height) in pixels of the PNG `plot_attention` writes."""
    width, height = figure_size(n_src, n_tgt)
    return round(width * DPI), round(height * DPI)


def plot_attention(
    attention: torch.Tensor,
    src_tokens: Sequence[str],
    tgt_tokens: Sequence[str],
    path: str | Path,
    *,
    title: str | None = None,
) -> Path:
    """Write a heatmap of `attention` to `path` (PNG).

    Args:
        attention: weights of each target token over the source tokens, (T, S).
        src_tokens: the S source labels (x axis, left to right).
        tgt_tokens: the T target labels (y axis, top to bottom).
        path: the PNG to write; its folder must exist.
        title: drawn small in the bottom-left corner, below the heatmap (the source labels fill the top).

    Returns:
        `path`.

    Raises:
        ValueError: the labels do not match the shape of `attention`.
        UserError: matplotlib is not installed.
    """
    T, S = attention.shape
    if T < 1 or S < 1 or (len(tgt_tokens), len(src_tokens)) != (T, S):
        raise ValueError(f"attention {tuple(attention.shape)} needs {T} target and {S} source labels, "
                         f"got {len(tgt_tokens)} and {len(src_tokens)}")
    Figure, FigureCanvasAgg = _matplotlib()
    w, h = figure_size(S, T)
    fig = Figure(figsize=(w, h), dpi=DPI)
    FigureCanvasAgg(fig)
    # Axes placed by hand, in fractions of the figure, so the layout never depends on the labels.
    ax = fig.add_axes((_LEFT / w, _BOTTOM / h, _CELL * S / w, _CELL * T / h))
    image = ax.imshow(attention.detach().float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0,
                      aspect="auto", interpolation="nearest")
    ax.set_xticks(range(S), labels=list(src_tokens), rotation=90, fontsize=8)
    ax.set_yticks(range(T), labels=list(tgt_tokens), fontsize=8)
    ax.xaxis.tick_top()
    ax.set_xlabel("source")
    ax.xaxis.set_label_position("top")
    ax.set_ylabel("target")
    colorbar = fig.add_axes(((_LEFT + _CELL * S + 0.2) / w, _BOTTOM / h, 0.15 / w, _CELL * T / h))
    fig.colorbar(image, cax=colorbar)
    if title:
        fig.text(0.1 / w, 0.1 / h, title, fontsize=8)
    path = Path(path)
    _save(fig, path, dpi=DPI)
    return path


def plot_bleu_by_length(results: dict[str, list[dict[str, Any]]], path: str | Path, *, title: str = "") -> Path:
    """One line per model: BLEU against source-length bucket (`nmt.analysis.bleu_by_length` rows); a PNG.

    Raises:
        UserError: matplotlib is not installed.
    """
    fig = bleu_by_length_figure(results, title=title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _save(fig, path)
    return path


_MISSING_GLYPH = re.compile(r"Glyph (\d+) .* missing from font\(s\) (.+)\.$")


PLOT_FORMATS = (".png", ".svg", ".pdf")
"""The file formats a plot is written in, named by its file's suffix."""


def _save(fig: Any, path: Path, **options: Any) -> None:
    """`fig` in the format its suffix names (`PLOT_FORMATS`), else as a PNG. matplotlib warns once for each character its font lacks (every Chinese character of the
    labels, with the font it ships); those warnings become one log line (`_say_missing_glyphs`), others pass on."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        suffix = path.suffix.lower()
        fig.savefig(path, format=suffix[1:] if suffix in PLOT_FORMATS else "png", **options)
    missing: dict[str, set[str]] = {}
    for w in caught:
        found = _MISSING_GLYPH.match(str(w.message))
        if found:
            missing.setdefault(found.group(2), set()).add(chr(int(found.group(1))))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    for font, chars in missing.items():
        _say_missing_glyphs(font, "".join(sorted(chars)))


_FONTS_SAID: set[str] = set()
"""The fonts whose missing characters this process has logged."""


def _say_missing_glyphs(font: str, chars: str) -> None:
    """Once per process and font: the first figure's missing characters stand for the others'."""
    if font in _FONTS_SAID:
        return
    _FONTS_SAID.add(font)
    log.warning("plots: the font %s has no glyph for %d characters of the labels (%s), drawn as boxes: install a "
                "font that has them (Noto Sans CJK for Chinese and Japanese) and name it in matplotlib's font.family "
                "(matplotlibrc)", font, len(chars), chars[:10] + ("..." if len(chars) > 10 else ""))


def bleu_by_length_figure(results: dict[str, list[dict[str, Any]]], *, title: str = ""):
    """The `matplotlib.figure.Figure` `plot_bleu_by_length` writes.

    Buckets are placed by their index, labelled with `bucket_labels`: on a category axis two buckets
    of one label ("10-10", where many sentences have 10 words) would fall on one point.
    """
    Figure, FigureCanvasAgg = _matplotlib()
    fig = Figure(figsize=(6.4, 4.0), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, rows in results.items():
        ax.plot(range(len(rows)), [r["bleu"] for r in rows], marker="o", label=name)
    longest = max(results.values(), key=len)  # every model's rows are the same buckets of one set
    ax.set_xticks(range(len(longest)), labels=bucket_labels(longest), rotation=45 if len(longest) > 6 else 0,
                  fontsize=8)
    ax.set_xlabel("source length (words)")
    ax.set_ylabel("BLEU")
    ax.set_title(title or "BLEU by source length")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def bucket_labels(rows: Sequence[dict[str, Any]], *, unit: str = "") -> list[str]:
    """Each bucket's `words` label and `unit`, numbered where buckets share one ("10-10 #1", "10-10 #2")."""
    words = [r["words"] for r in rows]
    shared = Counter(words)
    seen: dict[str, int] = {}
    labels = []
    for w in words:
        if shared[w] > 1:
            seen[w] = seen.get(w, 0) + 1
            labels.append(f"{w}{unit} #{seen[w]}")
        else:
            labels.append(f"{w}{unit}")
    return labels


def require_matplotlib(what: str) -> None:
    """Refuse `what` (a command's plotting option) before any work is done, where matplotlib is missing.

    Raises:
        UserError: matplotlib does not import.
    """
    _matplotlib(what)


def _matplotlib(what: str = "plotting"):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise UserError(f"{what} needs matplotlib ({err}); install it with: pip install 'nmt[plot]' "
                        "(make install includes it)") from None
    return Figure, FigureCanvasAgg
