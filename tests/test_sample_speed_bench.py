"""bench/sample_speed.py on the CPU: its `race` step is the sampler as it was (torch.multinomial's draws from
the same generator), and every row times each way."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from nmt.decode import Sampling, filter_logits

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    sys.path.insert(0, str(ROOT / "bench"))
    import sample_speed

    return sample_speed


def test_the_race_step_draws_what_torch_multinomial_draws_from_the_same_generator():
    sampling = Sampling(temperature=0.7, top_k=5)
    log_probs = torch.randn(6, 1, 40, generator=torch.Generator().manual_seed(3)).log_softmax(-1)
    ours, theirs = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    probs = filter_logits(log_probs / sampling.temperature, top_k=sampling.top_k).softmax(-1).view(6, 40)
    for _ in range(3):
        _, tokens, _ = _bench().race_step(log_probs, torch.zeros(6, 1), sampling=sampling, generator=ours)
        assert torch.equal(tokens.view(6), torch.multinomial(probs, 1, generator=theirs).view(6))


def test_every_row_times_each_way(tmp_path: Path):
    out = tmp_path / "rows.json"
    rows = _bench().main(["--batch", "4", "--vocab", "50", "--repeat", "2", "--json", str(out)])
    assert [(r.what, r.setting) for r in rows] == [("step", "plain"), ("step", "top_k=50"), ("step", "top_p=0.9"),
                                                  ("draw", "plain")]
    assert all(ms > 0 for r in rows for ms in r.ms.values())
    assert set(rows[-1].ms) == {"race", "keyed", "hash"}
    assert json.loads(out.read_text())[0]["ms"].keys() == {"race", "keyed"}
