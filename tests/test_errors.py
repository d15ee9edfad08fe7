"""Bad input gets one line on stderr and a distinct exit code, never a traceback (issue #7).

One table: each row is a command line with a bad input, the exit status it must
end with (2: usage, config, data and checkpoint errors; 1: runtime failures) and
the words its one-line message must hold (the file, line or key to look at). Rows
run in process through the real `nmt.cli.main`; those marked `SUB` also run as
`python -m nmt`, all started at once, to prove the status and the single
traceback-free line for real (`SUB_ONLY` rows run only so).
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import subprocess
import sys
from pathlib import Path

import datasets
import huggingface_hub
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from nmt import cli
from nmt.checkpoint import save_checkpoint
from nmt.config import config_from_dict, config_to_dict
from nmt.data.tokenizer import PAD_ID, train_tokenizer
from nmt.errors import shorten
from nmt.models import build_model
from tests.conftest import tiny_config_dict

SUB = "subprocess"
SUB_ONLY = "subprocess only"  # what only a real process shows (here: a progress bar on stderr)

# (id, command line, exit status, words the message holds, how it runs)
# `{name}` fields are paths of the `bad` fixture; stdin rows read the file named after `<`.
CASES = [
    # config
    ("config-missing", "train {dir}/nope.yaml", 2, ["nope.yaml", "config file not found"], None),
    ("config-yaml-syntax", "train {syntax}", 2, ["syntax.yaml: line 4, column 6: YAML syntax error",
                                                 "flow sequence that starts at line 3, column 13"], None),
    ("config-not-utf8", "train {latin1}", 2, ["latin1.yaml: line 2: not UTF-8"], None),
    ("config-unknown-key", "train {unknown_key}", 2, ["unknown key 'train.max_stepz'; did you mean 'max_steps'?"], None),
    ("config-wrong-type", "train {wrong_type}", 2, ["wrong_type.yaml: train.max_steps: expected int, got str 'lots'"], None),
    ("data-hf-a-file", "train {hf_a_file}", 2,
     ["pairs.jsonl: a file, and kind hf reads a hub dataset or a folder of data files; use kind: jsonl"], None),
    ("data-hf-a-file-format", "train {hf_builder}", 2,
     ["kind hf, path 'json': a file format of datasets, not a dataset; read such files with kind: jsonl"], SUB),
    ("config-test-names-one-file", "train {test_names}", 2,
     ["test_names.yaml: data: test.wmt14_full: its translations would go to the file of test.wmt14/full "
      "(wmt14_full.hyp); rename one of them"], None),
    ("config-norwegian-unquoted", "train {norwegian}", 2, ["norwegian.yaml: data.tgt_lang: expected str, got bool False",
                                                        "an unquoted yes, no, on, off, true or false", "in quotes"], None),
    ("config-negative-dropout", "train {tiny} --set model.transformer.dropout=-0.1", 2,
     ["model.transformer.dropout: -0.1 must be in [0, 1)"], None),
    ("config-heads-divide", "train {tiny} --set model.transformer.heads=3", 2,
     ["model.transformer: d_model (32) must be divisible by heads (3)"], None),
    ("config-rnn-heads-divide", "train {tiny} --set model.type=rnn --set model.rnn.attention=multihead "
     "--set model.rnn.attention_heads=3", 2,
     ["model.rnn: hidden_size (32) must be divisible by attention_heads (3) for multihead attention"], None),
    ("config-padding-past-positions", "train {tiny} --set train.pad_to_multiple=2048", 2,
     ["train.pad_to_multiple (2048) pads a batch of data.max_len (64) tokens to 2048 positions, more than "
      "model.transformer.max_positions (1024) holds"], None),
    ("set-unknown-section", "train {tiny} --set trian.lr=1", 2,
     ["--set 'trian.lr=1': unknown key 'trian'; did you mean 'train'?"], None),
    ("set-wrong-type", "train {tiny} --set train.lr=fast", 2, ["--set 'train.lr=fast': train.lr: expected float"], None),
    ("set-below-a-value", "train {tiny} --set train.lr.peak=1", 2, ["--set 'train.lr.peak=1': train.lr is a value"], None),
    # data (found when `nmt train` reads the corpus)
    ("data-missing", "train {missing_data}", 2, ["text corpus not found", "nope.en"], None),
    # as corpus paths say it: once a bare 'checkpoint not found', 'file not found'
    ("init-from-unset-variable", "train {tiny} --set train.init_from=$NMT_AUDIT_UNSET/parent.pt", 2,
     ["train.init_from: $NMT_AUDIT_UNSET/parent.pt: checkpoint not found (an environment variable in it is not set)"],
     None),
    ("init-from-relative", "train {tiny} --set train.init_from=runs/parent.pt", 2,
     ["train.init_from: runs/parent.pt: checkpoint not found (relative paths are read from the working directory "
      "{elsewhere})"], None),
    ("tokenizer-model-unset-variable", "train {tiny} --set tokenizer.model=$NMT_AUDIT_UNSET/spm.model", 2,
     ["tokenizer.model: $NMT_AUDIT_UNSET/spm.model: file not found (an environment variable in it is not set)"], None),
    ("data-relative-elsewhere", "train {relative}", 2, ["text corpus not found: tried corpus/", "working directory {elsewhere}"], None),
    ("data-line-counts", "train {line_counts}", 2, ["short.en has 400 lines but", "short.de has 397"], None),
    ("data-utf8-train", "train {utf8_train}", 2, ["utf8.en:250: invalid UTF-8"], SUB),
    ("data-utf8-valid", "train {utf8_valid}", 2, ["vutf8.en:20: invalid UTF-8"], None),
    ("data-all-filtered", "train {all_too_long}", 2, ["data.train (", "no pairs left of 400 read",
                                                      "400 longer than data.max_len=2", "raise data.max_len"], None),
    ("data-all-empty", "train {all_empty}", 2, ["data.train", "no joint training text"], None),
    ("data-empty-files", "train {zero_bytes}", 2, ["data.train (", "zero", "empty, no pairs to read"], None),
    ("data-empty-jsonl", "train {zero_jsonl}", 2, ["data.train (", "zero.jsonl): empty, no pairs to read"], None),
    ("data-empty-valid", "train {zero_valid}", 2, ["data.valid (", "zero): empty, no pairs to read; give a corpus"],
     None),
    ("data-parquet-no-rows", "train {parquet_no_rows}", 2, ["no_rows.parquet: empty, a parquet file of no rows"], SUB),
    ("data-not-parquet", "train {not_parquet}", 2, ["src2.txt: cannot read as parquet: ArrowInvalid: Parquet magic bytes"],
     SUB),
    ("config-no-corpus", "train {no_corpus}", 2, ["no_corpus.yaml: data.train: required for training"], None),
    ("config-coverage-without-attention", "train {coverage_noattn}", 2,
     ["coverage_noattn.yaml: decode.coverage_penalty (0.2) needs attention", "set decode.coverage_penalty to 0"],
     None),
    ("data-vocab-too-large", "train {vocab_big}", 2, ["tokenizer.vocab_size (5000) is too large", "at most"], None),
    ("data-vocab-below-characters", "train {tiny} --set tokenizer.vocab_size=8", 2,
     ["tokenizer.vocab_size (8) is below the ", " pieces that the characters of the joint text of data.train (",
      "raise it to at least", "or lower tokenizer.character_coverage"], None),
    ("data-hub-unreachable", "train {hub}", 2, ["hub dataset 'no-such-user/no-such-corpus'", "could not be loaded",
                                                "kind: disk"], SUB),
    # checkpoints given to translate and eval
    ("translate-ckpt-missing", "translate -c {dir}/none.pt", 2, ["none.pt: checkpoint not found"], None),
    ("translate-ckpt-truncated", "translate -c {truncated}", 2, ["truncated.pt: cannot read checkpoint"], None),
    ("translate-ckpt-foreign", "translate -c {foreign}", 2, ["foreign.pt: not an nmt checkpoint"], None),
    ("translate-ckpt-misfit", "translate -c {misfit}", 2, ["weights do not fit the model its config describes"], SUB),
    ("translate-ckpt-misfit-named", "translate -c {misfit}", 2, ["misfit.pt: ", "size mismatch for"], None),
    ("eval-ckpt-missing", "eval -c {dir}/none.pt --split test", 2, ["none.pt: checkpoint not found"], None),
    ("eval-ckpt-truncated", "eval -c {truncated} --split test", 2, ["truncated.pt: cannot read checkpoint"], None),
    ("eval-ckpt-foreign", "eval -c {foreign} --split test", 2, ["foreign.pt: not an nmt checkpoint"], None),
    ("eval-ckpt-misfit", "eval -c {misfit} --split test", 2, ["weights do not fit the model its config describes"], None),
    # eval and translate usage
    ("eval-hyp-without-ref", "eval --hyp {hyp3}", 2, ["--hyp needs --ref"], None),
    ("eval-hyp-ref-counts", "eval --hyp {hyp3} --ref {corpus}/test.de", 2, ["must pair line by line"], None),
    ("eval-hyp-ref-counts-named", "eval --hyp {hyp3} --ref {corpus}/test.de", 2,
     ["hyp3.txt has 3 lines but", "test.de has 30"], None),
    ("eval-hyp-utf8", "eval --hyp {hyp_utf8} --ref {hyp3}", 2, ["hyp_utf8.txt:3: invalid UTF-8"], None),
    ("eval-src-ref-counts", "eval -c {good} --src {src2} --ref {corpus}/test.de", 2,
     ["src2.txt has 2 lines but", "test.de has 30"], None),
    ("eval-unknown-split", "eval -c {good} --split tst", 2, ["--split 'tst'", "choose from valid, test"], None),
    ("eval-split-files-gone", "eval -c {moved} --split test", 2,
     ["the checkpoint's data.test.test: text corpus not found", "--src and --ref"], None),
    ("translate-input-missing", "translate -c {good} -i {dir}/nope.txt", 2, ["nope.txt: input file not found"], None),
    ("translate-input-utf8", "translate -c {good} -i {src_utf8}", 2, ["src_utf8.txt:6: invalid UTF-8"], None),
    ("translate-stdin-utf8", "translate -c {good} < {src_utf8}", 2, ["<stdin>:6: invalid UTF-8"], SUB),
    # folders, empty files and out-of-range options (issue #17)
    ("config-is-folder", "train {dir}", 2, ["is a folder, not a config file"], None),
    ("translate-ckpt-folder", "translate -c {dir}", 2, ["is a folder, not a checkpoint", "best.pt"], None),
    # a path that exists but is no file is named for what it is, not "not found"
    ("translate-ckpt-device", "translate -c /dev/null", 2, ["/dev/null: a pipe, a socket or a device, not a checkpoint file"],
     None),
    ("data-text-side-a-folder", "train {text_folder}", 2, ["data.train: {dir}/folder.en: a folder, not a text file"], None),
    ("data-jsonl-a-folder", "train {jsonl_folder}", 2, ["data.train: {elsewhere}: a folder, not a file"], None),
    ("config-tokenizer-model-a-folder", "train {tiny} --set tokenizer.model={dir}", 2,
     ["tokenizer.model: {dir}: a folder, not a sentencepiece model file"], None),
    ("eval-empty-files", "eval --hyp {empty} --ref {empty2}", 2, ["empty.txt and", "empty2.txt: both empty"], None),
    ("translate-max-tokens-negative", "translate -c {misfit} -i {src2} --max-tokens -5", 2,  # before the model loads
     ["--max-tokens: -5 must be >= 0"], None),
    ("translate-length-penalty-nan", "translate -c {good} -i {src2} --length-penalty nan", 2,
     ["--length-penalty: nan is not a finite number"], None),
    ("translate-beam-zero", "translate -c {good} -i {src2} --beam 0", 2, ["--beam: 0 must be in [1, 1000]"], None),
    ("translate-nbest-over-beam", "translate -c {good} -i {src2} --beam 2 --nbest 3", 2,
     ["--nbest (3) cannot exceed --beam (2)", "leave --beam out"], None),
    ("translate-nbest-zero", "translate -c {good} -i {src2} --nbest 0", 2, ["--nbest (0) must be at least 1"], None),
    ("translate-sample-beam", "translate -c {good} -i {src2} --sample --beam 3", 2,
     ["--sample draws one translation per line; --beam (3) must be 1 or left out"], None),
    ("translate-beam-huge", "translate -c {good} -i {src2} --beam 100000", 2, ["--beam: 100000 must be in [1, 1000]"],
     None),
    ("translate-min-len-above-max", "translate -c {good} -i {src2} --min-len 5 --max-len-a 0 --max-len-b 2", 2,
     ["min_len (5) is above the longest output that max_len_a 0 and max_len_b (2) allow"], None),
    ("translate-attention-head-without-plot", "translate -c {good} -i {src2} --attention-head 1", 2,
     ["--attention-layer and --attention-head choose what --attention-plot draws"], None),
    # a plot's choice must not change what is translated: the coverage penalty scores the chosen attention
    ("translate-attention-layer-with-coverage", "translate -c {good} -i {src2} --attention-plot {dir}/plots "
     "--attention-layer 0 --coverage-penalty 0.2", 2,
     ["the coverage penalty (0.2) scores the attention that --attention-layer and --attention-head choose"], None),
    ("translate-temperature-inf", "translate -c {good} -i {src2} --sample --temperature inf", 2,
     ["temperature (inf) must be a finite number > 0"], None),
    ("translate-max-len-zero", "translate -c {good} -i {src2} --max-len-a 0 --max-len-b 0", 2,
     ["max_len_a and max_len_b are both 0: no output could be produced"], None),
    ("translate-max-tokens-huge", "translate -c {good} -i {src2} --max-tokens 99999999999999999999999", 2,
     ["--max-tokens: 99999999999999999999999 does not fit in a 64-bit integer"], None),
    ("analyze-buckets-zero", "analyze -c {good} --buckets 0", 2, ["--buckets (0) must be at least 1"], None),
    ("translate-ckpt-tokenizer-int", "translate -c {tokenizer_int} -i {src2}", 2,
     ["tokenizer_int.pt: its 'tokenizer' entry is not the sentencepiece models nmt saves (TypeError"], None),
    ("translate-ckpt-tokenizer-bytes", "translate -c {tokenizer_bytes} -i {src2}", 2,
     ["tokenizer_bytes.pt: its 'tokenizer' entry is not the sentencepiece models nmt saves"], None),
    ("translate-ckpt-model-list", "translate -c {model_list} -i {src2}", 2,
     ["model_list.pt: its 'model' entry is list, not the weights by name nmt saves"], None),
    # outputs that could not be written, refused before any checkpoint is read or line translated
    ("average-output-folder", "average {good} {misfit} -o {dir}", 2, ["output is a folder; give a file name"], None),
    ("average-output-new-folder", "average {good} {misfit} -o {dir}/new/", 2,
     ["/new/: output is a folder; give a file name"], None),
    ("average-output-nowhere", "average {good} {misfit} -o {dir}/nowhere/avg.pt", 2,
     ["avg.pt: output folder", "nowhere does not exist"], None),
    ("average-output-unwritable", "average {good} {misfit} -o /proc/avg.pt", 2,  # root passes the permission check
     ["/proc/avg.pt: output folder /proc ", "; choose another -o"], None),
    ("eval-save-translations-file", "eval -c {good} --split test --save-translations {src2}", 2,
     ["--save-translations", "src2.txt: a file, not a folder"], None),
    ("translate-attention-plot-under-file", "translate -c {good} -i {src2} --attention-plot {src2}/plots", 2,
     ["--attention-plot", "src2.txt is a file, so no folder can be made there"], None),
    ("export-output-link", "export -c {good} -o {link} --force", 2, ["link: a symbolic link; give the folder"], None),
    ("serve-port-too-large", "serve -c {good} --port 70000", 2, ["--port 70000: a port is a number from 0 to 65535"],
     None),
    # an empty value (an unset shell variable): once --host '' listened on every interface, as a socket takes '',
    # and an empty path was typer's '.': --results, --report and --save-translations wrote into the working directory
    ("serve-host-empty", "serve -c {good} --host= --port 0", 2,
     ["--host '': an empty value (a shell variable that is not set?); give the file, folder or value meant"], None),
    ("experiment-results-empty", "experiment {tiny} --results=", 2, ["--results '': an empty value"], None),
    ("analyze-report-empty", "analyze -c {good} --report=", 2, ["--report '': an empty value"], None),
    ("analyze-sentences-not-numbers", "analyze -c {good} --report {dir}/report --sentences x,1", 2,
     ["--sentences 'x,1': 'x' is not a sentence number"], None),
    ("analyze-sentences-negative", "analyze -c {good} --report {dir}/report --sentences -1", 2,
     ["'-1' is not a sentence number"], None),
    # refused in one line, not a KeyError, a silently ignored option or a model loaded first
    ("average-no-model", "average {no_model} {good} -o {dir}/avg.pt", 2,
     ["no_model.pt: incompatible checkpoint: it has no 'model' entry"], None),
    ("average-output-is-an-input", "average {good} {good_copy} -o {good_copy}", 2,
     ["good_copy.pt: output is the input checkpoint", "averaging would overwrite it"], None),
    ("average-last-negative", "average --last -1 {dir}", 2, ["--last -1: average at least 1 checkpoint"], None),
    ("eval-src-without-ref-before-loading", "eval -c {misfit} --src {src2}", 2,
     ["--src and --ref go together: give both, or neither to use --split"], None),
    ("analyze-ref-without-src-before-loading", "analyze -c {misfit} --ref {src2}", 2,
     ["--src and --ref go together"], None),
    ("analyze-sentences-without-report", "analyze -c {misfit} --sentences 1", 2,
     ["--sentences chooses the heatmaps of --report; give --report DIR too"], None),
    ("translate-ensemble-of-one-checkpoint-twice", "translate -c {good} -c {good_copy}/../good.pt -i {src2}", 2,
     ["good.pt: given twice (also as ", "good.pt); it would count double in the ensemble"], None),
    ("eval-split-and-files", "eval -c {good} --src {src2} --ref {src2} --split test", 2,
     ["--split test and --src/--ref both choose what to score; give one of them"], None),
    ("experiment-results-a-file", "experiment {tiny} --results {src2}", 2,
     ["--results", "src2.txt: a file, not a folder; give a folder"], None),
    ("experiment-results-unwritable", "experiment {tiny} --results /proc/nmt-results", 2,  # root may write anywhere
     ["--results /proc/nmt-results: ", "; give another --results"], None),  # but there: refused before training
    ("experiment-name-a-path", "experiment {tiny} --name ../elsewhere --results {dir}/results", 2,  # was written there
     ["--name '../elsewhere': not a file name; the results go to {dir}/results/<name>.json"], None),
    # a name too long for the file system, in any path: once 'OSError: [Errno 36] File name too long', status 1
    ("path-too-long-config", "train {dir}/" + "c" * 300 + ".yaml", 2,
     ["cccc ... (", "cccc.yaml: too long for the file system", "give a shorter one"], None),
    ("path-too-long-hyp", "eval --hyp {dir}/" + "h" * 300 + " --ref {src2}", 2,
     ["hhhh ... (", "too long for the file system"], None),
    ("path-too-long-output", "translate -c {good} -i {src2} -o {dir}/" + "o" * 300, 2,
     ["oooo", "too long for the file system"], None),
    ("experiment-name-too-long", "experiment {tiny} --name " + "n" * 251 + " --results {dir}/results", 2,  # once an
     ["--name 'nnnnn", "(253 characters)", "too long for a file name (NAME.json may have at most 255 bytes"], None),
    # OSError 'File name too long', status 1, after the whole run: its results lost
    ("experiment-no-test-sets", "experiment {tiny} --set data.test={{}} --results {dir}/results", 2,
     ["data.test: no test sets, and nmt experiment scores them after training", "or use nmt train"], None),
    ("eval-hyp-save-translations", "eval --hyp {hyp3} --ref {hyp3} --save-translations {dir}/out", 2,
     ["--save-translations does not apply to --hyp"], None),
    ("eval-beam-zero-before-loading", "eval -c {misfit} --split test --beam 0", 2, ["--beam: 0 must be in [1, 1000]"], None),
    ("analyze-beam-zero-before-loading", "analyze -c {misfit} --beam 0", 2, ["--beam: 0 must be in [1, 1000]"], None),
    ("analyze-sentence-past-the-end", "analyze -c {good} --report {dir}/report --sentences 0,30", 2,
     ["--sentences 30: test has 30 sentences, numbered 0 to 29"], None),
    ("translate-input-utf8-before-progress", "translate -c {good} -i {src_utf8}", 2, ["src_utf8.txt:6: invalid UTF-8"],
     SUB_ONLY),
]
DEBUG_CASE = ("debug-traceback", "--debug train {dir}/nope.yaml", None, [], SUB)  # see test_debug_shows_the_traceback


def _params(cases) -> list:
    params = []
    for case_id, command, code, needles, _ in cases:
        params.append(pytest.param(case_id, command, code, needles, id=case_id))
    return params


@pytest.fixture(scope="module")
def bad(small_corpus, tmp_path_factory) -> dict[str, str]:
    """Every bad input of the table, and a good checkpoint built without training."""
    d = tmp_path_factory.mktemp("bad")
    paths = {"dir": str(d), "corpus": str(small_corpus), "elsewhere": str(d / "elsewhere")}
    base = tiny_config_dict(small_corpus, d / "run")

    def config(name: str, edit=lambda c: None) -> None:
        c = copy.deepcopy(base)
        c["run_dir"] = str(d / "runs" / name)
        edit(c)
        (d / f"{name}.yaml").write_text(yaml.safe_dump(c), encoding="utf-8")
        paths[name] = str(d / f"{name}.yaml")

    def lines(name: str, rows: list[bytes]) -> str:
        (d / name).write_bytes(b"".join(r + b"\n" for r in rows))
        return str(d / name)

    def data(section: str, **spec):
        return lambda c: c["data"].__setitem__(section, {"kind": "text", **spec})

    en = (small_corpus / "train.en").read_bytes().splitlines()
    de = (small_corpus / "train.de").read_bytes().splitlines()
    valid_en = (small_corpus / "valid.en").read_bytes().splitlines()
    config("tiny")
    paths["syntax"] = lines("syntax.yaml", [b"data:", b"  src_lang: en", b"  tgt_lang: [de, en", b"train:", b"  lr: 1"])
    paths["latin1"] = lines("latin1.yaml", [b"train:", b"  run_dir: caf\xe9"])
    config("unknown_key", lambda c: c["train"].update(max_stepz=3))
    config("wrong_type", lambda c: c["train"].update(max_steps="lots"))
    paths["norwegian"] = lines("norwegian.yaml", [b"data:", b"  src_lang: en", b"  tgt_lang: no"])
    config("missing_data", data("train", path=str(d / "nope")))
    config("relative", lambda c: (data("train", path="corpus/train")(c), data("valid", path="corpus/valid")(c)))
    (d / "elsewhere").mkdir()
    (d / "link").symlink_to(d / "elsewhere")
    paths["link"] = str(d / "link")
    lines("short.en", en), lines("short.de", de[:-3])
    config("line_counts", data("train", path=str(d / "short")))
    lines("utf8.en", en[:249] + [b"caf\xe9 au lait"] + en[250:]), lines("utf8.de", de)
    config("utf8_train", data("train", path=str(d / "utf8")))
    lines("vutf8.en", valid_en[:19] + [b"\xff\xfe"] + valid_en[20:])
    lines("vutf8.de", (small_corpus / "valid.de").read_bytes().splitlines())
    config("utf8_valid", data("valid", path=str(d / "vutf8")))
    config("all_too_long", lambda c: c["data"].update(max_len=2))
    lines("blank.en", en), lines("blank.de", [b""] * len(de))
    config("all_empty", data("train", path=str(d / "blank")))
    config("vocab_big", lambda c: c["tokenizer"].update(vocab_size=5000))
    lines("zero.en", []), lines("zero.de", []), lines("zero.jsonl", [])
    config("zero_bytes", data("train", path=str(d / "zero")))
    config("zero_jsonl", lambda c: c["data"].__setitem__("train", {"kind": "jsonl", "path": str(d / "zero.jsonl")}))
    config("zero_valid", data("valid", path=str(d / "zero")))
    (d / "folder.en").mkdir(), lines("folder.de", de)
    config("text_folder", data("train", path=str(d / "folder")))
    config("jsonl_folder", data("train", kind="jsonl", path=str(d / "elsewhere")))
    config("no_corpus", lambda c: c["data"].pop("train"))
    pq.write_table(pa.table({"en": pa.array([], pa.string()), "de": pa.array([], pa.string())}), d / "no_rows.parquet")
    config("parquet_no_rows", lambda c: c["data"].__setitem__("train", {"kind": "parquet",
                                                                        "path": str(d / "no_rows.parquet")}))
    config("not_parquet", lambda c: c["data"].__setitem__("train", {"kind": "parquet", "path": str(d / "src2.txt")}))
    config("coverage_noattn", lambda c: (c["model"].update(type="rnn", rnn={"decoder": "none", "embed_dim": 8,
                                                                            "hidden_size": 16}),
                                         c["decode"].update(coverage_penalty=0.2)))
    config("hub", data("train", kind="hf", path="no-such-user/no-such-corpus", hf_config="de-en"))
    config("hf_a_file", data("train", kind="hf", path=lines("pairs.jsonl", [b'{"en": "a", "de": "b"}'])))
    config("hf_builder", data("train", kind="hf", path="json"))
    config("test_names", lambda c: c["data"].__setitem__("test", {"wmt14/full": dict(c["data"]["valid"]),
                                                                  "wmt14_full": dict(c["data"]["valid"])}))
    paths["hyp3"] = lines("hyp3.txt", (small_corpus / "test.de").read_bytes().splitlines()[:3])
    paths["hyp_utf8"] = lines("hyp_utf8.txt", [b"ok", b"ok", b"caf\xe9"])
    paths["src2"] = lines("src2.txt", en[:2])
    paths["empty"], paths["empty2"] = lines("empty.txt", []), lines("empty2.txt", [])
    paths["src_utf8"] = lines("src_utf8.txt", [b"the man sees the dog ."] * 5 + [b"caf\xe9 ."])

    cfg = config_from_dict(base)
    tokenizer = train_tokenizer(cfg.tokenizer, [s.decode() for s in en], [s.decode() for s in de])
    vocab = dict(src_vocab_size=tokenizer.src_vocab_size, tgt_vocab_size=tokenizer.tgt_vocab_size, pad_id=PAD_ID)
    payload = {"config": config_to_dict(cfg), "tokenizer": tokenizer.to_state(),
               "model": build_model(cfg.model, **vocab).state_dict()}
    save_checkpoint(payload, d / "good.pt")
    wider = copy.deepcopy(payload)
    wider["config"]["model"]["transformer"].update(d_model=64, ff_dim=128)
    save_checkpoint(wider, d / "misfit.pt")
    for name, entry, value in (("tokenizer_int", "tokenizer", 5), ("model_list", "model", [1]),
                               ("tokenizer_bytes", "tokenizer", {"src_model": b"not a sentencepiece model"})):
        odd = copy.deepcopy(payload)
        odd[entry] = value
        save_checkpoint(odd, d / f"{name}.pt")
        paths[name] = str(d / f"{name}.pt")
    save_checkpoint({}, d / "no_model.pt")  # the format tag alone
    paths["no_model"] = str(d / "no_model.pt")
    moved = copy.deepcopy(payload)
    moved["config"]["data"]["test"]["test"]["path"] = str(d / "gone" / "test")
    save_checkpoint(moved, d / "moved.pt")
    (d / "truncated.pt").write_bytes((d / "good.pt").read_bytes()[:5000])
    torch.save({"state_dict": {"w": torch.zeros(2)}}, d / "foreign.pt")
    (d / "good_copy.pt").write_bytes((d / "good.pt").read_bytes())
    paths.update({name: str(d / f"{name}.pt")
                  for name in ("good", "good_copy", "misfit", "moved", "truncated", "foreign")})
    return paths


def _argv(command: str, bad: dict[str, str]) -> tuple[list[str], str | None]:
    """(arguments, stdin file) of a table command line."""
    command, _, stdin = command.format(**bad).partition(" < ")
    return command.split(), stdin or None


@pytest.fixture(scope="module")
def launched(bad) -> dict[str, subprocess.Popen]:
    """The `SUB` rows as `python -m nmt` processes, all started at once (they take seconds each)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    procs = {}
    with contextlib.ExitStack() as files:
        for case_id, command, _, _, how, *_ in CASES + [DEBUG_CASE]:
            if how in (SUB, SUB_ONLY):
                args, stdin = _argv(command, bad)
                procs[case_id] = subprocess.Popen(
                    [sys.executable, "-m", "nmt", *args], env=env, text=True, cwd=bad["elsewhere"],
                    stdin=files.enter_context(open(stdin, "rb")) if stdin else subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                )
        yield procs
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


