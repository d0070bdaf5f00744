"""Byte identity of the cleaner's output across an optimisation: a manifest of SHA-256s to compare.

Cleans a fixed set of inputs with the code of one tree and writes, per case, the SHA-256 of every file
the clean leaves (lock files excluded) plus each round's counters (timings dropped). Two manifests, one
from the tree before a change and one after, must be equal: `--compare A B` says where they differ.

Inputs (generated once under `--data-dir`, deterministic): W1-W4 of `bench/workloads.py` at `--scale`
(default 0.05), cleaned by `logcleaner clean` with a large and with a small dedupe buffer (partial rounds);
60 seeded random logs of `tests/cleaner/builders.random_log` (every codec, idempotent and transactional
producers, commits, aborts, tombstones, rolls; 20 of them with offset gaps), each cleaned three ways
(defaults; `delete.retention.ms=0` twice in a row, which removes tombstones and markers; a 6-slot offset
map, partial rounds); the Kafka 2.4 fixture's raw partition (`tests/fixtures/kafka/kafka-2.4-c2/raw`).

Usage (the tree before a change in a worktree, e.g. `git worktree add /tmp/base HEAD`):

    .venv/bin/python bench/identity.py --code /tmp/base --out /tmp/before.json
    .venv/bin/python bench/identity.py --out /tmp/after.json
    .venv/bin/python bench/identity.py --compare /tmp/before.json /tmp/after.json [--ignore bytes_read]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOW_MS = 1_900_000_000_000  # later than every input's timestamps: every horizon may pass
TIMINGS = {"elapsed_s", "survey_s", "index_s", "recopy_s", "directory"}
RANDOM_LOGS = 60


def _digests(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.name.endswith(".lock"):
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _round_facts(result) -> dict:
    facts = result.as_dict()
    return {k: v for k, v in facts.items() if k not in TIMINGS}


def _random_cases(data: Path, work: Path, manifest: dict) -> None:
    from tests.cleaner.builders import DAY_MS, T0, clean, random_log

    variants = {
        "defaults": [{}],
        "zero-retention-twice": [{"delete.retention.ms": 0}, {"delete.retention.ms": 0}],
        "tiny-map": [{}],
    }
    for seed in range(RANDOM_LOGS):
        src = data / "random" / f"s{seed}" / "t-0"
        if not src.exists():
            random_log(src, seed, batches_max=60, offset_gap=3 if seed % 3 == 0 else 0)
        for name, passes in variants.items():
            run = work / f"random-{seed}-{name}" / "t-0"
            shutil.copytree(src, run)
            rounds = []
            for settings in passes:
                kwargs = {"map_bytes": 24 * 6} if name == "tiny-map" else {}
                now = T0 + 2 * DAY_MS
                for _ in range(8 if name == "tiny-map" else 1):
                    result = clean(run, now_ms=now, settings=settings, **kwargs)
                    rounds.append(_round_facts(result))
                    if result.done:
                        break
            manifest[f"random-{seed}-{name}"] = {"files": _digests(run), "rounds": rounds}
            shutil.rmtree(run.parent)


def _cli_cases(data: Path, work: Path, manifest: dict, scale: float) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from workloads import generate  # bench/workloads.py of this tree

    for name in ("W1", "W2", "W3", "W4"):
        src = data / f"{name}-{scale}"
        if not src.exists():
            generate(name, src, scale=scale)
        part = next(p for p in src.iterdir() if p.is_dir())
        for label, dedupe in (("big-map", 64 << 20), ("small-map", 24 * 20_000)):
            run = work / f"{name}-{label}"
            shutil.copytree(part, run / part.name)
            manifest[f"{name}-{label}"] = _cli_clean(run / part.name, dedupe)
            shutil.rmtree(run)
    fixture = ROOT / "tests" / "fixtures" / "kafka" / "kafka-2.4-c2" / "raw"
    if fixture.exists():
        run = work / "kafka-2.4" / "c2-0"  # the fixture is one partition's files
        shutil.copytree(fixture, run)
        manifest["kafka-2.4"] = _cli_clean(run, 64 << 20, policy=True)
        shutil.rmtree(run.parent)


def _cli_clean(part: Path, dedupe: int, policy: bool = False) -> dict:
    cmd = [sys.executable, "-m", "cleaner.cli", "clean", str(part), "--json", "--now-ms", str(NOW_MS),
           "--set", f"log.cleaner.dedupe.buffer.size={dedupe}"]
    if policy:
        cmd += ["--set", "cleanup.policy=compact"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    facts = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            facts.append({k: v for k, v in json.loads(line).items() if k not in TIMINGS})
    return {"rc": proc.returncode, "rounds": facts, "files": _digests(part)}


def _drop(manifest: dict, keys: set[str]) -> dict:
    for case in manifest.values():
        for facts in case.get("rounds", []):
            for key in keys:
                facts.pop(key, None)
    return manifest


def _compare(a: Path, b: Path, ignore: set[str]) -> int:
    left, right = _drop(json.loads(a.read_text()), ignore), _drop(json.loads(b.read_text()), ignore)
    differ = 0
    for case in sorted(set(left) | set(right)):
        if left.get(case) != right.get(case):
            differ += 1
            print(f"differs: {case}")
            la, rb = left.get(case, {}), right.get(case, {})
            for key in sorted(set(la) | set(rb)):
                if la.get(key) != rb.get(key):
                    print(f"  {key}: {json.dumps(la.get(key))[:300]} != {json.dumps(rb.get(key))[:300]}")
    files = sum(len(v.get("files", {})) for v in left.values())
    print(f"{len(left)} cases, {files} files: {'identical' if not differ else f'{differ} cases differ'}")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", type=Path, help="the tree whose cleaner runs (default: this one)")
    parser.add_argument("--out", type=Path, help="where the manifest is written")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "bench" / "data" / "identity")
    parser.add_argument("--scale", type=float, default=0.05)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--ignore", default="", help="round counters left out of --compare, comma-separated "
                        "(for a change that alters a counter on purpose, e.g. bytes_read; files are always compared)")
    args = parser.parse_args()
    if args.compare:
        return _compare(*args.compare, {k for k in args.ignore.split(",") if k})
    if not args.out:
        parser.error("--out is needed (or --compare)")
    if args.code and args.code.resolve() != ROOT:
        # Run this very script against the other tree's packages (its own bench/workloads.py and builders).
        env = dict(os.environ, PYTHONPATH=str(args.code.resolve()), LOGCLEANER_IDENTITY_ROOT=str(args.code.resolve()))
        cmd = [sys.executable, __file__, "--out", str(args.out.resolve()), "--data-dir", str(args.data_dir.resolve()),
               "--scale", str(args.scale)]
        return subprocess.run(cmd, env=env, cwd=args.code).returncode
    args.data_dir.mkdir(parents=True, exist_ok=True)
    manifest: dict = {}
    with tempfile.TemporaryDirectory(dir=args.data_dir) as tmp:
        _random_cases(args.data_dir, Path(tmp), manifest)
        _cli_cases(args.data_dir, Path(tmp), manifest, args.scale)
    args.out.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    files = sum(len(v.get("files", {})) for v in manifest.values())
    print(f"{len(manifest)} cases, {files} files -> {args.out}")
    return 0


if __name__ == "__main__":
    if os.environ.get("LOGCLEANER_IDENTITY_ROOT"):
        ROOT = Path(os.environ["LOGCLEANER_IDENTITY_ROOT"])
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
