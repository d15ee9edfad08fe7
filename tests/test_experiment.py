"""`nmt experiment` writes a results file from a real (tiny) training run; `nmt.results` renders it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from nmt.checkpoint import load_checkpoint
from nmt.cli import app
from nmt.config import load_config
from nmt.errors import DataError
from nmt.experiment import better_checkpoint, pick_checkpoint
from nmt.results import END, START, main, results_table
from nmt.runtime import hardware
from nmt.translate import Translator
from tests.conftest import tiny_config_dict

runner = CliRunner()


def run_experiment(config: Path, results: Path) -> dict:
    """`nmt experiment CONFIG --name tiny` for 4 updates, scored with beam 1: its results file, read back."""
    out = runner.invoke(app, ["experiment", str(config), "--name", "tiny", "--results", str(results),
                              "--set", "train.max_steps=4", "--set", "decode.beam=1"])
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines()[-1] == f"wrote {results / 'tiny.json'}"
    return json.loads((results / "tiny.json").read_text(encoding="utf-8"))


@pytest.fixture
def experiment_result(tiny_config_file, tmp_path) -> dict:
    """A run of its own in `tmp_path` (run/, results/), for a test that trains or scores it again."""
    return run_experiment(tiny_config_file, tmp_path / "results")


@pytest.fixture(scope="module")
def shared_experiment(small_corpus, tmp_path_factory) -> tuple[Path, dict]:
    """One run that the tests which only read its files share: its folder (run/, results/) and its results."""
    folder = tmp_path_factory.mktemp("experiment")
    config = folder / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config_dict(small_corpus, folder / "run")), encoding="utf-8")
    return folder, run_experiment(config, folder / "results")


def test_experiment_records_scores_cost_and_overrides(shared_experiment):
    tmp_path, r = shared_experiment
    assert r["experiment"] == "tiny" and r["direction"] == "en-de" and r["model"] == "transformer"
    assert r["steps"] == 4 and r["stopped_by"] == "max_steps=4" and r["beam"] == 1
    assert r["checkpoint"] == str(tmp_path / "run" / "best.pt") and r["valid_by_checkpoint"] == {}
    # the validation of the checkpoint scored, and the run's last one, each with its step
    best = load_checkpoint(tmp_path / "run" / "best.pt")["progress"]
    assert r["best_step"] == best["step"] == best["best_step"] and r["best_valid"] == best["last_valid"]
    assert r["valid_step"] == 4 and set(r["valid"]) == set(r["best_valid"]) >= {"loss", "bleu", "chrf"}
    assert r["overrides"] == ["--set train.max_steps=4", "--set decode.beam=1"]
    assert r["parameters"] > 0 and r["train_seconds"] > 0 and r["tokens_per_s"] > 0
    trained_on = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")  # train.device auto
    assert r["hardware"] == hardware(trained_on)
    test = r["test"]["test"]
    assert 0.0 <= test["bleu"] <= 100.0 and 0.0 <= test["chrf"] <= 100.0
    assert test["bleu_signature"].startswith("nrefs:1") and test["sentences"] == 30
    assert sum(b["sentences"] for b in test["by_length"]) == 30
    # the hypotheses behind the score are kept next to the checkpoint, one line per source line
    hyps = (tmp_path / "run" / "test.hyp").read_text(encoding="utf-8").split("\n")
    assert len(hyps) == 31 and hyps[-1] == ""


def test_averaged_checkpoint_is_reported_only_when_it_validates_as_well(tiny_config_file, small_corpus, tmp_path):
    results = tmp_path / "results"
    out = runner.invoke(app, ["experiment", str(tiny_config_file), "--name", "avg", "--results", str(results),
                              "--set", "train.save_every=1", "--set", "train.keep_last=4",
                              "--set", "train.average_last=4", "--set", "decode.beam=1"])
    assert out.exit_code == 0, out.output
    r = json.loads((results / "avg.json").read_text(encoding="utf-8"))
    valid = r["valid_by_checkpoint"]
    assert set(valid) == {"averaged.pt", "best.pt"}
    key = {name: (v["bleu"], v["chrf"]) for name, v in valid.items()}
    chosen = "averaged.pt" if key["averaged.pt"] >= key["best.pt"] else "best.pt"
    assert r["checkpoint"] == str(tmp_path / "run" / chosen)

    # Make each candidate in turn the perfect one: validation references = its own translations.
    run = tmp_path / "run"
    sources = (small_corpus / "valid.en").read_text(encoding="utf-8").splitlines()
    outputs = {name: Translator.from_checkpoint(run / name).translate(sources) for name in valid}
    assert outputs["averaged.pt"] != outputs["best.pt"]
    for winner in ("averaged.pt", "best.pt"):
        prefix = tmp_path / winner / "valid"
        prefix.parent.mkdir()
        prefix.with_suffix(".en").write_text("\n".join(sources) + "\n", encoding="utf-8")
        prefix.with_suffix(".de").write_text("\n".join(outputs[winner]) + "\n", encoding="utf-8")
        loser = ({*valid} - {winner}).pop()
        for metric in ("bleu", "ter"):
            cfg = load_config(tiny_config_file, [f"data.valid.path={prefix}", "decode.beam=1",
                                                 f"train.early_stop_metric={metric}"])
            path, _, scores = pick_checkpoint(run, cfg)
            assert path == run / winner and scores[winner]["chrf"] == 100.0 > scores[loser]["chrf"]
            assert set(scores[winner]) == {metric, "bleu", "chrf"}
            assert metric != "ter" or scores[winner]["ter"] == 0.0 < scores[loser]["ter"]


@pytest.mark.parametrize(("order", "chosen"), [
    (["bleu", "chrf"], "best.pt"),
    (["chrf", "bleu"], "averaged.pt"),
    (["ter", "bleu", "chrf"], "averaged.pt"),  # lower is better
    (["ter", "bleu"], "averaged.pt"),
])
def test_the_candidate_is_chosen_by_the_metric_that_picked_the_best_checkpoint(order, chosen):
    """best.pt is the best by `train.early_stop_metric`; averaged.pt was judged against it by BLEU whatever that
    metric was, so a run that picked its best by chrF or TER could report the checkpoint BLEU preferred."""
    scores = {"averaged.pt": {"bleu": 30.0, "chrf": 60.0, "ter": 50.0},
              "best.pt": {"bleu": 31.0, "chrf": 55.0, "ter": 52.0}}
    assert better_checkpoint(scores, order) == chosen
    tied = {"averaged.pt": {"bleu": 30.0, "chrf": 60.0}, "best.pt": {"bleu": 30.0, "chrf": 60.0}}
    assert better_checkpoint(tied, ["bleu", "chrf"]) == "averaged.pt"  # listed first: a tie goes to it
    assert better_checkpoint(dict(reversed(tied.items())), ["bleu", "chrf"]) == "best.pt"


def test_an_averaged_checkpoint_of_an_earlier_end_of_the_run_is_not_a_candidate(tiny_config_file, tmp_path, caplog):
    """A run continued with train.average_last 0 keeps the averaged.pt of its first end: its weights are not
    the run's, so the experiment scores best.pt, and says why."""
    results, run = tmp_path / "results", tmp_path / "run"
    first = ["--set", "train.max_steps=4", "--set", "train.save_every=1", "--set", "train.keep_last=2",
             "--set", "train.average_last=2"]
    out = runner.invoke(app, ["experiment", str(tiny_config_file), "--results", str(results), "--set",
                              "decode.beam=1", *first])
    assert out.exit_code == 0, out.output
    assert set(json.loads((results / "tiny.json").read_text())["valid_by_checkpoint"]) == {"averaged.pt", "best.pt"}
    out = runner.invoke(app, ["experiment", str(tiny_config_file), "--results", str(results), "--set",
                              "decode.beam=1", "--set", "train.max_steps=6"])
    assert out.exit_code == 0, out.output
    r = json.loads((results / "tiny.json").read_text())
    assert r["steps"] == 6 and r["checkpoint"] == str(run / "best.pt") and r["valid_by_checkpoint"] == {}
    assert (run / "averaged.pt").is_file()  # left as it was: the user's file
    assert "the mean of checkpoints up to step 4, but the run has trained on to step 6 since" in caplog.text
    # averaging the run's end again makes it a candidate once more
    out = runner.invoke(app, ["average", "--last", "2", "-o", str(tmp_path / "end.pt"), str(run)])
    assert out.exit_code == 0, out.output
    (tmp_path / "end.pt").replace(run / "averaged.pt")
    _, _, scores = pick_checkpoint(run, load_config(tiny_config_file, ["decode.beam=1"]))
    assert set(scores) == {"averaged.pt", "best.pt"}