@pytest.fixture(autouse=True)
def quiet_datasets():
    """No `datasets` progress bars, as in `nmt` itself (whose switch is read when `datasets` is imported)."""
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    yield
    if was_enabled:
        datasets.enable_progress_bars()


def run_in_process(args: list[str], stdin: str | None, monkeypatch) -> tuple[int, str]:
    """(exit status, stderr) of `nmt ARGS` through `nmt.cli.main`, the console entry point."""
    monkeypatch.setattr(sys, "argv", ["nmt", *args])
    raw = Path(stdin).read_bytes() if stdin else b""
    # As Python sets stdin up in a C.UTF-8 locale: undecodable bytes become surrogates.
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", errors="surrogateescape"))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as ex:
        cli.main()
    return ex.value.code, err.getvalue()


@pytest.mark.parametrize(("case_id", "command", "code", "needles"), _params([c for c in CASES if c[4] != SUB_ONLY]))
def test_bad_input_is_one_line_and_an_exit_code(case_id, command, code, needles, bad, launched, monkeypatch):
    # `launched` starts the subprocess rows now, so they run while the in-process rows do.
    # Relative paths are read from the working directory: run from a folder without `corpus/`.
    monkeypatch.chdir(bad["elsewhere"])
    # The hub libraries read HF_HUB_OFFLINE at import time, so their copies are set too.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)

    status, stderr = run_in_process(*_argv(command, bad), monkeypatch)
    lines = [line for line in stderr.splitlines() if not line.startswith("[nmt] ")]  # progress logs
    assert status == code, stderr
    assert len(lines) == 1 and lines[0].startswith("nmt: error: "), stderr
    message = lines[0]
    for needle in needles:
        assert needle.format(**bad) in message, f"{needle!r} not in {message!r}"


