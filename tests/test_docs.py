"""The README and docs/ say what the code does: the pages cannot drift from the app, the settings or each other.

* README.md is a front door: at most 10 KiB, it keeps the test command `.ci/run` runs, and its map links every
  page of docs/ (and only pages that exist);
* every relative link of the README and docs/ reaches an existing file, and a `#anchor` a heading of it;
* docs/cli.md against the click app (`cleaner.cli.main`): every command has a `## \\`logcleaner <command>\\``
  section naming every spelling of every option and every value of a choice; conversely every `logcleaner
  <command>` and every flag the page names in code exists (a flag in a command's section, or after `logcleaner
  <command>` in one code span, belongs to that command);
* docs/configuration.md against the code: every setting accepted (`cleaner.settings.BROKER_SETTINGS`,
  `TOPIC_SETTINGS`, the daemon's `[server]` keys `cleaner.daemon.SERVER_DEFAULTS`) is a row of a `| setting |`
  table with the code's default, a topic setting's row names its broker synonym, every row names a setting the
  code accepts, and every `LOGCLEANER_*` environment variable the code reads has a row;
* docs/operations.md names every metric of `cleaner/metrics.py`'s table and every alert of the shipped rules,
  and nothing else;
* every repository file a page names in code (`tests/...`, `cleaner/....py`, ...) exists.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_BYTES_MAX = 10 * 1024

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
LONG_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
SHORT_FLAG = re.compile(r"(?<![\w-])-[a-zA-Z](?![\w-])")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def without_fences(text: str) -> str:
    return FENCE.sub("", text)


def code_snippets(text: str) -> list[str]:
    """The inline code spans and the fenced blocks of `text`."""
    blocks = FENCE.findall(text)
    return blocks + CODE_SPAN.findall(FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in without_fences(path.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def sections(path: Path) -> dict[str, str]:
    """The text under each `## ` heading (fences kept), keyed by the heading; '' is the text before the first."""
    out: dict[str, str] = {}
    title = ""
    lines: list[str] = []
    in_fence = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if not in_fence and line.startswith("## "):
            out[title] = "\n".join(lines)
            title, lines = line[3:].strip(), []
        else:
            lines.append(line)
    out[title] = "\n".join(lines)
    return out


def mentions(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


# ---- README ---------------------------------------------------------------------------------------------------


def test_the_readme_is_a_front_door_of_at_most_10_kib():
    size = README.stat().st_size
    assert size <= README_BYTES_MAX, f"README.md is {size} bytes; move detail into docs/ (at most {README_BYTES_MAX})"


def test_the_readme_keeps_the_test_command_that_ci_runs():
    command = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/python -m pytest"
    assert f"\n{command}\n" in README.read_text()
    assert f"\n{command}\n" in (ROOT / ".ci" / "run").read_text()
    assert "## Set-up: the two commands" in README.read_text()


def test_the_readme_map_links_every_page_of_docs_and_only_pages_that_exist():
    linked = {target.split("#")[0] for target in LINK.findall(README.read_text())}
    linked_docs = {t for t in linked if t.startswith("docs/") and t.endswith(".md")}
    assert linked_docs, "the README links no page of docs/"
    assert sorted(t for t in linked_docs if not (ROOT / t).is_file()) == []
    assert sorted(f"docs/{p.name}" for p in DOCS.glob("*.md") if f"docs/{p.name}" not in linked_docs) == []


def test_every_relative_link_reaches_a_file_and_its_anchor():
    broken = []
    for page in pages():
        for target in LINK.findall(without_fences(page.read_text())):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                broken.append(f"{page.name}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.name}: {target}: no heading with that anchor in {dest.name}")
    assert broken == []


def test_the_pages_name_only_repository_files_that_exist():
    prefixes = ("tests/", "cleaner/", "segments/", "offsetmap/", "bench/", "deploy/", "docs/", ".ci/")
    ignored = set((ROOT / ".gitignore").read_text().split())  # bench/data/: made by a benchmark run
    missing = []
    for page in pages():
        for snippet in CODE_SPAN.findall(without_fences(page.read_text())):
            for word in snippet.split():
                word = word.rstrip(".,;:)")
                if word.startswith(prefixes) and re.fullmatch(r"[\w./-]+", word) and word not in ignored:
                    if not (ROOT / word).exists():
                        missing.append(f"{page.name}: {word}")
    assert missing == []


def test_the_pages_write_decisions_as_the_projects():
    for page in pages():
        text = without_fences(page.read_text())
        assert not re.search(r"\bthe lead\b|\blead's\b", text, re.I), page.name
        assert not re.search(r"(?<![`\w])I(?= (?:am|have|think|decided|chose|want|prefer)\b)|\bI'(?:m|ve|d)\b",
                             text), page.name


# ---- docs/cli.md against the click app ------------------------------------------------------------------------


def app():
    from cleaner.cli import main

    return main


def commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    """Every command of the app, by its name after `logcleaner` (`admin`, or `group sub` when nested)."""
    out = {}
    for name, command in group.commands.items():
        out[prefix + name] = command
        if isinstance(command, click.Group):
            out.update(commands(command, prefix + name + " "))
    return out


def spellings(param: click.Parameter) -> list[str]:
    return [*param.opts, *getattr(param, "secondary_opts", [])]


def help_spellings() -> set[str]:
    """`-h` and `--help`, which the group's context settings give every command."""
    return set(app().context_settings.get("help_option_names", ["--help"]))


