"""Search settings as one object, from the command line to the search loop.

`SearchOptions` is what `nmt translate`, `Translator` and `search` all take; the
checkpoint's `decode` section gives the defaults of a translation
(`Translator.options`), and the few defaults here serve direct calls of `search`.
The strategy is picked in one place, `SearchOptions.step_fn`: a built-in name, or
any `StepFn` (which sees the step index, the prefixes and each sentence's input line,
so n-gram blocking or a diverse beam is a new step function, not an edit of the loop).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import torch
from torch import Tensor

from nmt.config.ranges import range_of
from nmt.config.schema import DecodeConfig, check_length_limit
from nmt.decode.beam import beam_step
from nmt.decode.greedy import greedy_step
from nmt.decode.sampling import Sampling, make_sample_step
from nmt.errors import UserError

CHUNK_LINES = 2000
"""Lines a stream is read and translated at a time, at least (`Translator.chunk_lines`): memory
stays bounded on files of any size, and each chunk is sorted by length into batches."""

MAX_CHUNK_LINES = 32_000
"""The most lines a stream is read and translated at a time (`Translator.chunk_lines`)."""


class StepFn(Protocol):
    """The choice of one search step, for every sentence: K (score, token, origin row) triples.

    Args:
        log_probs: next-token log-probabilities, (B, K, V), constraints applied.
        scores: cumulative log-probabilities of the K rows, (B, K); -inf marks an empty row.
        step: output tokens so far (0 at the first step): the output position the step chooses,
            the same for a sentence in any batch.
        prefix: the tokens of each row so far, BOS first, (B, K, step + 1).
        lines: the input line of each sentence, (B,) int64 on the device (`search`'s `lines`):
            what a sentence is, whichever row of whichever batch it is in (a sampler's draws are
            keyed by it).

    Returns:
        scores, tokens, origins: each (B, K); origins index the rows 0..K-1 extended.
    """

    def __call__(self, log_probs: Tensor, scores: Tensor, *, step: int, prefix: Tensor,
                 lines: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...


Strategy = Literal["auto", "greedy", "beam", "sample"]


@dataclass(frozen=True)
class SearchOptions:
    """How to translate.

    Attributes:
        max_len_a, max_len_b: at most floor(a * src_len + b) output tokens, EOS excluded.
        beam: hypotheses kept per sentence (K).
        nbest: hypotheses returned per sentence, at most `beam`.
        strategy: "auto" (sampling with `sampling`, else greedy at beam 1, else beam
            search), "greedy", "beam" (even at beam 1), "sample", or a `StepFn`.
        sampling: temperature and filters for sampling (needs beam 1).
        length_penalty: GNMT alpha; 0 ranks by raw log-probability.
        coverage_penalty: GNMT beta; > 0 needs attention from `decode_step`.
        min_len: EOS is forbidden before this many output tokens.
        attention: return each hypothesis's attention.
        cached: incremental decoding with `decode_step` (False recomputes the whole
            prefix each step: same hypotheses, for benchmarks).
        max_tokens: batch budget of `Translator` (padded source tokens times beam);
            0: by device. The search itself gets one batch.
        sync_every: steps between the host's checks for done sentences; None: every
            step on the CPU, every 8 elsewhere (see `nmt.decode.search`).

    Raises:
        ValueError: inconsistent settings, naming the values, or a setting outside the range its
            `decode` key of the config has (`DecodeConfig`): the same limits from a config as from
            the command line or a direct call.
    """

    max_len_a: float
    max_len_b: int
    beam: int = 1
    nbest: int = 1
    strategy: Strategy | StepFn = "auto"
    sampling: Sampling | None = None
    length_penalty: float = 1.0
    coverage_penalty: float = 0.0
    min_len: int = 0
    attention: bool = False
    cached: bool = True
    max_tokens: int = 0
    sync_every: int | None = None

    def __post_init__(self) -> None:
        for name, valid in DECODE_RANGES.items():
            problem = valid.problem(getattr(self, name))
            if problem:
                raise ValueError(f"{name}: {problem}")
        if isinstance(self.strategy, str) and self.strategy not in get_args(Strategy):
            raise ValueError(f"strategy ({self.strategy!r}) must be one of {get_args(Strategy)} or a StepFn")
        check_length_limit(self.max_len_a, self.max_len_b, self.min_len)
        if self.sampling is not None and self.strategy in ("greedy", "beam"):  # a StepFn may be the sampler itself
            raise ValueError(f"sampling settings need strategy 'sample' or 'auto', not {self.strategy!r}, "
                             "which would ignore them")
        sampling = self.sampling is not None or self.strategy == "sample"
        if problem := count_problem(beam=self.beam, nbest=self.nbest, sampling=sampling):
            raise ValueError(problem)
        if self.strategy == "greedy" and self.beam != 1:
            raise ValueError(f"greedy search keeps one hypothesis; beam ({self.beam}) must be 1")
        if not self.cached and (self.attention or self.coverage_penalty > 0):
            raise ValueError("cached=False gives no attention: attention and coverage_penalty need cached=True "
                             f"(attention={self.attention}, coverage_penalty={self.coverage_penalty})")
        if self.sync_every is not None and self.sync_every < 1:
            raise ValueError(f"sync_every ({self.sync_every}) must be >= 1")

    @property
    def wants_attention(self) -> bool:
        """Whether the model must return attention (asked for, or for the coverage penalty)."""
        return self.attention or self.coverage_penalty > 0

    def step_fn(self, device: torch.device) -> StepFn:
        """The step function the strategy names. An unseeded sampler's seed is drawn here, so one
        `step_fn` used for several batches draws them all from one seed (`make_sample_step`)."""
        match self.strategy:
            case "sample":
                return make_sample_step(self.sampling or Sampling())
            case "auto" if self.sampling is not None:
                return make_sample_step(self.sampling)
            case "greedy":
                return greedy_step
            case "beam":
                return beam_step
            case "auto":
                return greedy_step if self.beam == 1 else beam_step
            case _:
                return self.strategy


# The keys a `decode` section shares with `SearchOptions`, and their valid values.
DECODE_RANGES = {f.name: range_of(f) for f in dataclasses.fields(DecodeConfig)
                 if range_of(f) is not None and f.name in {g.name for g in dataclasses.fields(SearchOptions)}}


def check_search_flags(**given: object) -> None:
    """Refuse a search setting given on the command line (None: not given) that `decode` would refuse, naming its
    option (`length_penalty` as `--length-penalty`), before any model is loaded.

    Raises:
        UserError: the option and its range.
    """
    for name, value in given.items():
        problem = None if value is None else DECODE_RANGES[name].problem(value)
        if problem:
            raise UserError(f"--{name.replace('_', '-')}: {problem}")


def count_problem(*, beam: int | None, nbest: int, sampling: bool, flags: bool = False) -> str | None:
    """What is wrong with these counts of translations (`beam` None: not given), or None: the rules of
    `SearchOptions`, which `flags` words for the command line (`--nbest`, `--beam`, `--sample`), where a beam left
    out is the larger of the checkpoint's and --nbest, so that `nmt translate` refuses them before the model loads."""
    n, b = ("--nbest", "--beam") if flags else ("nbest", "beam")
    one = f"{'--sample' if flags else 'sampling'} draws one translation per line"
    if nbest < 1:
        return f"{n} ({nbest}) must be at least 1"
    if sampling and nbest > 1:
        return f"{one}; {n} ({nbest}) must be 1"
    if sampling and beam is not None and beam != 1:
        return f"{one}; {b} ({beam}) must be 1" + (" or left out" if flags else "")
    if beam is not None and nbest > beam:
        return f"{n} ({nbest}) cannot exceed {b} ({beam})" + (
            f"; give a beam of at least {nbest}, or leave --beam out to take the larger of the checkpoint's beam "
            "and --nbest" if flags else "")
    return None
