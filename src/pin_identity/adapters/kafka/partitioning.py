"""The partition librdkafka's producer puts a key in, computed here, so that one key's records can be found
without reading the whole topic (`access show`).

The relay produces with librdkafka's `partitioner` (default `consistent_random`); a `partitioner` set in
PIN_IDENTITY_KAFKA_CONFIG is honoured. For a non-empty key the `_random` variants hash like their plain ones
(they differ only for empty keys, which we never send):
- `consistent`, `consistent_random`: CRC-32 of the key modulo the partition count;
- `murmur2`, `murmur2_random`: the Java client's default (murmur2, made positive) modulo the count;
- `fnv1a`, `fnv1a_random`: 32-bit FNV-1a made absolute (Sarama's hash partitioner) modulo the count.
`random` places a key anywhere: nothing can be computed for it. tests/integration/test_key_partition.py holds
each against librdkafka itself.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping

DEFAULT_PARTITIONER = "consistent_random"
_MASK = 0xFFFFFFFF


class UnsupportedPartitionerError(ValueError):
    pass


def _crc32(key: bytes) -> int:
    return zlib.crc32(key) & _MASK


def _murmur2(key: bytes) -> int:
    """librdkafka's rd_murmur2, the Java client's Utils.murmur2, made positive as both partitioners do."""
    seed, m = 0x9747B28C, 0x5BD1E995
    length = len(key)
    h = (seed ^ length) & _MASK
    whole = length - length % 4
    for start in range(0, whole, 4):
        k = int.from_bytes(key[start : start + 4], "little")
        k = (k * m) & _MASK
        k ^= k >> 24
        k = (k * m) & _MASK
        h = ((h * m) & _MASK) ^ k
    tail = key[whole:]
    if tail:
        for index in reversed(range(len(tail))):
            h ^= tail[index] << (8 * index)
        h = (h * m) & _MASK
    h ^= h >> 13
    h = (h * m) & _MASK
    h ^= h >> 15
    return h & 0x7FFFFFFF


def _fnv1a(key: bytes) -> int:
    """librdkafka's rd_fnv1a: 32-bit FNV-1a read as a signed int and made absolute (Sarama's hash
    partitioner); the absolute of the most negative value stays 2**31."""
    h = 0x811C9DC5
    for byte in key:
        h = ((h ^ byte) * 0x01000193) & _MASK
    signed = h - (1 << 32) if h & 0x80000000 else h
    return abs(signed) & _MASK


_HASHES: dict[str, Callable[[bytes], int]] = {
    "consistent_random": _crc32,
    "consistent": _crc32,
    "murmur2_random": _murmur2,
    "murmur2": _murmur2,
    "fnv1a_random": _fnv1a,
    "fnv1a": _fnv1a,
}
SUPPORTED_PARTITIONERS = tuple(_HASHES)


def partitioner_of(client_config: Mapping[str, str]) -> str:
    """The producer's partitioner by these client properties; UnsupportedPartitionerError for one whose
    placement cannot be computed."""
    name = str(client_config.get("partitioner", DEFAULT_PARTITIONER)).strip()
    if name not in _HASHES:
        raise UnsupportedPartitionerError(
            f"partitioner {name!r}: a key's partition cannot be computed for it "
            f"(supported: {', '.join(SUPPORTED_PARTITIONERS)})"
        )
    return name


def key_partition(key: bytes, partitions: int, partitioner: str = DEFAULT_PARTITIONER) -> int:
    """The partition librdkafka's `partitioner` puts a non-empty `key` in, among `partitions`."""
    if not key:
        raise ValueError("an empty key has no fixed partition")
    if partitions < 1:
        raise ValueError("a topic has at least one partition")
    return _HASHES[partitioner](key) % partitions
