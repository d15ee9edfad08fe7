"""What `pip install nmt` gives a user outside this repository.

The development environment holds more than the package needs (the `dev` and `plot` extras), so a
module that a plain install lacks is found here all the same: sentencepiece's generated protobuf
module, which nmt used, needs the protobuf package, which sentencepiece does not require; it came only
through tensorboard, and a plain install failed at `nmt train`. These tests run nmt in a virtual
environment that holds what the declared dependencies bring and nothing else, as read from the
installed distributions' own metadata.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import venv
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import nmt
from tests.conftest import tiny_config_dict

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def brought_by(requirements: list[str]) -> set[str]:
    """The canonical names of the distributions that installing `requirements` brings: them and,
    through each one's metadata, what they require (with the extras asked for), as pip resolves it."""
    todo = [Requirement(r) for r in requirements]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in done:
            continue
        done.add(key)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            pytest.fail(f"{req.name} is a dependency but is not installed here; run make install")
        for text in dist.requires or []:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in {"", *req.extras}):
                todo.append(sub)
    return {name for name, _ in done}


def site_packages(python: Path) -> Path:
    return Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())


def venv_with(requirements: list[str], folder: Path) -> Path:
    """A virtual environment in `folder` that holds what installing `requirements` brings and nothing
    else: links to those distributions' files (top-level modules and their metadata) in its
    site-packages. Returns its python, which the processes it starts (sentencepiece's trainer) share."""
    venv.create(folder, symlinks=True, with_pip=False)
    python = folder / "bin" / "python"
    site = site_packages(python)
    for name in brought_by(requirements):
        dist = metadata.distribution(name)
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            if not (site / top).exists():
                (site / top).symlink_to(dist.locate_file(top))
    return python


# Imports every nmt module and prints each one that fails; run in a `venv_with` environment, with the
# repository on PYTHONPATH.
_IMPORT_ALL = """
import importlib, pkgutil, sys
try:
    import pytest
except ImportError:
    pass
else:
    sys.exit("pytest is importable: the environment holds more than the dependencies")
import nmt
for module in pkgutil.walk_packages(nmt.__path__, "nmt."):
    if module.name != "nmt.__main__":  # runs the command line
        try:
            importlib.import_module(module.name)
        except ImportError as err:
            print(f"{module.name}: {err}")
"""


@pytest.fixture(scope="module")
def plain_python(tmp_path_factory) -> Path:
    """The python of what `pip install nmt` brings, without extras (no matplotlib, tensorboard, ctranslate2)."""
    python = venv_with(project()["dependencies"], tmp_path_factory.mktemp("plain") / "venv")
    has = {name: subprocess.run([python, "-c", f"import {name}"], capture_output=True).returncode == 0
           for name in ("torch", "sentencepiece", "pytest", "matplotlib", "tensorboard", "ctranslate2")}
    assert has == {"torch": True, "sentencepiece": True, "pytest": False, "matplotlib": False, "tensorboard": False,
                   "ctranslate2": False}
    return python


