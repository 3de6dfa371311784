"""N-gram candidates from the context (prompt lookup, Saxena 2023; HF's
`prompt_lookup_num_tokens`): if the last n tokens occurred before, what followed them then is a
guess of what follows now. Free to compute, and right when the answer copies its prompt or
itself (translation, summarisation, retrieval, code edits), where a trained drafter is weak.

`NgramIndex` keeps, for every n-gram of the sequence so far (n = 1 .. max_n), where it last
ended before its latest occurrence, updated in O(max_n) a token, so a lookup costs O(max_n)
however long the context."""

from __future__ import annotations


class NgramIndex:
    def __init__(self, max_n: int = 3):
        if max_n < 1:
            raise ValueError(f"n-gram lookup needs max_n >= 1, got {max_n}")
        self.max_n = max_n
        self.seq: list[int] = []
        self._last: dict[tuple[int, ...], int] = {}  # n-gram -> end index of its latest
        self._before: dict[tuple[int, ...], int] = {}  # n-gram -> end index of the one before

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            self.seq.append(int(t))
            end = len(self.seq) - 1
            for n in range(1, min(self.max_n, end + 1) + 1):
                key = tuple(self.seq[end - n + 1 : end + 1])
                if key in self._last:
                    self._before[key] = self._last[key]
                self._last[key] = end

    def lookup(self, length: int, min_n: int = 1) -> tuple[list[int], int]:
        """(the up to `length` tokens that followed the latest earlier occurrence of the
        sequence's last n tokens, n): the longest n from max_n down to min_n that occurred
        before; ([], 0) if none did."""
        end = len(self.seq) - 1
        for n in range(min(self.max_n, end + 1), min_n - 1, -1):
            key = tuple(self.seq[end - n + 1 :])
            at = self._before.get(key) if self._last.get(key) == end else self._last.get(key)
            if at is not None and at < end:
                return self.seq[at + 1 : at + 1 + length], n
        return [], 0