def flags_of(command: click.Command) -> set[str]:
    return {s for p in command.params if isinstance(p, click.Option) for s in spellings(p)} | help_spellings()


CLI = DOCS / "cli.md"


def cli_sections() -> dict[str, str]:
    """The section of cli.md of each command, by its name after `logcleaner`."""
    out = {}
    for title, text in sections(CLI).items():
        m = re.fullmatch(r"`logcleaner ([\w -]+?)`", title)
        if m:
            out[m.group(1)] = text
    return out


def test_every_command_of_the_app_has_a_section_of_cli_md_and_every_section_a_command():
    documented = cli_sections()
    assert sorted(set(commands(app())) - set(documented)) == []
    assert sorted(set(documented) - set(commands(app()))) == []


@pytest.mark.parametrize("name", sorted(commands(app())))
def test_every_option_and_choice_of_a_command_is_in_its_section(name):
    command = commands(app())[name]
    text = cli_sections()[name]
    missing = []
    for param in command.params:
        if isinstance(param, click.Option):
            missing += [s for s in spellings(param) if not mentions(text, s)]
        if isinstance(param.type, click.Choice):
            missing += [f"{param.name}={c}" for c in param.type.choices if not mentions(text, str(c))]
    assert missing == [], f"docs/cli.md, `logcleaner {name}` does not name these"


def test_the_options_of_logcleaner_itself_are_in_the_rules_every_command_follows():
    general = sections(CLI)["Rules every command follows"]
    group = app()
    missing = [s for p in group.params if isinstance(p, click.Option) for s in spellings(p) if not mentions(general, s)]
    missing += [s for s in help_spellings() if not mentions(general, s)]
    assert missing == []


INVOCATION = re.compile(r"(?m)(?:^\s*(?:\$\s+)?|[|;&(]\s*)logcleaner ([a-z][\w-]*)")


def test_every_command_and_flag_cli_md_names_exists():
    known = commands(app())
    unknown = []
    for title, text in sections(CLI).items():
        m = re.fullmatch(r"`logcleaner ([\w -]+?)`", title)
        section_command = m.group(1) if m else None
        for snippet in code_snippets(text):
            # flags after `logcleaner <command>` belong to that command; flags before it to the section's command
            # (outside a command's section they are prose: `set -o pipefail`, `--help`)
            invocations = list(INVOCATION.finditer(snippet))
            pieces = [(section_command, snippet[: invocations[0].start() if invocations else len(snippet)])]
            for i, inv in enumerate(invocations):
                end = invocations[i + 1].start() if i + 1 < len(invocations) else len(snippet)
                pieces.append((inv.group(1), snippet[inv.end():end]))
            for owner, piece in pieces:
                if owner is None:
                    continue
                if owner not in known:
                    unknown.append(f"{title or 'the introduction'}: logcleaner {owner} is not a command")
                    continue
                for flag in LONG_FLAG.findall(piece) + SHORT_FLAG.findall(piece):
                    if flag not in flags_of(known[owner]) | group_flags():
                        unknown.append(f"{title}: {flag} is not an option of logcleaner {owner}")
    assert unknown == []


def group_flags() -> set[str]:
    return {s for p in app().params if isinstance(p, click.Option) for s in spellings(p)} | help_spellings()


# ---- docs/configuration.md against the settings the code accepts -------------------------------------------------

CONFIGURATION = DOCS / "configuration.md"


def table_rows(path: Path, first_header: str) -> list[list[str]]:
    """The rows (cells stripped) of every table of `path` whose header's first cell is `first_header`."""
    rows: list[list[str]] = []
    table = None  # None: not in a table; else whether it is one of the wanted tables
    for line in without_fences(path.read_text()).splitlines():
        if not line.startswith("|"):
            table = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if table is None:
            table = cells[0] == first_header
        elif table and not set(line.strip()) <= set("|-: "):
            rows.append(cells)
    return rows


