"""The README's Layout section matches the tree: every module and top-level folder it names
exists, and every module of the package is named there."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def layout_block() -> str:
    text = (REPO / "README.md").read_text()
    m = re.search(r"## Layout\n\n```\n(.*?)```", text, re.S)
    assert m, "README.md has no Layout section with a code block"
    return m.group(1)


def test_every_named_path_exists():
    block = layout_block()
    tops = [line.split()[0] for line in block.splitlines() if line and not line.startswith(" ")]
    for top in tops:
        assert (REPO / top).exists(), f"README Layout names {top}, which does not exist"
    for line in block.splitlines():
        if line.startswith("  ") and line.split():
            name = line.split()[0]
            assert (REPO / "podracer_hpc" / name).exists(), f"README Layout names podracer_hpc/{name}: missing"


def test_every_module_and_subpackage_is_named():
    block = layout_block()
    named = {line.split()[0] for line in block.splitlines() if line.startswith("  ") and line.split()}
    pkg = REPO / "podracer_hpc"
    modules = {p.name for p in pkg.glob("*.py") if p.name != "__init__.py"}
    subpackages = {f"{p.name}/" for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    covered = named | {n.split("/")[0] + "/" for n in named if "/" in n}
    missing = sorted((modules | subpackages) - covered)
    assert not missing, f"README Layout does not mention: {missing}"
