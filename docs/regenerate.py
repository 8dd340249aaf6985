"""Re-run every command of docs/usage.md and paste its real output under it.

Usage (from the project root): ``python docs/regenerate.py [docs/usage.md]``

Each ```bash block is run with bash in one scratch folder (holding a copy of
``instances/amp_het_cluster.json``), in the page's order, so later commands see the files
earlier ones wrote; when the next block after it is an output block (``` / ```json /
```text), that block is replaced with what the command printed (stdout and stderr, in the
order a terminal shows them).  The page then says exactly what the current code prints.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\w*)\s*$")


def blocks(lines: list[str]):
    """(start, end, language) of every fenced block; end is the closing fence's index."""
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append((i, j, m.group(1)))
            i = j + 1
        else:
            i += 1
    return out


def main(path: str = "docs/usage.md") -> int:
    page = ROOT / path
    lines = page.read_text().split("\n")
    found = blocks(lines)
    replacements = {}
    with tempfile.TemporaryDirectory(prefix="amp_opt_docs_") as tmp:
        shutil.copy(ROOT / "instances" / "amp_het_cluster.json", tmp)
        for k, (start, end, lang) in enumerate(found):
            if lang != "bash":
                continue
            command = "\n".join(lines[start + 1:end])
            run = subprocess.run(["bash", "-c", command], cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, env={**__import__("os").environ, "COLUMNS": "130"})
            if k + 1 < len(found):
                nxt = found[k + 1]
                between = [line for line in lines[end + 1:nxt[0]] if line.strip()]
                if not between and nxt[2] != "bash" and nxt[2] != "python":
                    replacements[nxt] = run.stdout.rstrip("\n").split("\n")
    out, i = [], 0
    for (start, end, lang), text in sorted(replacements.items()):
        out += lines[i:start + 1] + text
        i = end
    out += lines[i:]
    page.write_text("\n".join(out))
    print(f"{path}: {len(replacements)} outputs regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
