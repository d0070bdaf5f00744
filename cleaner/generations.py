"""Generational cleaning: which suffix of a log a round recopies, and the generation boundaries kept between rounds.

Kafka recopies the whole log every round, although with skewed updates most of it lost nothing since the
last round. In generational mode (`cleaner.mode = generational`) the clean section is a sequence of
*generations*, contiguous offset ranges, oldest first, each deduplicated internally, each older one larger.
A round merges the dirty head with the youngest generations only: walking from the youngest, a generation
joins the merge while its size is at most `cleaner.generation.ratio` × the bytes merged so far. The merged
range becomes one generation. When the walk reaches the oldest generation the round is a *full cycle*: the
whole log is recopied, and afterwards it holds one record per key, exactly as after a Kafka round.

A partial round builds its offset map over the younger merged generations and the dirty head (`map_from`)
and recopies from the oldest merged generation (`recopy_from`); older generations are not read. Records
they hold may be superseded by newer ones (a consumer reading to the end still sees the latest value of
every key), so a partial round never removes tombstones or transaction markers: the records they delete or
abort may lie in an older generation. Those go at the next full cycle. Offsets and order never change.

Owns the plan (pure arithmetic over segment bases and sizes) and the generation file,
`<partition dir>/.logcleaner-generations` (JSON, written atomically; a missing or stale file means the
whole clean section is one generation). Kafka ignores the file.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from segments.files.fileio import DEFAULT_FILE_OPS, FileOps
from segments.partition.checkpoint import GENERATIONS_FILE

__all__ = ["GENERATIONS_FILE", "GenerationPlan", "load_starts", "plan_round", "save_starts"]


@dataclass(frozen=True, slots=True)
class GenerationPlan:
    map_from: int  # the offset map covers [map_from, end of the dirty section)
    recopy_from: int  # segments with a base ≥ this are recopied; older generations are left alone
    full: bool  # recopy_from is the log start: tombstones and markers may go, one record per key after
    merged: int  # generations merged with the dirty head
    generations: tuple[int, ...]  # the generation starts the clean section has before the round


def load_starts(directory: str | os.PathLike) -> list[int]:
    """The generation starts recorded for the partition at `directory` ([] if none or unreadable)."""
    try:
        data = json.loads((Path(directory) / GENERATIONS_FILE).read_text())
        return sorted(int(s) for s in data["starts"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def save_starts(directory: str | os.PathLike, starts: Sequence[int], *, file_ops: FileOps = DEFAULT_FILE_OPS) -> None:
    file_ops.write_atomic(Path(directory) / GENERATIONS_FILE, json.dumps({"starts": list(starts)}).encode())


def plan_round(
    starts: Sequence[int],
    bases: Sequence[int],
    sizes: Sequence[int],
    *,
    log_start: int,
    first_dirty: int,
    first_uncleanable: int,
    ratio: float,
    map_capacity: int,
    force_full: bool = False,
) -> GenerationPlan:
    """Which generations the next round merges (see the module docstring).

    `bases`/`sizes` are the log's segments in order. Recorded starts that are not segment bases inside the
    clean section are ignored (the log changed under them: a full Kafka-style round, retention). The merge
    also stops where the map, which must cover every offset from `map_from` to `first_uncleanable`, would
    exceed `map_capacity` entries. `force_full` merges every generation the map allows, whatever their
    sizes (a round forced to recopy, e.g. because tombstones' delete horizons passed).
    """
    segment_bases = set(bases)
    valid = sorted({s for s in starts if log_start < s < first_dirty and s in segment_bases})
    gens = [log_start, *valid] if first_dirty > log_start else []
    bounds = [*gens, first_dirty]
    gen_bytes = [_bytes_between(bases, sizes, lo, hi) for lo, hi in zip(bounds, bounds[1:])]
    merged_bytes = _bytes_between(bases, sizes, first_dirty, first_uncleanable)
    k = len(gens)  # gens[k:] are merged
    while k > 0 and (force_full or gen_bytes[k - 1] <= ratio * merged_bytes):
        map_from = gens[k] if k < len(gens) else first_dirty  # the map covers the generations younger than k-1
        if first_uncleanable - map_from > map_capacity:
            break
        k -= 1
        merged_bytes += gen_bytes[k]
    recopy_from = gens[k] if k < len(gens) else first_dirty
    map_from = gens[k + 1] if k + 1 < len(gens) else first_dirty
    return GenerationPlan(map_from, recopy_from, k == 0, len(gens) - k, tuple(gens))


def _bytes_between(bases: Sequence[int], sizes: Sequence[int], lo: int, hi: int) -> int:
    """Bytes of the segments whose base lies in [lo, hi)."""
    i, j = bisect.bisect_left(bases, lo), bisect.bisect_left(bases, hi)
    return int(sum(sizes[i:j]))
