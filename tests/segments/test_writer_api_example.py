"""The writer API example of docs/design.md runs as written (with its directory moved under a temporary path)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def test_the_documented_writer_example_runs_and_prints_what_it_says(tmp_path):
    text = DESIGN.read_text()
    marker = text.index("<!-- writer-api-example")
    code = re.search(r"```python\n(.*?)```", text[marker:], re.S).group(1)
    code = code.replace("/var/lib/logs", str(tmp_path))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DESIGN), "exec"), {})
    assert out.getvalue().splitlines() == [
        "3",
        "0 b'alice' b'{\"plan\": \"pro\"}'",
        "1 b'bob' b'{\"plan\": \"free\"}'",
        "2 b'alice' None",
    ]
