"""`metrics.jsonl` on resume: records past the checkpoint's step and a line cut short by a kill are dropped."""

import json

import pytest

from nmt.train.metrics import MetricsLog, _lines_from_the_end


def records(step_events):
    return "".join(json.dumps({"event": e, "step": s}) + "\n" for s, e in step_events)


def steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_records_after_the_resumed_step_and_a_cut_line_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(records([(0, "valid"), (10, "train"), (20, "train"), (20, "valid"), (30, "train")])
                    + '{"event": "train", "st')
    MetricsLog(tmp_path, resume_step=20, tensorboard=False)
    assert steps(path) == [0, 10, 20, 20]
    assert path.read_text().endswith('"valid", "step": 20}\n')


def test_a_last_record_whole_but_for_its_newline_is_kept_and_ended(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(records([(10, "train")]) + json.dumps({"event": "train", "step": 20}))
    log = MetricsLog(tmp_path, resume_step=20, tensorboard=False)
    log.write({"event": "train", "step": 30})
    assert steps(path) == [10, 20, 30]


def test_a_file_past_the_step_throughout_is_emptied_and_one_before_it_left_as_it_is(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(records([(10, "train"), (20, "train")]))
    MetricsLog(tmp_path, resume_step=5, tensorboard=False)
    assert path.read_text() == ""
    text = records([(10, "train"), (20, "train")])
    path.write_text(text)
    MetricsLog(tmp_path, resume_step=20, tensorboard=False)
    assert path.read_text() == text


@pytest.mark.parametrize("text", [b"", b"\n", b"a", b"a\n", b"ab\ncd", b"ab\ncd\n", b"\n\nxyz\n\nq", b"one line\n" * 5])
@pytest.mark.parametrize("block", [1, 2, 3, 64])
def test_lines_read_from_the_end_are_the_files_lines_reversed(tmp_path, text, block):
    expected, offset = [], 0
    for line in text.split(b"\n"):
        expected.append((offset, line))
        offset += len(line) + 1
    if text.endswith(b"\n") or not text:
        expected.pop()  # no line after the final newline
    path = tmp_path / "f"
    path.write_bytes(text)
    with open(path, "rb") as f:
        assert list(_lines_from_the_end(f, len(text), block=block)) == expected[::-1]


def test_a_file_where_the_tensorboard_folder_goes_is_one_line_with_the_way_out(tmp_path):
    # SummaryWriter's makedirs stopped nmt train with "FileExistsError: [Errno 17] File exists" and exit 1.
    pytest.importorskip("torch.utils.tensorboard")
    from nmt.errors import UserError

    (tmp_path / "tensorboard").write_text("not a folder\n")
    with pytest.raises(UserError, match=r"tensorboard: a file, where the run writes its TensorBoard folder; move it "
                                        r"away, or set train.tensorboard: false$"):
        MetricsLog(tmp_path, resume_step=0)
    MetricsLog(tmp_path, resume_step=0, tensorboard=False).close()
