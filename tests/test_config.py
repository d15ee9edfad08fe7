"""Strict config loading: good files, unknown keys, wrong types, invariants, overrides."""

import os
import re
from pathlib import Path

import pytest
import yaml

from nmt.config import (
    EvalConfig,
    ExperimentConfig,
    config_from_dict,
    config_to_dict,
    load_config,
    reference_markdown,
    save_config,
)
from nmt.errors import ConfigError
from nmt.metrics import bleu_tokenizer, score

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_good_file_loads_with_defaults(tmp_path):
    cfg = load_config(write(tmp_path, "run_dir: r\nmodel:\n  transformer:\n    d_model: 64\n    heads: 4\n"))
    assert cfg.run_dir == "r"
    assert cfg.model.transformer.d_model == 64
    assert cfg.model.transformer.ff_dim == 2048  # default kept
    assert cfg.train.betas == (0.9, 0.98)


def test_unknown_key_suggests_the_close_one(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "train:\n  lerning_rate: 1\n  max_step: 3\n"))
    assert "exp.yaml" in str(err.value)
    assert "train.max_step" in str(err.value) or "train.lerning_rate" in str(err.value)
    with pytest.raises(ConfigError, match=r"unknown key 'train.max_step'; did you mean 'max_steps'\?"):
        load_config(write(tmp_path, "train:\n  max_step: 3\n"))


def test_an_unknown_key_with_no_close_one_lists_a_small_section_and_points_a_large_one_to_the_reference(tmp_path):
    """train's 41 keys made a 600-character line (seen on a checkpoint's stored config)."""
    with pytest.raises(ConfigError, match=r"unknown key 'eval.zzz'; known keys: tokenize, lowercase, metrics$"):
        load_config(write(tmp_path, "eval:\n  zzz: 1\n"))
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "train:\n  zzz: 1\n"))
    assert re.search(r"unknown key 'train.zzz'; `nmt config-reference` lists the \d\d keys of 'train'$",
                     str(err.value)), str(err.value)


def test_a_key_in_the_wrong_section_names_the_section_that_has_it(tmp_path):
    """A YAML indentation slip moves a key out of its section: the hint names where it belongs, not a look-alike
    key of the section it landed in ('valid' is close to 'eval')."""
    train = "data:\n  train: {kind: text, path: c/train}\n"
    with pytest.raises(ConfigError, match=r"exp.yaml: unknown key 'valid'; did you mean 'data.valid', a key of "
                                          r"another section\? \(in YAML, check its indentation\)$"):
        load_config(write(tmp_path, train + "valid: {kind: text, path: c/valid}\n"))
    with pytest.raises(ConfigError, match=r"unknown key 'data.kind'; did you mean 'data.train.kind' or "
                                          r"'data.valid.kind' or 'data.test.NAME.kind',"):
        load_config(write(tmp_path, "data:\n  train:\n  kind: text\n  path: c/train\n"))
    with pytest.raises(ConfigError, match=r"unknown key 'train.dropout'; did you mean 'model.transformer.dropout' "
                                          r"or 'model.rnn.dropout',"):
        load_config(write(tmp_path, train), ["train.dropout=0.1"])


@pytest.mark.parametrize(("yaml_text", "overrides", "where", "indentation"), [
    ("train:\n  dropout: 0.1\n", [], "exp.yaml", True),
    ("", ["train.dropout=0.1"], "--set 'train.dropout=0.1'", False),
    ("", ["train={dropout: 0.1}"], "--set 'train={dropout: 0.1}'", False),
], ids=["yaml", "set-key", "set-mapping"])
def test_a_key_of_another_section_blames_indentation_only_in_yaml(tmp_path, monkeypatch, capsys, yaml_text, overrides,
                                                                  where, indentation):
    """`nmt train` with a key that another section has: a `--set` item's hint said "(in YAML, check its
    indentation)" of a key typed on the command line, which has none; the file's hint keeps it."""
    from nmt import cli

    path = write(tmp_path, yaml_text)
    monkeypatch.setattr("sys.argv", ["nmt", "train", str(path), *(arg for item in overrides for arg in ("--set", item))])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    hint = " (in YAML, check its indentation)" if indentation else ""
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"nmt: error: {path if where == 'exp.yaml' else where}: unknown key 'train.dropout'; did you mean "
        f"'model.transformer.dropout' or 'model.rnn.dropout', a key of another section?{hint}"]


