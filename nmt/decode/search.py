"""One search loop for greedy, beam and sampling decoding, vectorised over batch x beam.

Each sentence keeps K hypothesis rows (K = beam; 1 for greedy and sampling), so
the model always sees N = b * K rows for the b sentences still active. A step:

1. the model scores the next token of every row (`decode_step`, or `decode` on
   the whole prefix when `cached=False`);
2. constraints apply: PAD and BOS never, EOS not before `min_len`, only EOS once
   a sentence reaches its maximum length;
3. the step function of `SearchOptions.strategy` (`greedy_step`, `beam_step`,
   `sample_step`, or any `StepFn`) chooses, per sentence, K (score, token,
   origin row) triples, seeing the step index, the prefixes and each sentence's
   input line (what keys a sampler's draws, so that they do not depend on the batch);
4. hypotheses that chose EOS are scored and copied into preallocated slots of
   their sentence (`_Finished`) and their rows set to -inf, so later steps
   never extend them (the other rows refill the beam at the next step); a
   sentence is done once it has K finished hypotheses (fairseq's early
   stopping: the best of them is final, although with a length penalty a
   longer unfinished one could in principle still beat it), once it reaches
   its maximum length, or when no row is alive; a done sentence's rows are
   set to -inf too, so it is searched no further;
5. the decoder state is reordered by origin. Every `sync_every` steps the host
   looks at which sentences are done: the search ends when all are, and done
   sentences are dropped with one `index_select` on the N rows, so work
   shrinks as sentences finish.

Steps 1-4 run on the device without waiting for it: every decision is a tensor
operation (`torch.where`, scatter into the slots), none reads a tensor on the
host. Only step 5's check does, once per `sync_every` steps, so on a GPU the
host queues steps ahead of the kernels instead of waiting for each step.

A sentence's maximum length is `floor(max_len_a * src_len + max_len_b)` tokens
(EOS excluded) for its unpadded source length; at that step EOS is forced,
with the model's own EOS log-probability.

Scores: rows are ranked by cumulative log-probability. All candidates of one
step have the same length, so the length penalty would not change their order;
it and the coverage penalty (`nmt.decode.beam`) score a hypothesis once, when it
finishes, with |Y| counting the final EOS.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nmt.config.schema import LENGTH_ROUNDING
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from nmt.decode.beam import coverage_penalty, length_penalty
from nmt.decode.options import SearchOptions, StepFn
from nmt.models.contract import Memory, Seq2Seq, State


@dataclass
class Hypothesis:
    """One output of the search.

    Attributes:
        tokens: output ids, without BOS and without the final EOS.
        score: what hypotheses are ranked by: log_prob / lp(len(tokens) + 1),
            plus the coverage penalty when one is used.
        log_prob: sum of the token log-probabilities, EOS included.
        attention: attention of each output step (EOS included) over the
            unpadded source, (len(tokens) + 1, S_unpadded), fp32 on the CPU; None unless requested.
    """

    tokens: list[int]
    score: float
    log_prob: float
    attention: Tensor | None = None


@dataclass(frozen=True)
class _Ids:
    bos: int
    eos: int
    pad: int


_GPU_SYNC_EVERY = 8
"""Steps between the host's looks at which sentences are done, off the CPU.

