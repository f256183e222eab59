"""The docs cannot drift from the code: every message docs/troubleshooting.md quotes still exists in the source."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_quoted_error_message_still_exists_in_the_code():
    doc = (ROOT / "docs" / "troubleshooting.md").read_text()
    quoted = re.findall(r"^### `(.+)`$", doc, flags=re.MULTILINE)
    assert len(quoted) >= 20
    source = "\n".join(p.read_text() for p in (ROOT / "asyncrl").rglob("*.py"))
    missing = [q for q in quoted if q not in source]
    assert not missing, f"docs/troubleshooting.md quotes messages the code no longer has: {missing}"