def test_wrong_type_names_key_file_and_expected_type(tmp_path):
    with pytest.raises(ConfigError, match=r"exp.yaml: train.max_steps: expected int, got str 'many'"):
        load_config(write(tmp_path, "train:\n  max_steps: many\n"))
    with pytest.raises(ConfigError, match=r"model.type: 'transfomer' is not one of .*did you mean 'transformer'"):
        load_config(write(tmp_path, "model:\n  type: transfomer\n"))
    with pytest.raises(ConfigError, match=r"train.valid_bleu: expected bool"):
        load_config(write(tmp_path, "train:\n  valid_bleu: 1\n"))


def test_ints_are_accepted_for_floats_and_exponent_strings_parse(tmp_path):
    cfg = load_config(write(tmp_path, "train:\n  lr: 1e-3\n  label_smoothing: 0\n"))
    assert cfg.train.lr == pytest.approx(1e-3)
    assert isinstance(cfg.train.label_smoothing, float)


def test_invariants_raise_with_values_and_key_path(tmp_path):
    with pytest.raises(ConfigError, match=r"model.transformer: d_model \(100\) must be divisible by heads \(3\)"):
        load_config(write(tmp_path, "model:\n  transformer:\n    d_model: 100\n    heads: 3\n"))
    with pytest.raises(ConfigError, match=r"exp.yaml: model.rnn.dropout: -0.1 must be in \[0, 1\)"):
        load_config(write(tmp_path, "model:\n  rnn:\n    dropout: -0.1\n"))
    with pytest.raises(ConfigError, match="tokenizer.joint"):
        load_config(write(tmp_path, "tokenizer:\n  joint: false\nmodel:\n  tie_embeddings: all\n"))
    with pytest.raises(ConfigError, match=r"exp.yaml: train: compile_dynamic false .* needs batch_shapes static"):
        load_config(write(tmp_path, "train:\n  compile: true\n  compile_dynamic: false\n  batch_shapes: free\n"))


def test_overrides_set_nested_keys_and_are_validated(tmp_path):
    path = write(tmp_path, "train:\n  lr: 0.1\n")
    cfg = load_config(path, ["train.lr=0.5", "model.type=rnn", "model.rnn.cell=lstm", "data.test.x.path=a/b"])
    assert cfg.train.lr == 0.5
    assert cfg.model.type == "rnn" and cfg.model.rnn.cell == "lstm"
    assert cfg.data.test["x"].path == "a/b"
    with pytest.raises(ConfigError, match="unknown key 'train.lrr'"):
        load_config(path, ["train.lrr=1"])
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(path, ["train.lr"])


def test_missing_file_and_yaml_syntax_error(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"exp.yaml: line 3, column 6: YAML syntax error"):
        load_config(write(tmp_path, "train:\n  lr: [1, 2\nmodel: {}\n"))


def test_round_trip_through_dict_and_yaml(tmp_path):
    cfg = load_config(write(tmp_path, "data:\n  train: {kind: text, path: a}\n  test:\n    t1: {path: b}\n"))
    again = config_from_dict(config_to_dict(cfg))
    assert again == cfg
    save_config(cfg, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml") == cfg


def test_defaults_are_valid():
    assert config_from_dict({}) == ExperimentConfig()


def test_readme_config_reference_is_in_sync():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert reference_markdown() in readme, "regenerate the README table with `nmt config-reference`"


BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))
MEGA = "x" * 1_000_000

