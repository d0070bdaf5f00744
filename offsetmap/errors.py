"""Typed errors of the offset map.

Owns the exception hierarchy of `offsetmap`: one root, `OffsetMapError`, and subclasses that carry the
fields a caller needs to act on the failure (the offending index, offset, span or limit). It must not
import anything else from the package, so every module can raise these without import cycles.

Hierarchy::

    OffsetMapError
    +-- OffsetMapConfigError   (ValueError)  bad memory budget, load factor, seed or thread count
    +-- OffsetMapFullError                   a single put of a new key at the fill limit
    +-- OffsetMapInputError    (ValueError)  bulk input of the wrong shape, dtype or length
        +-- OffsetOrderError                 an offset below the previous one or below latest_offset
        +-- KeySpanError                     a key span outside its buffer, or a length below -1
"""

from __future__ import annotations

__all__ = [
    "KeySpanError",
    "OffsetMapConfigError",
    "OffsetMapError",
    "OffsetMapFullError",
    "OffsetMapInputError",
    "OffsetOrderError",
]


class OffsetMapError(Exception):
    """Root of every error raised by `offsetmap`."""


class OffsetMapConfigError(OffsetMapError, ValueError):
    """A sizing or hashing parameter is out of range.

    `name` is the parameter as the caller spelled it (`memory_bytes`, `load_factor`, `seed`, `threads`),
    `value` what was passed and `reason` what was expected.
    """

    def __init__(self, name: str, value: object, reason: str) -> None:
        self.name = name
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {name}={value!r}: {reason}")


class OffsetMapFullError(OffsetMapError):
    """`put` of a key the map does not hold while the map already holds `capacity` keys.

    Bulk inserts never raise this; they stop and report how many entries they consumed.
    """

    def __init__(self, size: int, capacity: int) -> None:
        self.size = size
        self.capacity = capacity
        super().__init__(
            f"offset map is at its fill limit: {size} keys held, capacity {capacity}; "
            "a new key does not fit (clean what was indexed and continue in the next round)"
        )


class OffsetMapInputError(OffsetMapError, ValueError):
    """Bulk input that cannot be used: wrong dtype, dimension or mismatched lengths.

    `argument` names the offending parameter and `reason` says what was expected versus found.
    """

    def __init__(self, argument: str, reason: str) -> None:
        self.argument = argument
        self.reason = reason
        super().__init__(f"{argument}: {reason}")


class OffsetOrderError(OffsetMapInputError):
    """An offset that would make the map go backwards.

    Offsets are Kafka offsets: non-negative, and the cleaner feeds them in log order. Within one call they must
    be non-decreasing, and none may be below the map's `latest_offset`. `index` is the position of the first
    offending entry in the call's input (0 for a single `put`), `offset` its value and `offset_min` the
    smallest value that would have been accepted there.
    """

    def __init__(self, index: int, offset: int, offset_min: int) -> None:
        self.index = index
        self.offset = offset
        self.offset_min = offset_min
        OffsetMapError.__init__(
            self,
            f"offsets: offset {offset} at index {index} is below {offset_min}; offsets must be "
            "non-negative, non-decreasing within a call and not below the map's latest_offset",
        )
        self.argument = "offsets"
        self.reason = str(self)


class KeySpanError(OffsetMapInputError):
    """A key span that does not lie inside its buffer.

    `index` is the record's position in the span arrays, `position` and `length` its span (length -1 means
    a null key and is always valid) and `buffer_bytes` the buffer's size.
    """

    def __init__(self, index: int, position: int, length: int, buffer_bytes: int) -> None:
        self.index = index
        self.position = position
        self.length = length
        self.buffer_bytes = buffer_bytes
        OffsetMapError.__init__(
            self,
            f"key span {index}: position {position}, length {length} does not lie inside a buffer of "
            f"{buffer_bytes} bytes (expected 0 <= position and position + length <= {buffer_bytes}, "
            "or length -1 for a null key)",
        )
        self.argument = "key_pos/key_len"
        self.reason = str(self)
