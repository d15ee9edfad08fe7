"""Every numeric key's range is checked at load: one line naming file, key and value (issue 17).

Each bad value below once passed the config check and failed deep inside torch
or sentencepiece with exit 1; the valid edge values must still load.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from operator import attrgetter

import pytest
import torch

from nmt.config import ExperimentConfig, TransformerConfig, load_config, reference_markdown
from nmt.config.ranges import range_of
from nmt.errors import ConfigError

# (id, YAML text, pattern the one-line message must match after "FILE: ")
REFUSED = [
    ("lr-nan", "train:\n  lr: .nan\n", r"train.lr: nan is not a finite number$"),
    ("lr-nan-string", "train:\n  lr: nan\n", r"train.lr: nan is not a finite number$"),
    ("lr-inf", "train:\n  lr: .inf\n", r"train.lr: inf is not a finite number$"),
    ("lr-minus-inf", "train:\n  lr: -.inf\n", r"train.lr: -inf is not a finite number$"),
    ("lr-zero", "train:\n  lr: 0\n", r"train.lr: 0.0 must be > 0$"),
    ("heads-zero", "model:\n  transformer:\n    heads: 0\n", r"model.transformer.heads: 0 must be >= 1$"),
    ("heads-negative", "model:\n  transformer:\n    heads: -4\n", r"model.transformer.heads: -4 must be >= 1$"),
    ("d_model-zero", "model:\n  transformer:\n    d_model: 0\n", r"model.transformer.d_model: 0 must be >= 1$"),
    ("d_model-odd-sinusoidal", "model:\n  transformer:\n    d_model: 9\n    heads: 3\n",
     r"model.transformer: d_model \(9\) must be even for sinusoidal positions$"),
    ("attention_pack-negative", "model:\n  transformer:\n    attention_pack: -1\n",
     r"model.transformer.attention_pack: -1 must be >= 0$"),
    ("attention_pack-manual", "model:\n  transformer:\n    attention_impl: manual\n    attention_pack: 64\n",
     r"model.transformer: attention_pack \(64\) needs attention_impl 'sdpa', not 'manual': set attention_pack to 0 "
     r"or attention_impl to sdpa$"),
    ("beta1-one", "train:\n  betas: [1.0, 0.98]\n", r"train.betas: 1.0 \(item 0 of \[1.0, 0.98\]\) must be in \[0, 1\)$"),
    ("beta2-above-one", "train:\n  betas: [0.9, 1.5]\n", r"train.betas: 1.5 \(item 1 of \[0.9, 1.5\]\) must be in \[0, 1\)$"),
    ("beta-negative", "train:\n  betas: [-0.1, 0.98]\n", r"train.betas: -0.1 \(item 0 of .*\) must be in \[0, 1\)$"),
    ("beta-nan", "train:\n  betas: [.nan, 0.98]\n", r"train.betas: nan \(item 0 of .*\) is not a finite number$"),
    ("eps-negative", "train:\n  eps: -1e-8\n", r"train.eps: -1e-08 must be >= 0$"),
    ("seed-negative", "train:\n  seed: -1\n", r"train.seed: -1 must be in \[0, 4294967295\]$"),
    ("seed-too-large", "train:\n  seed: 4294967296\n", r"train.seed: 4294967296 must be in \[0, 4294967295\]$"),
    ("valid_max_sentences-negative", "train:\n  valid_max_sentences: -1\n", r"train.valid_max_sentences: -1 must be >= 0$"),
    ("max_positions-below-max_len", "data:\n  max_len: 100\nmodel:\n  transformer:\n    max_positions: 50\n",
     r"model.transformer.max_positions \(50\) must be at least data.max_len \(100\)"),
    ("max_positions-absurd", "model:\n  transformer:\n    max_positions: 1000000000\n",
     r"model.transformer.max_positions: 1000000000 must be in \[1, 65536\]$"),
    ("tokenizer-max_sentences-zero", "tokenizer:\n  max_sentences: 0\n", r"tokenizer.max_sentences: 0 must be >= 1$"),
    ("device-tpu", "train:\n  device: tpu\n", r"train.device: 'tpu' is not one of 'auto', 'cpu', 'cuda', 'mps' or 'cuda:N'$"),
    ("device-cuda-letter", "train:\n  device: cuda:x\n", r"train.device: 'cuda:x' is not one of .* or 'cuda:N'$"),
    ("compile_dynamic-number", "train:\n  compile_dynamic: 0\n",  # 0 == False in Python, not in the config
     r"train.compile_dynamic: 0 is not one of 'auto', true, false$"),
    ("character_coverage-zero", "tokenizer:\n  character_coverage: 0\n",
     r"tokenizer.character_coverage: 0.0 must be in \[0.98, 1\]$"),
    # below 0.98 sentencepiece failed with "INTERNAL: src/trainer_interface.cc(94) [trainer_spec.character_coverage()
    # >= 0.98 && ...]", which named no key
    ("character_coverage-below-sentencepiece", "tokenizer:\n  character_coverage: 0.9\n",
     r"tokenizer.character_coverage: 0.9 must be in \[0.98, 1\]$"),
    ("length_penalty-inf", "decode:\n  length_penalty: .inf\n", r"decode.length_penalty: inf is not a finite number$"),
    ("max_time-nan", "train:\n  max_time: .nan\n", r"train.max_time: nan is not a finite number$"),
    ("max_steps-beyond-int64", "train:\n  max_steps: 99999999999999999999999\n",
     r"train.max_steps: 99999999999999999999999 does not fit in a 64-bit integer$"),
    ("length_penalty-huge", "decode:\n  length_penalty: 1e308\n", r"decode.length_penalty: 1e\+308 must be in \[-5, 5\]$"),
    ("max_ratio-below-one", "data:\n  max_ratio: 0.5\n", r"data.max_ratio: 0.5 must be 0 or >= 1$"),
    ("lr-beyond-any-float", "train:\n  lr: 1" + "0" * 400 + "\n", r"train.lr: 10+ \.\.\. .* is not a finite number$"),
]

# Valid edge values: each must load unchanged.
ACCEPTED = [
    ("lr-tiny", "train:\n  lr: 1e-12\n", ("train", "lr"), 1e-12),
    ("beta-zero", "train:\n  betas: [0, 0.999]\n", ("train", "betas"), (0.0, 0.999)),
    ("eps-zero", "train:\n  eps: 0\n", ("train", "eps"), 0.0),
    ("seed-zero", "train:\n  seed: 0\n", ("train", "seed"), 0),
    ("device-cuda-number", "train:\n  device: cuda:1\n", ("train", "device"), "cuda:1"),
    ("compile_dynamic-false", "train:\n  compile_dynamic: false\n  batch_shapes: static\n", ("train", "compile_dynamic"),
     False),
    ("seed-largest", "train:\n  seed: 4294967295\n", ("train", "seed"), 4294967295),
    ("valid_max_sentences-zero", "train:\n  valid_max_sentences: 0\n", ("train", "valid_max_sentences"), 0),
    ("tokenizer-max_sentences-one", "tokenizer:\n  max_sentences: 1\n", ("tokenizer", "max_sentences"), 1),
    ("character_coverage-one", "tokenizer:\n  character_coverage: 1\n", ("tokenizer", "character_coverage"), 1.0),
    ("length_penalty-negative", "decode:\n  length_penalty: -0.5\n", ("decode", "length_penalty"), -0.5),
    ("max_ratio-zero", "data:\n  max_ratio: 0\n", ("data", "max_ratio"), 0.0),
    ("max_ratio-one", "data:\n  max_ratio: 1\n", ("data", "max_ratio"), 1.0),
]


def write(tmp_path, text: str):
    path = tmp_path / "exp.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("text", "pattern"), [pytest.param(t, p, id=i) for i, t, p in REFUSED])
def test_out_of_range_value_is_one_line_naming_file_key_and_value(tmp_path, text, pattern):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "\n" not in message, message
    assert re.match(re.escape(f"{path}: ") + pattern, message), message


@pytest.mark.parametrize(("text", "keys", "value"), [pytest.param(t, k, v, id=i) for i, t, k, v in ACCEPTED])
def test_valid_edge_values_load(tmp_path, text, keys, value):
    cfg = load_config(write(tmp_path, text))
    assert getattr(getattr(cfg, keys[0]), keys[1]) == value


def test_max_positions_equal_to_max_len_and_any_for_rnn_load(tmp_path):
    text = "data:\n  max_len: 64\nmodel:\n  transformer:\n    max_positions: 64\n"
    assert load_config(write(tmp_path, text)).model.transformer.max_positions == 64
    text = "data:\n  max_len: 200\nmodel:\n  type: rnn\n  transformer:\n    max_positions: 50\n"
    assert load_config(write(tmp_path, text)).model.type == "rnn"


def test_override_out_of_range_names_the_set_item(tmp_path):
    with pytest.raises(ConfigError, match=r"^--set 'model.transformer.heads=0': model.transformer.heads: 0 must be >= 1$"):
        load_config(write(tmp_path, "train:\n  lr: 0.1\n"), ["model.transformer.heads=0"])
    with pytest.raises(ConfigError, match=r"^--set 'train.lr=nan': train.lr: nan is not a finite number$"):
        load_config(write(tmp_path, "train:\n  lr: 0.1\n"), ["train.lr=nan"])


def test_configs_built_in_code_are_checked_too():
    with pytest.raises(ValueError, match=r"^heads: 0 must be >= 1$"):
        TransformerConfig(heads=0)


def test_every_numeric_key_has_a_range_shown_in_the_reference():
    def walk(cls):
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else None
            if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
                yield from walk(f.default_factory)
            elif isinstance(default, (int, float, tuple)) and not isinstance(default, bool):
                yield f

    numeric = list(walk(ExperimentConfig))
    assert len(numeric) > 40
    missing = [f.name for f in numeric if range_of(f) is None]
    assert not missing, f"numeric keys without a Range: {missing}"
    assert "| `train.betas` | `[0.9, 0.98]` | `in [0, 1)` |" in reference_markdown()
    assert "| `model.transformer.heads` | `8` | `>= 1` |" in reference_markdown()


@pytest.mark.parametrize(("item", "pattern"), [
    ("train.lr=nan", r"train.lr: nan is not a finite number"),
    ("model.transformer.heads=0", r"model.transformer.heads: 0 must be >= 1"),
])
def test_cli_refuses_out_of_range_with_one_line_and_exit_2(tmp_path, item, pattern):
    path = write(tmp_path, "train:\n  seed: -3\n")
    proc = subprocess.run([sys.executable, "-m", "nmt", "train", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"nmt: error: {path}: train.seed: -3 must be in [0, 4294967295]"
    path = write(tmp_path, "train:\n  lr: 0.1\n")
    proc = subprocess.run([sys.executable, "-m", "nmt", "train", str(path), "--set", item], capture_output=True, text=True)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and re.search(pattern, proc.stderr), proc.stderr


@pytest.mark.parametrize(("run_dir", "expected"), [
    ("~/runs/x", "{home}/runs/x"),
    ("$NMT_TEST_ROOT/x", "/data/nmt/x"),
    ("${NMT_TEST_ROOT}/x", "/data/nmt/x"),
    ("${NMT_TEST_UNSET:-/fallback}/x", "/fallback/x"),
    ("runs/plain", "runs/plain"),
])
def test_run_dir_expands_like_corpus_paths(tmp_path, monkeypatch, run_dir, expected):
    monkeypatch.setenv("HOME", "/home/tester")
    monkeypatch.setenv("NMT_TEST_ROOT", "/data/nmt")
    monkeypatch.delenv("NMT_TEST_UNSET", raising=False)
    text = f"run_dir: '{run_dir}'\ndata:\n  train: {{path: '{run_dir}/train'}}\n"
    cfg = load_config(write(tmp_path, text))
    assert cfg.run_dir == expected.format(home="/home/tester")
    assert cfg.data.train.path == cfg.run_dir + "/train"
    assert load_config(write(tmp_path, "train:\n  lr: 0.1\n"), [f"run_dir={run_dir}"]).run_dir == cfg.run_dir


@pytest.mark.parametrize("run_dir", ["$NMT_TEST_UNSET/run", "${NMT_TEST_UNSET}/run", "~/$NMT_TEST_UNSET"])
def test_a_run_dir_with_an_unset_variable_is_refused_before_training_names_a_folder_after_it(
        tmp_path, monkeypatch, tiny_config_file, run_dir):
    """It once trained into a folder named `$NMT_TEST_UNSET` in the working directory, and said nothing."""
    from tests.test_errors import run_in_process

    monkeypatch.delenv("NMT_TEST_UNSET", raising=False)
    monkeypatch.chdir(tmp_path)
    status, err = run_in_process(["train", str(tiny_config_file), "--set", f"run_dir={run_dir}"], None, monkeypatch)
    assert status == 2 and err.count("\n") == 1, err
    assert "run_dir: '" in err and "environment variable NMT_TEST_UNSET is not set; set it, or give a default as " \
        "${NMT_TEST_UNSET:-DEFAULT}" in err, err
    assert not any(tmp_path.rglob("*NMT_TEST_UNSET*"))
    # a checkpoint's config, which translates without training, still loads
    assert load_config(write(tmp_path, f"run_dir: '{run_dir}'\n")).run_dir.endswith(("$NMT_TEST_UNSET/run", "}/run",
                                                                                      "$NMT_TEST_UNSET"))


def test_a_run_dir_under_the_home_of_no_such_user_is_refused_not_made_as_a_folder_named_after_it(
        tmp_path, monkeypatch, tiny_config_file):
    """`~nosuchuser/run` is left as written by the expansion of `~`: training made a folder named `~nosuchuser`."""
    from tests.test_errors import run_in_process

    monkeypatch.chdir(tmp_path)
    status, err = run_in_process(["train", str(tiny_config_file), "--set", "run_dir=~nmt_no_such_user/run"], None,
                                 monkeypatch)
    assert status == 2 and err.count("\n") == 1, err
    assert err.endswith(": run_dir: '~nmt_no_such_user/run': no user 'nmt_no_such_user' to expand ~nmt_no_such_user "
                        "to; give a path without it\n"), err
    assert not any(tmp_path.rglob("*no_such_user*"))


@pytest.mark.parametrize("command", [
    ["translate", "-c", "model.pt"], ["eval", "-c", "model.pt"], ["analyze", "-c", "model.pt"],
])
def test_cli_device_outside_the_known_ones_is_one_line_and_exit_2(command):
    proc = subprocess.run([sys.executable, "-m", "nmt", *command, "--device", "tpu"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr == "nmt: error: --device 'tpu': not one of 'auto', 'cpu', 'cuda', 'mps' or 'cuda:N'\n"


def test_pick_device_refuses_an_unknown_name():
    from nmt.errors import UserError
    from nmt.runtime import pick_device

    with pytest.raises(UserError, match=r"^device 'tpu' \(train.device or --device\): not one of 'auto', 'cpu'"):
        pick_device("tpu")
    assert pick_device("cpu").type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the message of a machine without CUDA")
def test_a_gpu_by_number_on_a_machine_without_one_is_one_line(tiny_config_file, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", str(tmp_path / "model.pt"), "--device",
                           "cuda:1"], input="Hallo\n", capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr == ("nmt: error: device 'cuda:1' (train.device or --device): this machine has 0 CUDA devices; "
                           "use 'auto' or 'cpu'\n")


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the message of a machine without CUDA")
def test_training_on_a_gpu_by_number_on_a_machine_without_one_is_one_line(tiny_config_file):
    proc = subprocess.run([sys.executable, "-m", "nmt", "train", str(tiny_config_file), "--set", "train.device=cuda:0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == ("nmt: error: device 'cuda:0' (train.device or --device): this machine has "
                                            "0 CUDA devices; use 'auto' or 'cpu'")


def test_a_gpu_by_number_under_torchrun_is_refused_before_the_group_is_joined(monkeypatch):
    """torchrun gives each process the GPU of its LOCAL_RANK: one number for every process would put them all on one
    GPU, so it is refused in one line, before any process waits for the others."""
    import torch.distributed as dist

    from nmt.distributed import init_distributed
    from nmt.errors import UserError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(UserError, match=r"^train.device: cuda:1 names one GPU, but torchrun gives each of its 2 "
                                        r"processes the GPU of its LOCAL_RANK; set train.device: cuda \(or auto\)$"):
        init_distributed("cuda:1")
    assert not dist.is_initialized()


def test_a_gpu_number_past_the_machine_s_gpus_names_how_many_there_are():
    from nmt.errors import UserError
    from nmt.runtime import pick_device

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(UserError, match=rf"^device 'cuda:{count}' \(train.device or --device\): this machine has "
                                        rf"{count} CUDA dev"):
        pick_device(f"cuda:{count}")
    if count:
        assert pick_device("cuda:0") == torch.device("cuda", 0)


@pytest.mark.parametrize("where", ["yaml", "set"])
def test_a_nul_character_in_a_text_value_is_refused_with_its_key(tmp_path, where):
    # The OS refuses it in a path: a run_dir holding one stopped training with "ValueError: embedded null byte"
    # (exit 1), and in a language code it made a file name with a NUL.
    yaml_text, overrides = ('run_dir: "runs/a\\0b"\n', []) if where == "yaml" else ("train:\n  lr: 0.1\n", ["run_dir=runs/a\0b"])
    path = write(tmp_path, yaml_text)
    with pytest.raises(ConfigError, match=r"run_dir: 'runs/a\\x00b' holds a NUL character \(\\0\); remove it$"):
        load_config(path, overrides)
    with pytest.raises(ConfigError, match=r"data.src_lang: 'e\\x00n' holds a NUL character"):
        load_config(write(tmp_path, 'data:\n  src_lang: "e\\0n"\n'))


def test_a_huge_num_workers_is_refused_at_load(tmp_path):
    # The DataLoader started worker processes one after another, without end, for train.num_workers=99999999999.
    with pytest.raises(ConfigError, match=r"train.num_workers: 99999999999 must be in \[0, 256\]$"):
        load_config(write(tmp_path, "train:\n  lr: 0.1\n"), ["train.num_workers=99999999999"])
    assert load_config(write(tmp_path, "train:\n  num_workers: 256\n")).train.num_workers == 256


@pytest.mark.parametrize("key", ["model.transformer.encoder_layers", "model.transformer.decoder_layers",
                                 "model.rnn.encoder_layers", "model.rnn.decoder_layers"])
def test_a_huge_layer_count_is_refused_at_load(tmp_path, key):
    # Building 99999999999 small layers ran for hours, silent, before memory ran out.
    with pytest.raises(ConfigError, match=rf"{key}: 99999999999 must be in \[1, 1000\]$"):
        load_config(write(tmp_path, "train:\n  lr: 0.1\n"), [f"{key}=99999999999"])
    assert attrgetter(key)(load_config(write(tmp_path, "train:\n  lr: 0.1\n"), [f"{key}=1000"])) == 1000


def test_a_vocab_size_beyond_sentencepieces_int32_is_refused_at_load(tmp_path):
    # sentencepiece failed with 'cannot parse "99999999999" as int', naming neither the key nor what to do.
    with pytest.raises(ConfigError, match=r"tokenizer.vocab_size: 99999999999 must be in \[8, 2147483647\]$"):
        load_config(write(tmp_path, "tokenizer:\n  vocab_size: 99999999999\n"))
