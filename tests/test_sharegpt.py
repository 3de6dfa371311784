import json

import pytest

from drafters.data.sharegpt import (
    ConversationSourceError,
    ReadStats,
    iter_json_array,
    read_conversations,
    split_of,
)


def conv(cid, *turns, system=None):
    turns = [{"from": r, "value": v} for r, v in turns]
    if system:
        turns.insert(0, {"from": "system", "value": system})
    return {"id": cid, "conversations": turns}


GOOD = [
    conv("a_0", ("human", "hi"), ("gpt", "hello")),
    conv("b_0", ("human", "q1"), ("gpt", "a1"), ("human", "q2"), ("gpt", "a2"), system="Be brief."),
    conv("c_1", ("gpt", "orphan answer"), ("human", "next question"), ("gpt", "x")),
]
BAD = [
    (conv("d", ("human", "hi"), ("robot", "beep")), "unknown_role"),
    (conv("e", ("human", "hi"), ("human", "again")), "not_alternating"),
    (conv("f", ("human", "   "), ("gpt", "x")), "empty"),
    (conv("g"), "empty"),
    ({"id": "h", "conversations": "nope"}, "malformed"),
    (conv("a_0", ("human", "other"), ("gpt", "text")), "duplicate"),  # same id
    (conv("z", ("human", "hi"), ("gpt", "hello")), "duplicate"),  # same content as a_0
]


def write_truncated_array(path, records, tail):
    text = json.dumps(records, indent=2)
    path.write_text(text[: text.rindex("]")].rstrip() + ",\n" + tail)


def test_truncated_array_recovers_every_complete_record(tmp_path):
    path = tmp_path / "cut.json"
    tail = json.dumps(conv("t", ("human", "cut"), ("gpt", "off")))[:25]
    write_truncated_array(path, GOOD + [r for r, _ in BAD], tail)
    stats = ReadStats()
    kept = list(read_conversations(str(path), stats))
    assert [c.id for c in kept] == ["a_0", "b_0", "c_1"]
    d = stats.to_dict()
    assert d["read"] == len(GOOD) + len(BAD) + 1
    assert d["kept"] == 3
    assert d["skipped"] == {
        "truncated_tail": 1,
        "malformed": 1,
        "empty": 2,
        "unknown_role": 1,
        "not_alternating": 1,
        "duplicate": 2,
    }


def test_small_chunks_give_same_records(tmp_path):
    path = tmp_path / "cut.json"
    write_truncated_array(path, GOOD * 1, '{"id": "x", "conv')
    whole = list(iter_json_array(path))
    chunked = list(iter_json_array(path, chunk_chars=7))
    assert whole == chunked
    assert whole[-1] == (None, "truncated_tail")


def test_roles_normalised_system_kept_orphan_answer_dropped(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in GOOD) + "\n")
    a, b, c = read_conversations(str(path))
    assert [m["role"] for m in b.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert b.messages[0]["content"] == "Be brief."
    assert [m["role"] for m in c.messages] == ["user", "assistant"]
    assert c.messages[0]["content"] == "next question"


def test_jsonl_bad_line_and_cut_tail(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(GOOD[0]) + "\n{not json}\n" + json.dumps(GOOD[1])[:20])
    stats = ReadStats()
    assert [c.id for c in read_conversations(str(path), stats)] == ["a_0"]
    assert stats.skipped["malformed"] == 1 and stats.skipped["truncated_tail"] == 1


def test_split_is_deterministic_and_keeps_parts_together():
    assert split_of("abc_0", 0.5) == split_of("abc_7", 0.5)
    ids = [f"conv{i}_0" for i in range(2000)]
    val = [i for i in ids if split_of(i, 0.1) == "validation"]
    assert 100 < len(val) < 300
    assert val == [i for i in ids if split_of(i, 0.1) == "validation"]


def test_missing_file_is_a_clear_error():
    with pytest.raises(ConversationSourceError, match="does not exist.*data.source"):
        list(read_conversations("/no/such/file.json"))


def test_package_file_recovers_all_complete_conversations():
    stats = ReadStats()
    train = sum(1 for _ in read_conversations("sharegpt-package", stats, split="train"))
    d = stats.to_dict()
    assert d["skipped"]["truncated_tail"] == 1  # the package file is cut mid-record
    assert d["read"] - 1 > 17_500  # complete records before the cut
    assert d["read"] == d["kept"] + d["other_split"] + sum(d["skipped"].values())
    assert train == d["kept"] > 15_000


def test_hf_dataset_source_streams_through_datasets(tmp_path):
    """`hf:NAME[:split]` goes through datasets.load_dataset (a hub id on a cluster; here a local
    folder of JSON files, which load_dataset reads the same way)."""
    folder = tmp_path / "sharegpt_hf"
    folder.mkdir()
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in GOOD) + "\n")
    stats = ReadStats()
    kept = list(read_conversations(f"hf:{folder}:train", stats))
    assert [c.id for c in kept] == ["a_0", "b_0", "c_1"]
    assert stats.read == 3