def test_experiment_resumes_instead_of_retraining(experiment_result, tiny_config_file, tmp_path):
    out = runner.invoke(app, ["experiment", str(tiny_config_file), "--name", "tiny", "--results",
                              str(tmp_path / "again"), "--set", "train.max_steps=4", "--set", "decode.beam=1"])
    assert out.exit_code == 0, out.output
    again = json.loads((tmp_path / "again" / "tiny.json").read_text(encoding="utf-8"))
    assert again["steps"] == 4 and again["test"] == experiment_result["test"]
    train_steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
                   if json.loads(line)["event"] == "train"]
    assert train_steps == sorted(set(train_steps))  # no step trained twice


def test_results_of_another_run_under_the_same_name_are_replaced_with_a_warning(experiment_result, tiny_config_file,
                                                                               tmp_path, caplog):
    """Two configs of one file name (`a/exp.yaml`, `b/exp.yaml`) write one results file: the second replaced the
    first's unsaid. The same run scored again replaces its own results without a word."""
    results, other = tmp_path / "results", tmp_path / "other_run"
    args = ["experiment", str(tiny_config_file), "--name", "tiny", "--results", str(results), "--set",
            "train.max_steps=4", "--set", "decode.beam=1"]
    with caplog.at_level("WARNING", logger="nmt"):
        assert runner.invoke(app, args).exit_code == 0
        assert "held the results" not in caplog.text
        out = runner.invoke(app, args + ["--set", f"run_dir={other}"])
    assert out.exit_code == 0, out.output
    assert (f"{results / 'tiny.json'} held the results of the run in {tmp_path / 'run'}, not this one's ({other}): "
            "replaced; give nmt experiment --name to keep both") in caplog.text
    assert json.loads((results / "tiny.json").read_text(encoding="utf-8"))["checkpoint"].startswith(str(other))