# (id, file text, pattern the one-line message must match); each line stays short.
REFUSED_YAML = [
    ("duplicate-section", "train:\n  lr: 0.1\ndata:\n  src_lang: en\ntrain:\n  lr: 0.2\n",
     r"exp.yaml: line 5: duplicate key 'train' \(first at line 1\); remove one$"),
    ("duplicate-nested-key", "model:\n  transformer:\n    d_model: 64\n    heads: 4\n    d_model: 32\n",
     r"exp.yaml: line 5: duplicate key 'd_model' \(first at line 3\); remove one$"),
    ("duplicate-in-flow-mapping", "train: {lr: 1, lr: 2}\n", r"exp.yaml: line 1: duplicate key 'lr' \(first at line 1\)"),
    ("alias-bomb", BOMB, r"exp.yaml: line 2: YAML alias \*a is not supported .*; write the value out in full$"),
    ("alias-merge-key", "data:\n  test:\n    a: &t {path: x}\n    b:\n      <<: *t\n", r"exp.yaml: line 5: YAML alias \*t"),
    ("huge-integer", "train:\n  max_steps: 1" + "0" * 5000 + "\n", r"exp.yaml: line 2: an integer of 5001 digits is too large$"),
    ("mega-value-of-wrong-type", f"train:\n  max_steps: {MEGA}\n",
     r"exp.yaml: train.max_steps: expected int, got str 'xxx+ \.\.\. \(1000002 characters\) \.\.\. xxx+'$"),
    ("mega-value-not-in-enum", f"model:\n  type: {MEGA}\n", r"model.type: 'xxx+ \.\.\. \(1000002 characters\) .* is not one of"),
    ("mega-value-in-an-invariant", f"data:\n  src_lang: {MEGA}\n  tgt_lang: {MEGA}\n",
     r"exp.yaml: data: src_lang and tgt_lang are both 'xxx+ \.\.\. \(1000033 characters\) \.\.\. xxx+"),
    ("mega-unknown-key", f"model:\n  ? {MEGA}\n  : 1\n", r"unknown key 'model.xxx+ \.\.\. \(1000008 characters\) \.\.\. xxx+'; known keys: type"),
    ("mega-test-set-name", f"data:\n  test:\n    ? {MEGA}\n    : 3\n",
     r"data.test.xxx+ \.\.\. \(1000000 characters\) \.\.\. xxx+: expected a mapping, got int 3$"),
    ("nested-past-the-recursion-limit", "train: " + "[" * 5000 + "]" * 5000 + "\n",  # was RecursionError, exit 1
     r"exp.yaml: YAML syntax error: lists or mappings nested too deeply to parse; a config nests a few levels$"),
]


@pytest.mark.parametrize(("text", "pattern"), [pytest.param(t, p, id=i) for i, t, p in REFUSED_YAML])
def test_refused_yaml_is_one_short_line(tmp_path, text, pattern):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    message = str(err.value)
    assert "\n" not in message and len(message) < 500 + len(str(tmp_path)), message[:1000]
    assert re.search(pattern, message), message[:1000]


# (id, --set item, pattern the message must match)
REFUSED_OVERRIDES = [
    ("alias", "train.lr=[&a [1, 1], *a]", r"^--set 'train.lr=\[&a \[1, 1\], \*a\]': YAML alias \*a is not supported"),
    ("duplicate-key", "data.test={a: {path: x}, a: {path: y}}", r"^--set '.*': duplicate key 'a' \(first at line 1\)"),
    ("mega-value", f"train.max_steps={MEGA}", r"^--set 'train.max_steps=xxx+ \.\.\. \(1000018 characters\) .*"
                                             r"expected int, got str 'xxx+ \.\.\. \(1000002 characters\)"),
    ("nested-past-the-recursion-limit", "train.lr=" + "[" * 5000 + "]" * 5000,  # was RecursionError, exit 1
     r"^--set 'train.lr=\[\[+ \.\.\. \(\d+ characters\) \.\.\. \]+': train.lr: expected float, got str '\[\[+ "),
]


@pytest.mark.parametrize(("item", "pattern"), [pytest.param(t, p, id=i) for i, t, p in REFUSED_OVERRIDES])
def test_refused_override_is_one_short_line(tmp_path, item, pattern):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "train:\n  lr: 0.1\n"), [item])
    message = str(err.value)
    assert "\n" not in message and len(message) < 500, message[:1000]
    assert re.search(pattern, message), message[:1000]


def test_a_text_key_takes_its_set_value_as_typed(tmp_path):
    """YAML would read `no` as false, `12:30` as 750 and `#1` as a comment: a key that holds text takes the text."""
    cfg = load_config(write(tmp_path, "train:\n  lr: 0.1\n"),
                      ["run_dir=runs/x #1", "data.src_lang=no", "data.tgt_lang='on'", "tokenizer.model=12:30"])
    assert (cfg.run_dir, cfg.data.src_lang, cfg.data.tgt_lang, cfg.tokenizer.model) == ("runs/x #1", "no", "on", "12:30")
    assert load_config(write(tmp_path, ""), ["train.max_steps=12"]).train.max_steps == 12  # other keys: YAML as ever