def backticked(cell: str) -> list[str]:
    return CODE_SPAN.findall(cell)


def accepted_settings() -> dict[str, object]:
    """Every setting name the code accepts, with its default."""
    from cleaner.daemon import SERVER_DEFAULTS
    from cleaner.settings import BROKER_SETTINGS, TOPIC_SETTINGS

    out: dict[str, object] = {name: s.default for name, s in BROKER_SETTINGS.items()}
    out.update({name: s.default for name, (s, _synonym) in TOPIC_SETTINGS.items()})
    out.update(SERVER_DEFAULTS)
    return out


def documented_settings() -> dict[str, list[str]]:
    rows = table_rows(CONFIGURATION, "setting")
    assert rows, "docs/configuration.md has no | setting | table"
    out = {}
    for cells in rows:
        names = backticked(cells[0])
        assert len(names) == 1, f"a settings row names one setting first: {cells[0]}"
        out[names[0]] = cells
    return out


def test_every_setting_the_code_accepts_is_in_configuration_md():
    assert sorted(set(accepted_settings()) - set(documented_settings())) == []


def test_every_setting_configuration_md_names_is_accepted_by_the_code():
    assert sorted(set(documented_settings()) - set(accepted_settings())) == []


def default_spellings(value: object) -> list[str]:
    if value is None:
        return ["unset", "none"]
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, float):
        return [repr(value), repr(value).replace("e+", "e"), f"{value:g}"]
    if isinstance(value, (list, tuple)):
        return [",".join(value)]
    return [str(value)]


def test_configuration_md_gives_each_setting_the_codes_default():
    documented = documented_settings()
    wrong = []
    for name, default in accepted_settings().items():
        if name not in documented:
            continue  # test_every_setting_the_code_accepts_is_in_configuration_md says so
        cells = documented[name]
        default_cell = cells[2] if name in topic_synonyms() else cells[1]
        if not any(s in default_cell for s in default_spellings(default)):
            wrong.append(f"{name}: the code's default is {default!r}, the page says {default_cell!r}")
    assert wrong == []


def topic_synonyms() -> dict[str, str | None]:
    from cleaner.settings import TOPIC_SETTINGS

    return {name: synonym for name, (_s, synonym) in TOPIC_SETTINGS.items()}


def test_configuration_md_names_each_topic_settings_broker_synonym():
    documented = documented_settings()
    wrong = [f"{name}: {synonym}" for name, synonym in topic_synonyms().items()
             if synonym is not None and name in documented and backticked(documented[name][1]) != [synonym]]
    assert wrong == []


def test_every_environment_variable_the_code_reads_is_in_configuration_md():
    variables = set()
    for package in ("cleaner", "segments", "offsetmap"):
        for source in (ROOT / package).rglob("*.py"):
            variables |= set(re.findall(r"[\"'](LOGCLEANER_[A-Z_]+)[\"']", source.read_text()))
    assert variables, "no LOGCLEANER_* variable found in the code"
    documented = {name for cells in table_rows(CONFIGURATION, "variable") for name in backticked(cells[0])}
    assert sorted(variables - documented) == []


# ---- docs/operations.md: metrics and alerts ----------------------------------------------------------------------

OPERATIONS = DOCS / "operations.md"


def test_operations_md_lists_every_metric_of_the_metrics_docstring_and_no_other():
    import cleaner.metrics

    def names(rows_text: str) -> set[str]:
        return set(re.findall(r"logcleaner_\w+(?:\{[\w,]+\})?", rows_text))

    in_code = set()
    for line in cleaner.metrics.__doc__.splitlines():
        if line.strip().startswith("| logcleaner_"):
            in_code |= names(line.split("|")[1])
    documented = set()
    for cells in table_rows(OPERATIONS, "metric"):
        documented |= names(cells[0])
    assert len(in_code) >= 20
    assert sorted(in_code - documented) == []
    assert sorted(documented - in_code) == []


def test_operations_md_says_what_to_do_about_every_shipped_alert_and_no_other():
    rules = (ROOT / "deploy" / "prometheus" / "logcleaner-alerts.yml").read_text()
    shipped = set(re.findall(r"- alert: (\w+)", rules))
    rows = table_rows(OPERATIONS, "alert")
    documented = {backticked(cells[0])[0] for cells in rows}
    assert shipped and sorted(shipped ^ documented) == []
    assert all(len(cells) == 3 and cells[1] and cells[2] for cells in rows), "each alert: what it means, what to do"