def test_results_render_into_readme_between_markers(shared_experiment, tmp_path):
    folder, experiment_result = shared_experiment
    results = folder / "results"
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nbefore\n\n{START}\nold table\n{END}\n\nafter\n", encoding="utf-8")
    main(["--results", str(results), "--readme", str(readme)])
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("# title\n\nbefore\n\n") and text.endswith("\n\nafter\n") and "old table" not in text
    table = text.split(START)[1].split(END)[0]
    row = next(line for line in table.splitlines() if line.startswith("| tiny |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:5] == ["tiny", "en-de", "transformer", f"{experiment_result['parameters'] / 1e6:.1f}M", "test"]
    test = experiment_result["test"]["test"]
    assert cells[5:8] == [f"{test['bleu']:.1f}", f"{test['chrf']:.1f}", f"{test['by_length'][-1]['bleu']:.1f}"]
    assert "- `tiny`: `--set train.max_steps=4 --set decode.beam=1`" in table
    main(["--results", str(results), "--readme", str(readme)])
    assert readme.read_text(encoding="utf-8") == text  # rendering twice changes nothing


def test_results_without_overrides_have_no_notes(shared_experiment):
    experiment_result = shared_experiment[1]
    plain = {**experiment_result, "overrides": []}
    assert "Settings changed" not in results_table([plain])
    assert "Settings changed" in results_table([experiment_result])


@pytest.mark.parametrize("name", ["", ".", "..", "../elsewhere", "a/b", "a\0b"])
def test_a_name_that_is_no_file_name_is_refused_before_training(small_corpus, tmp_path, name):
    # "a\0b" trained, then failed to write its results with "ValueError: embedded null byte", exit 1; "../elsewhere"
    # wrote them outside --results, and "a/b" into a subfolder that the results table does not read.
    from nmt.config import config_from_dict
    from nmt.errors import UserError
    from nmt.experiment import run_experiment

    cfg = config_from_dict(tiny_config_dict(small_corpus, tmp_path / "run"))
    with pytest.raises(UserError, match=r"^--name .*: not a file name; the results go to \S*results/<name>.json"):
        run_experiment(cfg, name, results_dir=tmp_path / "results")  # not the checkout's, should it be written
    assert not (tmp_path / "run").exists()


def test_results_need_the_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="markers"):
        main(["--results", str(tmp_path / "results"), "--readme", str(readme)])



@pytest.mark.parametrize(("content", "why"), [
    (b"{bad", r"JSONDecodeError: Expecting property name"),
    (b"\xff\xfe", r"UnicodeDecodeError: "),
    (b"[1]", r"a JSON list, not an object"),
    (b'{"experiment": "x"}', r"no direction, model, parameters, steps, train_seconds, tokens_per_s, hardware, "
                             r"stopped_by, test"),
    (b'{"experiment": "x", "direction": "de-en", "model": "m", "parameters": 1, "steps": 1, "train_seconds": 1, '
     b'"tokens_per_s": null, "hardware": "cpu", "stopped_by": "max_steps", "test": {"t": {"bleu": "high"}}}',
     r"test set 't' lacks the numbers bleu, chrf and by_length"),
])
def test_a_results_file_the_table_cannot_read_is_named_in_one_line(tmp_path, capsys, content, why):
    # `python -m nmt.results` showed a traceback (KeyError, TypeError, JSONDecodeError, a format code's ValueError).
    good = {"experiment": "a", "direction": "de-en", "model": "m", "parameters": 10**6, "steps": 3, "train_seconds": 60,
            "tokens_per_s": None, "hardware": "cpu", "stopped_by": "max_steps", "test": {"t": {"bleu": 1, "chrf": 2}}}
    (tmp_path / "a.json").write_text(json.dumps(good), encoding="utf-8")
    main(["--print", "--results", str(tmp_path)])
    assert "| a | de-en | m | 1.0M | t | 1.0 | 2.0 |" in capsys.readouterr().out
    (tmp_path / "b.json").write_bytes(content)
    with pytest.raises(SystemExit, match=rf"^{re.escape(str(tmp_path / 'b.json'))}: not a results file of nmt "
                                         rf"experiment \({why}.*\); move it out of {re.escape(str(tmp_path))}, or "
                                         r"run its experiment again$"):
        main(["--print", "--results", str(tmp_path)])


def test_results_print_the_table_where_there_is_no_readme(shared_experiment, monkeypatch, capsys):
    """A user's own experiments, outside the checkout: no README.md to render into, the table is wanted on stdout."""
    tmp_path = shared_experiment[0]
    monkeypatch.chdir(tmp_path)  # holds results/tiny.json and no README.md
    main(["--print"])
    table = capsys.readouterr().out
    assert table.startswith("| experiment |") and "\n| tiny | en-de | transformer |" in table
    assert not (tmp_path / "README.md").exists()
    with pytest.raises(SystemExit, match=r"^README.md: not found; give --readme FILE .* or --print"):
        main([])


def test_results_from_an_empty_folder_leave_the_readme_s_table_alone(tmp_path):
    readme = tmp_path / "README.md"
    text = f"{START}\n| a table |\n{END}\n"
    readme.write_text(text, encoding="utf-8")
    with pytest.raises(SystemExit, match="no results"):
        main(["--results", str(tmp_path / "reslts"), "--readme", str(readme)])
    assert readme.read_text(encoding="utf-8") == text


def test_hardware_names_the_machines_that_trained_not_the_one_that_scored(experiment_result, tiny_config_file,
                                                                           tmp_path):
    """A run trained elsewhere (here: its start record says a GPU's) and scored here names where it trained;
    a session that resumes it here adds this machine; one with nothing left to train adds nothing."""
    assert experiment_result["hardware"] == hardware(torch.device("cpu"))
    log = tmp_path / "run" / "metrics.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["hardware"] for r in records if r["event"] == "start"] == [experiment_result["hardware"]]
    log.write_text("".join(json.dumps({**r, "hardware": "1x NVIDIA H200"} if r["event"] == "start" else r) + "\n"
                           for r in records))

    def rerun(steps: int) -> str:
        out = runner.invoke(app, ["experiment", str(tiny_config_file), "--name", "tiny", "--results",
                                  str(tmp_path / f"again{steps}"), "--set", f"train.max_steps={steps}",
                                  "--set", "decode.beam=1"])
        assert out.exit_code == 0, out.output
        return json.loads((tmp_path / f"again{steps}" / "tiny.json").read_text(encoding="utf-8"))["hardware"]

    assert rerun(4) == "1x NVIDIA H200"  # finished: scored here, trained there
    assert rerun(6) == f"1x NVIDIA H200 + {hardware(torch.device('cpu'))}"


def test_one_experiment_run_twice_names_each_runs_hardware(shared_experiment):
    experiment_result = shared_experiment[1]
    gpu = {**experiment_result, "hardware": "1x NVIDIA H200", "overrides": ["--set train.device=cuda"]}
    table = results_table([experiment_result, gpu])
    rows = [line for line in table.splitlines() if line.startswith("| tiny |")]
    assert len(rows) == 2 and rows[1].endswith("| 1x NVIDIA H200 | " + gpu["stopped_by"] + " |")
    assert f"- `tiny` ({experiment_result['hardware']}): `--set train.max_steps=4 --set decode.beam=1`" in table
    assert "- `tiny` (1x NVIDIA H200): `--set train.device=cuda`" in table


def test_experiment_scores_bleu_and_chrf_whatever_eval_metrics_says(tiny_config_file, tmp_path):
    """eval.metrics [ter] is a valid config: training validates on TER and BLEU (the early-stopping metric), and
    the experiment scores BLEU and chrF, which its table and its choice of checkpoint rest on, and TER besides."""
    results = tmp_path / "results"
    out = runner.invoke(app, ["experiment", str(tiny_config_file), "--name", "ter", "--results", str(results),
                              "--set", "eval.metrics=[ter]", "--set", "train.max_steps=2", "--set", "decode.beam=1",
                              "--set", "train.save_every=1", "--set", "train.average_last=2"])
    assert out.exit_code == 0, out.output
    r = json.loads((results / "ter.json").read_text(encoding="utf-8"))
    assert set(r["valid_by_checkpoint"]) == {"averaged.pt", "best.pt"}  # chosen on BLEU, then chrF
    test = r["test"]["test"]
    assert list(test)[:6] == ["bleu", "bleu_signature", "chrf", "chrf_signature", "ter", "ter_signature"]
    assert all({"bleu", "chrf"} <= set(b) for b in test["by_length"])
    assert f"ter test: BLEU {test['bleu']:.2f} chrF {test['chrf']:.2f} TER {test['ter']:.2f}" in out.stdout
    assert "| ter | en-de | transformer |" in results_table([r])


def test_experiment_scores_with_the_config_it_was_given_not_the_checkpoint_s(experiment_result, tiny_config_file,
                                                                             small_corpus, tmp_path):
    """A second run over a finished one trains nothing and scores with its own decode, data.test and eval
    settings; the checkpoint's (beam 1, the 30-line test set, case-sensitive) are not used."""
    mini = tmp_path / "mini"
    for lang in ("en", "de"):
        lines = (small_corpus / f"test.{lang}").read_text(encoding="utf-8").splitlines()[:5]
        mini.with_suffix(f".{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = runner.invoke(app, ["experiment", str(tiny_config_file), "--name", "again", "--results",
                              str(tmp_path / "again"), "--set", "train.max_steps=4", "--set", "decode.beam=2",
                              "--set", "decode.max_len_a=0", "--set", "decode.max_len_b=2",
                              "--set", f"data.test={{mini: {{kind: text, path: {mini}}}}}",
                              "--set", "eval.lowercase=true"])
    assert out.exit_code == 0, out.output
    r = json.loads((tmp_path / "again" / "again.json").read_text(encoding="utf-8"))
    best = tmp_path / "run" / "best.pt"
    translator = Translator.from_checkpoint(best)
    assert translator.cfg.decode.beam == 1 and list(translator.cfg.data.test) == ["test"]  # what the checkpoint says
    assert r["steps"] == 4 and r["beam"] == 2 and (r["decode"]["max_len_a"], r["decode"]["max_len_b"]) == (0, 2)
    assert list(r["test"]) == ["mini"] and r["test"]["mini"]["sentences"] == 5
    assert "|case:lc|" in r["test"]["mini"]["bleu_signature"]
    sources = mini.with_suffix(".en").read_text(encoding="utf-8").splitlines()
    expected = translator.translate(sources, beam=2, max_len_a=0, max_len_b=2)
    assert (tmp_path / "run" / "mini.hyp").read_text(encoding="utf-8").splitlines() == expected
    assert expected != translator.translate(sources)  # the checkpoint's own settings give other translations