@pytest.mark.parametrize(("case_id", "command", "code", "needles"), _params([c for c in CASES if c[4] in (SUB, SUB_ONLY)]))
def test_for_real_one_line_on_stderr_and_the_exit_code(case_id, command, code, needles, bad, launched):
    proc = launched[case_id]
    _, stderr = proc.communicate(timeout=120)
    errors = [line for line in stderr.splitlines() if not line.startswith("[nmt] ")]  # progress logs
    assert proc.returncode == code, stderr
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    assert errors[0].startswith("nmt: error: ")
    for needle in needles:
        assert needle.format(**bad) in errors[0], stderr


def test_debug_shows_the_traceback(launched):
    proc = launched[DEBUG_CASE[0]]
    _, stderr = proc.communicate(timeout=120)
    assert "Traceback (most recent call last)" in stderr
    assert "nmt.errors.ConfigError: " in stderr and "nope.yaml: config file not found" in stderr
    assert proc.returncode != 0


@pytest.fixture
def unreadable(tmp_path) -> Path:
    """A regular file this process may not read: one without permissions, or, for root (whom permissions do not
    stop), a write-only file of /proc/sys."""
    path = tmp_path / "unreadable.txt"
    path.write_text("the man sees the dog .\n", encoding="utf-8")
    path.chmod(0)
    for candidate in (path, Path("/proc/sys/vm/compact_memory")):
        try:
            open(candidate, "rb").close()
        except PermissionError:
            return candidate
        except OSError:
            continue
    pytest.skip("no file here that this process may not read (root reads every file of tmp_path)")