Reading a device tensor on the host waits for every queued kernel, and a small
model's step is mostly the host queueing kernels: one wait per step leaves the
GPU idle for most of it. Every 8 steps, the host runs up to 8 steps ahead; the
price is at most 7 steps of extra work on sentences already done (their rows
are at -inf: they change nothing) and a batch that shrinks in steps of 8. On
the CPU reading a tensor costs nothing, so the search looks every step there.
"""


@dataclass
class _Active:
    """The sentences still searched; each owns K consecutive rows of the N = b * K."""

    sent: Tensor  # (b,) position of each sentence in the input batch
    line: Tensor  # (b,) input line of each sentence (`search`'s `lines`), for the step function
    max_len: Tensor  # (b,) longest output, EOS excluded
    scores: Tensor  # (b, K) cumulative log-probs; -inf marks a finished or empty row, or a done sentence
    prefix: Tensor  # (N, t + 1) tokens fed so far, BOS first
    attn: Tensor | None  # (N, t, S) attention of each step so far; its sum (N, 1, S) for the coverage penalty alone
    memory: Memory  # rows (N, ...)
    state: State | None  # rows (N, ...); None when uncached


@dataclass
class _Finished:
    """The finished hypotheses of every input sentence, in preallocated device tensors.

    A sentence has fewer than K finished hypotheses before a step (else it is
    done) and gains at most K at a step, so 2K - 1 slots hold them all, in the
    order they finished; slot F - 1 = 2K - 1 takes the writes of the rows that
    did not finish, so one scatter per step serves all rows, none chosen on the host.
    """

    count: Tensor  # (B,) slots used
    length: Tensor  # (B, F) output tokens, EOS excluded
    tokens: Tensor  # (B, F, L + 1) output tokens, EOS at `length`
    log_prob: Tensor  # (B, F)
    score: Tensor  # (B, F)
    attn: Tensor | None  # (B, F, L + 1, S) attention of each output step, allocated at the first write

    @classmethod
    def empty(cls, batch: int, beam: int, longest: int, device: torch.device) -> _Finished:
        F = 2 * beam
        return cls(count=torch.zeros(batch, dtype=torch.long, device=device),
                   length=torch.zeros(batch, F, dtype=torch.long, device=device),
                   tokens=torch.zeros(batch, F, longest + 1, dtype=torch.long, device=device),
                   log_prob=torch.zeros(batch, F, device=device), score=torch.zeros(batch, F, device=device),
                   attn=None)

    @property
    def discard(self) -> int:
        """The slot that takes the writes of rows that did not finish."""
        return self.length.size(1) - 1


def search(
    model: Seq2Seq,
    src: Tensor,
    src_pad_mask: Tensor,
    options: SearchOptions | None = None,
    *,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    pad_id: int = PAD_ID,
    lines: Tensor | Sequence[int] | None = None,
    **fields: Any,
) -> list[list[Hypothesis]]:
    """Translate a batch: greedy, beam search or sampling, as `options` say.

    The model should be in eval mode; the search runs under `torch.inference_mode()`.

    Args:
        model: any `Seq2Seq`.
        src: source ids, (B, S).
        src_pad_mask: True at source padding, (B, S).
        options: the search settings; or give their `fields` as keywords
            (`search(model, src, mask, beam=5, max_len_a=1.5, max_len_b=10)`).
        bos_id, eos_id, pad_id: special target ids.
        lines: the input line of each sentence, (B,) ints, which the step function
            sees (`StepFn`); None: 0 .. B-1. A seeded sampler draws a sentence's
            tokens from its line, so a line searched in any batch, at any row, gets
            the same sample (`Translator` gives each line its number in the input).

    The hypotheses do not depend on `options.sync_every`, sampled ones included.

    Returns:
        For each sentence, up to `nbest` hypotheses, best score first (fewer only
        when the vocabulary and length limits allow fewer distinct outputs).

    Raises:
        ValueError: on inconsistent options or shapes, or when attention is needed
            (attention, coverage_penalty > 0) and the model returns none.
    """
    if options is None:
        options = SearchOptions(**fields)
    elif fields:
        options = dataclasses.replace(options, **fields)
    if src.dim() != 2 or src_pad_mask.shape != src.shape:
        raise ValueError(f"src {tuple(src.shape)} and src_pad_mask {tuple(src_pad_mask.shape)} "
                         "must both be (B, S)")
    if lines is not None and len(lines) != src.size(0):
        raise ValueError(f"lines ({len(lines)}) must number the {src.size(0)} sentences of src")
    step_fn = options.step_fn(src.device)
    sync_every = options.sync_every or (1 if src.device.type == "cpu" else _GPU_SYNC_EVERY)
    ids = _Ids(bos=bos_id, eos=eos_id, pad=pad_id)
    with torch.inference_mode():
        if src.size(0) == 0:
            return []
        max_len = _max_lengths(src_pad_mask, options.max_len_a, options.max_len_b)
        finished = _run(model, src, src_pad_mask, max_len, lines, step_fn, options, ids, sync_every)
        return _assemble(finished, src_pad_mask, options.nbest, options.attention)


def greedy_search(model: Seq2Seq, src: Tensor, src_pad_mask: Tensor, **fields: Any) -> list[Hypothesis]:
    """The single greedy hypothesis of each sentence; `fields` as for `SearchOptions`."""
    return [hyps[0] for hyps in search(model, src, src_pad_mask, strategy="greedy", **fields)]


def beam_search(model: Seq2Seq, src: Tensor, src_pad_mask: Tensor, *, beam: int, **fields: Any) -> list[list[Hypothesis]]:
    """Beam search with `beam_step` for any beam, even 1; `fields` as for `SearchOptions`."""
    return search(model, src, src_pad_mask, beam=beam, strategy="beam", **fields)


def _max_lengths(src_pad_mask: Tensor, a: float, b: int) -> Tensor:
    """Longest output of each sentence, EOS excluded: (B, S) -> (B,)."""
    src_lens = (~src_pad_mask).sum(dim=1).double()  # (B,)
    return (a * src_lens + b + LENGTH_ROUNDING).floor().long()  # `nmt.config.schema.longest_output`, per row


def _run(model: Seq2Seq, src: Tensor, src_pad_mask: Tensor, max_len: Tensor, lines: Tensor | Sequence[int] | None,
         step_fn: StepFn, opts: SearchOptions, ids: _Ids, sync_every: int) -> _Finished:
    """The loop: advance every active row one token per step until all sentences are done."""
    K, device = opts.beam, src.device
    batch, longest, shortest = src.size(0), int(max_len.max()), int(max_len.min())
    # Before the encoder: a copy from the host waits for queued work.
    bans = _Bans.build(opts.min_len, ids, device)
    line = (torch.arange(batch, device=device) if lines is None
            else torch.as_tensor(lines, dtype=torch.long).to(device))  # (B,)
    rows = torch.arange(batch, device=device).repeat_interleave(K)  # (B*K,)
    memory = model.encode(src, src_pad_mask).index_select(rows)
    scores = torch.full((batch, K), -math.inf, device=device)  # identical rows: only row 0 expands
    scores[:, 0] = 0.0
    act = _Active(
        sent=torch.arange(batch, device=device), line=line, max_len=max_len.to(device), scores=scores,
        prefix=torch.full((batch * K, 1), ids.bos, dtype=torch.long, device=device),
        attn=None, memory=memory,
        # Positions 0 .. longest are fed (BOS, then up to `longest` tokens): caches can be preallocated.
        # Static shapes pay on a GPU; on the CPU, caches grown step by step are cheaper to reorder.
        state=(model.init_state(memory, max_len=None if device.type == "cpu" else longest + 1)
               if opts.cached else None),
    )
    finished = _Finished.empty(batch, K, longest, device)
    for step in range(longest + 1):
        log_probs, state, attn = _next_log_probs(model, act, opts)
        at_max = act.max_len.repeat_interleave(K) if step >= shortest else None
        log_probs = _constrain(log_probs, step, at_max, bans)
        b = act.sent.numel()
        scores, tokens, origins = step_fn(log_probs.view(b, K, -1), act.scores, step=step,
                                          prefix=act.prefix.view(b, K, -1), lines=act.line)  # (b, K)
        order = (origins + torch.arange(b, device=device).unsqueeze(1) * K).flatten()  # (N,)
        prefix = torch.cat([act.prefix[order], tokens.view(-1, 1)], dim=1)  # (N, t + 2)
        history = None  # (N, t + 1, S), or for the coverage penalty alone its running sum (N, 1, S)
        if attn is not None:
            step_attn = attn[order].unsqueeze(1)  # (N, 1, S)
            if act.attn is None:
                history = step_attn
            elif opts.attention:  # every step's, for the plots
                history = torch.cat([act.attn[order], step_attn], dim=1)
            else:  # the coverage each row has so far: the whole history, copied at every step, cost O(T^2 S)
                history = act.attn[order] + step_attn
        ended = tokens.eq(ids.eos) & scores.isfinite()  # (b, K)
        _record(finished, act.sent, ended, scores, prefix, history, src_pad_mask, opts)
        scores = scores.masked_fill(ended, -math.inf)
        done = (finished.count[act.sent] >= K) | (act.max_len <= step) | scores.isneginf().all(dim=1)  # (b,)
        act.scores = scores.masked_fill(done.unsqueeze(1), -math.inf)  # a done sentence goes no further
        kept = None
        if (step + 1) % sync_every == 0:
            kept = (~done).nonzero().squeeze(1)  # (b',) the one host sync
            if kept.numel() == 0:
                break
        _advance(act, kept, order, prefix, history, state)
    return finished


def _next_log_probs(model: Seq2Seq, act: _Active, opts: SearchOptions) -> tuple[Tensor, State | None, Tensor | None]:
    """Next-token log-probabilities (N, V) of every row, the new state, attention (N, S) or None."""
    if opts.cached:
        log_probs, state, attn = model.decode_step(act.prefix[:, -1], act.memory, act.state,
                                                   need_attn=opts.wants_attention)
        if opts.wants_attention and attn is None:
            raise ValueError(f"{type(model).__name__}.decode_step returned no attention, needed by "
                             f"attention ({opts.attention}) or coverage_penalty ({opts.coverage_penalty})")
        # fp32 like the scores: the coverage penalty and returned attention of bf16 or fp16 weights
        return log_probs.float(), state, attn.float() if opts.wants_attention else None
    logits = model.decode(act.prefix, act.memory)  # (N, t + 1, V)
    return logits[:, -1].float().log_softmax(dim=-1), None, None


def _constrain(log_probs: Tensor, step: int, max_len: Tensor | None, bans: _Bans) -> Tensor:
    """Forbid PAD and BOS; EOS before min_len; anything but EOS at max_len; NaN everywhere. In place.

    A NaN (a row whose fp16 activations overflowed) becomes -inf: `topk` and `argmax` rank NaN above
    every number, so one such row would take every beam slot of its sentence and lose its finite
    hypotheses.

    The model's log-probabilities are the search's to write into (`Seq2Seq.decode_step`): only the few
    banned columns are set to -inf, where adding a (V,) row of 0 and -inf to every hypothesis's row took
    a pass over the (N, V) values and a new (N, V) tensor at every step.

    Args:
        log_probs: (N, V) for the token after `step` output tokens; written and returned.
        max_len: each row's maximum output length, (N,); None when no row can be
            at its maximum yet (before the shortest maximum), which saves an (N, V)
            pass at most steps.
    """
    log_probs.nan_to_num_(nan=-math.inf, posinf=math.inf, neginf=-math.inf)
    if max_len is not None:
        eos = log_probs[:, bans.eos].clone()  # (N,) the model's own, which a row at its maximum keeps
    log_probs.index_fill_(1, bans.early if step < bans.min_len else bans.always, -math.inf)
    if max_len is None:
        return log_probs
    # At max_len only EOS, with the model's own log-probability (even before min_len);
    # applied to every row by masks, since asking which rows are there would wait for the device.
    at_max = max_len <= step  # (N,)
    log_probs.masked_fill_(at_max.unsqueeze(1), -math.inf)
    log_probs[:, bans.eos] = torch.where(at_max, eos, log_probs[:, bans.eos])
    return log_probs


@dataclass(frozen=True)
class _Bans:
    """The columns `_constrain` sets to -inf, each a (n,) tensor of token ids, and EOS's id."""

    always: Tensor  # PAD and BOS
    early: Tensor  # PAD, BOS and EOS: before min_len
    eos: int
    min_len: int

    @classmethod
    def build(cls, min_len: int, ids: _Ids, device: torch.device) -> _Bans:
        always = [ids.pad] + ([ids.bos] if ids.bos != ids.eos else [])
        return cls(torch.tensor(always, device=device), torch.tensor([*always, ids.eos], device=device),
                   ids.eos, min_len)