def test_a_test_set_pair_left_unscored_keeps_its_empty_line_in_the_hyp_file(experiment_result, tiny_config_file,
                                                                           small_corpus, tmp_path):
    """run_dir/NAME.hyp pairs line by line with the test set's files: a pair with an empty side, which is not
    scored, has an empty line there (the file had one line fewer, the translations after it shifted up)."""
    gaps = tmp_path / "gaps"
    src = (small_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:5]
    ref = (small_corpus / "test.de").read_text(encoding="utf-8").splitlines()[:5]
    src[2] = "\u2028"  # a line break to other programs, whitespace here: an empty source
    gaps.with_suffix(".en").write_text("\n".join(src) + "\n", encoding="utf-8")
    gaps.with_suffix(".de").write_text("\n".join(ref) + "\n", encoding="utf-8")
    out = runner.invoke(app, ["experiment", str(tiny_config_file), "--name", "gaps", "--results",
                              str(tmp_path / "gaps_results"), "--set", "train.max_steps=4", "--set", "decode.beam=1",
                              "--set", f"data.test={{gaps: {{kind: text, path: {gaps}}}}}"])
    assert out.exit_code == 0, out.output
    r = json.loads((tmp_path / "gaps_results" / "gaps.json").read_text(encoding="utf-8"))
    assert r["test"]["gaps"]["sentences"] == 4
    kept = [0, 1, 3, 4]
    expected = Translator.from_checkpoint(tmp_path / "run" / "best.pt").translate([src[i] for i in kept], beam=1)
    hyps = (tmp_path / "run" / "gaps.hyp").read_text(encoding="utf-8").split("\n")
    assert hyps == [*expected[:2], "", *expected[2:], ""]