def test_an_unreadable_input_file_is_one_line_before_the_model_loads(bad, unreadable, monkeypatch):
    status, stderr = run_in_process(["translate", "-c", bad["good"], "-i", str(unreadable)], None, monkeypatch)
    assert status == 2, stderr
    assert stderr == f"nmt: error: {unreadable}: cannot read the input file (Permission denied)\n"


@pytest.mark.parametrize(("command", "message"), [
    ("train {path}", "{path}: cannot read the config file (Permission denied)"),
    ("translate -c {path}", "{path}: not a checkpoint: cannot be read (Permission denied)"),
    ("eval --hyp {path} --ref {path}", "{path}: cannot read: Permission denied"),
    ("average {good} {path} -o {dir}/avg.pt", "{path}: not a checkpoint: cannot be read (Permission denied)"),
])
def test_an_unreadable_file_named_on_the_command_line_is_one_line(bad, unreadable, monkeypatch, command, message):
    # click's own check of a path option answered with its four-line usage error ("Invalid value for '--checkpoint'
    # / '-c': path ... is not readable"), and the config file, once read, with "PermissionError" and exit 1.
    status, stderr = run_in_process(command.format(path=unreadable, **bad).split(), None, monkeypatch)
    assert status == 2, stderr
    assert stderr == f"nmt: error: {message.format(path=unreadable)}\n"



