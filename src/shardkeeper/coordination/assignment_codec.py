"""Compact encodings of an assignment's owner maps (item -> instance id).

A registry value is limited in size (ZooKeeper refuses a request over 1 MB; etcd's
default limit is 1.5 MiB), and the first encoding, one ``"item": "instance"`` pair
per item, crossed it at about 39,000 items. Two encodings replace it:

``ranges`` (readable, used whenever it is small)
    ``{"instance-a": "0-49,100", "instance-b": "50-99,101"}``: each instance's items
    as comma-separated tokens ``a`` (one item), ``a-b`` (a to b) and ``a-b/s`` (a to
    b, every s-th item). The built-in strategies give each instance one block of
    consecutive items (and at most one more), so 100,000 items over 100 instances
    take a few kilobytes.
``packed`` (bounded for every strategy)
    One shared ``instances`` table and, per map, base64 text of the zlib-compressed
    big-endian array of owner indices (one per item; 1, 2 or 4 bytes each, by the
    size of the table; the largest value means "no owner"). Its size depends only on
    the number of items and instances, never on how a strategy spreads them.

:func:`choose` takes ``ranges`` while the value stays under
:data:`READABLE_MAX_BYTES` and ``packed`` otherwise, so the size of a value is at
most ``max(READABLE_MAX_BYTES, packed_size_bound(...))``; :func:`worst_case_bytes`
computes that bound and :data:`ASSIGNMENT_MAX_BYTES` is what a store takes.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
import zlib
from array import array
from collections.abc import Iterable, Mapping
from typing import Any

# defined below configuration, which checks job sizes against it (see limits.py)
from shardkeeper.limits import ASSIGNMENT_MAX_BYTES

__all__ = [
    "ASSIGNMENT_MAX_BYTES",
    "MAX_ITEM",
    "READABLE_MAX_BYTES",
    "decode_packed",
    "decode_ranges",
    "encode_packed",
    "encode_ranges",
    "json_size",
    "worst_case_bytes",
]


READABLE_MAX_BYTES = 128 * 1024
"""The ``ranges`` form is used while the whole value stays at most this size."""

MAX_ITEM = 10_000_000
"""Item numbers above this in a stored value are refused as malformed (a corrupt
``0-999999999`` must not make a reader build a billion-entry map)."""

# Bytes a document needs besides its maps and instance table (keys, numbers, the
# leader's id): generous, so that the bound stays a bound.
_FIXED_OVERHEAD = 1024


def _runs(items: list[int]) -> Iterable[tuple[int, int, int]]:
    """Greedy (first, last, step) runs of a sorted list of distinct items."""
    i, n = 0, len(items)
    while i < n:
        if i + 1 < n:
            step = items[i + 1] - items[i]
            j = i + 1
            while j + 1 < n and items[j + 1] - items[j] == step:
                j += 1
            # a stride needs 3 terms to beat "a,b"; consecutive items need 2
            if j - i + 1 >= (2 if step == 1 else 3):
                yield items[i], items[j], step
                i = j + 1
                continue
        yield items[i], items[i], 1
        i += 1


def encode_ranges(items: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 10, 15, 20]`` -> ``"0-2,5-20/5"`` (items sorted first)."""
    parts: list[str] = []
    for first, last, step in _runs(sorted(set(items))):
        if first == last:
            parts.append(str(first))
        elif step == 1:
            parts.append(f"{first}-{last}")
        else:
            parts.append(f"{first}-{last}/{step}")
    return ",".join(parts)


def decode_ranges(text: str) -> list[int]:
    """The items of a ranges text; ValueError naming the bad token."""
    items: list[int] = []
    if not text:
        return items
    for token in text.split(","):
        span, slash, step_s = token.partition("/")
        first_s, dash, last_s = span.partition("-")
        try:
            first = int(first_s)
            last = int(last_s) if dash else first
            step = int(step_s) if slash else 1
        except ValueError:
            raise ValueError(f"range {token!r} is not a, a-b or a-b/s") from None
        if not 0 <= first <= last <= MAX_ITEM or step < 1:
            raise ValueError(f"range {token!r} is out of order or out of 0..{MAX_ITEM}")
        items.extend(range(first, last + 1, step))
    return items


def _width(instances: int) -> str:
    """The array type code whose largest value (the "no owner" mark) is no index."""
    if instances < 0xFF:
        return "B"
    if instances < 0xFFFF:
        return "H"
    return "L" if array("L").itemsize == 4 else "I"


def encode_packed(owners: Mapping[int, str], table: Mapping[str, int]) -> str:
    """Base64 of the zlib-compressed big-endian owner-index array of ``owners``."""
    code = _width(len(table))
    length = max(owners, default=-1) + 1
    values = array(code, [(1 << (8 * array(code).itemsize)) - 1]) * length
    for item, owner in owners.items():
        values[item] = table[owner]
    if sys.byteorder == "little":
        values.byteswap()
    return base64.b64encode(zlib.compress(values.tobytes(), 9)).decode("ascii")


def decode_packed(text: str, instances: list[str]) -> dict[int, str]:
    """The owner map of a packed text over the instance table; ValueError when bad."""
    if not text:
        return {}
    code = _width(len(instances))
    size = array(code).itemsize
    limit = (MAX_ITEM + 1) * size
    try:
        # bounded: a corrupt value must not inflate into gigabytes
        inflater = zlib.decompressobj()
        raw = inflater.decompress(base64.b64decode(text, validate=True), limit + 1)
    except (binascii.Error, zlib.error) as exc:
        raise ValueError(f"packed owners are not base64 zlib data: {exc}") from None
    if not inflater.eof and len(raw) <= limit:
        raise ValueError("packed owners are truncated zlib data")
    if len(raw) > limit or len(raw) % size:
        raise ValueError(f"packed owners have {len(raw)} bytes: not whole {size}-byte entries")
    values = array(code)
    values.frombytes(raw)
    if sys.byteorder == "little":
        values.byteswap()
    none = (1 << (8 * size)) - 1
    owners: dict[int, str] = {}
    for item, index in enumerate(values):
        if index == none:
            continue
        if index >= len(instances):
            raise ValueError(f"item {item} names instance #{index} of {len(instances)}")
        owners[item] = instances[index]
    return owners


def _packed_bound(items: int, instances: int) -> int:
    raw = items * array(_width(instances)).itemsize
    # zlib: at worst stored blocks of up to 65,535 bytes, 5 bytes of header each,
    # plus its own 2-byte header and 4-byte checksum; then base64's 4 per 3.
    compressed = raw + 5 * (raw // 65_535 + 1) + 6
    return 4 * ((compressed + 2) // 3)


def worst_case_bytes(
    total: int, instances: int, id_length: int = 64, previous_total: int | None = None
) -> int:
    """The largest value an assignment of ``total`` items over ``instances`` instances
    (ids of at most ``id_length`` characters) can encode to, for every strategy: the
    current owner map and the previous one (``previous_total`` items, default
    ``total``) packed, with the instance table of both, or the readable budget,
    whichever is larger."""
    prev = total if previous_total is None else previous_total
    table = 2 * instances * (len(json.dumps("x" * id_length)) + 1)
    maps = _packed_bound(total, 2 * instances) + _packed_bound(prev, 2 * instances)
    return max(READABLE_MAX_BYTES, maps + table + _FIXED_OVERHEAD)


def json_size(doc: Mapping[str, Any]) -> int:
    """Bytes of ``doc`` as compact JSON (what the registry stores)."""
    return len(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
