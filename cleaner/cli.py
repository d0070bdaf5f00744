"""The `logcleaner` command line: thin click glue over the library.

Owns argument parsing, printing and exit codes only; every command calls into `segments/`,
`offsetmap/` or `cleaner/`. Library errors become one-line messages here and nowhere else.
Exit codes: 0 success, 1 a problem with the data (verify found problems, a partition failed), 2 usage.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import click

from segments.errors import SegmentError

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="logcleaner")
def main() -> None:
    """Compaction engine for Kafka-format log segment files."""


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--deep-iteration", is_flag=True, help="Print every record, not just batch headers.")
@click.option("--print-data-log", is_flag=True, help="Print keys and values (implies --deep-iteration).")
@click.option("--index-sanity-check", is_flag=True, help="For index files: only check them and report.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def dump(files: tuple[Path, ...], deep_iteration: bool, print_data_log: bool, index_sanity_check: bool, as_json: bool) -> None:
    """Print the batches and records of .log files, or the entries of .index/.timeindex/.txnindex files."""
    from segments.dump import dump_file, format_entry

    failed = False
    for path in files:
        try:
            for entry in dump_file(
                path, deep_iteration=deep_iteration, print_data=print_data_log, index_sanity_check=index_sanity_check
            ):
                click.echo(json.dumps(entry) if as_json else format_entry(entry))
                if entry["type"] == "sanity" and not entry["passed"]:
                    failed = True
        except (SegmentError, ValueError) as exc:
            click.echo(f"error: {exc}", err=True)
            failed = True
    sys.exit(1 if failed else 0)


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of text.")
def verify(paths: tuple[Path, ...], as_json: bool) -> None:
    """Check CRCs, framing, offsets, indexes and leftover files of log dirs, partition dirs or segment files.

    Exit 1 with one line per problem (file and byte position) if anything is wrong.
    """
    from segments.verify import verify_paths

    summary = verify_paths(list(paths))
    if as_json:
        click.echo(
            json.dumps(
                {
                    "partitions": summary.partitions,
                    "segments": summary.segments,
                    "batches": summary.batches,
                    "records": summary.records,
                    "bytes": summary.bytes,
                    "problems": [str(p) for p in summary.problems],
                }
            )
        )
    else:
        for problem in summary.problems:
            click.echo(str(problem))
        status = "OK" if not summary.problems else f"{len(summary.problems)} problem(s)"
        click.echo(
            f"{status}: {summary.partitions} partition(s), {summary.segments} segment(s), "
            f"{summary.batches} batches, {summary.records} records, {summary.bytes} bytes",
            err=bool(summary.problems),
        )
    sys.exit(1 if summary.problems else 0)


@main.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("demo-logs"),
              show_default=True, help="Log directory to create (replaced if it exists).")
@click.option("--records", default=50_000, show_default=True, help="Records per partition.")
@click.option("--keys", default=2_000, show_default=True, help="Distinct keys per partition.")
@click.option("--partitions", default=2, show_default=True, help="Partitions of topic 'demo'.")
def demo(directory: Path, records: int, keys: int, partitions: int) -> None:
    """Generate a demo log directory of keyed records, then verify it and show what it holds."""
    from segments.generate import WorkloadSpec, generate_partition
    from segments.verify import verify_paths

    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    for p in range(partitions):
        spec = WorkloadSpec(records=records, keys=keys, tombstone_fraction=0.05, seed=p)
        counts = generate_partition(directory / f"demo-{p}", spec)
        click.echo(
            f"wrote demo-{p}: {counts['records']} records, {counts['keys']} keys, "
            f"{counts['tombstones']} tombstones in {counts['batches']} batches"
        )
    summary = verify_paths([directory])
    for problem in summary.problems:
        click.echo(str(problem))
    click.echo(
        f"{directory}: {summary.partitions} partitions, {summary.segments} segments, {summary.records} records, "
        f"{summary.bytes / 1e6:.2f} MB; verify: {'OK' if not summary.problems else 'FAILED'}"
    )
    sys.exit(1 if summary.problems else 0)