def test_a_corpus_path_takes_its_set_value_as_typed_unless_it_is_a_list(tmp_path):
    """`--set 'data.train.path=corpus/v #2'` read `corpus/v` (YAML's comment dropped), and a prefix `no` was
    refused as `expected a list, got bool`; a `[...]` value is still a list, and an optional text key's `null`
    still None."""
    cfg = load_config(write(tmp_path, "data:\n  train: {path: a}\n  valid: {path: b, split: dev}\n"),
                      ["data.train.path=corpus/v #2", "data.valid.path=no", "data.test.t.path=12:30",
                       "data.valid.split=null", "data.valid.hf_config=on"])
    assert (cfg.data.train.path, cfg.data.valid.path, cfg.data.test["t"].path) == ("corpus/v #2", "no", "12:30")
    assert cfg.data.valid.split is None and cfg.data.valid.hf_config == "on"
    listed = load_config(write(tmp_path, "data:\n  train: {path: a}\n"), ["data.train.path=[x, 'y #1']"])
    assert listed.data.train.path == ["x", "y #1"]
    tsv = write(tmp_path, "data:\n  train: {kind: tsv, path: a.tsv}\n")
    cfg = load_config(tsv, ["data.train.src_field=1", "data.train.tgt_field=0"])  # str | int: read as YAML
    assert (cfg.data.train.src_field, cfg.data.train.tgt_field) == (1, 0)


def test_a_value_that_fits_no_member_of_a_union_names_every_member(tmp_path):
    """`--set data.train.path=` (null) was refused as "expected a list", though text is the usual path."""
    path = write(tmp_path, "data:\n  train: {kind: tsv, path: a.tsv}\n")
    for item, expected in [("data.train.path=", "data.train.path: expected a list or str, got nothing (null)"),
                           ("data.train.src_field=1.5", "data.train.src_field: expected str or int, got float 1.5"),
                           ("data.train=x", "data.train: expected a mapping or a list, got str 'x'")]:
        with pytest.raises(ConfigError) as err:
            load_config(path, [item])
        assert str(err.value).endswith(expected), str(err.value)


@pytest.mark.parametrize("item", ["train=", "model.transformer=null", "tokenizer=~", "decode=", "eval="])
def test_an_empty_section_from_set_is_refused_not_read_as_its_defaults(tmp_path, item):
    """`--set "model.transformer=$OVERRIDES"` with the variable unset took every default of the section: a
    Transformer-base where the file asked for d_model 32, a train section without the file's max_steps."""
    path = write(tmp_path, "model:\n  transformer: {d_model: 32, heads: 2}\ntrain: {max_steps: 3}\n")
    key = item.split("=")[0]
    with pytest.raises(ConfigError) as err:
        load_config(path, [item])
    assert str(err.value).startswith(f"--set {item!r}: {key}: expected a mapping, got nothing (null)")
    cfg = load_config(path, [f"{key}={{}}"])  # an empty mapping sets nothing
    assert (cfg.model.transformer.d_model, cfg.train.max_steps) == (32, 3)


