"""docs/sites.md carries the key reference generated from the profile definition; keep them in step."""

from __future__ import annotations

import os
import re
from pathlib import Path

from submission_helpers import reference_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "sites.md"
BLOCK = re.compile(r"(<!-- keys:begin -->\n)(.*?)(<!-- keys:end -->)", re.S)


def test_sites_md_key_reference_is_generated_from_the_definition():
    text = DOC.read_text()
    match = BLOCK.search(text)
    assert match, "docs/sites.md lost its <!-- keys:begin/end --> markers"
    if os.environ.get("HPCVOD_REGEN_GOLDEN") == "1":
        DOC.write_text(text[:match.start(2)] + reference_markdown() + text[match.end(2):])
        text = DOC.read_text()
        match = BLOCK.search(text)
    assert match.group(2) == reference_markdown(), "regenerate with HPCVOD_REGEN_GOLDEN=1"
