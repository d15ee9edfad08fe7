"""bench/reduction_speed.py on the CPU: every way of computing the column-sum gradients of the config's model
agrees with fp64 sums, is timed at each width the model has, and the update column adds up its layers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from nmt.config import load_config
from nmt.models import build_model

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "reduction_speed.py"


def _bench():
    sys.path.insert(0, str(ROOT / "bench"))
    import reduction_speed

    return reduction_speed


def test_the_widths_are_the_models_linear_biases_and_layer_norms():
    bench = _bench()
    cfg = load_config(ROOT / "configs" / "multi30k_transformer.yaml")
    found = bench.widths(build_model(cfg.model, src_vocab_size=100, tgt_vocab_size=100, pad_id=0))
    # 3+3 layers of d_model 256 and FFN 1024: per encoder layer qkv, out, FFN in and out; per decoder layer
    # those and cross-attention's q, kv and out; a LayerNorm per sublayer and one after each stack
    assert found["bias"] == {768: 6, 256: 18, 1024: 6, 512: 3}
    assert found["norm"] == {256: 3 * 2 + 1 + 3 * 3 + 1}


def test_each_way_gives_the_fp64_sums_and_the_update_column_adds_up_the_layers(tmp_path: Path, capsys):
    out = tmp_path / "rows.json"
    _bench().main([str(ROOT / "configs" / "multi30k_transformer.yaml"), "--device", "cpu", "--dtype", "fp32",
                   "--tokens", "64", "--steps", "2", "--json", str(out)])
    written = json.loads(out.read_text())
    assert written["tokens"] == 64 and written["dtype"] == "fp32"
    rows = written["rows"]
    assert {(r["kind"], r["width"], r["way"]) for r in rows} == (
        {("bias", w, way) for w in (256, 512, 768, 1024) for way in ("sum", "mv")}
        | {("norm", 256, way) for way in ("native", "sums", "mv")})
    assert all(r["us"] > 0 and r["gb_per_s"] > 0 and r["max_diff"] < 1e-5 for r in rows)
    printed = capsys.readouterr().out
    for kind, way in (("bias", "sum"), ("bias", "mv"), ("norm", "native")):
        total = sum(r["count"] * r["us"] for r in rows if r["kind"] == kind and r["way"] == way) / 1e3
        assert f"{way} {total:.3f}" in printed


@pytest.mark.gpu
def test_on_a_gpu_the_rows_are_replayed_from_a_cuda_graph(capsys):
    _bench().main([str(ROOT / "configs" / "multi30k_transformer.yaml"), "--device", "cuda", "--steps", "3"])
    assert "replayed as one CUDA graph" in capsys.readouterr().out


def test_an_rnn_config_is_refused_in_one_line(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    monkeypatch.setattr(sys, "argv", [str(ROOT / "bench" / "reduction_speed.py")])  # argparse names the program by it
    import reduction_speed  # bench/reduction_speed.py, called as its command line calls it

    with pytest.raises(SystemExit) as done:
        reduction_speed.main(["configs/multi30k_rnn_bahdanau.yaml", "--device", "cpu"])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == ("reduction_speed.py: error: configs/multi30k_rnn_bahdanau.yaml "
                                                        "has an rnn model: use a Transformer config")
