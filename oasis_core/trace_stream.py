"""Streaming trace reader: a large trace file is read in chunks and each request checked as it arrives, so memory
holds one chunk of text and the ``TraceRequest`` objects, never the whole text and its parsed JSON at once.

``load_trace_stream(path, chunk_bytes=, progress=)`` returns the same ``Trace`` as ``trace.load_trace`` for every
valid file. It decodes with the strict loader's own hooks (duplicate keys and NaN / Infinity refused). On any
problem it gives up streaming and loads the file with ``load_trace``, so the error message is the strict loader's,
word for word (which names the first problem in the loader's own order: schema and version first).
"""

from __future__ import annotations

import codecs
import json
from os import PathLike
from typing import Callable, Optional, Union

from . import trace as _t


class _GiveUp(Exception):
    """Not a well-formed trace as far as streaming can tell: the strict loader says why."""


class _Reader:
    def __init__(self, f, chunk_bytes: int, progress: Optional[Callable[[int], None]]):
        self.f, self.chunk, self.progress = f, chunk_bytes, progress
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.buf, self.pos, self.eof = "", 0, False
        self.dec = json.JSONDecoder(object_pairs_hook=_t._no_duplicate_keys, parse_constant=_t._reject_constant)

    def more(self) -> bool:
        if self.eof:
            return False
        data = self.f.read(self.chunk)
        if self.progress is not None and data:
            self.progress(len(data))
        try:
            text = self.utf8.decode(data, final=not data)
        except UnicodeDecodeError:
            raise _GiveUp from None
        self.buf, self.pos = self.buf[self.pos :] + text, 0
        self.eof = not data
        return True

    def peek(self) -> str:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\n\r":
                self.pos += 1
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos] if self.pos < len(self.buf) else ""

    def take(self, ch: str) -> None:
        if self.peek() != ch:
            raise _GiveUp
        self.pos += 1

    def value(self):
        """The next JSON value. A value that ends exactly at the buffer's end may be cut (a number), so it is
        decoded again with more text unless the file has ended."""
        self.peek()
        while True:
            try:
                v, end = self.dec.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError:
                if self.more():
                    continue
                raise _GiveUp from None
            except (ValueError, RecursionError, _t._DuplicateKey):
                raise _GiveUp from None
            if end == len(self.buf) and self.more():
                continue
            self.pos = end
            return v


def _stream(r: _Reader) -> _t.Trace:
    r.take("{")
    obj, requests = {}, None
    while r.peek() != "}":
        if obj or requests is not None:
            r.take(",")
        key = r.value()
        if not isinstance(key, str) or key in obj or (key == "requests" and requests is not None):
            raise _GiveUp
        r.take(":")
        if key == "requests" and r.peek() == "[":
            r.take("[")
            requests = []
            if r.peek() == "]":
                r.take("]")
            else:
                while True:
                    try:
                        requests.append(_t._parse_request(len(requests), r.value()))
                    except _t._Problem:
                        raise _GiveUp from None
                    if r.peek() == ",":
                        r.take(",")
                        continue
                    r.take("]")
                    break
            obj["requests"] = None  # present; its requests are checked already
        else:
            obj[key] = r.value()
    r.take("}")
    if r.peek() != "":
        raise _GiveUp  # text after the object
    try:
        return _t._parse(obj, parsed=requests if requests is not None else None)
    except (_t._Problem, RecursionError):
        raise _GiveUp from None


def load_trace_stream(
    path: Union[str, PathLike], chunk_bytes: int = 1 << 20, progress: Optional[Callable[[int], None]] = None
) -> _t.Trace:
    """Read and validate the trace file at ``path`` in ``chunk_bytes`` pieces (``progress(n)`` after each);
    ``TraceError`` as ``trace.load_trace`` raises it."""
    try:
        with open(path, "rb") as f:
            return _stream(_Reader(f, chunk_bytes, progress))
    except (_GiveUp, OSError):  # the strict loader says why, in its own words (also for a file it cannot read)
        pass
    return _t.load_trace(path)
