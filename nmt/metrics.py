"""Metrics as data: each one's name, direction and computation, in one table.

The training loop (best checkpoint, early stopping, the plateau schedule), the
config schema (`train.early_stop_metric`, `eval.metrics`), `nmt eval` and the
experiment reports all read `METRICS`: a new metric is one entry here.

Text metrics are sacreBLEU's, on detokenized text, each reported with its
signature (Post, 2018, "A Call for Clarity in Reporting BLEU Scores"): BLEU
(Papineni et al., 2002), chrF (Popović, 2015) and TER (Snover et al., 2006).
`loss` is the validation loss per target token as training minimises it, label
smoothing included (`ppl` beside it is exp of the plain cross-entropy), computed
under teacher forcing, not from text.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.base import Metric as SacreMetric

from nmt.errors import UserError, headline

log = logging.getLogger(__name__)

TOKENIZERS = ("auto", "13a", "intl", "zh", "ja-mecab", "char", "none")
"""sacreBLEU's BLEU tokenizers that `eval.tokenize` accepts, and `auto` (`bleu_tokenizer`)."""

_BY_LANGUAGE = {**dict.fromkeys(("zh", "zho", "chi", "cmn", "yue"), "zh"), **dict.fromkeys(("ja", "jpn"), "ja-mecab")}
"""The BLEU tokenizer sacreBLEU picks for a target language written without spaces between words (its
`BLEU(trg_lang=...)`, which knows `zh` and `ja`; here also their three-letter codes, as in Flores-200's
`zho_Hans` and `jpn_Jpan`, and Mandarin's and Cantonese's): 13a would take a whole sentence of Chinese or
Japanese for one word."""
_UNSPACED = frozenset(_BY_LANGUAGE.values())
"""BLEU tokenizers of languages written without spaces. With them TER splits Chinese and Japanese characters
too (sacreBLEU's `asian_support`, which needs its `normalized`): by spaces, it took a sentence for one word, so
one wrong character made the whole sentence an edit."""

REPORTED = ("bleu", "chrf")
"""The metrics experiments and `nmt analyze` always score (`with_metrics`): their tables, plots and
the choice between best.pt and averaged.pt are built on them."""


@dataclass(frozen=True)
class Metric:
    """One metric.

    Attributes:
        name: its key in configs, logs and results ("bleu").
        label: how reports print it ("BLEU").
        higher_is_better: the direction of improvement.
        scorer: builds the sacreBLEU scorer from (tokenize, lowercase); None for
            a metric that is not computed from text (the validation loss).
        reads: the `eval` settings its score depends on: scores under others do not compare.
    """

    name: str
    label: str
    higher_is_better: bool
    scorer: Callable[[str, bool], SacreMetric] | None = None
    reads: tuple[str, ...] = ()

    def better(self, value: float, best: float | None) -> bool:
        """Whether `value` improves on `best` (None: nothing yet, so it does)."""
        if best is None:
            return True
        return value > best if self.higher_is_better else value < best


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("bleu", "BLEU", True, lambda tokenize, lowercase: BLEU(tokenize=tokenize, lowercase=lowercase),
           ("tokenize", "lowercase")),
    Metric("chrf", "chrF", True, lambda tokenize, lowercase: CHRF(lowercase=lowercase), ("lowercase",)),
    Metric("ter", "TER", False, lambda tokenize, lowercase: TER(
        case_sensitive=not lowercase, normalized=tokenize in _UNSPACED, asian_support=tokenize in _UNSPACED),
           ("tokenize", "lowercase")),
    Metric("loss", "loss", False),
)}
TEXT_METRICS = tuple(name for name, m in METRICS.items() if m.scorer is not None)
"""The metrics computed from translations and references."""


class ScoreSettings(Protocol):
    """What `score` reads of a config (`nmt.config.EvalConfig` has it)."""

    tokenize: str
    lowercase: bool
    metrics: Sequence[str]


@dataclass(frozen=True)
class _Settings:
    tokenize: str = "auto"
    lowercase: bool = False
    metrics: tuple[str, ...] = TEXT_METRICS


DEFAULTS = _Settings()
"""The settings `score` uses without a config, and `EvalConfig`'s defaults."""


