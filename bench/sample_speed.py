"""One sampling step, keyed by line (`sample_step`) against a generator's exponential race, as it was.

    python bench/sample_speed.py [--batch 256] [--vocab 8000,32000] [--repeat 15] [--device cpu]
        [--threads N] [--json FILE]

Until a seed's draws were keyed by (seed, line, step), `sample_step` drew one Exp(1) number per token
from a `torch.Generator` and took the argmax of probs / race (the `race` column, that step as it was);
now it hashes one number per row (`nmt.decode.counter_random.uniform`) and takes the first token whose
running float64 sum of weights passes it (`keyed`). Each row times a whole step, temperature and filters
included, on (B, 1, V) log-probabilities, as medians of `--repeat` calls of each way in turn (so that
both see the same load); `draw` rows time the draw alone from the same probabilities: `race` the
exponential race, `keyed` the hash, running sum and search, `hash` the hash alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from nmt.decode.counter_random import uniform
from nmt.decode.sampling import Sampling, filter_logits, make_sample_step

SETTINGS = {"plain": Sampling(seed=1), "top_k=50": Sampling(top_k=50, seed=1), "top_p=0.9": Sampling(top_p=0.9, seed=1)}


@dataclass
class Row:
    what: str  # "step" or "draw"
    vocab: int
    setting: str
    ms: dict[str, float]  # way -> median milliseconds per call


def race_step(log_probs: Tensor, scores: Tensor, *, sampling: Sampling, generator: torch.Generator,
              **_: object) -> tuple[Tensor, Tensor, Tensor]:
    """`sample_step` before its draws were keyed by line: an exponential race on a generator's numbers."""
    batch, beam, vocab = log_probs.shape
    best = log_probs.amax(dim=-1, keepdim=True)
    best = best.masked_fill(best.isinf(), 0.0)
    logits = filter_logits((log_probs - best) / sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    probs = logits.softmax(dim=-1).view(batch * beam, vocab)  # (B*K, V)
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    tokens = (probs / race).argmax(dim=-1).view(batch, beam)
    return scores + log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), tokens, torch.zeros_like(tokens)


def medians(ways: dict[str, Callable[[int], object]], repeat: int, device: torch.device) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in ways}
    for way in ways.values():  # warm up
        way(0)
    for i in range(repeat):
        for name, way in ways.items():
            start = time.perf_counter()
            way(i)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times[name].append(time.perf_counter() - start)
    return {name: round(statistics.median(t) * 1e3, 3) for name, t in times.items()}


def measure(batch: int, vocab: int, repeat: int, device: torch.device) -> list[Row]:
    g = torch.Generator().manual_seed(0)
    log_probs = (torch.randn(batch, 1, vocab, generator=g) * 2).log_softmax(-1).to(device)  # (B, 1, V)
    scores, lines = torch.zeros(batch, 1, device=device), torch.arange(batch, device=device)
    rows = []

    def step_ways(sampling: Sampling) -> dict[str, Callable[[int], object]]:
        keyed, generator = make_sample_step(sampling), torch.Generator(device=device).manual_seed(1)
        return {"race": lambda i: race_step(log_probs, scores, sampling=sampling, generator=generator),
                "keyed": lambda i: keyed(log_probs, scores, step=i, prefix=None, lines=lines)}

    for name, sampling in SETTINGS.items():
        rows.append(Row("step", vocab, name, medians(step_ways(sampling), repeat, device)))
    probs = log_probs.view(batch, vocab).softmax(-1)  # (B, V)
    generator = torch.Generator(device=device).manual_seed(1)

    def inverse(i: int) -> Tensor:
        running = probs.cumsum(-1, dtype=torch.float64)
        return torch.searchsorted(running, (uniform(1, lines, i) * running[:, -1]).unsqueeze(1), right=True)

    ways = {"race": lambda i: (probs / torch.empty_like(probs).exponential_(1, generator=generator)).argmax(-1),
            "keyed": inverse, "hash": lambda i: uniform(1, lines, i)}
    rows.append(Row("draw", vocab, "plain", medians(ways, repeat, device)))
    return rows


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--vocab", default="8000,32000", help="comma-separated vocabulary sizes")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = [row for vocab in map(int, args.vocab.split(",")) for row in measure(args.batch, vocab, args.repeat, device)]
    print(f"B={args.batch}, {device}, {torch.get_num_threads()} threads; median ms per call")
    for row in rows:
        ways = "  ".join(f"{name} {ms:8.2f}" for name, ms in row.ms.items())
        print(f"{row.what:4} V={row.vocab:>6} {row.setting:>9}  {ways}  keyed/race {row.ms['keyed'] / row.ms['race']:.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([asdict(row) for row in rows], f, indent=1)
    return rows


if __name__ == "__main__":
    main()