@pytest.mark.parametrize(("args", "message"), [
    ("translate --bogus", "No such option: --bogus (see 'nmt translate -h')"),
    ("trian", "No such command 'trian'. Did you mean 'train'? (see 'nmt -h')"),
    ("translate --beam five", "Invalid value for '--beam': "),
    ("train", "Missing argument 'config'. (see 'nmt train -h')"),
])
def test_a_usage_error_is_one_line(args, message, monkeypatch):
    """click's usage errors were four lines (usage, a hint, a blank line, the error), unlike every other error."""
    status, stderr = run_in_process(args.split(), None, monkeypatch)
    assert status == 2, stderr
    assert stderr.startswith(f"nmt: error: {message}") and stderr.count("\n") == 1, stderr


def test_nmt_alone_prints_its_help_and_help_exits_0(monkeypatch, capsys):
    status, stderr = run_in_process([], None, monkeypatch)
    assert status == 2 and stderr.startswith("Usage: nmt [OPTIONS] COMMAND") and "translate" in stderr, stderr
    monkeypatch.setattr(sys, "argv", ["nmt", "translate", "-h"])
    with pytest.raises(SystemExit) as ex:
        cli.main()
    assert ex.value.code == 0 and "Usage: nmt translate" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["translate", "-c", "{good}", "-i", "{src2}", "-o={out}"],
                                  ["translate", "-c={good}", "-i", "{src2}"]])