def run_plain(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -c CODE` or `python -m nmt ...` (args) in the `plain_python` environment, from `cwd`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([python, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def test_every_module_imports_with_the_declared_dependencies_alone(plain_python, tmp_path):
    run = run_plain(plain_python, "-c", _IMPORT_ALL, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "", "modules that a plain `pip install nmt` cannot import:\n" + run.stdout


@pytest.fixture(scope="module")
def trained_plain(plain_python, small_corpus, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A tiny run trained by `nmt train` under a plain install (train.tensorboard true, as by default)."""
    work = tmp_path_factory.mktemp("user")
    config = work / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config_dict(small_corpus, work / "run")), encoding="utf-8")
    return work / "run", run_plain(plain_python, "-m", "nmt", "train", str(config), cwd=work)


def test_training_without_tensorboard_says_which_extra_brings_it(trained_plain):
    """It wrote no event files and said nothing: `train.tensorboard` is true by default."""
    run_dir, done = trained_plain
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "train.tensorboard" in line]
    assert warned == ["[nmt] train.tensorboard: the tensorboard package is not installed, so this run writes "
                      "metrics.jsonl but no TensorBoard event files; install it with: pip install "
                      "'nmt[tensorboard]' (or set train.tensorboard: false)"]
    assert (run_dir / "metrics.jsonl").is_file() and not (run_dir / "tensorboard").exists()


@pytest.mark.slow
def test_training_with_a_broken_tensorboard_warns_and_trains(small_corpus, tmp_path):
    """A tensorboard whose protobuf is of another major version raises protobuf's VersionError, no
    ImportError, on import; that stopped the training at its start. Here a tensorboard that raises so."""
    python = venv_with(project()["dependencies"], tmp_path / "venv")
    site = site_packages(python)
    (site / "tensorboard").mkdir()
    (site / "tensorboard" / "__init__.py").write_text(
        "class VersionError(Exception):\n    pass\n\n"
        "raise VersionError('Detected mismatched Protobuf Gencode/Runtime major versions\\nSee the guarantees')\n")
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config_dict(small_corpus, tmp_path / "run")), encoding="utf-8")
    done = run_plain(python, "-m", "nmt", "train", str(config), "--set", "train.max_steps=2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "train.tensorboard" in line]
    assert warned == ["[nmt] train.tensorboard: torch.utils.tensorboard does not import (VersionError: Detected "
                      "mismatched Protobuf Gencode/Runtime major versions), so this run writes metrics.jsonl but no "
                      "TensorBoard event files; install it with: pip install 'nmt[tensorboard]' (or set "
                      "train.tensorboard: false)"]


def test_every_extra_that_a_message_or_the_readme_names_exists():
    named = set()
    for path in [*(ROOT / "nmt").rglob("*.py"), ROOT / "README.md"]:
        named.update(re.findall(r"nmt\[(\w+)\]", path.read_text(encoding="utf-8")))
    assert {"plot", "export", "tensorboard"} <= named
    assert named <= set(project()["optional-dependencies"])



@pytest.mark.slow
@pytest.mark.parametrize("flag", ["translate --attention-plot", "analyze --plot", "analyze --report"])
def test_a_plot_without_matplotlib_is_refused_before_any_translating(flag, plain_python, trained_plain, small_corpus,
                                                                     tmp_path):
    """`analyze --plot` translated the whole test set first, then failed naming attention plots;
    `translate --attention-plot` failed after its first batch, leaving its lines in `out.de.partial`."""
    run_dir, trained = trained_plain
    assert trained.returncode == 0, trained.stderr
    command, option = flag.split()
    args = {"translate": ["-i", str(small_corpus / "test.en"), "-o", "out.de", option, "plots"],
            "analyze": [option, "plots/bleu.png" if option == "--plot" else "report"]}[command]
    done = run_plain(plain_python, "-m", "nmt", command, "-c", str(run_dir / "best.pt"), *args, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (f"nmt: error: {option} needs matplotlib (No module named 'matplotlib'); install it with: "
                           "pip install 'nmt[plot]' (make install includes it)\n")
    assert list(tmp_path.iterdir()) == []  # no output, no partial output, no folder


def test_the_package_version_is_the_one_nmt_version_prints(tmp_path):
    """The version was written twice, in pyproject.toml and in nmt/__init__.py, so a release that
    changed one had `pip show nmt` and `nmt --version` disagree."""
    from setuptools.config.pyprojecttoml import read_configuration

    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "nmt").mkdir()
    init = (ROOT / "nmt" / "__init__.py").read_text(encoding="utf-8")
    assert f'__version__ = "{nmt.__version__}"' in init
    (tmp_path / "nmt" / "__init__.py").write_text(init.replace(nmt.__version__, "9.8.7"), encoding="utf-8")
    assert read_configuration(tmp_path / "pyproject.toml")["project"]["version"] == "9.8.7"


def test_export_without_ctranslate2_names_the_extra_and_writes_nothing(plain_python, trained_plain, tmp_path):
    run_dir, trained = trained_plain
    assert trained.returncode == 0, trained.stderr
    done = run_plain(plain_python, "-m", "nmt", "export", "-c", str(run_dir / "best.pt"), "-o", "ct2", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (2, "nmt: error: ctranslate2 is not installed; install it with: "
                                                 "pip install 'nmt[export]'\n")
    assert list(tmp_path.iterdir()) == []


# Versions of dependencies that failed with this code, each with what failed; found by installing each one
# alone into a plain install (2026-12-05, Python 3.11, click 8.5.1, pyarrow 26), the others at their newest.
# pip keeps an installed version that the declared range allows, so each must fall outside it.
FAILED_WITH = {
    "datasets": {
        "2.14.0": "nmt train: AttributeError: module 'pyarrow' has no attribute 'PyExtensionType'",
        "2.18.0": "nmt train: ImportError: cannot import name 'List' from 'datasets' (new in 4.0)",
        "3.0.0": "nmt train: ImportError: cannot import name 'List' from 'datasets' (new in 4.0)",
    },
    "typer": {
        "0.13.0": "nmt translate -h: TypeError: Parameter.make_metavar() missing 1 required positional argument: 'ctx'",
        "0.15.1": "nmt translate -h: TypeError: Parameter.make_metavar() missing 1 required positional argument: 'ctx'",
        "0.17.0": "nmt eval -h: AttributeError: module 'rich' has no attribute 'markup'",
        "0.17.3": "nmt eval -h: AttributeError: module 'rich' has no attribute 'markup'",
    },
}


def test_the_declared_versions_leave_out_those_that_failed():
    declared = {canonicalize_name(r.name): r.specifier for r in map(Requirement, project()["dependencies"])}
    allowed = {f"{name} {version}: {failure}" for name, failures in FAILED_WITH.items()
               for version, failure in failures.items() if declared[name].contains(version)}
    assert not allowed
    for name in FAILED_WITH:  # the versions installed here are inside the range
        assert declared[name].contains(metadata.version(name)), name