@pytest.mark.parametrize("key", ["train.init_from", "tokenizer.model", "data.src_lang"])
def test_an_empty_value_for_text_says_how_to_give_the_empty_text(tmp_path, key):
    """`--set train.init_from=` (meant to clear the file's parent) said only "expected str, got nothing (null)"."""
    path = write(tmp_path, "train: {init_from: parent.pt}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, [f"{key}="])
    assert str(err.value).startswith(f"--set '{key}=': {key}: expected text, got nothing; to empty it, give two "
                                     f"quotes: --set \"{key}=''\"")
    assert load_config(path, ["train.init_from=''"]).train.init_from == ""


def test_set_into_a_list_of_corpora_says_to_set_the_whole_list(tmp_path):
    path = write(tmp_path, "data:\n  train:\n    - {path: a}\n    - {path: b}\n")
    with pytest.raises(ConfigError, match=r"^--set 'data.train.weight=3': data.train is a list of 2 sections here, "
                                          r"which --set cannot reach into; set the whole list, e.g. --set 'data.train=\["):
        load_config(path, ["data.train.weight=3"])
    for item in ("data.train.0.weight=3", "data.train[0].weight=3"):  # an index is no key either
        with pytest.raises(ConfigError, match=r"data.train is a list of 2 sections here, which --set cannot reach"):
            load_config(path, [item])
    assert [c.weight for c in load_config(path, ["data.train=[{path: a}, {path: b, weight: 3}]"]).data.train] == [1, 3]


def test_anchors_without_aliases_and_equal_values_under_different_keys_load(tmp_path):
    cfg = load_config(write(tmp_path, "data:\n  test:\n    a: &t {path: x}\n    b: {path: x}\n"), ["data.test.c={path: x}"])
    assert [t.path for t in cfg.data.test.values()] == ["x", "x", "x"]


def test_the_schema_offers_exactly_the_attention_scores_and_corpus_kinds_the_code_builds() -> None:
    import typing

    from nmt.config.schema import CorpusConfig, RNNConfig
    from nmt.models.attention import ATTENTION_KINDS

    hints = typing.get_type_hints(RNNConfig)
    assert typing.get_args(hints["attention"]) == ATTENTION_KINDS
    source = (Path(__file__).resolve().parents[1] / "nmt" / "data" / "corpus.py").read_text(encoding="utf-8")
    cases = re.findall(r'^        case ("\w+"(?: \| "\w+")*):', source, flags=re.M)  # case "a": or case "a" | "b":
    assert set(typing.get_args(typing.get_type_hints(CorpusConfig)["kind"])) == {
        kind for case in cases for kind in re.findall(r'"(\w+)"', case)}


def test_a_tokenizer_sacrebleu_cannot_build_here_is_refused_at_load(tmp_path, monkeypatch):
    """eval.tokenize ja-mecab needs MeCab (sacrebleu[ja]): without it, refused when the config loads, naming the key
    and the extra, not at the first validation of a training run, with nothing saved."""
    from sacrebleu.tokenizers import tokenizer_ja_mecab

    monkeypatch.setattr(tokenizer_ja_mecab, "MeCab", None)  # as where sacrebleu[ja] is not installed
    path = write(tmp_path, "eval:\n  tokenize: ja-mecab\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (f"{path}: eval.tokenize 'ja-mecab': Japanese tokenization requires extra dependencies, "
                              "but you do not have them installed; install them with: pip install 'sacrebleu[ja]', "
                              "or choose another tokenizer")
    with pytest.raises(ConfigError, match=r"eval.tokenize 'ja-mecab': Japanese tokenization requires"):
        load_config(write(tmp_path, "{}\n"), ["eval.tokenize=ja-mecab"])
    for name in ("13a", "intl", "zh", "char", "none"):
        assert load_config(write(tmp_path, f"eval:\n  tokenize: '{name}'\n")).eval.tokenize == name


def test_auto_scores_chinese_and_japanese_with_the_bleu_tokenizer_of_their_script(tmp_path, monkeypatch):
    """13a splits at spaces and punctuation, so it takes a sentence of Chinese for one word: a translation with
    one character wrong in each sentence scored 0 BLEU, and validation chose checkpoints by that number."""
    tokenize = {lang: load_config(write(tmp_path, f"data:\n  src_lang: en\n  tgt_lang: {lang}\n")).eval.tokenize
                for lang in ("zh", "zh-TW", "zho_Hans", "cmn", "de", "ru")}
    assert tokenize == {"zh": "zh", "zh-TW": "zh", "zho_Hans": "zh", "cmn": "zh", "de": "13a", "ru": "13a"}
    assert bleu_tokenizer("auto", "ja") == bleu_tokenizer("auto", "jpn_Jpan") == "ja-mecab"
    assert bleu_tokenizer("auto") == "13a"
    assert load_config(write(tmp_path, "data:\n  tgt_lang: zh\neval:\n  tokenize: 13a\n")).eval.tokenize == "13a"
    han = [chr(0x4E00 + 97 * i) for i in range(200)]
    refs = ["".join(han[(7 * n + i) % 200] for i in range(12)) + "\u3002" for n in range(20)]
    hyps = [ref[:5] + "\u4e86" + ref[6:] for ref in refs]  # one ideograph of twelve wrong
    chinese = load_config(write(tmp_path, "data:\n  tgt_lang: zh\n")).eval
    assert score(hyps, refs, chinese)["bleu"] > 50 and "tok:zh" in score(hyps, refs, chinese)["bleu_signature"]
    assert score(hyps, refs, EvalConfig(tokenize="13a"))["bleu"] < 1

    from sacrebleu.tokenizers import tokenizer_ja_mecab

    monkeypatch.setattr(tokenizer_ja_mecab, "MeCab", None)  # as where sacrebleu[ja] is not installed
    path = write(tmp_path, "data:\n  tgt_lang: ja\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: eval.tokenize 'ja-mecab' (sacreBLEU's for data.tgt_lang "
                                                    "'ja'): Japanese tokenization requires extra dependencies")):
        load_config(path)
    assert load_config(write(tmp_path, "data:\n  tgt_lang: ja\neval:\n  tokenize: char\n")).eval.tokenize == "char"


