"""The replay buffer's encoding of event data: what a stream entry's `d` field holds (B1, B3).

A run's events repeat themselves: every `messages` chunk of the bench graph (200 tokens + a
tool step, 206 events) carries the same ~700 bytes of metadata (run and thread ids,
`langgraph_node`, the checkpoint namespace, tags) and the same ~280-byte message skeleton
around a 6-byte token. Stored as they are, 206 events took 213 KB of Redis (`make bench`,
bench/stream_memory.py). Compressing each entry alone barely helps (the repetition is
between entries), and compressing across entries would tie an entry to the ones before it,
which trimming removes. So a run keeps a few *dictionaries*: the first sizeable payload of
each event name becomes that name's dictionary, stored once in the run's meta hash (field
`z<id>`), and later payloads of that name are deflated with it as the preset dictionary
(zlib `zdict`): a token chunk shrinks to ~20 bytes, and every entry still decodes alone.

`d` is one of (the first byte says which; JSON never starts with a byte below 0x20):
- the payload itself, when it is small or does not compress;
- 0x00 + the payload: a payload whose own first byte is 0x00, 0x01 or 0x02 (escaped);
- 0x01 + raw deflate of the payload;
- 0x02 + dictionary id + ':' + raw deflate of the payload primed with that dictionary.

Decoding gives back exactly the bytes published, so what a client is sent (SSE and
WebSocket frames) is byte for byte what it was before the encoding existed. Entries written
before it (plain JSON) decode as themselves.

A dictionary id is `<epoch>.<k>`: the owner epoch of the attempt that made it (from
Postgres, never reused for a run) and its ordinal in that attempt, so an id always names
the same bytes and a reader may cache it for as long as it likes.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from cachetools import LRUCache

from shared.errors import StoreError

ESCAPED = 0x00
DEFLATE = 0x01
WITH_DICT = 0x02
_MARKERS = (ESCAPED, DEFLATE, WITH_DICT)
DICT_FIELD = "z"
"""Prefix of a dictionary's field in the run's meta hash (`z<id>`)."""
_WBITS = -13
"""Raw deflate (no zlib header or checksum: 6 bytes an entry) with an 8 KB window: enough
for a dictionary and a payload of up to 4 KB each, and the compressor state a payload copies
is small (make bench: 13 us an event against 80 us with zlib's defaults, same sizes)."""
_READ_WBITS = -15  # a reader accepts any window
_MEM_LEVEL = 2


class UndecodableEntry(StoreError):
    """An entry's data cannot be decoded: its dictionary is gone (the stream expired or
    was deleted between two reads) or the bytes are not this encoding."""


@dataclass(frozen=True, slots=True)
class CodecSettings:
    """The encoder's thresholds (from `Settings.stream_compress_*`)."""

    min_bytes: int = 128
    """Payloads shorter than this are stored as they are (deflate would save nothing)."""
    max_dicts: int = 8
    """Dictionaries one attempt may make (bounds the meta hash)."""
    dict_max_bytes: int = 4096
    """Larger payloads never become a dictionary (half of the compressor's window)."""
    level: int = 3
    """zlib's level. 3 is the last of its fast levels: on the bench's 206-event run, 3.7 us an
    event against 5.2 us at 6 (the default) for 0.7 % more bytes (6,391 against 6,348)."""
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class Dictionary:
    """A preset dictionary of one run: its id and its bytes."""

    id: str
    body: bytes


@dataclass(slots=True)
class _Primed:
    """A dictionary and a compressor already primed with it (copied per payload)."""

    dictionary: Dictionary
    compressor: zlib._Compress


def _escape(data: bytes) -> bytes:
    return bytes((ESCAPED,)) + data if data[:1] and data[0] in _MARKERS else data


def _deflate(data: bytes, level: int) -> bytes:
    c = zlib.compressobj(level, zlib.DEFLATED, _READ_WBITS)  # rare: a payload of its own
    return c.compress(data) + c.flush()


def encode_plain(data: bytes, settings: CodecSettings = CodecSettings()) -> bytes:
    """`d` for one payload without dictionaries: deflated when that pays, else as is."""
    if settings.enabled and len(data) >= settings.min_bytes:
        packed = _deflate(data, settings.level)
        if len(packed) + 1 < len(data):
            return bytes((DEFLATE,)) + packed
    return _escape(data)


def dictionary_ref(d: bytes) -> str | None:
    """The id of the dictionary an encoded `d` needs, if any."""
    if d[:1] != bytes((WITH_DICT,)):
        return None
    ref, sep, _ = d[1:].partition(b":")
    if not sep:
        raise UndecodableEntry("a dictionary entry without its id")
    return ref.decode()


def decode(d: bytes, dictionaries: Callable[[str], bytes | None] = lambda _id: None) -> bytes:
    """The payload an encoded `d` holds; `dictionaries` looks a dictionary up by id."""
    if not d or d[0] not in _MARKERS:
        return d
    marker = d[0]
    try:
        if marker == ESCAPED:
            return d[1:]
        if marker == DEFLATE:
            z = zlib.decompressobj(_READ_WBITS)
            return z.decompress(d[1:]) + z.flush()
        ref = dictionary_ref(d)
        assert ref is not None
        body = dictionaries(ref)
        if body is None:
            raise UndecodableEntry(f"dictionary {ref} is gone")
        z = zlib.decompressobj(_READ_WBITS, zdict=body)
        return z.decompress(d[2 + len(ref) :]) + z.flush()
    except zlib.error as exc:
        raise UndecodableEntry(f"corrupt entry data: {exc}") from exc


@dataclass(slots=True)
class EncodedBatch:
    """One call's events in the stream encoding, and the dictionaries they reference
    (those made by this batch first: they must be stored with it)."""

    events: list[tuple[str, bytes]]
    dictionaries: list[Dictionary]
    new: int


@dataclass(slots=True)
class EventEncoder:
    """One run attempt's encoder: its dictionaries live as long as the attempt.

    `tag` is the attempt's owner epoch (unique per run for ever): it makes dictionary ids
    of different attempts differ, so a reader's cache never confuses them.
    """

    tag: str
    settings: CodecSettings = field(default_factory=CodecSettings)
    _by_name: dict[str, _Primed] = field(default_factory=dict)
    _made: int = 0
    _sent: set[str] = field(default_factory=set)

    def encode(self, events: Sequence[tuple[str, bytes]]) -> EncodedBatch:
        """Encode one call's events, in order; a dictionary goes with the first call that
        uses it (the caller sends every call it encodes, or gives the attempt up)."""
        used: dict[str, Dictionary] = {}
        out: list[tuple[str, bytes]] = []
        for name, data in events:
            d, dictionary = self._encode_one(name, data)
            if dictionary is not None:
                used.setdefault(dictionary.id, dictionary)
            out.append((name, d))
        new = [x for x in used.values() if x.id not in self._sent]
        old = [x for x in used.values() if x.id in self._sent]
        self._sent.update(x.id for x in new)
        return EncodedBatch(out, new + old, len(new))

    def _encode_one(self, name: str, data: bytes) -> tuple[bytes, Dictionary | None]:
        s = self.settings
        if not s.enabled or len(data) < s.min_bytes:
            return _escape(data), None
        primed = self._by_name.get(name)
        if primed is None:
            primed = self._new_dictionary(name, data)
            if primed is None:
                return encode_plain(data, s), None
        packed = self._deflate_with(primed, data)
        if len(packed) * 2 > len(data) and self._made < s.max_dicts:
            # This payload is unlike the name's dictionary (another shape under one name):
            # it becomes the dictionary for the payloads that follow it.
            fresh = self._new_dictionary(name, data)
            if fresh is not None:
                primed = fresh
                packed = self._deflate_with(primed, data)
        if len(packed) >= len(data):
            return _escape(data), None
        return packed, primed.dictionary

    def _deflate_with(self, primed: _Primed, data: bytes) -> bytes:
        c = primed.compressor.copy()
        head = bytes((WITH_DICT,)) + primed.dictionary.id.encode() + b":"
        return head + c.compress(data) + c.flush()

    def _new_dictionary(self, name: str, data: bytes) -> _Primed | None:
        s = self.settings
        if self._made >= s.max_dicts or len(data) > s.dict_max_bytes:
            return None
        dictionary = Dictionary(f"{self.tag}.{self._made}", data)
        self._made += 1
        compressor = zlib.compressobj(s.level, zlib.DEFLATED, _WBITS, _MEM_LEVEL, zdict=data)
        primed = _Primed(dictionary, compressor)
        self._by_name[name] = primed
        return primed


DICTIONARY_CACHE_ENTRIES = 4096
"""Dictionaries a reading process keeps (~1 KB each for the bench graph)."""


class DictionaryCache:
    """A reading process's dictionaries, keyed by (meta hash key, id); ids are immutable."""

    def __init__(self, entries: int = DICTIONARY_CACHE_ENTRIES) -> None:
        self._cache: LRUCache[tuple[str, str], bytes] = LRUCache(entries)
        self._lock = threading.Lock()

    def get(self, meta_key: str, ref: str) -> bytes | None:
        """A cached dictionary, or None."""
        with self._lock:
            return self._cache.get((meta_key, ref))

    def put(self, meta_key: str, ref: str, body: bytes) -> None:
        """Remember a dictionary read from Redis."""
        with self._lock:
            self._cache[(meta_key, ref)] = body


def needed(datas: Iterable[bytes]) -> set[str]:
    """The dictionary ids a set of encoded `d` values reference."""
    refs: set[str] = set()
    for d in datas:
        ref = dictionary_ref(d)
        if ref is not None:
            refs.add(ref)
    return refs