SCORE_CHUNK = 2000
"""Sentences whose references sacreBLEU holds analysed at a time (`corpus_score`). `Metric.corpus_score` first
analyses every reference (chrF: a Counter of the character and word n-grams of each), then scores: on a 50,000-line
test set of good translations that took 1.6 GB for chrF alone (`bench/score_memory.py`), about 32 KB a line, so a
set of a few hundred thousand lines did not fit in memory. The statistics of each sentence are kept (a few numbers
each) and summed at the end, as sacreBLEU sums them: the scores are the same."""

TER_SLOW_WORDS = 1000
"""Words in a line beyond which sacreBLEU's TER slows down steeply, in its search for shifts: one pair of lines of
1,000 words took 0.45 s, of 1,200 words 3.7 s, of 3,000 words 80 s and of 4,000 words 136 s on a 2-core CPU (a
fifth of the words changed, a few blocks of three moved; 2026-12-07). BLEU and chrF took under 0.1 s."""

_TOKENIZER_ERRORS = (RuntimeError, ImportError, AssertionError)
"""sacreBLEU's ways to say that a tokenizer's extra is missing or broken."""


def bleu_tokenizer(tokenize: str, tgt_lang: str | None = None) -> str:
    """The sacreBLEU tokenizer that `eval.tokenize` names: `auto` is sacreBLEU's choice for `tgt_lang` (`zh` for
    Chinese, `ja-mecab` for Japanese, by the code's first part: `zh-TW` and `zho_Hant` are Chinese), 13a for other
    languages and where the language is not known."""
    if tokenize != "auto":
        return tokenize
    return _BY_LANGUAGE.get(tgt_lang.replace("_", "-").split("-")[0].lower(), "13a") if tgt_lang else "13a"


def tokenizer_problem(tokenize: str) -> str | None:
    """Why sacreBLEU cannot build the BLEU tokenizer `tokenize` here, or None when it can.

    Only ja-mecab needs more than sacreBLEU itself: MeCab and its IPA dictionary, sacreBLEU's `ja`
    extra. Building a tokenizer takes at most about 10 ms (intl's regexes; ja-mecab's dictionary when
    installed), so a config checks it as it loads, not at the first validation of a training run.
    """
    try:
        BLEU(tokenize=bleu_tokenizer(tokenize))
    except _TOKENIZER_ERRORS as err:
        return (f"{headline(err).rstrip('.') or type(err).__name__}; install them with: pip install 'sacrebleu[ja]', "
                "or choose another tokenizer")
    return None


def check_tokenizer(settings: ScoreSettings, where: str) -> None:
    """Refuse, before any translation, settings whose BLEU tokenizer this machine cannot build.

    Raises:
        UserError: naming `where` (a checkpoint, a model), the setting and what to install.
    """
    problem = tokenizer_problem(settings.tokenize)
    if problem:
        raise UserError(f"{where}: eval.tokenize {settings.tokenize!r}: {problem}")


def with_metrics(cfg: ScoreSettings | None, names: Sequence[str] = REPORTED, *, besides: bool = True) -> ScoreSettings:
    """`cfg` (or `DEFAULTS`) scoring `names` first, then (`besides`) the rest of its own `metrics`."""
    cfg = cfg or DEFAULTS
    return _Settings(cfg.tokenize, cfg.lowercase, tuple(dict.fromkeys([*names, *(cfg.metrics if besides else ())])))