def test_a_mapping_set_for_a_section_merges_into_it(tmp_path):
    """`--set 'model.transformer={dropout: 0.2}'` keeps the file's d_model; named test sets are replaced whole."""
    path = write(tmp_path, "model:\n  transformer: {d_model: 32, heads: 2, ff_dim: 64}\n"
                           "data:\n  train: {path: a, src_field: x, tgt_field: y}\n  test:\n    t1: {path: b}\n")
    cfg = load_config(path, ["model.transformer={dropout: 0.2, heads: 4}", "model={rnn: {cell: lstm}}",
                             "data.train={path: c}", "data.test={t2: {path: d}}"])
    t = cfg.model.transformer
    assert (t.d_model, t.ff_dim, t.heads, t.dropout) == (32, 64, 4, 0.2) and cfg.model.rnn.cell == "lstm"
    assert (cfg.data.train.path, cfg.data.train.src_field, cfg.data.train.tgt_field) == ("c", "x", "y")
    assert list(cfg.data.test) == ["t2"]
    # a key of the mapping that no section has is named as ever, and a section the file lacks is made
    with pytest.raises(ConfigError, match="unknown key 'model.transformer.d_modle'"):
        load_config(path, ["model.transformer={d_modle: 64}"])
    assert load_config(write(tmp_path, ""), ["model.transformer={d_model: 64, heads: 2}"]).model.transformer.ff_dim == 2048
    # each key is checked as if set alone: checked whole against the section's defaults, the mapping was refused
    # for the defaults' 8 heads, a corpus without a path, an average_last over the default keep_last
    path = write(tmp_path, "model:\n  transformer: {heads: 2}\ndata:\n  train: {path: a}\n  valid: {path: b}\n"
                           "train: {keep_last: 5}\n")
    cfg = load_config(path, ["model.transformer={d_model: 30}", "data.train={weight: 2}", "train={average_last: 4}",
                             "data.valid={kind: tsv, src_field: 0, tgt_field: 1}"])
    assert (cfg.model.transformer.d_model, cfg.data.train.path, cfg.data.train.weight) == (30, "a", 2.0)
    assert (cfg.train.average_last, cfg.data.valid.path, cfg.data.valid.src_field) == (4, "b", 0)
    with pytest.raises(ConfigError, match="src_field and tgt_field: give both or neither"):  # the merged config's
        load_config(path, ["data.valid={kind: tsv, src_field: 0}"])


def test_a_transformer_whose_decode_lengths_outgrow_its_positions_is_refused_before_training(tmp_path):
    """16 positions hold BOS and 15 output tokens; a one-subword source (2 positions with EOS) may give
    2 x max_len_a + max_len_b. At 16 nothing could be translated, so the first validation would fail after the
    first valid_every updates: refused at load for training, and by `train` before the run directory is made."""
    from nmt.train.loop import train

    def config(a: float, b: int) -> Path:
        return write(tmp_path, f"run_dir: {tmp_path / 'run'}\n"
                               "data: {train: {path: corpus/train}, valid: {path: corpus/valid}, max_len: 16}\n"
                               "model: {transformer: {d_model: 32, heads: 2, max_positions: 16}}\n"
                               f"decode: {{max_len_a: {a}, max_len_b: {b}}}\n")

    message = ("decode.max_len_a (3) and decode.max_len_b (10) allow outputs of more than the 15 tokens that "
               "model.transformer.max_positions (16) holds, even from a one-subword source (2 positions with EOS), so "
               "validation could translate nothing: lower them so that 2 x max_len_a + max_len_b is at most 15, or "
               "raise max_positions")
    with pytest.raises(ConfigError) as err:
        load_config(config(3, 10), training=True)
    assert str(err.value) == f"{tmp_path / 'exp.yaml'}: {message}"
    cfg = load_config(config(3, 10))  # a checkpoint's config, whose search `nmt translate` may set otherwise
    with pytest.raises(ConfigError, match=re.escape(message)):
        train(cfg)
    assert not (tmp_path / "run").exists()
    assert load_config(config(2.5, 10), training=True).decode.max_len_a == 2.5  # 15: the longest that fits
    assert load_config(config(3, 10), ["model.type=rnn"], training=True).model.type == "rnn"  # no position table