def _record(finished: _Finished, sent: Tensor, ended: Tensor, scores: Tensor, prefix: Tensor,
            history: Tensor | None, src_pad_mask: Tensor, opts: SearchOptions) -> None:
    """Score the hypotheses that just chose EOS and copy them into their sentences' next free slots.

    Every row is scored and written; those that did not end go to the discard
    slot, so no row is chosen on the host.

    Args:
        sent: input position of each active sentence, (b,).
        ended: rows that chose EOS, (b, K).
        scores: cumulative log-probabilities, EOS included, (b, K).
        prefix: tokens of each row, BOS first and EOS last, (N, t + 2).
        history: attention of each row's steps, (N, t + 1, S), their sum (N, 1, S) where only the coverage
            penalty reads it (`opts.attention` off), or None.
    """
    b, K = ended.shape
    length = prefix.size(1) - 1  # output tokens including this EOS
    slot = finished.count[sent].unsqueeze(1) + ended.long().cumsum(dim=1) - 1  # (b, K), in row order
    at = (sent.unsqueeze(1).expand(b, K), slot.masked_fill(~ended, finished.discard))  # indices into (B, F)
    score = scores / length_penalty(length, opts.length_penalty)  # (b, K)
    if opts.coverage_penalty > 0:
        row_pad = src_pad_mask[sent].repeat_interleave(K, dim=0)  # (N, S)
        score = score + coverage_penalty(history, row_pad, opts.coverage_penalty).view(b, K)
    finished.log_prob[at] = scores
    finished.score[at] = score
    finished.length[at] = length - 1
    finished.tokens[:, :, :length][at] = prefix[:, 1:].view(b, K, length)
    if opts.attention:
        if finished.attn is None:
            finished.attn = history.new_zeros(*finished.tokens.shape, history.size(2))  # (B, F, L + 1, S)
        finished.attn[:, :, :length][at] = history.view(b, K, length, -1)
    finished.count.index_add_(0, sent, ended.sum(dim=1))


