"""The atomic writes every module publishes through: files, create-once files, folders."""

import json
import os

import pytest

from drafters.io_utils import (
    atomic_file,
    create_exclusive,
    replace_dir,
    staged_dir,
    write_json_atomic,
)


def _folder(path, text):
    path.mkdir()
    (path / "f.txt").write_text(text)
    return path


def test_replace_dir_swaps_in_the_new_folder_and_leaves_nothing_behind(tmp_path):
    dst = _folder(tmp_path / "out", "old")
    replace_dir(_folder(tmp_path / "new", "new"), dst)
    assert (dst / "f.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_replace_dir_creates_a_missing_destination(tmp_path):
    replace_dir(_folder(tmp_path / "new", "new"), tmp_path / "out")
    assert (tmp_path / "out" / "f.txt").read_text() == "new"


def test_replace_dir_failure_keeps_the_previous_folder(tmp_path):
    dst = _folder(tmp_path / "out", "old")
    with pytest.raises(FileNotFoundError):
        replace_dir(tmp_path / "never-written", dst)
    assert (dst / "f.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_write_json_atomic_round_trips_without_temporaries(tmp_path):
    write_json_atomic(tmp_path / "a.json", {"é": [1, 2]})
    write_json_atomic(tmp_path / "a.json", {"é": [3]})  # replaces, never appends
    assert json.loads((tmp_path / "a.json").read_text(encoding="utf-8")) == {"é": [3]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_atomic_file_publishes_only_a_finished_file(tmp_path):
    path = tmp_path / "shard.npy"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_file(path) as tmp:
        assert tmp.suffix == ".npy" and tmp.parent == tmp_path  # np.save keeps the name
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    with atomic_file(path) as tmp:
        tmp.write_text("new")
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_create_exclusive_keeps_the_first_writer(tmp_path):
    path = tmp_path / "run.json"
    assert create_exclusive(path, "first")
    assert not create_exclusive(path, "second")
    assert path.read_text() == "first" and sorted(p.name for p in tmp_path.iterdir()) == [
        "run.json"
    ]


def test_staged_dir_appears_whole_or_not_at_all(tmp_path):
    dst = tmp_path / "dataset"
    with pytest.raises(RuntimeError), staged_dir(dst) as tmp:
        (tmp / "part").write_text("1")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []
    old = os.umask(0o022)
    try:
        with staged_dir(dst) as tmp:
            (tmp / "part").write_text("2")
            (tmp / "part").chmod(0o600)  # as safetensors writes its files
    finally:
        os.umask(old)
    assert (dst / "part").read_text() == "2"
    assert oct(dst.stat().st_mode & 0o777) == "0o755"
    assert oct((dst / "part").stat().st_mode & 0o777) == "0o644"  # readable by a server
    with staged_dir(dst) as tmp:  # replaces
        (tmp / "other").write_text("3")
    assert sorted(p.name for p in dst.iterdir()) == ["other"]
    with staged_dir(dst, replace=False) as tmp:  # another process got there first: theirs stays
        (tmp / "mine").write_text("4")
    assert sorted(p.name for p in dst.iterdir()) == ["other"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]
