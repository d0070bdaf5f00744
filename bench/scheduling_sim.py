"""Scheduling simulation (issue 10): Kafka's dirty-ratio policy against the survivorship policy.

A mix of logs is appended to tick after tick: insert-only logs (every record a new key, as while a topic is
bootstrapped) and update-heavy logs (Zipf-distributed updates over a small key space). A cleaner that can run
`--rounds-per-tick` rounds per tick picks logs with the policy under test, using the same functions the daemon
uses (`cleaner.survivorship`: smoothing, eligibility, rank; Kafka's ratio and `min.cleanable.dirty.ratio`
gate otherwise). A round is modelled exactly on key sets: it reads the clean and dirty sections, writes one
record per distinct key, and its observed survivorship is distinct dirty keys / dirty records. Prints, per
policy, bytes freed per byte of cleaning I/O, total I/O, rounds spent on each kind of log, and the disk the
logs occupy at the end.

Usage: python bench/scheduling_sim.py [--ticks 400] [--insert-logs 8] [--update-logs 8] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cleaner import survivorship

RECORD_BYTES = 100
MIN_RATIO = 0.5  # min.cleanable.dirty.ratio
ALPHA = 0.5  # log.cleaner.survivorship.alpha
BACKSTOP = 0.9  # log.cleaner.survivorship.backstop.ratio


@dataclass
class Log:
    kind: str
    clean: set = field(default_factory=set)
    dirty: list = field(default_factory=list)
    survivorship: float | None = None
    next_key: int = 0
    rounds: int = 0

    def bytes(self) -> tuple[int, int]:
        return len(self.clean) * RECORD_BYTES, len(self.dirty) * RECORD_BYTES


def append(log: Log, rng: np.random.Generator, n: int, update_keys: int) -> None:
    if log.kind == "insert-only":
        log.dirty.extend(range(log.next_key, log.next_key + n))
        log.next_key += n
    else:
        ranks = rng.zipf(1.3, size=n)
        log.dirty.extend(int(k) for k in np.minimum(ranks, update_keys))


def clean(log: Log) -> tuple[int, int]:
    """One round over the whole log; returns (bytes read, bytes written)."""
    read = (len(log.clean) + len(log.dirty)) * RECORD_BYTES
    distinct_dirty = set(log.dirty)
    observed = len(distinct_dirty) / len(log.dirty)
    log.survivorship = survivorship.smoothed(log.survivorship, observed, ALPHA)
    log.clean |= distinct_dirty
    log.dirty = []
    log.rounds += 1
    return read, len(log.clean) * RECORD_BYTES


def pick(logs: list[Log], policy: str) -> Log | None:
    best, best_score = None, 0.0
    for log in logs:
        clean_b, dirty_b = log.bytes()
        total = clean_b + dirty_b
        if not dirty_b:
            continue
        if policy == "dirty-ratio":
            score = dirty_b / total
            ok = score > MIN_RATIO
        else:
            s = log.survivorship or 0.0
            score = survivorship.freed_per_io_byte(clean_b, dirty_b, s)
            ok = survivorship.eligible(clean_b, dirty_b, s, min_ratio=MIN_RATIO, backstop_ratio=BACKSTOP)
        if ok and (best is None or score > best_score):
            best, best_score = log, score
    return best


def simulate(policy: str, args) -> dict:
    rng = np.random.default_rng(args.seed)
    logs = [Log("insert-only") for _ in range(args.insert_logs)] + [Log("update-heavy") for _ in range(args.update_logs)]
    read = written = 0
    for _ in range(args.ticks):
        for log in logs:
            append(log, rng, args.records_per_tick, args.update_keys)
        for _ in range(args.rounds_per_tick):
            chosen = pick(logs, policy)
            if chosen is None:
                break
            r, w = clean(chosen)
            read, written = read + r, written + w
    size = sum(sum(log.bytes()) for log in logs)
    return {
        "policy": policy,
        "io": read + written,
        "freed": read - written,
        "rounds_insert": sum(log.rounds for log in logs if log.kind == "insert-only"),
        "rounds_update": sum(log.rounds for log in logs if log.kind == "update-heavy"),
        "size": size,
        "update_size": sum(sum(log.bytes()) for log in logs if log.kind == "update-heavy"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ticks", type=int, default=400)
    parser.add_argument("--insert-logs", type=int, default=8)
    parser.add_argument("--update-logs", type=int, default=8)
    parser.add_argument("--records-per-tick", type=int, default=1000)
    parser.add_argument("--update-keys", type=int, default=5000)
    parser.add_argument("--rounds-per-tick", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(f"{args.insert_logs} insert-only + {args.update_logs} update-heavy logs, {args.ticks} ticks of "
          f"{args.records_per_tick} records each, {args.rounds_per_tick} rounds per tick")
    print(f"{'policy':>13} {'freed/IO':>9} {'IO MB':>9} {'freed MB':>9} {'rounds ins':>10} {'rounds upd':>10} "
          f"{'disk MB':>8} {'upd disk MB':>11}")
    for policy in survivorship.POLICIES:
        r = simulate(policy, args)
        print(f"{policy:>13} {r['freed'] / r['io']:>9.3f} {r['io'] / 1e6:>9.1f} {r['freed'] / 1e6:>9.1f} "
              f"{r['rounds_insert']:>10} {r['rounds_update']:>10} {r['size'] / 1e6:>8.1f} {r['update_size'] / 1e6:>11.1f}")


if __name__ == "__main__":
    main()
