"""The byte format of one slot file: a run of self-checking frames.

A slot file is only ever appended to, so the only damage a crash can do is a torn
tail. Every frame carries a magic byte, its length and a CRC32 of its body, so a
reader can always tell where the last whole record ends and never mistakes garbage
for a record. Frame layout (little-endian):

    magic u8 (0xD5) | body length u32 | crc32(body) u32 | body

Body: offset i64, due_ms i64, delay_ms i64, target_partition i32 (-1 = none),
flags u8 (bit 0: replica; bit 1: a reschedule's copy, live only while the reschedule log
names its offset, see `reschedule_log`), message id (u32 length + UTF-8), target (u16 length +
UTF-8), key and value (i32 length, -1 = None, + bytes), header count u32, then per
header a name (u32 length + UTF-8) and a value (i32 length, -1 = None, + bytes).
The message id gets a u32 length because `delay-id` is an ordinary header value and
Kafka puts no cap on it; topic names are capped at 249 characters, so u16 is plenty.

A second kind of frame, magic 0xD6 with an 8-byte body (offset i64), marks the record
with that offset as settled. The wheel appends one when a record of a slot is forwarded
and acknowledged while others in the slot are still waiting, so a process killed before
the slot is deleted does not send the settled ones again: the write sits in the page
cache, which outlives the process. Records read back from a file leave out the settled.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final, NamedTuple

from delayservice.errors import DelayServiceError

MAGIC: Final = 0xD5
SETTLED_MAGIC: Final = 0xD6
_FLAG_REPLICA: Final = 0x01
_FLAG_COPY: Final = 0x02

_FRAME = struct.Struct("<BII")  # magic, body length, crc32 of body
_FIXED = struct.Struct("<qqqiBI")  # offset, due_ms, delay_ms, partition, flags, id length
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")

FRAME_OVERHEAD: Final = _FRAME.size
_MAX_U16: Final = 0xFFFF
_MAX_I32: Final = 0x7FFFFFFF


class SlotFormatError(DelayServiceError, ValueError):
    """A record cannot be framed (a field outside what the format can hold).

    Retrying cannot help, so it is never retriable; the record belongs on the
    dead-letter topic.
    """


class StoredRecord(NamedTuple):
    """One held message as the wheel keeps it on disk."""

    offset: int  # offset on the precise topic partition
    due_ms: int  # absolute due time, epoch ms
    replica: bool  # a replica's copy: fires only on takeover
    message_id: str
    target: str
    target_partition: int | None  # explicit target partition, or None
    delay_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]  # the user's headers
    copy: bool = False  # written by a reschedule (its offset is the marker's)


_NONE: Final = _I32.pack(-1)


def _optional_bytes(parts: list[bytes], data: bytes | None) -> None:
    if data is None:
        parts.append(_NONE)
        return
    if len(data) > _MAX_I32:
        raise SlotFormatError(f"a field of {len(data)} bytes does not fit a slot frame")
    parts.append(_I32.pack(len(data)))
    parts.append(data)


def encode(record: StoredRecord) -> bytes:
    """Frame one record. Raises `SlotFormatError` for fields the format cannot hold."""
    return encode_fields(*record)


def encode_fields(
    offset: int,
    due_ms: int,
    replica: bool,
    message_id: str,
    target: str,
    partition: int | None,
    delay_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]],
    copy: bool = False,
) -> bytes:
    """`encode` from the fields themselves: this runs once per record the intake
    stores, where building the tuple first cost as much as framing it."""
    if partition is None:
        partition = -1
    elif partition < 0:
        raise SlotFormatError(f"target partition must be >= 0, got {partition}")
    try:
        raw_id = message_id.encode()
        raw_target = target.encode()
        if len(raw_target) > _MAX_U16:
            raise SlotFormatError(f"target topic name of {len(raw_target)} bytes is too long")
        if (key is not None and len(key) > _MAX_I32) or (
            value is not None and len(value) > _MAX_I32
        ):
            raise SlotFormatError("a key or value does not fit a slot frame")
        flags = (_FLAG_REPLICA if replica else 0) | (_FLAG_COPY if copy else 0)
        parts = [
            _FIXED.pack(offset, due_ms, delay_ms, partition, flags, len(raw_id)),
            raw_id,
            _U16.pack(len(raw_target)),
            raw_target,
            _NONE if key is None else _I32.pack(len(key)),
            key or b"",
            _NONE if value is None else _I32.pack(len(value)),
            value or b"",
            _U32.pack(len(headers)),
        ]
        for name, header_value in headers:
            raw_name = name.encode()
            parts.append(_U32.pack(len(raw_name)))
            parts.append(raw_name)
            _optional_bytes(parts, header_value)
        body = b"".join(parts)
    except (struct.error, UnicodeEncodeError, TypeError) as exc:
        raise SlotFormatError(f"record {message_id!r} cannot be framed: {exc}") from exc
    return _FRAME.pack(MAGIC, len(body), zlib.crc32(body)) + body


def _parse(body: memoryview) -> StoredRecord:
    """One frame body. Raises struct.error or ValueError on anything `encode` cannot
    have written; the checks are inlined because this runs for every held record."""
    size = len(body)
    offset, due_ms, delay_ms, partition, flags, length = _FIXED.unpack_from(body, 0)
    if partition < -1 or flags & ~(_FLAG_REPLICA | _FLAG_COPY):
        raise ValueError("bad fixed fields")
    # A slice past the end is silently short, so overruns push `pos` beyond `size`;
    # the next unpack or the final length check catches them.
    pos = _FIXED.size + length
    message_id = str(body[_FIXED.size : pos], "utf-8")
    (length,) = _U16.unpack_from(body, pos)
    pos += 2
    target = str(body[pos : pos + length], "utf-8")
    pos += length
    (length,) = _I32.unpack_from(body, pos)
    pos += 4
    key: bytes | None = None
    if length != -1:
        if length < 0:
            raise ValueError("bad key length")
        key = bytes(body[pos : pos + length])
        pos += length
    (length,) = _I32.unpack_from(body, pos)
    pos += 4
    value: bytes | None = None
    if length != -1:
        if length < 0:
            raise ValueError("bad value length")
        value = bytes(body[pos : pos + length])
        pos += length
    (count,) = _U32.unpack_from(body, pos)
    pos += 4
    headers: list[tuple[str, bytes | None]] = []
    if count > size - pos:  # each header takes at least 8 bytes; stops absurd counts
        raise ValueError("header count overruns the frame")
    for _ in range(count):
        (length,) = _U32.unpack_from(body, pos)
        pos += 4
        name = str(body[pos : pos + length], "utf-8")
        pos += length
        (length,) = _I32.unpack_from(body, pos)
        pos += 4
        header_value: bytes | None = None
        if length != -1:
            if length < 0:
                raise ValueError("bad header length")
            header_value = bytes(body[pos : pos + length])
            pos += length
        headers.append((name, header_value))
    if pos != size:
        raise ValueError("frame length does not match its fields")
    return tuple.__new__(
        StoredRecord,
        (
            offset,
            due_ms,
            bool(flags & _FLAG_REPLICA),
            message_id,
            target,
            None if partition == -1 else partition,
            delay_ms,
            key,
            value,
            headers,
            bool(flags & _FLAG_COPY),
        ),
    )


def encode_settled(offset: int) -> bytes:
    """Frame the mark that the record with `offset` is settled."""
    body = _I64.pack(offset)
    return _FRAME.pack(SETTLED_MAGIC, len(body), zlib.crc32(body)) + body


def decode(data: bytes | memoryview) -> tuple[list[StoredRecord], int]:
    """Records of the longest valid prefix of `data` that no settled mark names, and
    that prefix's length.

    Never raises on any input: whatever follows the last whole, checksummed,
    parseable frame is a torn tail, and the caller decides what to do with it.
    """
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    records: list[StoredRecord] = []
    settled: set[int] = set()
    end = len(view)
    pos = 0
    while pos + FRAME_OVERHEAD <= end:
        magic, length, crc = _FRAME.unpack_from(view, pos)
        body_end = pos + FRAME_OVERHEAD + length
        if magic not in (MAGIC, SETTLED_MAGIC) or body_end > end:
            break
        body = view[pos + FRAME_OVERHEAD : body_end]
        if zlib.crc32(body) != crc:
            break
        if magic == SETTLED_MAGIC:
            if length != _I64.size:
                break
            settled.add(_I64.unpack_from(body)[0])
            pos = body_end
            continue
        try:
            records.append(_parse(body))
        except (struct.error, ValueError):  # UnicodeDecodeError is a ValueError
            break
        pos = body_end
    if settled:
        records = [r for r in records if r.offset not in settled]
    return records, pos


class Frame(NamedTuple):
    """Where one whole frame sits, and what routing it needs, without parsing its body."""

    start: int  # position of its magic byte
    end: int  # one past its last byte
    settled: bool  # a settled mark (then `offset` is the record it names)
    offset: int
    fire_ms: int  # due_ms, plus `takeover_ms` for a replica's copy (0 for a mark)
    replica: bool = False  # a replica's copy
    copy: bool = False  # a reschedule's copy (live only while the reschedule log names it)


def frames(
    data: bytes | memoryview, takeover_ms: int = 0, start: int = 0
) -> tuple[list[Frame], int]:
    """The whole, checksummed frames of `data` from `start`, and where they stop.

    Only the frame header and the body's fixed fields are read, so moving or indexing
    records costs a checksum and an unpack, not a parse. A frame cut off by the end of
    `data` stops the walk: a chunked reader continues from the returned position.
    """
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    out: list[Frame] = []
    end = len(view)
    pos = start
    unpack_frame, crc32, fixed = _FRAME.unpack_from, zlib.crc32, _FIXED.unpack_from
    while pos + FRAME_OVERHEAD <= end:
        magic, length, crc = unpack_frame(view, pos)
        body_end = pos + FRAME_OVERHEAD + length
        if magic not in (MAGIC, SETTLED_MAGIC) or body_end > end:
            break
        body = view[pos + FRAME_OVERHEAD : body_end]
        if crc32(body) != crc:
            break
        if magic == SETTLED_MAGIC:
            if length != _I64.size:
                break
            out.append(Frame(pos, body_end, True, _I64.unpack_from(body)[0], 0))
        else:
            if length < _FIXED.size:
                break
            offset, due_ms, _delay, _partition, flags, _ = fixed(body, 0)
            fire_ms = due_ms + (takeover_ms if flags & _FLAG_REPLICA else 0)
            replica = bool(flags & _FLAG_REPLICA)
            copy = bool(flags & _FLAG_COPY)
            out.append(Frame(pos, body_end, False, offset, fire_ms, replica, copy))
        pos = body_end
    return out, pos


def message_id_of(data: bytes | memoryview, frame: Frame) -> str | None:
    """The message id of a record frame `frames` found in `data` (None: not UTF-8)."""
    start = frame.start + FRAME_OVERHEAD + _FIXED.size
    length = _U32.unpack_from(data, start - _U32.size)[0]
    try:
        return bytes(data[start : start + length]).decode()
    except UnicodeDecodeError:
        return None


def frame_offset(frame: bytes | memoryview) -> int:
    """The offset of the record in a frame `encode` made."""
    offset: int = _I64.unpack_from(frame, FRAME_OVERHEAD)[0]
    return offset


def frame_length(data: bytes | memoryview) -> int | None:
    """The full length of the frame that starts `data` (None: not even a header), so a
    chunked reader can fetch a frame larger than its chunk in one piece."""
    if len(data) < FRAME_OVERHEAD:
        return None
    _magic, length, _crc = _FRAME.unpack_from(data, 0)
    return int(FRAME_OVERHEAD + length)


def parse_frame(frame: bytes | memoryview) -> StoredRecord:
    """The record in one whole frame that `frames` found (its checksum already checked)."""
    view = memoryview(frame)
    return _parse(view[FRAME_OVERHEAD:])