def _advance(act: _Active, kept: Tensor | None, order: Tensor, prefix: Tensor,
             history: Tensor | None, state: State | None) -> None:
    """Take the reordered rows and, when `kept` is given, only the sentences it names, in place.

    Args:
        kept: positions in the active batch of the sentences still searched, (b',),
            or None to keep them all.
        order: the old row each new row extends, (N,); `prefix` (N, t + 2) and
            `history` (N, t + 1, S) are already in that order, `state` is not.
    """
    K = act.scores.size(1)
    if kept is None or kept.numel() == act.sent.numel():
        act.prefix, act.attn = prefix, history
        act.state = state.index_select(order) if state is not None and K > 1 else state
        return
    rows = (kept.unsqueeze(1) * K + torch.arange(K, device=kept.device)).flatten()  # (b' * K,)
    act.sent, act.line, act.max_len, act.scores = act.sent[kept], act.line[kept], act.max_len[kept], act.scores[kept]
    act.prefix, act.memory = prefix[rows], act.memory.index_select(rows)
    act.attn = history[rows] if history is not None else None
    act.state = state.index_select(order[rows]) if state is not None else None


def _assemble(finished: _Finished, src_pad_mask: Tensor, nbest: int,
              need_attn: bool) -> list[list[Hypothesis]]:
    """Each sentence's hypotheses, best first, `nbest` each: the one copy to the host (attention's too).

    A sentence whose every hypothesis scored -inf or NaN (a model's non-finite output) has none.
    """
    count, length = finished.count.tolist(), finished.length.tolist()
    tokens, log_prob, score = finished.tokens.tolist(), finished.log_prob.tolist(), finished.score.tolist()
    attn = finished.attn.cpu() if need_attn else None  # (B, F, L + 1, S)
    real = (~src_pad_mask).cpu() if need_attn else None  # (B, S)
    out = []
    for sent, n in enumerate(count):
        best = sorted(range(n), key=lambda j: -score[sent][j])[:nbest]  # ties keep the order they finished in
        out.append([Hypothesis(tokens[sent][j][: length[sent][j]], score[sent][j], log_prob[sent][j],
                               None if attn is None else attn[sent, j, : length[sent][j] + 1][:, real[sent]])
                    for j in best])
    return out