def test_a_test_set_that_cannot_be_read_stops_the_experiment_before_it_trains(tiny_config_file, tmp_path):
    results = tmp_path / "results"
    out = runner.invoke(app, ["experiment", str(tiny_config_file), "--results", str(results),
                              "--set", f"data.test.test.path={tmp_path / 'tset'}", "--set", "train.max_steps=2"])
    assert isinstance(out.exception, DataError)  # `nmt` prints it as one line and exits 2
    assert str(out.exception).startswith(f"data.test.test: text corpus not found: tried {tmp_path / 'tset'}.en")
    assert not (tmp_path / "run").exists() and not results.exists()


def test_test_sets_named_with_a_slash_write_one_file_each(tiny_config_file, tmp_path):
    """Test sets are often named as sacrebleu names them (wmt14/full): their translations go to wmt14_full.hyp."""
    raw = yaml.safe_load(tiny_config_file.read_text(encoding="utf-8"))
    raw["data"]["test"] = {"wmt14/full": raw["data"]["test"]["test"], "wmt16/full": dict(raw["data"]["valid"])}
    config = tmp_path / "slash.yaml"
    config.write_text(yaml.safe_dump(raw), encoding="utf-8")
    results = tmp_path / "results"
    out = runner.invoke(app, ["experiment", str(config), "--results", str(results), "--set", "train.max_steps=2",
                              "--set", "decode.beam=1"])
    assert out.exit_code == 0, out.output
    tests = json.loads((results / "slash.json").read_text(encoding="utf-8"))["test"]
    for name, file in (("wmt14/full", "wmt14_full.hyp"), ("wmt16/full", "wmt16_full.hyp")):
        hyps = (tmp_path / "run" / file).read_text(encoding="utf-8").splitlines()
        assert len(hyps) == tests[name]["sentences"] == 30


