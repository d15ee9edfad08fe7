"""The process group (`nmt.distributed`), then DDP on CPU with gloo.

Joining a torchrun job first, with the group and CUDA faked (`group`, `fake_gpus`), so the GPU paths run on
a CPU-only machine: too many processes for the node's GPUs fail at once, in one line. Then real gloo runs:
two ranks stay identical, match one process on the same batches, and only rank 0 writes. Every run pins
`train.device: cpu`, so the tests pass on a machine with one GPU (or none): with `auto` there, two ranks
would need two GPUs.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp

from nmt import cli, distributed
from nmt.checkpoint import periodic_checkpoints
from nmt.config import ExperimentConfig
from nmt.distributed import (
    Dist,
    HostCopy,
    check_gpus_per_node,
    init_distributed,
    lost_peers_named,
    reduce_on_device,
)
from nmt.errors import PeerStopped, UserError
from nmt.experiment import run_experiment
from nmt.runtime import pick_device
from nmt.train.faults import Interrupted
from nmt.train.loop import train, train_run
from nmt.train.setup import build_run
from tests.conftest import ROOT
from tests.test_experiment import run_experiment as experiment_on_the_command_line
from tests.train.helpers import same_weights, tiny_cfg, weights, write_cfg


@pytest.mark.parametrize(("local_rank", "local_world_size", "device_count"), [
    (0, 1, 1),  # one process, one GPU
    (0, 1, 8),  # one process on a node of 8 GPUs
    (1, 2, 2),
    (3, 4, 4),  # the last process of a full node
    (1, 2, 4),  # fewer processes than GPUs
])
def test_one_gpu_per_process_is_fine(local_rank, local_world_size, device_count):
    check_gpus_per_node(local_rank, local_world_size, device_count)


@pytest.mark.parametrize(("local_rank", "local_world_size", "device_count", "counts"), [
    (1, 2, 1, "2 processes on this node (LOCAL_WORLD_SIZE) but 1 CUDA device,"),
    (0, 2, 1, "2 processes on this node (LOCAL_WORLD_SIZE) but 1 CUDA device,"),  # rank 0 fails too: nobody waits
    (5, 8, 4, "8 processes on this node (LOCAL_WORLD_SIZE) but 4 CUDA devices,"),
    (2, 1, 2, "3 processes on this node (LOCAL_WORLD_SIZE) but 2 CUDA devices,"),  # no LOCAL_WORLD_SIZE: rank + 1
])
def test_more_processes_than_gpus_names_both_counts_and_what_to_do(local_rank, local_world_size, device_count,
                                                                   counts):
    with pytest.raises(UserError) as err:
        check_gpus_per_node(local_rank, local_world_size, device_count)
    message = str(err.value)
    assert counts in message
    assert f"use --nproc_per_node {device_count} or fewer" in message
    assert "--set train.device=cpu" in message and "\n" not in message


class FakeGroup:
    """Stands in for torch.distributed's process group; records how it was joined."""

    def __init__(self):
        self.backend: str | None = None

    def join(self, backend: str) -> None:
        self.backend = backend


@pytest.fixture
def group(monkeypatch) -> FakeGroup:
    fake = FakeGroup()
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: fake.backend is not None)
    monkeypatch.setattr(distributed.dist, "init_process_group", fake.join)
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: int(os.environ["RANK"]))
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: int(os.environ["WORLD_SIZE"]))
    return fake


def as_torchrun_rank(monkeypatch, rank: int, nproc: int) -> None:
    """The environment torchrun gives process `rank` of `--standalone --nproc_per_node nproc`."""
    for key, value in {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": nproc, "LOCAL_WORLD_SIZE": nproc,
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 29500}.items():
        monkeypatch.setenv(key, str(value))


LAUNCHER = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.parametrize(("environment", "message"), [
    ({"WORLD_SIZE": "abc"}, "environment variable WORLD_SIZE='abc': not a whole number of at least 0; unset it"),
    ({"WORLD_SIZE": "0"}, "environment variable WORLD_SIZE=0: a job has at least 1 process"),
    ({"WORLD_SIZE": "2"}, "environment variable WORLD_SIZE=2 is set but RANK is not: launch with torchrun"),
    ({"WORLD_SIZE": "2", "RANK": "5"}, "environment variable RANK=5: a job of WORLD_SIZE=2 has ranks 0 to 1"),
    ({"WORLD_SIZE": "2", "RANK": "-1"}, "environment variable RANK='-1': not a whole number"),
    ({"WORLD_SIZE": "2", "RANK": "0"}, "WORLD_SIZE=2, but MASTER_ADDR and MASTER_PORT are not set: launch with torchrun"),
    ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "http"},
     "environment variable MASTER_PORT='http': not a port (1 to 65535)"),
])
def test_a_torchrun_environment_torchrun_did_not_set_is_one_line_naming_the_variable(environment, message, monkeypatch,
                                                                                      capsys, tiny_config_file):
    """Left in a shell, or set by hand: once `int('abc')` ended with status 1 (and the error handler itself then
    failed on it), and WORLD_SIZE=2 without MASTER_ADDR with torch's rendezvous ValueError, status 1."""
    for key in LAUNCHER:
        monkeypatch.delenv(key, raising=False)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "argv", ["nmt", "train", str(tiny_config_file)])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert err.startswith("nmt: error: ") and err.count("\n") == 1 and message in err, err


