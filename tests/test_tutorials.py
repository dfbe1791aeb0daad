"""Every tutorial notebook executes top to bottom without error.

The auto-tuning tutorial tunes 256^3 kernels for dozens of trials, minutes on a 2-core machine:
as written it runs with ``-m slow``; CI runs every one of its cells on smaller sizes and
budgets (`QUICK`), which exercises the same calls (tune, resume, plot, template, export,
load) and the same correctness checks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "tutorials").glob("*.ipynb"))

# notebook -> (pattern, replacement) applied to its code cells; every pattern must match, so a
# tutorial edit that breaks the quick variant fails here instead of silently running as written
QUICK: dict[str, list[tuple[str, str]]] = {
    "02_auto_tuning.ipynb": [
        (r"\bN = 256\b", "N = 64"),
        (r"\btrials=(32|48|16)\b", "trials={}"),  # 32 -> 8, 48 -> 16, 16 -> 8 (in order)
        (r"_256_256_256\b", "_64_64_64"),  # exported kernel names carry the sizes
    ],
}
QUICK_TRIALS = {"32": "8", "48": "16", "16": "8"}


def _execute(nb: nbformat.NotebookNode, path: Path) -> None:
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.name in QUICK else p
                                  for p in NOTEBOOKS], ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path) -> None:
    _execute(nbformat.read(str(path), as_version=4), path)


def _shrink(source: str, pattern: str, repl: str) -> tuple[str, int]:
    if "{}" in repl:
        return re.subn(pattern, lambda m: repl.format(QUICK_TRIALS[m.group(1)]), source)
    return re.subn(pattern, repl, source)


@pytest.mark.parametrize("name", sorted(QUICK))
def test_notebook_runs_quick(name: str) -> None:
    path = next(p for p in NOTEBOOKS if p.name == name)
    nb = nbformat.read(str(path), as_version=4)
    hits = dict.fromkeys((pat for pat, _ in QUICK[name]), 0)
    for cell in nb.cells:
        if cell.cell_type == "code":
            for pat, repl in QUICK[name]:
                cell.source, n = _shrink(cell.source, pat, repl)
                hits[pat] += n
    missing = [pat for pat, n in hits.items() if not n]
    assert not missing, f"{name} changed: update QUICK in {__file__} ({missing} match nothing)"
    _execute(nb, path)
