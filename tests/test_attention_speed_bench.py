"""bench/attention_speed.py on the CPU: every kernel that runs here agrees with the manual path, the ones that do
not are reported with a reason, and the update column adds up the calls of one update."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "attention_speed.py"


def _bench():
    sys.path.insert(0, str(ROOT / "bench"))
    import attention_speed

    return attention_speed


def test_each_kernel_is_timed_against_the_manual_path_or_refused_with_a_reason(tmp_path: Path, capsys) -> None:
    out = tmp_path / "rows.json"
    bench = _bench()
    bench.main(["--device", "cpu", "--dtype", "fp32", "--tokens", "256", "--heads", "2", "--head-dim", "8",
                "--lengths", "8,12", "--kernels", "flash,efficient,math,manual", "--steps", "2", "--layers", "2,3",
                "--json", str(out)])
    printed = capsys.readouterr().out
    written = json.loads(out.read_text())
    assert written["device"] == "cpu" and written["dtype"] == "fp32"
    rows = written["rows"]
    assert {(r["length"], r["kind"], r["kernel"]) for r in rows} == {
        (L, kind, k) for L in (8, 12) for kind in ("padded", "causal") for k in ("flash", "efficient", "math", "manual")}
    assert {r["length"]: r["sentences"] for r in rows} == {8: 32, 12: 21}
    ran = [r for r in rows if r["kernel"] != "efficient"]
    assert all(r["refused"] is None and r["ms"] > 0 and r["tflops"] > 0 for r in ran)
    assert all(r["max_diff"] < 1e-5 for r in ran)  # flash and math compute what the manual path does
    assert all(r["max_diff"] == 0 for r in ran if r["kernel"] == "manual")
    efficient = [r for r in rows if r["kernel"] == "efficient"]  # a CUDA kernel
    assert all(r["ms"] is None and r["refused"] for r in efficient)
    assert "refused: " in printed

    ms = {(r["length"], r["kind"], r["kernel"]): r["ms"] for r in rows}
    for L in (8, 12):
        assert bench.update_ms([bench.Row(**r) for r in rows], L, "math", 2, 3) == pytest.approx(
            5 * ms[L, "padded", "math"] + 3 * ms[L, "causal", "math"])
        assert bench.update_ms([bench.Row(**r) for r in rows], L, "efficient", 2, 3) is None
    table = printed.split("update ms:")[1].splitlines()
    cells = next(line for line in table if line.startswith("   8 ")).split()[1:]  # flash, efficient, math, manual
    assert cells[1] == "-" and float(cells[2]) == pytest.approx(5 * ms[8, "padded", "math"] + 3 * ms[8, "causal", "math"],
                                                                abs=0.01)


def test_a_bad_kernel_choice_is_one_line() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--kernels", "flash,triton"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert ("--kernels 'flash,triton': use a comma-separated choice of flash, efficient, math, manual, varlen, packed, rows, cudnn"
            in proc.stderr)
    assert "Traceback" not in proc.stderr


def _sentence_by_sentence(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, window_size=(-1, -1)):
    """torch's `varlen_attn` (CUDA only) as its documentation defines it, on a CPU: each sentence of the
    packed rows attends within itself, causally for the window (-1, 0)."""
    out = torch.empty_like(query)
    for i in range(cu_seq_q.numel() - 1):
        q0, q1, k0, k1 = int(cu_seq_q[i]), int(cu_seq_q[i + 1]), int(cu_seq_k[i]), int(cu_seq_k[i + 1])
        q, k, v = (x.transpose(0, 1) for x in (query[q0:q1], key[k0:k1], value[k0:k1]))  # (H, n, Dh)
        out[q0:q1] = F.scaled_dot_product_attention(q, k, v, is_causal=window_size == (-1, 0)).transpose(0, 1)
    return out


def test_the_varlen_rows_pack_each_sentence_without_its_padding(monkeypatch, tmp_path: Path) -> None:
    """The packing, the sentences' starts and the causal window, checked against the manual path with a CPU
    stand-in for the CUDA kernel; on a CPU the real kernel refuses, as a row with torch's reason."""
    import torch.nn.attention.varlen as varlen

    bench, out = _bench(), tmp_path / "rows.json"
    args = ["--device", "cpu", "--dtype", "fp32", "--tokens", "256", "--heads", "2", "--head-dim", "8",
            "--lengths", "8,12", "--kernels", "manual,varlen", "--steps", "1", "--json", str(out)]
    bench.main(args)
    refused = [r for r in json.loads(out.read_text())["rows"] if r["kernel"] == "varlen"]
    assert len(refused) == 4 and all(r["ms"] is None and "CPU" in r["refused"] for r in refused)
    monkeypatch.setattr(varlen, "varlen_attn", _sentence_by_sentence)
    bench.main(args)
    rows = [r for r in json.loads(out.read_text())["rows"] if r["kernel"] == "varlen"]
    assert {(r["length"], r["kind"]) for r in rows} == {(L, kind) for L in (8, 12) for kind in ("padded", "causal")}
    assert all(r["refused"] is None and r["ms"] > 0 and r["max_diff"] < 1e-5 for r in rows), rows


def test_packing_lays_sentences_in_order_into_rows_none_split_or_overfull() -> None:
    bench = _bench()
    lengths = torch.randint(1, 17, (300,), generator=torch.Generator().manual_seed(3)).tolist()
    rows = bench.pack_rows(lengths, 16)
    assert rows[0] == 0 and all(b - a in (0, 1) for a, b in zip(rows, rows[1:]))  # in order, no row skipped
    fill = [sum(n for n, r in zip(lengths, rows) if r == row) for row in range(rows[-1] + 1)]
    assert max(fill) <= 16
    starts = [i for i in range(1, len(rows)) if rows[i] != rows[i - 1]]
    assert all(fill[rows[i - 1]] + lengths[i] > 16 for i in starts)  # a new row only for a sentence that did not fit
    assert bench.pack_rows([16, 1, 15, 16], 16) == [0, 1, 1, 2]


@pytest.mark.parametrize("kernel", ["packed", "rows"])
def test_rows_of_several_sentences_keep_each_sentence_to_itself(kernel: str, tmp_path: Path) -> None:
    """Several sentences share each row (packed: 16 positions, sentences of 6-8 and 9-12 laid without their padding;
    rows: 36 positions, 4 sentences of 8 or 3 of 12 side by side), and the block-diagonal bias (causal within a
    sentence for the decoder's calls) keeps the output and gradients the manual path's."""
    out = tmp_path / "rows.json"
    pack = "16" if kernel == "packed" else "36"
    _bench().main(["--device", "cpu", "--dtype", "fp32", "--tokens", "256", "--heads", "2", "--head-dim", "8",
                   "--lengths", "8,12", "--kernels", f"manual,{kernel}", "--pack", pack, "--steps", "1",
                   "--json", str(out)])
    rows = [r for r in json.loads(out.read_text())["rows"] if r["kernel"] == kernel]
    assert {(r["length"], r["kind"]) for r in rows} == {(L, kind) for L in (8, 12) for kind in ("padded", "causal")}
    assert all(r["refused"] is None and r["ms"] > 0 and r["max_diff"] < 1e-5 for r in rows), rows
