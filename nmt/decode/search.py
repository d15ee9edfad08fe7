"""One search loop for greedy, beam and sampling decoding, vectorised over batch x beam.

Each sentence keeps K hypothesis rows (K = beam; 1 for greedy and sampling), so
the model always sees N = b * K rows for the b sentences still active. A step:

1. the model scores the next token of every row (`decode_step`, or `decode` on
   the whole prefix when `cached=False`);
2. constraints apply: PAD and BOS never, EOS not before `min_len`, only EOS once
   a sentence reaches its maximum length;
3. a step function (`greedy_step`, `beam_step`, `sample_step`) chooses, per
   sentence, K (score, token, origin row) triples;
4. hypotheses that chose EOS are set aside as finished and their rows set to
   -inf, so later steps never extend them (the other rows refill the beam at
   the next step); a sentence is done once it has K finished hypotheses
   (fairseq's early stopping: the best of them is final, although with a
   length penalty a longer unfinished one could in principle still beat it),
   once it reaches its maximum length, or when no row is alive;
5. the decoder state is reordered by origin and done sentences are dropped,
   with one `index_select` on the N rows, so work shrinks as sentences finish.

A sentence's maximum length is `floor(max_len_a * src_len + max_len_b)` tokens
(EOS excluded) for its unpadded source length; at that step EOS is forced,
with the model's own EOS log-probability.

Scores: rows are ranked by cumulative log-probability. All candidates of one
step have the same length, so the length penalty would not change their order;
it and the coverage penalty (`nmt.decode.beam`) score a hypothesis once, when it
finishes, with |Y| counting the final EOS.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from nmt.decode.beam import beam_step, coverage_penalty, length_penalty
from nmt.decode.greedy import greedy_step
from nmt.decode.sampling import Sampling, make_sample_step
from nmt.models.contract import Memory, Seq2Seq, State

StepFn = Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]
"""(log_probs (B, K, V), scores (B, K)) -> (scores, tokens, origins), each (B, K)."""


@dataclass
class Hypothesis:
    """One output of the search.

    Attributes:
        tokens: output ids, without BOS and without the final EOS.
        score: what hypotheses are ranked by: log_prob / lp(len(tokens) + 1),
            plus the coverage penalty when one is used.
        log_prob: sum of the token log-probabilities, EOS included.
        attention: attention of each output step (EOS included) over the
            unpadded source, (len(tokens) + 1, S_unpadded); None unless requested.
    """

    tokens: list[int]
    score: float
    log_prob: float
    attention: Tensor | None = None


@dataclass(frozen=True)
class _Options:
    beam: int
    alpha: float
    beta: float
    min_len: int
    cached: bool
    need_attn: bool
    bos_id: int
    eos_id: int
    pad_id: int

    @property
    def want_attn(self) -> bool:
        return self.need_attn or self.beta > 0


@dataclass
class _Active:
    """The sentences still searched; each owns K consecutive rows of the N = b * K."""

    sent: Tensor  # (b,) position of each sentence in the input batch
    max_len: Tensor  # (b,) longest output, EOS excluded
    n_finished: Tensor  # (b,)
    scores: Tensor  # (b, K) cumulative log-probs; -inf marks a finished or empty row
    prefix: Tensor  # (N, t + 1) tokens fed so far, BOS first
    attn: Tensor | None  # (N, t, S) attention of each step so far
    memory: Memory  # rows (N, ...)
    state: State | None  # rows (N, ...); None when uncached


@dataclass
class _Finished:
    """Hypotheses set aside at one step (n of them, t tokens each)."""

    sent: Tensor  # (n,)
    tokens: Tensor  # (n, t)
    log_prob: Tensor  # (n,)
    score: Tensor  # (n,)
    attn: Tensor | None  # (n, t + 1, S)


def search(
    model: Seq2Seq,
    src: Tensor,
    src_pad_mask: Tensor,
    *,
    beam: int = 1,
    nbest: int = 1,
    length_penalty: float = 1.0,
    max_len_a: float,
    max_len_b: int,
    min_len: int = 0,
    coverage_penalty: float = 0.0,
    sampling: Sampling | None = None,
    cached: bool = True,
    need_attn: bool = False,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    pad_id: int = PAD_ID,
    step_fn: StepFn | None = None,
) -> list[list[Hypothesis]]:
    """Translate a batch: greedy (beam=1), beam search (beam>1) or sampling.

    The model should be in eval mode; the search runs under `torch.inference_mode()`.

    Args:
        model: any `Seq2Seq`.
        src: source ids, (B, S).
        src_pad_mask: True at source padding, (B, S).
        beam: hypotheses kept per sentence (K).
        nbest: hypotheses returned per sentence, at most `beam`.
        length_penalty: GNMT alpha; 0 ranks by raw log-probability.
        max_len_a, max_len_b: at most floor(a * src_len + b) output tokens, EOS excluded.
        min_len: EOS is forbidden before this many output tokens.
        coverage_penalty: GNMT beta; > 0 needs attention from `decode_step`.
        sampling: sample instead of choosing the best (needs beam=1).
        cached: use `decode_step` (True) or recompute `decode` on the whole
            prefix each step (False, same hypotheses, for benchmarks).
        need_attn: return each hypothesis's attention.
        bos_id, eos_id, pad_id: special target ids.
        step_fn: overrides the step function chosen from beam and sampling.

    Returns:
        For each sentence, up to `nbest` hypotheses, best score first (fewer only
        when the vocabulary and length limits allow fewer distinct outputs).

    Raises:
        ValueError: on inconsistent arguments, or when attention is needed
            (need_attn, coverage_penalty > 0) and the model returns none.
    """
    _check_args(src, src_pad_mask, beam, nbest, max_len_a, max_len_b, min_len,
                coverage_penalty, sampling, cached, need_attn)
    if step_fn is None:
        step_fn = _default_step_fn(beam, sampling, src.device)
    opts = _Options(beam=beam, alpha=length_penalty, beta=coverage_penalty, min_len=min_len,
                    cached=cached, need_attn=need_attn, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    with torch.inference_mode():
        if src.size(0) == 0:
            return []
        max_len = _max_lengths(src_pad_mask, max_len_a, max_len_b)
        finished = _run(model, src, src_pad_mask, max_len, step_fn, opts)
        return _assemble(finished, src_pad_mask, nbest, need_attn)


def greedy_search(model: Seq2Seq, src: Tensor, src_pad_mask: Tensor, **kwargs) -> list[Hypothesis]:
    """The single greedy hypothesis of each sentence; `kwargs` as for `search` (beam=1)."""
    return [hyps[0] for hyps in search(model, src, src_pad_mask, beam=1, step_fn=greedy_step, **kwargs)]


def beam_search(model: Seq2Seq, src: Tensor, src_pad_mask: Tensor, *, beam: int, **kwargs) -> list[list[Hypothesis]]:
    """Beam search with `beam_step` for any beam, even 1; `kwargs` as for `search`."""
    return search(model, src, src_pad_mask, beam=beam, step_fn=beam_step, **kwargs)


def _check_args(src: Tensor, src_pad_mask: Tensor, beam: int, nbest: int, max_len_a: float,
                max_len_b: int, min_len: int, beta: float, sampling: Sampling | None,
                cached: bool, need_attn: bool) -> None:
    if src.dim() != 2 or src_pad_mask.shape != src.shape:
        raise ValueError(f"src {tuple(src.shape)} and src_pad_mask {tuple(src_pad_mask.shape)} "
                         "must both be (B, S)")
    if beam < 1 or not 1 <= nbest <= beam:
        raise ValueError(f"need beam >= 1 and 1 <= nbest <= beam, got beam={beam}, nbest={nbest}")
    if max_len_a < 0 or max_len_b < 0 or min_len < 0:
        raise ValueError(f"max_len_a ({max_len_a}), max_len_b ({max_len_b}) and min_len ({min_len}) "
                         "must be >= 0")
    if beta < 0:
        raise ValueError(f"coverage_penalty ({beta}) must be >= 0")
    if sampling is not None and beam != 1:
        raise ValueError(f"sampling draws one hypothesis per sentence; beam ({beam}) must be 1")
    if not cached and (need_attn or beta > 0):
        raise ValueError("cached=False gives no attention: need_attn and coverage_penalty "
                         f"need cached=True (need_attn={need_attn}, coverage_penalty={beta})")


def _default_step_fn(beam: int, sampling: Sampling | None, device: torch.device) -> StepFn:
    if sampling is not None:
        return make_sample_step(sampling, device)
    return greedy_step if beam == 1 else beam_step


def _max_lengths(src_pad_mask: Tensor, a: float, b: int) -> Tensor:
    """Longest output of each sentence, EOS excluded: (B, S) -> (B,)."""
    src_lens = (~src_pad_mask).sum(dim=1).double()  # (B,)
    return (a * src_lens + b).floor().long()


def _run(model: Seq2Seq, src: Tensor, src_pad_mask: Tensor, max_len: Tensor,
         step_fn: StepFn, opts: _Options) -> list[_Finished]:
    """The loop: advance every active row one token per step until all sentences are done."""
    K, device = opts.beam, src.device
    batch, longest = src.size(0), int(max_len.max())
    rows = torch.arange(batch, device=device).repeat_interleave(K)  # (B*K,)
    memory = model.encode(src, src_pad_mask).index_select(rows)
    scores = torch.full((batch, K), -math.inf, device=device)  # identical rows: only row 0 expands
    scores[:, 0] = 0.0
    act = _Active(
        sent=torch.arange(batch, device=device), max_len=max_len.to(device),
        n_finished=torch.zeros(batch, dtype=torch.long, device=device), scores=scores,
        prefix=torch.full((batch * K, 1), opts.bos_id, dtype=torch.long, device=device),
        attn=None, memory=memory,
        # Positions 0 .. longest are fed (BOS, then up to `longest` tokens): caches can be preallocated.
        state=model.init_state(memory, max_len=longest + 1) if opts.cached else None,
    )
    finished: list[_Finished] = []
    for step in range(longest + 1):
        log_probs, state, attn = _next_log_probs(model, act, opts)
        log_probs = _constrain(log_probs, step, act.max_len.repeat_interleave(K), opts)
        b = act.sent.numel()
        scores, tokens, origins = step_fn(log_probs.view(b, K, -1), act.scores)  # (b, K)
        order = (origins + torch.arange(b, device=device).unsqueeze(1) * K).flatten()  # (N,)
        prefix = torch.cat([act.prefix[order], tokens.view(-1, 1)], dim=1)  # (N, t + 2)
        history = None  # (N, t + 1, S)
        if attn is not None:
            step_attn = attn[order].unsqueeze(1)  # (N, 1, S)
            history = step_attn if act.attn is None else torch.cat([act.attn[order], step_attn], dim=1)
        ended = tokens.eq(opts.eos_id) & scores.isfinite()  # (b, K)
        if ended.any():
            finished.append(_set_aside(act.sent, ended, scores, prefix, history, src_pad_mask, opts))
        act.scores = scores.masked_fill(ended, -math.inf)
        act.n_finished = act.n_finished + ended.sum(dim=1)
        done = (act.n_finished >= K) | (act.max_len <= step) | act.scores.isneginf().all(dim=1)
        if done.all():
            break
        _advance(act, ~done, order, prefix, history, state)
    return finished


def _next_log_probs(model: Seq2Seq, act: _Active, opts: _Options) -> tuple[Tensor, State | None, Tensor | None]:
    """Next-token log-probabilities (N, V) of every row, the new state, attention (N, S) or None."""
    if opts.cached:
        log_probs, state, attn = model.decode_step(act.prefix[:, -1], act.memory, act.state,
                                                   need_attn=opts.want_attn)
        if opts.want_attn and attn is None:
            raise ValueError(f"{type(model).__name__}.decode_step returned no attention, needed by "
                             f"need_attn ({opts.need_attn}) or coverage_penalty ({opts.beta})")
        return log_probs.float(), state, attn if opts.want_attn else None
    logits = model.decode(act.prefix, act.memory)  # (N, t + 1, V)
    return logits[:, -1].float().log_softmax(dim=-1), None, None


def _constrain(log_probs: Tensor, step: int, max_len: Tensor, opts: _Options) -> Tensor:
    """Forbid PAD and BOS; EOS before min_len; anything but EOS at max_len.

    Args:
        log_probs: (N, V) for the token after `step` output tokens; not modified.
        max_len: each row's maximum output length, (N,).
    """
    out = log_probs.clone()  # (N, V)
    out[:, opts.pad_id] = -math.inf
    if opts.bos_id != opts.eos_id:
        out[:, opts.bos_id] = -math.inf
    if step < opts.min_len:
        out[:, opts.eos_id] = -math.inf
    at_max = max_len <= step  # (N,)
    if at_max.any():
        eos_only = torch.full_like(out, -math.inf)
        eos_only[:, opts.eos_id] = log_probs[:, opts.eos_id]
        out = torch.where(at_max.unsqueeze(1), eos_only, out)
    return out


def _set_aside(sent: Tensor, ended: Tensor, scores: Tensor, prefix: Tensor, history: Tensor | None,
               src_pad_mask: Tensor, opts: _Options) -> _Finished:
    """Score the hypotheses that just chose EOS and copy them out.

    Args:
        sent: input position of each active sentence, (b,).
        ended: rows that chose EOS, (b, K).
        scores: cumulative log-probabilities, EOS included, (b, K).
        prefix: tokens of each row, BOS first and EOS last, (N, t + 2).
        history: attention of each row's steps, (N, t + 1, S), or None.
    """
    rows = ended.flatten().nonzero().squeeze(1)  # (n,)
    sent = sent[torch.div(rows, opts.beam, rounding_mode="floor")]  # (n,)
    log_prob = scores.flatten()[rows]  # (n,)
    length = prefix.size(1) - 1  # output tokens including this EOS
    score = log_prob / length_penalty(length, opts.alpha)
    attn = history[rows] if history is not None else None  # (n, t + 1, S)
    if opts.beta > 0:
        score = score + coverage_penalty(attn, src_pad_mask[sent], opts.beta)
    return _Finished(sent=sent, tokens=prefix[rows, 1:-1], log_prob=log_prob, score=score,
                     attn=attn if opts.need_attn else None)


def _advance(act: _Active, keep: Tensor, order: Tensor, prefix: Tensor,
             history: Tensor | None, state: State | None) -> None:
    """Take the reordered rows and drop the sentences not in `keep`, in place.

    Args:
        keep: sentences still searched, (b,).
        order: the old row each new row extends, (N,); `prefix` (N, t + 2) and
            `history` (N, t + 1, S) are already in that order, `state` is not.
    """
    K = act.scores.size(1)
    if keep.all():
        act.prefix, act.attn = prefix, history
        act.state = state.index_select(order) if state is not None and K > 1 else state
        return
    kept = keep.nonzero().squeeze(1)  # (b',)
    rows = (kept.unsqueeze(1) * K + torch.arange(K, device=kept.device)).flatten()  # (b' * K,)
    act.sent, act.max_len = act.sent[kept], act.max_len[kept]
    act.n_finished, act.scores = act.n_finished[kept], act.scores[kept]
    act.prefix, act.memory = prefix[rows], act.memory.index_select(rows)
    act.attn = history[rows] if history is not None else None
    act.state = state.index_select(order[rows]) if state is not None else None


def _assemble(finished: list[_Finished], src_pad_mask: Tensor, nbest: int,
              need_attn: bool) -> list[list[Hypothesis]]:
    """Group finished hypotheses by sentence, best first, `nbest` each."""
    per_sentence: list[list[Hypothesis]] = [[] for _ in range(src_pad_mask.size(0))]
    for chunk in finished:
        columns = zip(chunk.sent.tolist(), chunk.tokens.tolist(), chunk.log_prob.tolist(),
                      chunk.score.tolist(), strict=True)
        for i, (sent, tokens, log_prob, score) in enumerate(columns):
            attn = chunk.attn[i][:, ~src_pad_mask[sent]] if need_attn else None  # (T_out, S_unpadded)
            per_sentence[sent].append(Hypothesis(tokens, score, log_prob, attn))
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in per_sentence]