def test_a_stale_rank_without_a_job_is_a_lone_process_that_writes_its_results(monkeypatch, tiny_config_file, tmp_path):
    """RANK=3 with no WORLD_SIZE trains alone (a job of one): once it counted as a rank other than 0, and
    `nmt experiment` trained, then exited 0 without scoring the test sets or writing its results file."""
    for key in LAUNCHER:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RANK", "3")
    experiment_on_the_command_line(tiny_config_file, tmp_path / "results")
    assert (tmp_path / "results" / "tiny.json").is_file()


def fake_gpus(monkeypatch, count: int) -> list[int]:
    """Pretend this machine has `count` CUDA devices; returns the list `torch.cuda.set_device` appends to."""
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def no_cuda_calls(monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("CUDA was consulted")

    for name in ("is_available", "device_count", "set_device"):
        monkeypatch.setattr(torch.cuda, name, fail)


def test_cpu_under_torchrun_joins_with_gloo_without_consulting_cuda(monkeypatch, group):
    as_torchrun_rank(monkeypatch, 1, 2)
    no_cuda_calls(monkeypatch)
    assert init_distributed("cpu") == Dist(rank=1, world_size=2)
    assert group.backend == "gloo"
    assert pick_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("device", ["auto", "cuda"])
@pytest.mark.parametrize("rank", [0, 1])
def test_two_processes_on_one_gpu_fail_before_touching_it_or_waiting(monkeypatch, group, device, rank):
    as_torchrun_rank(monkeypatch, rank, 2)
    chosen = fake_gpus(monkeypatch, 1)
    with pytest.raises(UserError, match="2 processes on this node .* but 1 CUDA device"):
        init_distributed(device)
    assert chosen == [] and group.backend is None


def test_one_process_per_gpu_joins_with_nccl_on_its_own_gpu(monkeypatch, group):
    as_torchrun_rank(monkeypatch, 1, 2)
    chosen = fake_gpus(monkeypatch, 2)
    assert init_distributed("auto") == Dist(rank=1, world_size=2)
    assert chosen == [1] and group.backend == "nccl"
    assert pick_device("auto") == pick_device("cuda") == torch.device("cuda", 1)


@pytest.mark.parametrize("rank", [0, 1])
def test_the_cli_prints_one_line_on_local_rank_0_and_every_rank_exits_2(rank, monkeypatch, capsys, group,
                                                                         tiny_config_file):
    """Every process of the node meets the error; its local rank 0 alone prints it, not one line per process."""
    as_torchrun_rank(monkeypatch, rank, 2)
    fake_gpus(monkeypatch, 1)
    monkeypatch.setattr(cli, "SILENT_EXIT_WAIT_S", 0.0)  # the wait for torchrun to stop a silent process
    monkeypatch.setattr(sys, "argv", ["nmt", "train", str(tiny_config_file)])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    if rank == 0:
        assert err.startswith("nmt: error: torchrun --nproc_per_node: 2 processes on this node") and err.count("\n") == 1
    else:
        assert err == ""


def test_host_copy_gives_the_values_as_python_numbers():
    values = HostCopy([torch.tensor(True), torch.tensor([3.0, 0.0]), torch.tensor(7)]).values()
    assert values == [True, [3.0, 0.0], 7] and type(values[2]) is int


def test_reduce_on_device_in_one_process_keeps_the_values_in_a_tensor():
    t = reduce_on_device([3, 4], torch.device("cpu"), Dist(), dtype=torch.int64)
    assert t.dtype == torch.int64 and t.tolist() == [3, 4]


GLOO_LOST_PEER = ("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                  "[127.0.0.1]:52121. This is typically caused by a remote worker crashing.")


def test_gloos_lost_peer_becomes_one_line_naming_this_rank_under_torchrun_alone(monkeypatch):
    as_torchrun_rank(monkeypatch, 1, 2)
    with pytest.raises(PeerStopped, match=r"^another process of this run stopped, and rank 1 cannot go on") as err:
        with lost_peers_named():
            raise RuntimeError(GLOO_LOST_PEER)
    assert "\n" not in str(err.value) and isinstance(err.value.__cause__, RuntimeError)  # --debug shows gloo's
    with pytest.raises(RuntimeError, match="out of memory"), lost_peers_named():  # other errors pass as they are
        raise RuntimeError("out of memory")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(RuntimeError, match="Connection closed by peer"), lost_peers_named():
        raise RuntimeError(GLOO_LOST_PEER)


@pytest.mark.gpu
def test_on_cuda_neither_waits_for_the_work_queued_after_its_values():
    """What lets the training loop read an update's outcome with the next update still running."""
    x = torch.arange(5, device="cuda")
    copy = HostCopy([x.sum(), x > 2])
    torch.cuda._sleep(2_000_000_000)  # a kernel of about a second, queued behind the copy
    assert copy.values() == [10, [False, False, False, True, True]]
    assert not torch.cuda.current_stream().query()  # the sleep still runs: the read did not wait for it
    sums = reduce_on_device([1, 2], torch.device("cuda"), Dist(), dtype=torch.int64)
    assert not torch.cuda.current_stream().query()  # queued behind the sleep, not waited for
    assert sums.tolist() == [1, 2]
    assert torch.cuda.current_stream().query()  # reading the tensor itself waits for everything


def _as_rank(rank: int, world_size: int, port: int) -> None:
    """Set this forked process up as torchrun would (environment variables), with one thread."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)


def _threads() -> list[str] | None:
    """The names of this process's native threads (Linux); None where /proc does not list them."""
    tasks = "/proc/self/task"
    if not os.path.isdir(tasks):
        return None
    names = []
    for tid in os.listdir(tasks):
        with contextlib.suppress(OSError), open(f"{tasks}/{tid}/comm", encoding="utf-8") as f:
            names.append(f.read().strip())
    return names


def _gloo_threads(names: list[str] | None) -> list[str]:
    """gloo's worker and transport threads, and the rendezvous store's, among `names`."""
    return [n for n in names or [] if n.startswith(("pt_gloo", "gloo", "pt_tcpstore"))]


def _train_rank(rank: int, world_size: int, port: int, cfg: ExperimentConfig, out: str) -> None:
    """One training rank, saving its final weights and summary, and its threads once the run is closed."""
    _as_rank(rank, world_size, port)
    run = build_run(cfg)
    try:
        summary = train_run(run)
        torch.save({"model": run.trainable.model.state_dict(), "summary": summary}, f"{out}/rank{rank}.pt")
    finally:
        run.close()
    with open(f"{out}/rank{rank}.threads.json", "w", encoding="utf-8") as f:
        json.dump(_threads(), f)


def _signalled_rank(rank: int, world_size: int, port: int, cfg: ExperimentConfig, out: str) -> None:
    """A training rank; rank 1 alone sends itself SIGTERM as its third update's optimizer step ends."""
    _as_rank(rank, world_size, port)
    run = build_run(cfg)
    try:
        if rank == 1:
            steps = itertools.count(1)
            run.trainable.optimizer.register_step_post_hook(
                lambda *_: os.kill(os.getpid(), signal.SIGTERM) if next(steps) == 3 else None)
        try:
            train_run(run)
            outcome = {"interrupted": False}
        except Interrupted as err:
            outcome = {"interrupted": True, "signal": err.signum, "step": err.step, "checkpoint": str(err.checkpoint)}
    finally:
        run.close()
    with open(f"{out}/rank{rank}.json", "w", encoding="utf-8") as f:
        json.dump(outcome, f)


def _signalled_in_final_validation_rank(rank: int, world_size: int, port: int, cfg: ExperimentConfig, out: str) -> None:
    """A training rank whose run validates once, after its last update; rank 1 alone gets SIGTERM there."""
    import nmt.train.loop as loop

    _as_rank(rank, world_size, port)
    validate = loop.validate

    def validate_and_signal(*args, **kwargs):
        result = validate(*args, **kwargs)
        if rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return result

    loop.validate = validate_and_signal
    run = build_run(cfg)
    try:
        try:
            outcome = {"stop": train_run(run)["stop"]}
        except Interrupted as err:
            outcome = {"interrupted": True, "signal": err.signum, "step": err.step}
    finally:
        run.close()
    with open(f"{out}/rank{rank}.json", "w", encoding="utf-8") as f:
        json.dump(outcome, f)


def _experiment_rank(rank: int, world_size: int, port: int, cfg: ExperimentConfig, out: str) -> None:
    """One rank of `nmt experiment`, saving what `run_experiment` returned to it and its threads after."""
    _as_rank(rank, world_size, port)
    result = run_experiment(cfg, "ddp", results_dir=f"{out}/results", device="cpu")  # scoring too, as training
    with open(f"{out}/rank{rank}.json", "w", encoding="utf-8") as f:
        json.dump({"result": result, "threads": _threads()}, f)


def _rank_in_own_directory(rank: int, world_size: int, port: int, cfg: ExperimentConfig, out: str) -> None:
    """A training rank working in `out/node<rank>`, as on a node of its own: the config's relative corpus
    paths name the same files there (`node<rank>/corpus` links to them), under other absolute paths."""
    os.chdir(f"{out}/node{rank}")
    _train_rank(rank, world_size, port, cfg, out)


def _failing_rank(rank: int, world_size: int, port: int, cfg: ExperimentConfig, out: str) -> None:
    """One rank of a run that should fail: what it raised, as text, and its threads after."""
    _as_rank(rank, world_size, port)
    try:
        train(cfg)
        outcome = "trained"
    except UserError as err:
        outcome = f"UserError: {err}"
    except Exception as err:  # a rank left waiting for rank 0 dies of a gloo error instead
        outcome = f"{type(err).__name__}: {err}"
    with open(f"{out}/rank{rank}.json", "w", encoding="utf-8") as f:
        json.dump({"outcome": outcome, "threads": _threads()}, f)


def _rank_failing_in_its_step(rank: int, world_size: int, port: int, cfg: ExperimentConfig, out: str) -> None:
    """One rank whose first update fails after its optimizer step, as every rank's does: its error, and its threads
    while the error (and so the frames it was raised through) is still held."""
    _as_rank(rank, world_size, port)
    run = build_run(cfg)

    def fail(*_) -> None:
        raise RuntimeError("the step failed on purpose")

    run.trainable.optimizer.register_step_post_hook(fail)
    try:
        try:
            train_run(run)
        finally:
            run.close()
    except RuntimeError as err:
        outcome = {"outcome": str(err), "threads": _threads()}
    with open(f"{out}/rank{rank}.json", "w", encoding="utf-8") as f:
        json.dump(outcome, f)


def _refused_rank(rank: int, world_size: int, port: int, cfg: ExperimentConfig, out: str) -> None:
    """One rank of a run that should fail: its error's type and text."""
    _as_rank(rank, world_size, port)
    try:
        train(cfg)
        outcome = ["trained", ""]
    except UserError as err:
        outcome = [type(err).__name__, str(err)]
    with open(f"{out}/rank{rank}.json", "w", encoding="utf-8") as f:
        json.dump(outcome, f)


def start_ranks(target, world_size: int, cfg: ExperimentConfig, out) -> None:
    """Run `target(rank, world_size, port, cfg, out)` in `world_size` gloo processes (spawned)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # spawn, not fork: a forked child inherits this test process's memory but not its threads (Arrow's
    # pool after the data tests, autograd's device threads on CUDA machines), and was seen to deadlock
    # in a torch operation on a lock one of them held. Spawned ranks import torch afresh (seconds).
    start_method = "spawn"
    mp.start_processes(target, args=(world_size, port, cfg, str(out)), nprocs=world_size, start_method=start_method)


def run_ranks(cfg: ExperimentConfig, world_size: int, out) -> list[dict]:
    """Train `cfg` in `world_size` gloo processes; each rank's final weights and summary."""
    start_ranks(_train_rank, world_size, cfg, out)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


def test_two_ranks_agree_and_match_one_process_on_the_same_batches(small_corpus, tmp_path):
    # no dropout: the two setups then compute the same function of the same data
    settings = {"max_steps": 4, "valid_every": 2, "save_every": 1, "device": "cpu"}
    ddp_cfg = tiny_cfg(small_corpus, tmp_path / "ddp", **settings)
    ddp_cfg.model.transformer.dropout = 0.0
    ranks = run_ranks(ddp_cfg, 2, tmp_path)

    assert same_weights(ranks[0]["model"], ranks[1]["model"])
    assert ranks[0]["summary"]["last_valid"] == ranks[1]["summary"]["last_valid"]  # sharded, then reduced
    assert same_weights(ranks[0]["model"], weights(tmp_path / "ddp" / "ckpt_4.pt"))
    records = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "train"] == [1, 2, 3, 4]  # rank 0 alone logs

    # One process accumulating 2 batches sees, at each update, the batches the two ranks saw.
    single_cfg = tiny_cfg(small_corpus, tmp_path / "single", accumulate=2, **settings)
    single_cfg.model.transformer.dropout = 0.0
    single = train(single_cfg)
    assert single["last_valid"]["loss"] == pytest.approx(ranks[0]["summary"]["last_valid"]["loss"], rel=1e-3)
    single_weights = weights(tmp_path / "single" / "ckpt_4.pt")
    for k, v in ranks[0]["model"].items():
        assert torch.allclose(v, single_weights[k], atol=1e-4), k
    # the logged figures are the whole update's, summed over the ranks, not rank 0's share
    logged = [json.loads(line) for line in (tmp_path / "single" / "metrics.jsonl").read_text().splitlines()]
    for key in ("loss", "ppl", "real_tokens", "tokens_per_update"):
        assert [r[key] for r in records if r["event"] == "train"] == pytest.approx(
            [r[key] for r in logged if r["event"] == "train"], rel=1e-3), key


@pytest.mark.slow  # two spawned ranks (10-26 s here); CI runs it with make test-slow
def test_two_ranks_train_bf16_on_their_copies_and_stay_identical(small_corpus, tmp_path):
    """bf16 on a bf16 copy of the model: DDP wraps the copy, reduces its gradients, and every rank's
    fp32 weights (the ones checkpointed) take the same update, accumulation included."""
    cfg = tiny_cfg(small_corpus, tmp_path / "ddp", max_steps=3, device="cpu", precision="bf16", accumulate=2)
    ranks = run_ranks(cfg, 2, tmp_path)
    assert same_weights(ranks[0]["model"], ranks[1]["model"])
    for r in range(2):  # the bf16 copy's DDP let the group go too
        assert _gloo_threads(json.loads((tmp_path / f"rank{r}.threads.json").read_text(encoding="utf-8"))) == []
    assert {v.dtype for v in ranks[0]["model"].values() if v.is_floating_point()} == {torch.float32}
    assert ranks[0]["summary"]["step"] == 3
    assert same_weights(ranks[0]["model"], weights(tmp_path / "ddp" / "ckpt_3.pt"))


@pytest.mark.slow  # three two-rank runs (about 50 s here); CI runs it with make test-slow
def test_a_signal_to_one_rank_stops_every_rank_after_the_same_update_and_the_run_resumes(small_corpus, tmp_path):
    """The ranks share their wishes to stop on the device with each update and read them when that update
    settles, one update later: all stop together, with one checkpoint, and the run resumes from it exactly."""
    # logs every 100 updates, so that updates settle one late (a log step settles at once)
    settings = {"max_steps": 8, "valid_every": 100, "log_every": 100, "device": "cpu"}
    cfg = tiny_cfg(small_corpus, tmp_path / "stopped", **settings)
    cfg.model.transformer.dropout = 0.0
    start_ranks(_signalled_rank, 2, cfg, tmp_path)

    outcomes = [json.loads((tmp_path / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(2)]
    assert outcomes[0] == outcomes[1]  # rank 0 received nothing, yet stopped with rank 1
    # rank 1 noted the signal after update 3 and shared it with that update; the ranks read their
    # agreed wishes as update 3 settles, once update 4 is queued, so both stop after update 4
    assert outcomes[0] == {"interrupted": True, "signal": signal.SIGTERM, "step": 4,
                           "checkpoint": str(tmp_path / "stopped" / "ckpt_4.pt")}
    records = [json.loads(line) for line in (tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in records if r["event"] == "interrupted"] == [
        {"event": "interrupted", "step": 4, "signal": signal.SIGTERM}]
    shutil.copytree(tmp_path / "stopped", tmp_path / "alone")  # as it stopped: the resume replaces ckpt_4.pt

    resumed = run_ranks(cfg, 2, tmp_path)  # the same run again: resumes at update 5
    straight_cfg = tiny_cfg(small_corpus, tmp_path / "straight", **settings)
    straight_cfg.model.transformer.dropout = 0.0
    straight = run_ranks(straight_cfg, 2, tmp_path)
    assert resumed[0]["summary"]["step"] == straight[0]["summary"]["step"] == 8
    assert same_weights(resumed[0]["model"], straight[0]["model"])
    assert same_weights(resumed[0]["model"], resumed[1]["model"])
    assert [p.name for p in periodic_checkpoints(tmp_path / "stopped")] == [p.name for p in periodic_checkpoints(
        tmp_path / "straight")] == ["ckpt_8.pt"]

    # one process resuming the two's run goes on after the 2 x 4 batches they had taken of the epoch
    alone = tiny_cfg(small_corpus, tmp_path / "alone", **settings)
    alone.model.transformer.dropout = 0.0
    run = build_run(alone)
    try:
        assert (run.progress.step, run.progress.batch_in_epoch) == (4, 8)
    finally:
        run.close()


@pytest.mark.slow  # two spawned ranks (10-26 s here); CI runs it with make test-slow
def test_a_signal_to_one_rank_in_the_final_validation_stops_every_rank_alike(small_corpus, tmp_path):
    cfg = tiny_cfg(small_corpus, tmp_path / "run", max_steps=3, valid_every=100, device="cpu")
    start_ranks(_signalled_in_final_validation_rank, 2, cfg, tmp_path)
    outcomes = [json.loads((tmp_path / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(2)]
    assert outcomes[0] == outcomes[1] == {"interrupted": True, "signal": signal.SIGTERM, "step": 3}
    events = [json.loads(line)["event"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert events[-2:] == ["valid", "interrupted"] and (tmp_path / "run" / "ckpt_3.pt").is_file()


@pytest.mark.slow  # two spawned ranks (10-26 s here); CI runs it with make test-slow
def test_experiment_under_two_ranks_trains_together_and_rank_0_alone_scores(small_corpus, tmp_path):
    cfg = tiny_cfg(small_corpus, tmp_path / "run", max_steps=4, valid_every=2, device="cpu")
    cfg.decode.beam = 1
    start_ranks(_experiment_rank, 2, cfg, tmp_path)

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(2)]
    returned = [r["result"] for r in ranks]
    assert returned[1] is None
    # The group was torn down when training ended, on both ranks: no gloo thread is left to
    # abort a rank that exits while rank 0 still scores.
    assert [_gloo_threads(r["threads"]) for r in ranks] == [[], []]
    written = json.loads((tmp_path / "results" / "ddp.json").read_text(encoding="utf-8"))
    assert written == returned[0]
    assert written["steps"] == 4 and written["test"]["test"]["sentences"] == 30
    assert ", 2 processes x 1 thread (" in written["hardware"]  # the CPU's, on a machine with GPUs too
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "train"] == [1, 2, 3, 4]


@pytest.mark.slow  # two spawned ranks (10-26 s here); CI runs it with make test-slow
def test_ranks_take_rank_0s_tokenizer_and_leave_its_files_alone(small_corpus, tmp_path):
    """Nodes may start in different working directories: the other ranks use the tokenizer rank 0 trained,
    and do not judge its files themselves (the record of the corpus's absolute path would differ) and train
    their own over them."""
    for rank in range(2):
        (tmp_path / f"node{rank}").mkdir()
        (tmp_path / f"node{rank}" / "corpus").symlink_to(small_corpus)
    cfg = tiny_cfg(small_corpus, tmp_path / "run", max_steps=1, device="cpu")
    cfg.data.train.path, cfg.data.valid.path = "corpus/train", "corpus/valid"
    start_ranks(_rank_in_own_directory, 2, cfg, tmp_path)

    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert same_weights(ranks[0]["model"], ranks[1]["model"])
    record = json.loads((tmp_path / "run" / "spm.json").read_text(encoding="utf-8"))
    assert record["train"][0]["path"] == [str(tmp_path / "node0" / "corpus" / "train")]  # rank 0's, kept


@pytest.mark.slow  # two spawned ranks (10-26 s here); CI runs it with make test-slow
def test_a_bad_corpus_stops_every_rank_with_rank_0s_error(small_corpus, tmp_path):
    """Rank 0 prepares the data alone; its error reaches the waiting rank instead of a lost connection."""
    cfg = tiny_cfg(small_corpus, tmp_path / "run", max_steps=2, device="cpu")
    cfg.data.train.path = str(tmp_path / "missing" / "train")
    start_ranks(_failing_rank, 2, cfg, tmp_path)

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(2)]
    outcomes = [r["outcome"] for r in ranks]
    assert outcomes[0].startswith("UserError: data.train: text corpus not found: tried ")
    assert str(tmp_path / "missing" / "train.en") in outcomes[0]
    assert outcomes[1] == outcomes[0]
    assert [_gloo_threads(r["threads"]) for r in ranks] == [[], []]  # torn down on the way out too


@pytest.mark.slow  # two spawned ranks (10-26 s here); CI runs it with make test-slow
def test_a_run_that_fails_in_its_step_leaves_the_group_while_the_error_still_holds_its_frames(small_corpus, tmp_path):
    """The frames of an error raised in the step hold DDP (`train_step`'s `objective`), and DDP the group: closing the
    run drops their locals, so that the group is torn down there, not as the interpreter exits, where freeing it
    with a gloo collective just finished hung the process (2 of 38 torchrun runs of a rank failing alone)."""
    cfg = tiny_cfg(small_corpus, tmp_path / "run", max_steps=3, device="cpu")
    start_ranks(_rank_failing_in_its_step, 2, cfg, tmp_path)

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(2)]
    assert [r["outcome"] for r in ranks] == ["the step failed on purpose"] * 2
    assert [_gloo_threads(r["threads"]) for r in ranks] == [[], []]


@pytest.mark.slow  # two spawned ranks (10-26 s here); CI runs it with make test-slow
def test_a_checkpoint_the_config_cannot_resume_stops_every_rank_with_one_error(small_corpus, tmp_path):
    """Every rank would meet the refusal alike: rank 0 raises it, the others relay it, so that the CLI prints
    it once (`RelayedError`), not once a process."""
    train(tiny_cfg(small_corpus, tmp_path / "run", max_steps=1, save_every=1))
    cfg = tiny_cfg(small_corpus, tmp_path / "run", max_steps=2, device="cpu")
    cfg.model.transformer.ff_dim *= 2  # other weights than the checkpoint's
    start_ranks(_refused_rank, 2, cfg, tmp_path)

    outcomes = [json.loads((tmp_path / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(2)]
    message = f"{tmp_path / 'run' / 'ckpt_1.pt'}: the run directory holds a run with a different model section"
    assert outcomes[0][0] == "UserError" and outcomes[0][1].startswith(message)
    assert outcomes[1] == ["RelayedError", outcomes[0][1]]


@pytest.mark.slow
def test_torchrun_two_processes_on_the_command_line(small_corpus, tmp_path):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    config = write_cfg(tmp_path / "tiny.yaml", small_corpus, tmp_path / "run", max_steps=4, valid_every=2,
                       device="cpu")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    command = [torchrun, "--standalone", "--nproc_per_node", "2", "-m", "nmt", "train", str(config)]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1 and summaries[0]["step"] == 4  # printed by rank 0 alone
    assert sorted(p.name for p in (tmp_path / "run").glob("ckpt_*.pt")) == ["ckpt_2.pt", "ckpt_4.pt"]

    proc = subprocess.run([*command, "--set", "train.max_steps=6"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "train"] == [1, 2, 3, 4, 5, 6]  # resumed at step 5


def two_nodes(torchrun: str, args: list[str], cwd, timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """`torchrun ... -m nmt ARGS` as on two machines of one process each: two agents that meet through a c10d
    rendezvous on this machine, as `--nnodes 2 --rdzv_endpoint HOST0:PORT` meets on two."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    command = [torchrun, "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint",
               f"127.0.0.1:{port}", "--rdzv_id", "two-nodes", "-m", "nmt", *args]
    agents = [subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(2)]
    outputs = [agent.communicate(timeout=timeout) for agent in agents]
    return [subprocess.CompletedProcess(command, agent.returncode, *output) for agent, output in zip(agents, outputs)]


@pytest.mark.slow  # two torchrun agents, 10-20 s here; CI runs it with make test-slow
def test_two_nodes_train_as_one_job_and_each_node_prints_an_error_every_process_meets_once(small_corpus, tmp_path):
    """Multi-node through torchrun: every other test launches one machine's processes (`--standalone`). On two
    nodes the second node's process is local rank 0 but not rank 0: it must neither write the run's files nor print
    the summary, and a config error is printed once a node, by each node's local rank 0."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    config = write_cfg(tmp_path / "tiny.yaml", small_corpus, tmp_path / "run", max_steps=4, valid_every=2,
                       device="cpu")
    agents = two_nodes(torchrun, ["train", str(config)], tmp_path)
    assert [a.returncode for a in agents] == [0, 0], "\n".join(a.stderr[-2000:] for a in agents)
    summaries = [json.loads(line) for a in agents for line in a.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1 and summaries[0]["step"] == 4  # rank 0's, on whichever node it is
    assert sum("x 1 accumulated x 2 processes" in a.stderr for a in agents) == 1  # one job of two, logged once
    assert sorted(p.name for p in (tmp_path / "run").glob("ckpt_*.pt")) == ["ckpt_2.pt", "ckpt_4.pt"]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["event"] == "train"] == [1, 2, 3, 4]

    agents = two_nodes(torchrun, ["train", str(config), "--set", "train.lr=-1"], tmp_path)
    for agent in agents:
        errors = [line for line in agent.stderr.splitlines() if line.startswith("nmt: error: ")]
        assert agent.returncode != 0 and len(errors) == 1 and "train.lr" in errors[0], agent.stderr[-3000:]


# `nmt` whose local rank 0 writes its error line late, as on a loaded machine: torchrun, which stops every process
# once one exits, must not stop it before the line is out.
LATE_ERROR_LINE = """
import os, sys, time
from nmt.cli import main

class LateErrorLine:
    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        if text.startswith("nmt: error: "):
            time.sleep(2)
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)

if os.environ["LOCAL_RANK"] == "0":
    sys.stderr = LateErrorLine(sys.stderr)
main()
"""


@pytest.mark.slow  # torchrun runs of 8-17 s each here; CI runs them with make test-slow
@pytest.mark.parametrize("late", [False, True], ids=["line-at-once", "line-late"])
@pytest.mark.parametrize("setting, message", [
    ("train.lr=-1", "nmt: error: "),  # a config error: every process meets it, local rank 0 prints it
    ("data.train.path=missing/train", "nmt: error: data.train: text corpus not found"),  # rank 0's, relayed
    ("train.init_from=missing.pt", "nmt: error: train.init_from: missing.pt: checkpoint not found"),  # every rank's, relayed
    # what the node cannot run, which every process meets too: before the process group, and once it is up
    ("train.device=cuda:1", "nmt: error: train.device: cuda:1 names one GPU"),
    ("train.cuda_graphs=true", "nmt: error: train.cuda_graphs: true records updates as CUDA graphs, which needs a "
                               "CUDA device (training runs on cpu)"),
], ids=["config", "corpus", "init-from", "device", "cuda-graphs"])
def test_torchrun_prints_an_error_every_process_meets_once(setting, message, late, small_corpus, tmp_path):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    config = write_cfg(tmp_path / "tiny.yaml", small_corpus, tmp_path / "run", max_steps=2, device="cpu")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    program = ["-m", "nmt"]
    if late:
        (tmp_path / "late_nmt.py").write_text(LATE_ERROR_LINE, encoding="utf-8")
        program = [str(tmp_path / "late_nmt.py")]
    command = [torchrun, "--standalone", "--nproc_per_node", "2", *program, "train", str(config), "--set", setting]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("nmt: error: ")]
    assert len(errors) == 1 and errors[0].startswith(message), proc.stderr[-3000:]


# `nmt` whose rank 1 alone fails as its third update's optimizer step ends, leaving rank 0 in a collective: with an
# error of its own (FAIL=error) or killed as the OOM killer kills (FAIL=killed).
RANK_1_FAILS = """
import os, signal, time
import nmt.train.loop as loop
from nmt.cli import main

build_run = loop.build_run

def build_run_failing_on_rank_1(*args, **kwargs):
    run = build_run(*args, **kwargs)
    if os.environ["RANK"] == "1":
        steps = iter(range(1, 1000))

        def fail(*_):
            if next(steps) == 3:
                time.sleep(1)  # rank 0 is then waiting in the next update's collective, which fails at once
                if os.environ["FAIL"] == "killed":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError("rank 1 failed on purpose")

        run.trainable.optimizer.register_step_post_hook(fail)
    return run

loop.build_run = build_run_failing_on_rank_1
main()
"""


@pytest.mark.slow  # torchrun runs of 8-17 s each here; CI runs them with make test-slow
@pytest.mark.parametrize("fail", ["error", "killed"])
def test_a_rank_that_fails_alone_leaves_the_other_a_line_that_points_to_it(fail, small_corpus, tmp_path):
    """gloo ends rank 0's wait with "Connection closed by peer" (or "reset by peer", for a killed peer), which
    names a socket and reads as a failure of its own: rank 0 says instead that another process stopped, and waits
    for torchrun to stop it, so that torchrun's report names rank 1 as the first to fail.

    torchrun looks at its workers every 0.1 s by default, and may stop rank 0 for rank 1's death before rank 0 reaches
    the collective that finds it gone: its report then names rank 1 alone, which is right but not what this test is
    about. Looking every 5 s lets gloo report the lost peer first; rank 1 fails a second after rank 0 has gone on to
    wait for it, so that rank 0's line comes within milliseconds of the failure rather than after an update."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    config = write_cfg(tmp_path / "tiny.yaml", small_corpus, tmp_path / "run", max_steps=8, valid_every=100,
                       device="cpu")
    (tmp_path / "failing_nmt.py").write_text(RANK_1_FAILS, encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "FAIL": fail,
           "PYTHONPATH": str(ROOT)}
    command = [torchrun, "--standalone", "--nproc_per_node", "2", "--monitor-interval", "5",
               str(tmp_path / "failing_nmt.py"), "train", str(config)]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("nmt: error: ")]
    expected = ["nmt: error: another process of this run stopped, and rank 0 cannot go on without it; that "
                "process's own message, or torchrun's report of how it ended, says why"]
    if fail == "error":
        expected.append("nmt: error: RuntimeError: rank 1 failed on purpose (run with --debug for the traceback)")
    assert sorted(errors) == sorted(expected), proc.stderr[-3000:]
    assert "by peer" not in proc.stderr and "gloo" not in proc.stderr, proc.stderr[-3000:]
    root_cause = proc.stderr.partition("Root Cause")[2]
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)", root_cause), proc.stderr[-3000:]