def score(hyps: Sequence[str], refs: Sequence[str], cfg: ScoreSettings | None = None, *,
          more_refs: Sequence[Sequence[str]] = ()) -> dict[str, Any]:
    """Corpus scores of `hyps` against one reference each (`refs`), and as many more as `more_refs` gives (each a
    reference per hypothesis, as sacreBLEU's `-r REF1 REF2`): {name: score, name_signature: ..., sentences: n}.

    Raises:
        UserError: the lists differ in length, or are empty; the tokenizer cannot be built here
            (`tokenizer_problem`).
    """
    cfg = cfg or DEFAULTS
    for other in (refs, *more_refs):
        if len(hyps) != len(other):
            raise UserError(f"{len(hyps)} hypotheses but {len(other)} references: they must pair line by line")
    if not hyps:
        raise UserError("nothing to score: no hypotheses and no references (empty files?)")
    hyps, streams = list(hyps), [list(refs), *map(list, more_refs)]
    result: dict[str, Any] = {}
    for name in cfg.metrics:
        try:
            scorer = METRICS[name].scorer(bleu_tokenizer(cfg.tokenize), cfg.lowercase)
        except _TOKENIZER_ERRORS:
            raise UserError(f"eval.tokenize {cfg.tokenize!r}: {tokenizer_problem(cfg.tokenize)}") from None
        if name == "ter":
            _warn_of_slow_ter(hyps, streams)
        result[name] = round(corpus_score(scorer, hyps, streams).score, 2)
        result[f"{name}_signature"] = str(scorer.get_signature())
    result["sentences"] = len(hyps)
    return result


_warned_of_slow_ter = False


def _warn_of_slow_ter(hyps: Sequence[str], streams: Sequence[Sequence[str]]) -> None:
    """Say, before TER starts on it, which line will make TER slow (`TER_SLOW_WORDS`) and how to leave TER out:
    a document scored as one line held `nmt eval` for minutes without a word. Once a process: a training run
    validates on the same lines again and again."""
    global _warned_of_slow_ter
    if _warned_of_slow_ter:
        return
    words, line = max((len(text.split()), i) for lines in (hyps, *streams) for i, text in enumerate(lines))
    if words > TER_SLOW_WORDS:
        _warned_of_slow_ter = True
        log.warning("TER: line %d has %s words, and sacreBLEU's TER slows down steeply beyond %s words a line "
                    "(seconds to minutes a line); to leave it out, give nmt eval --metrics bleu,chrf, or set "
                    "eval.metrics", line + 1, f"{words:,}", f"{TER_SLOW_WORDS:,}")


def corpus_score(scorer: SacreMetric, hyps: Sequence[str], streams: Sequence[Sequence[str]]) -> Any:
    """`scorer.corpus_score(hyps, streams)` (`streams`: one list of references per reference set) computed
    `SCORE_CHUNK` sentences at a time, in bounded memory.

    A warning sacreBLEU gives about the text (BLEU's "lines that end in a tokenized period") is given once,
    not once per chunk; its count of 100 lines is then one chunk's.
    """
    if not (hasattr(scorer, "_extract_corpus_statistics") and hasattr(scorer, "_aggregate_and_compute")):
        # the two steps of corpus_score are sacreBLEU's own (2.x) methods: a release without them scores whole
        return scorer.corpus_score(list(hyps), [list(refs) for refs in streams])
    stats: list[Any] = []
    with _each_warning_once():
        for start in range(0, len(hyps), SCORE_CHUNK):
            end = start + SCORE_CHUNK
            stats += scorer._extract_corpus_statistics(hyps[start:end], [refs[start:end] for refs in streams])
    return scorer._aggregate_and_compute(stats)


@contextlib.contextmanager
def _each_warning_once() -> Iterator[None]:
    """sacreBLEU's log messages, each shown once while the block runs."""
    seen: set[str] = set()

    def first_time(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in seen:
            return False
        seen.add(message)
        return True

    sacre_log = logging.getLogger("sacrebleu")
    sacre_log.addFilter(first_time)
    try:
        yield
    finally:
        sacre_log.removeFilter(first_time)


def format_scores(name: str, scores: dict[str, Any]) -> str:
    """A line of every metric in `scores`, then one line per signature, each led by its metric's label."""
    found = [m for m in METRICS.values() if m.name in scores and m.scorer is not None]
    values = "  ".join(f"{m.label} = {scores[m.name]:.2f}" for m in found)
    signed = [m for m in found if m.name + "_signature" in scores]
    width = max((len(m.label) for m in signed), default=0) + 1
    signatures = "".join(f"\n  {m.label + ':':<{width}} {scores[m.name + '_signature']}" for m in signed)
    n = scores["sentences"]
    return f"{name}: {values}  ({n} sentence{'' if n == 1 else 's'}){signatures}"
