"""bench/gpu_acceptance.sh runs on a lent GPU whose minutes are few, and a command of it that dies at its first line
(a renamed option, a config key that is gone) costs some of them. This reads every command the script would
start, as bash would split it, and checks on the CPU what can be checked without running it: the scripts and test
files it names exist, each option it passes is one the command's --help offers, and each config with its --set
overrides loads."""

from __future__ import annotations

import contextlib
import io
import re
import runpy
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from nmt.config import load_config
from nmt.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_acceptance.sh"
ENDS = {";", ";;", "|", "||", "&&", "&", ">", ">>", "2>&1", "<", "do", "done", "then", "fi"}
# values the script's variables take in a stage, for the overrides that use them
VARIABLES = {"$device": "cuda", "$steps": "50", "$seconds": "270", "$steps_to": "150", "$2": "200", "${ways[i]}": "true",
             "$run_dir": "/tmp/gpu_run", "$name": "run", "${name}": "run", "$e": "experiment"}


def logical_lines(text: str) -> list[list[str]]:
    """The script's lines as bash's words: continuations joined, comments dropped, a quote or an array that spans
    lines read whole, and `"${decode[@]}"` replaced by the words of the array it names."""
    arrays = {m.group(1): m.group(2) for m in re.finditer(r"^\s*(\w+)=\((.*?)\)\s*$", text, re.M | re.S)}
    for name, words in arrays.items():
        text = text.replace(f'"${{{name}[@]}}"', " ".join(words.split()))
    lines, pending = [], ""
    for line in text.replace("\\\n", " ").splitlines():
        pending += line + "\n"
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # a quote not yet closed
            continue
        lines.append(words)
        pending = ""
    assert not pending, f"unparsed end of {SCRIPT}: {pending[:200]}"
    return lines


def commands() -> list[tuple[str, list[str]]]:
    """(program, arguments) of every bench script, `nmt` subcommand and pytest run the script starts."""
    found = []
    for words in logical_lines(SCRIPT.read_text()):
        for i, word in enumerate(words):
            if re.fullmatch(r"bench/\w+\.py", word):
                program, start = word, i + 1
            elif word == "-m" and i + 2 < len(words) and words[i + 1] == "nmt":
                program, start = f"nmt {words[i + 2]}", i + 3
            elif word == "-m" and i + 1 < len(words) and words[i + 1] == "pytest":
                program, start = "pytest", i + 2
            else:
                continue
            args = []
            for arg in words[start:]:
                if arg in ENDS or arg.endswith(";"):
                    break
                args.append(arg)
            found.append((program, args))
    return found


COMMANDS = commands()


@cache
def help_text(program: str) -> str:
    """What `PROGRAM --help` prints. A bench script runs in this process, as `python bench/X.py --help` runs it:
    they import torch, which a test process has imported already, where a process apiece took 20 s of a 2-core
    machine. `nmt` commands import nothing heavy for --help and run as processes."""
    if program.startswith("nmt "):
        proc = subprocess.run([sys.executable, "-m", "nmt", *program.split()[1:], "--help"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{program} --help: {proc.stderr[-1000:]}"
        return proc.stdout
    script, out = ROOT / program, io.StringIO()
    argv, path = sys.argv, list(sys.path)
    sys.argv, sys.path[:0] = [str(script), "--help"], [str(script.parent)]  # a script's folder leads sys.path
    try:
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = argv, path
    assert done.value.code in (0, None), f"{program} --help exited with {done.value.code}"
    return out.getvalue()


def test_the_script_is_valid_bash_and_its_commands_are_found() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    programs = {program for program, _ in COMMANDS}
    # every kind of command the stages start, so that a parsing slip cannot leave one unchecked
    assert {"bench/train_speed.py", "bench/decode_speed.py", "bench/attention_speed.py", "nmt train",
            "nmt experiment", "pytest"} <= programs
    assert sum(program == "bench/train_speed.py" for program, _ in COMMANDS) >= 25


def test_every_option_the_script_passes_is_one_its_command_offers() -> None:
    programs = sorted({program for program, _ in COMMANDS if program != "pytest"})
    for program in programs:
        if program.startswith("bench/"):
            assert (ROOT / program).is_file(), f"{SCRIPT.name} runs {program}, which does not exist"
    helps = {program: help_text(program) for program in programs}
    for program, args in COMMANDS:
        if program == "pytest":
            continue
        offered = set(re.findall(r"--[\w-]+", helps[program]))
        for arg in args:
            option = arg.split("=")[0]
            if option.startswith("--"):
                assert option in offered, f"{SCRIPT.name} passes {option} to {program}, which offers {sorted(offered)}"


def test_every_test_path_the_script_runs_exists() -> None:
    paths = [arg.split("::")[0] for program, args in COMMANDS if program == "pytest" for arg in args
             if arg.startswith("tests")]
    assert paths
    for path in paths:
        assert (ROOT / path).exists(), f"{SCRIPT.name} runs pytest on {path}, which does not exist"


def substituted(value: str) -> str:
    """`value` with the script's variables replaced by values they take: `${NAME:-default}` by its default."""
    value = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)
    for name in sorted(VARIABLES, key=len, reverse=True):
        value = value.replace(name, VARIABLES[name])
    return value


@pytest.mark.parametrize("program, args", [(p, a) for p, a in COMMANDS if p != "pytest"],
                         ids=lambda x: x if isinstance(x, str) else None)
def test_each_config_and_its_overrides_load(program: str, args: list[str]) -> None:
    # a config named by a loop's variable (configs/$e.yaml): its overrides checked on the Multi30k Transformer's
    configs = [a if "$" not in a else "configs/multi30k_transformer.yaml" for a in args if a.endswith(".yaml")]
    overrides = [substituted(v) for k, v in zip(args, args[1:]) if k in ("--set", "-s")]
    assert all("$" not in o for o in overrides), f"an override with a variable this test does not know: {overrides}"
    for config in configs:
        try:
            load_config(ROOT / config, overrides)
        except UserError as err:
            pytest.fail(f"{SCRIPT.name}: {program} {config} {' '.join(overrides)}: {err}")