@pytest.mark.parametrize("src, ref, why", [("", "", "its files are empty"),
                                           ("\n \n", "x\ny\n", "each of its 2 pairs has an empty side")])
def test_a_test_set_without_a_pair_to_score_stops_the_experiment_before_it_trains(tiny_config_file, tmp_path, src,
                                                                                  ref, why):
    """It stopped after training, at scoring, with a message that named no test set."""
    (tmp_path / "empty.en").write_text(src, encoding="utf-8")
    (tmp_path / "empty.de").write_text(ref, encoding="utf-8")
    results = tmp_path / "results"
    out = runner.invoke(app, ["experiment", str(tiny_config_file), "--results", str(results),
                              "--set", f"data.test.test.path={tmp_path / 'empty'}", "--set", "train.max_steps=2"])
    assert isinstance(out.exception, DataError)
    assert str(out.exception) == f"data.test.test: {tmp_path / 'empty'}: nothing to score: {why}"
    assert not (tmp_path / "run").exists() and not results.exists()


def test_experiment_scores_on_the_device_of_its_config(tiny_config_file, tmp_path, monkeypatch):
    """A run kept on the CPU (`train.device: cpu`, a GPU busy with something else, say) is scored on the CPU too,
    not on the device `auto` would pick. On a machine without a GPU both are the CPU, so the device each
    checkpoint is loaded for is read on its way to the real `Translator.from_checkpoint`."""
    asked = []
    load = Translator.from_checkpoint.__func__

    def from_checkpoint(cls, path, device="auto", **kwargs):
        asked.append(device)
        return load(cls, path, device=device, **kwargs)

    monkeypatch.setattr(Translator, "from_checkpoint", classmethod(from_checkpoint))
    results = tmp_path / "results"
    out = runner.invoke(app, ["experiment", str(tiny_config_file), "--name", "cpu", "--results", str(results),
                              "--set", "train.max_steps=2", "--set", "decode.beam=1", "--set", "train.device=cpu"])
    assert out.exit_code == 0, out.output
    assert asked == ["cpu"]
    assert json.loads((results / "cpu.json").read_text(encoding="utf-8"))["scored_on"] == "cpu"
