"""A small MessagePack encoder and decoder in pure Python, for `serialize`/`deserialize`.

The engine imports only the standard library, yet its serialized state is msgpack. This covers
the types a state record uses (nil, bool, int, float64, str, bin, array, map) and encodes them
exactly as the `msgpack` package's `packb(obj)` does with its defaults (smallest int form,
float64, str/bin types), so the stream processor may use that faster C codec on
`state_to_record` and get the same bytes; a test holds the two to that.
"""

from __future__ import annotations

import struct
from typing import Any, Final

_FLOAT = struct.Struct(">d")
_FLOAT32 = struct.Struct(">f")


class PackingError(ValueError):
    """Raised for bytes that are not well-formed msgpack of the supported types."""


def pack(obj: Any) -> bytes:
    """Encode `obj` (None, bool, int, float, str, bytes, list/tuple, dict) as msgpack."""
    out = bytearray()
    _pack(obj, out)
    return bytes(out)


def _pack(obj: Any, out: bytearray) -> None:
    if obj is None:
        out.append(0xC0)
    elif obj is True:
        out.append(0xC3)
    elif obj is False:
        out.append(0xC2)
    elif isinstance(obj, int):
        _pack_int(obj, out)
    elif isinstance(obj, float):
        out.append(0xCB)
        out += _FLOAT.pack(obj)
    elif isinstance(obj, str):
        data = obj.encode("utf-8")
        _pack_header(len(data), out, 0xA0, 32, (0xD9, 0xDA, 0xDB))
        out += data
    elif isinstance(obj, bytes | bytearray):
        _pack_header(len(obj), out, None, 0, (0xC4, 0xC5, 0xC6))
        out += obj
    elif isinstance(obj, list | tuple):
        _pack_header(len(obj), out, 0x90, 16, (None, 0xDC, 0xDD))
        for item in obj:
            _pack(item, out)
    elif isinstance(obj, dict):
        _pack_header(len(obj), out, 0x80, 16, (None, 0xDE, 0xDF))
        for key, value in obj.items():
            _pack(key, out)
            _pack(value, out)
    else:
        msg = f"cannot pack {type(obj).__name__}"
        raise TypeError(msg)


def _pack_int(value: int, out: bytearray) -> None:
    if 0 <= value < 0x80:
        out.append(value)
    elif -32 <= value < 0:
        out.append(value & 0xFF)
    elif value >= 0:
        for code, fmt, limit in (
            (0xCC, ">B", 1 << 8),
            (0xCD, ">H", 1 << 16),
            (0xCE, ">I", 1 << 32),
            (0xCF, ">Q", 1 << 64),
        ):
            if value < limit:
                out.append(code)
                out += struct.pack(fmt, value)
                return
        msg = f"int too large for msgpack: {value}"
        raise OverflowError(msg)
    else:
        for code, fmt, limit in (
            (0xD0, ">b", 1 << 7),
            (0xD1, ">h", 1 << 15),
            (0xD2, ">i", 1 << 31),
            (0xD3, ">q", 1 << 63),
        ):
            if value >= -limit:
                out.append(code)
                out += struct.pack(fmt, value)
                return
        msg = f"int too small for msgpack: {value}"
        raise OverflowError(msg)


def _pack_header(
    length: int,
    out: bytearray,
    fix_base: int | None,
    fix_limit: int,
    codes: tuple[int | None, int, int],
) -> None:
    if fix_base is not None and length < fix_limit:
        out.append(fix_base | length)
        return
    code8, code16, code32 = codes
    if code8 is not None and length < 1 << 8:
        out += bytes((code8, length))
    elif length < 1 << 16:
        out.append(code16)
        out += struct.pack(">H", length)
    else:
        out.append(code32)
        out += struct.pack(">I", length)


MAX_DEPTH: Final = 32
"""The deepest nesting of arrays and maps `unpack` reads. A state record nests 6 deep (the
record, its intents' map, an intent, its held episodes, one held episode, its signals; an
embedded config 5: the record, config, intents, an intent, its signals), so 32 leaves room for
later formats while bytes such as 100,000 one-item arrays fail at once with a PackingError,
not with Python's RecursionError."""


