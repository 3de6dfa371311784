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


# --- malformed records inside a JSON array, undecodable files ---------------------------------

# answers hold brackets, quotes and backslashes: scanning past a bad record must respect strings
RECORDS = [
    conv(f"r{i}", ("human", f"question {i}"), ("gpt", f'answer {i}: {{"a": [1]}} \\ "]}}" end'))
    for i in range(24)
]


def array_file(path, elements, indent=2):
    """A JSON array whose element texts are given (so one can be broken)."""
    sep = ",\n" if indent else ", "
    path.write_text(
        "[\n" + sep.join(elements) + "\n]\n" if indent else "[" + sep.join(elements) + "]"
    )
    return path


def element_texts(indent=2):
    return [json.dumps(r, indent=indent) for r in RECORDS]


BROKEN = {  # how record 3 is broken: its text -> text that is not JSON
    "stray_token": lambda t: t.replace('"conversations"', 'oops "conversations"'),
    "unterminated_string": lambda t: t.replace('"question 3"', '"question 3'),
    "missing_comma": lambda t: t.replace('"r3",', '"r3"'),
    "trailing_comma": lambda t: t[: t.rindex("}")] + ",}",
    "bad_literal": lambda t: t.replace('"id": "r3"', '"id": nul'),
    "missing_brace": lambda t: t[: t.rindex("}")],
    "unclosed_list": lambda t: t.replace('"conversations": [', '"conversations": [['),
    "key_quote_missing": lambda t: t.replace('"conversations"', 'conversations"'),
    "raw_newline": lambda t: t.replace("answer 3:", "answer\n3:"),  # JSON needs it as \n
    "cut_short": lambda t: t[: t.index("answer 3") + 4],  # the rest of the record is lost
}


@pytest.mark.parametrize("indent", [2, None], ids=["pretty", "one_line"])
@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_malformed_record_in_array_is_skipped_and_reading_goes_on(tmp_path, broken, indent):
    texts = element_texts(indent)
    texts[3] = BROKEN[broken](texts[3])
    with pytest.raises(json.JSONDecodeError):
        json.loads(texts[3])
    path = array_file(tmp_path / "c.json", texts, indent)
    stats = ReadStats()
    kept = [c.id for c in read_conversations(str(path), stats)]
    assert kept == [f"r{i}" for i in range(24) if i != 3]
    assert stats.summary() == (
        "read 24, kept 23, skipped 1 (malformed 1); "
        "malformed records at index 3 (0-based, in file order)"
    )
    assert stats.to_dict()["malformed_indices"] == [3]
    whole = list(iter_json_array(path))
    for chunk in (5, 64):  # the same wherever the reads cut the text
        assert list(iter_json_array(path, chunk_chars=chunk)) == whole


@pytest.mark.parametrize("broken", ["stray_token", "missing_brace"])
def test_malformed_record_then_a_cut_tail(tmp_path, broken):
    texts = element_texts()
    texts[3] = BROKEN[broken](texts[3])
    texts[-1] = texts[-1][:40]  # the file ends inside the last record
    path = tmp_path / "c.json"
    path.write_text("[\n" + ",\n".join(texts))
    stats = ReadStats()
    kept = [c.id for c in read_conversations(str(path), stats)]
    assert kept == [f"r{i}" for i in range(23) if i != 3]
    assert stats.read == 24 and stats.malformed_indices == [3]
    assert dict(stats.skipped) == {"malformed": 1, "truncated_tail": 1}
    assert list(iter_json_array(path, chunk_chars=9)) == list(iter_json_array(path))


def test_stray_tokens_between_records_are_skipped(tmp_path):
    texts = element_texts()[:4]
    path = array_file(tmp_path / "c.json", [texts[0], "]", texts[1], "}", texts[2], "x", texts[3]])
    stats = ReadStats()
    kept = [c.id for c in read_conversations(str(path), stats)]
    assert kept == ["r0", "r1", "r2", "r3"]
    assert stats.malformed_indices == [1, 3, 5]
    assert list(iter_json_array(path, chunk_chars=3)) == list(iter_json_array(path))


def test_valid_json_of_the_wrong_shape_is_malformed_with_its_index(tmp_path):
    wrong = [42, "text", [1, 2], {"id": "x"}, {"id": "y", "conversations": [{"from": "human"}]}]
    path = tmp_path / "c.json"
    path.write_text(json.dumps([RECORDS[0], *wrong, RECORDS[1]]))
    stats = ReadStats()
    assert [c.id for c in read_conversations(str(path), stats)] == ["r0", "r1"]
    assert stats.skipped == {"malformed": 5}
    assert stats.malformed_indices == [1, 2, 3, 4, 5]
    assert stats.summary().endswith(
        "malformed records at index 1, 2, 3, 4, 5 (0-based, in file order)"
    )


def test_only_the_first_malformed_indices_are_listed(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n" + "{not json}\n" * 30)
    stats = ReadStats()
    assert len(list(read_conversations(str(path), stats))) == 1
    assert stats.skipped["malformed"] == 30
    assert stats.to_dict()["malformed_indices"] == list(range(1, 21))
    assert stats.summary().endswith(
        "at index " + ", ".join(map(str, range(1, 21))) + ", ... (0-based, in file order)"
    )


@pytest.mark.parametrize("name", ["data.json", "data.jsonl"])
def test_binary_file_is_a_clear_error_naming_it(tmp_path, name):
    import gzip

    path = tmp_path / name
    path.write_bytes(gzip.compress(json.dumps(RECORDS).encode()))
    with pytest.raises(ConversationSourceError, match=rf"{name}: not UTF-8 text .*decompress"):
        list(read_conversations(str(path)))


@pytest.mark.parametrize("chunk", [1 << 20, 7])
def test_invalid_utf8_names_the_file_and_byte(tmp_path, chunk):
    head = ("[" + json.dumps(RECORDS[0], ensure_ascii=False) + ', {"id": "üü').encode()
    path = tmp_path / "latin.json"
    path.write_bytes(head + "é".encode("latin-1") + b'"}]')
    with pytest.raises(
        ConversationSourceError, match=rf"latin.json: not UTF-8 text \(byte {len(head)}:"
    ):
        list(iter_json_array(path, chunk_chars=chunk))
    lines = tmp_path / "latin.jsonl"
    lines.write_bytes(json.dumps(RECORDS[0]).encode() + b'\n{"id": "\xe9"}\n')
    with pytest.raises(ConversationSourceError, match=r"latin.jsonl: not UTF-8 text \(line 2, "):
        list(read_conversations(str(lines)))


def test_file_cut_inside_a_character_is_a_truncated_tail(tmp_path):
    cut = "é".encode()[:1]  # the file ends between the two bytes of a character
    text = json.dumps(RECORDS[:3], indent=2, ensure_ascii=False)
    array = tmp_path / "cut.json"
    array.write_bytes(text[: text.rindex("]")].rstrip().encode() + b',\n{"id": "' + cut)
    lines = tmp_path / "cut.jsonl"
    lines.write_bytes(
        b"".join(json.dumps(r).encode() + b"\n" for r in RECORDS[:3]) + b'{"id": "' + cut
    )
    for path in (array, lines):
        stats = ReadStats()
        assert [c.id for c in read_conversations(str(path), stats)] == ["r0", "r1", "r2"]
        assert dict(stats.skipped) == {"truncated_tail": 1}
