"""Search: greedy, beam and sampling decoding over any `nmt.models.contract.Seq2Seq`.

`search` is the entry point, `SearchOptions` its settings; `greedy_step`,
`beam_step` and `sample_step` are the per-step choices its one loop is
parametrised by.
"""

from nmt.decode.beam import beam_step, coverage_penalty, length_penalty
from nmt.decode.greedy import greedy_step
from nmt.decode.options import CHUNK_LINES, MAX_CHUNK_LINES, SearchOptions, StepFn
from nmt.decode.sampling import Sampling, filter_logits, sample_step
from nmt.decode.search import Hypothesis, beam_search, greedy_search, search

__all__ = [
    "CHUNK_LINES",
    "MAX_CHUNK_LINES",
    "SearchOptions",
    "Hypothesis",
    "Sampling",
    "StepFn",
    "beam_search",
    "beam_step",
    "coverage_penalty",
    "filter_logits",
    "greedy_search",
    "greedy_step",
    "length_penalty",
    "sample_step",
    "search",
]