def unpack(data: bytes) -> Any:
    """Decode one msgpack value that fills `data` exactly.

    Raises:
        PackingError: truncated data, trailing bytes, an unsupported type code, or arrays and
            maps nested deeper than `MAX_DEPTH`.
    """
    try:
        value, end = _unpack(memoryview(data), 0, 0)
    except (IndexError, struct.error) as exc:
        msg = "truncated msgpack data"
        raise PackingError(msg) from exc
    if end != len(data):
        msg = f"{len(data) - end} trailing bytes after the msgpack value"
        raise PackingError(msg)
    return value


_SIMPLE = {0xC0: None, 0xC2: False, 0xC3: True}
_NUMBERS = {
    0xCA: (">f", 4),
    0xCB: (">d", 8),
    0xCC: (">B", 1),
    0xCD: (">H", 2),
    0xCE: (">I", 4),
    0xCF: (">Q", 8),
    0xD0: (">b", 1),
    0xD1: (">h", 2),
    0xD2: (">i", 4),
    0xD3: (">q", 8),
}
_LENGTHS = {  # code -> (kind, bytes of the length field)
    0xD9: ("str", 1),
    0xDA: ("str", 2),
    0xDB: ("str", 4),
    0xC4: ("bin", 1),
    0xC5: ("bin", 2),
    0xC6: ("bin", 4),
    0xDC: ("array", 2),
    0xDD: ("array", 4),
    0xDE: ("map", 2),
    0xDF: ("map", 4),
}


def _unpack(  # noqa: PLR0911 - one per code family
    data: memoryview, pos: int, depth: int
) -> tuple[Any, int]:
    """The value at `pos` and the position after it; `depth`: the arrays and maps around it."""
    code = data[pos]
    pos += 1
    if code < 0x80:
        return code, pos
    if code >= 0xE0:
        return code - 0x100, pos
    if 0xA0 <= code <= 0xBF:
        return _unpack_body("str", code & 0x1F, data, pos, depth)
    if 0x90 <= code <= 0x9F:
        return _unpack_body("array", code & 0x0F, data, pos, depth)
    if 0x80 <= code <= 0x8F:
        return _unpack_body("map", code & 0x0F, data, pos, depth)
    if code in _SIMPLE:
        return _SIMPLE[code], pos
    if code in _NUMBERS:
        fmt, size = _NUMBERS[code]
        (number,) = struct.unpack_from(fmt, data, pos)
        return number, pos + size
    if code in _LENGTHS:
        kind, size = _LENGTHS[code]
        length = int.from_bytes(data[pos : pos + size], "big")
        if pos + size > len(data):
            raise IndexError(pos)
        return _unpack_body(kind, length, data, pos + size, depth)
    msg = f"unsupported msgpack type code 0x{code:02x}"
    raise PackingError(msg)


def _unpack_body(kind: str, length: int, data: memoryview, pos: int, depth: int) -> tuple[Any, int]:
    if kind in ("str", "bin"):
        end = pos + length
        if end > len(data):
            raise IndexError(end)
        raw = bytes(data[pos:end])
        if kind == "bin":
            return raw, end
        try:
            return raw.decode("utf-8"), end
        except UnicodeDecodeError as exc:
            msg = "invalid UTF-8 in a msgpack string"
            raise PackingError(msg) from exc
    if length > len(data) - pos:  # each item takes at least one byte: refuse absurd lengths
        raise IndexError(length)
    depth += 1
    if depth > MAX_DEPTH:
        msg = f"msgpack arrays and maps nested deeper than {MAX_DEPTH} levels"
        raise PackingError(msg)
    if kind == "array":
        items = []
        for _ in range(length):
            item, pos = _unpack(data, pos, depth)
            items.append(item)
        return items, pos
    mapping: dict[Any, Any] = {}
    for _ in range(length):
        key, pos = _unpack(data, pos, depth)
        if isinstance(key, list | dict):
            msg = "msgpack map keys must be scalars"
            raise PackingError(msg)
        mapping[key], pos = _unpack(data, pos, depth)
    return mapping, pos
