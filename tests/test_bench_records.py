"""The benchmark's run.json and per-question records: what lets shards run side by side and a
killed run resume."""

import json
import multiprocessing as mp

import pytest

from drafters.eval.records import RecordStore, question_machines, read_records

SETTINGS = {"bench": "mt_bench", "max_new_tokens": 256, "question_ids": [81, 82], "machine": "a"}
METHODS = {"hf_greedy": {"kind": "hf"}}


def _open_stores(folders, barrier, settings):
    barrier.wait()  # every shard starts at the same moment, on the same fresh folders
    for folder in folders:
        RecordStore(folder, settings, METHODS)


def test_shards_starting_together_all_open_the_same_run(tmp_path):
    ctx = mp.get_context("fork")
    n, folders = 4, [tmp_path / f"run{i}" for i in range(200)]
    barrier = ctx.Barrier(n)
    procs = [
        ctx.Process(target=_open_stores, args=(folders, barrier, {**SETTINGS, "machine": str(i)}))
        for i in range(n)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * n
    for folder in folders:
        assert json.loads((folder / "run.json").read_text())["settings"]["bench"] == "mt_bench"
        assert sorted(p.name for p in folder.iterdir()) == ["records", "run.json"]


def test_a_shard_with_other_settings_is_refused_by_name(tmp_path):
    RecordStore(tmp_path, SETTINGS, METHODS)
    RecordStore(tmp_path, {**SETTINGS, "machine": "b"}, METHODS)  # volatile: may differ
    with pytest.raises(ValueError, match="max_new_tokens"):
        RecordStore(tmp_path, {**SETTINGS, "max_new_tokens": 128}, METHODS)


def test_a_line_cut_by_a_kill_is_counted_and_its_question_reruns(tmp_path):
    store = RecordStore(tmp_path, SETTINGS, METHODS)
    store.append(81, [{"method": "hf_greedy"}])
    with open(store.path, "a") as f:
        f.write('{"question_id": 82, "reco')  # killed mid-write
    assert read_records(tmp_path) == ({81: [{"method": "hf_greedy"}]}, 1)
    store = RecordStore(tmp_path, SETTINGS, METHODS)  # the restart ends the cut line
    store.append(82, [{"method": "hf_greedy"}])
    assert store.done() == {81, 82}


def test_each_question_is_on_the_machine_of_its_first_line(tmp_path):
    RecordStore(tmp_path, SETTINGS, METHODS)  # run.json names machine "a"
    rows = [
        {"question_id": 81, "machine": "x", "records": []},
        {"question_id": 82, "records": []},  # written before records named their machine
        {"question_id": 81, "machine": "y", "records": []},  # a rerun: the first line wins
    ]
    (tmp_path / "records" / "old.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"question_id": 83, "mach'
    )
    assert question_machines(tmp_path) == {81: "x", 82: "a"}