def test_a_short_option_joined_by_an_equals_sign_is_refused_and_nothing_is_written(args, bad, tmp_path, monkeypatch):
    """`-o=out.txt` wrote the translations to a file named `=out.txt`, as click (like getopt) reads it."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out.txt"
    args = [a.format(out=out.name, **bad) for a in args]
    status, err = run_in_process(args, None, monkeypatch)
    joined = next(a for a in args if "=" in a)
    assert status == 2 and err == (f"nmt: error: {shorten(joined, 60)}: a short option's value follows it after a "
                                   f"space, so this one would be {shorten(joined[2:], 40)!r}; write {joined[:2]} "
                                   f"{shorten(joined[3:], 40)}\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("args", "message"), [
    (["translate", "-c", "{good}", "-i", "{src2}", "-i", "other.txt", "-o", "{out}"],
     "--input given 2 times ('{src2}', 'other.txt'); it takes one value: give it once"),
    (["translate", "-c", "{good}", "--beam", "4", "-i", "{src2}", "--beam=5", "-o{out}"],
     "--beam given 2 times ('4', '5'); it takes one value: give it once"),
    (["export", "-c", "{good}", "--checkpoint={good}", "-o", "{out}"],
     "--checkpoint given 2 times ('{good}', '{good}'); it takes one value: give it once"),
])
def test_an_option_of_one_value_given_twice_is_refused_and_nothing_is_written(args, message, bad, tmp_path,
                                                                              monkeypatch):
    """click kept the last value and dropped the first without a word: `-i a.txt -i b.txt` translated b.txt
    alone, `export -c A -c B` exported B."""
    monkeypatch.chdir(tmp_path)
    fill = {"out": "out.txt", **bad}
    status, err = run_in_process([a.format(**fill) for a in args], None, monkeypatch)
    assert (status, err) == (2, f"nmt: error: {message.format(**fill)}\n")
    assert list(tmp_path.iterdir()) == []
    # repeatable options pass: translate's -c (an ensemble), --set, eval's --ref
    status, err = run_in_process(["translate", "-c", bad["good"], "-c", bad["good"], "-i", bad["src2"]], None,
                                 monkeypatch)
    assert status == 2 and "ensemble" in err, err


@pytest.mark.parametrize(("args", "where"), [
    (["eval", "-c", "{good}", "--split", "test", "--save-translations", ""], "--save-translations ''"),
    (["train", ""], "the argument after train"),
])
def test_an_empty_argument_is_refused_naming_its_option_and_nothing_is_written(args, where, bad, tmp_path,
                                                                               monkeypatch):
    """`--save-translations "$OUT"` with OUT unset wrote test.hyp into the working directory; `train ''` said
    '.: is a folder, not a config file'."""
    monkeypatch.chdir(tmp_path)
    status, err = run_in_process([a.format(**bad) for a in args], None, monkeypatch)
    assert status == 2 and err == f"nmt: error: {where}: an empty value (a shell variable that is not set?); give " \
                                  "the file, folder or value meant ('.' for the working directory)\n"
    assert list(tmp_path.iterdir()) == []
