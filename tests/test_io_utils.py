"""The atomic folder swap that export and the distilled corpus publish through."""

import json

import pytest

from drafters.io_utils import replace_dir, write_json_atomic


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