def test_an_empty_run_dir_is_refused_for_training(tmp_path):
    # "" trained into the working directory, its checkpoints and caches among the files there.
    path = write(tmp_path, "data: {train: {path: corpus/train}, valid: {path: corpus/valid}}\n")
    with pytest.raises(ConfigError, match=r"--set 'run_dir=\"\"' \(on .*exp.yaml\): run_dir: '' names no folder; give one \(`.`"):
        load_config(path, ['run_dir=""'], training=True)
    with pytest.raises(ConfigError, match=r"exp.yaml: run_dir: ' ' names no folder"):
        load_config(write(tmp_path, "run_dir: ' '\ndata: {train: {path: a}, valid: {path: b}}\n"), training=True)
    assert load_config(path, ["run_dir=."], training=True).run_dir == "."


def test_a_rule_across_keys_that_a_set_item_breaks_names_that_item(tmp_path):
    """Each `--set` item is checked against the schema alone; a rule across keys (a weight on the validation set,
    a separate vocabulary under tied embeddings) was blamed on the file, whose own keys keep it. The item that
    breaks it is named, among others that do not; a file that breaks it itself is named alone."""
    from tests.conftest import tiny_config_dict

    raw = tiny_config_dict(tmp_path / "corpus", tmp_path / "run")
    raw["model"]["tie_embeddings"] = "all"
    path = write(tmp_path, yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as err:
        load_config(path, ["train.lr=0.001", "data.valid.weight=3"])
    assert str(err.value) == (f"--set 'data.valid.weight=3' (on {path}): data: valid.weight: weights apply to training "
                              "corpora only; remove it")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["tokenizer.joint=false", "train.lr=0.001"])
    assert str(err.value).startswith(f"--set 'tokenizer.joint=false' (on {path}): model.tie_embeddings 'all' needs ")
    raw["data"]["valid"]["weight"] = 3
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, yaml.safe_dump(raw)), ["train.lr=0.001"])
    assert str(err.value).startswith(f"{path}: data: valid.weight: ")


def test_compile_dynamic_false_is_accepted_and_unused_without_compile(small_corpus, tmp_path):
    """`compile_dynamic` is read only when compiling, as `compile_mode` is: a config that keeps compile settings for
    `--set train.compile=true` trains without compile, free batch shapes and all; with compile, false still needs
    static shapes, and the error says why."""
    from nmt.train.loop import train
    from tests.conftest import tiny_config_dict

    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["train"].update({"compile": False, "compile_dynamic": False, "batch_shapes": "free", "compile_mode":
                         "reduce-overhead", "max_steps": 1, "valid_every": 1, "valid_bleu": False, "device": "cpu"})
    path = write(tmp_path, yaml.safe_dump(raw))
    assert train(load_config(path, training=True))["step"] == 1
    with pytest.raises(ConfigError) as err:
        load_config(path, ["train.compile=true"], training=True)
    assert str(err.value) == (f"--set 'train.compile=true' (on {path}): train: compile_dynamic false compiles a graph "
                              "per batch shape, so it needs batch_shapes static (one shape per length bucket), not free")


def test_a_config_is_read_from_a_pipe_as_from_a_file():
    """`nmt train <(sed s/.../.../ base.yaml)`: a pipe was refused as "config file not found"."""
    read, write_end = os.pipe()
    with os.fdopen(write_end, "w") as out:
        out.write("run_dir: runs/piped\ntrain: {max_steps: 7}\n")
    try:
        cfg = load_config(f"/dev/fd/{read}")
    finally:
        os.close(read)
    assert (cfg.run_dir, cfg.train.max_steps) == ("runs/piped", 7)
