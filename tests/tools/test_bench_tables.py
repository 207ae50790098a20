"""benchmarks/README.md's current tables (benchmarks/readme_tables.py, benchmarks/update_readme.py):
each marked table is well formed, says on what machine, when, at which commit and by which command
it was measured, and is what its script prints from the committed results file. No benchmark runs."""
import re
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(SOURCE / "benchmarks"))
import update_readme  # noqa: E402

README = (SOURCE / "benchmarks" / "README.md").read_text()
PROVENANCE = [r"- Machine: \S", r"- Date: \d{4}-\d{2}-\d{2}", r"- Commit: \S", r"- Command: `[^`]+`$"]


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def markdown_tables(body):
    """Each run of lines starting with '|' in the body, as lists of lines."""
    found, current = [], []
    for line in body.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append(current)
            current = []
    return found


def test_every_script_table_is_marked_once():
    marked = update_readme.tables(README)
    assert set(marked) == set(update_readme.TABLES), \
        f"marked in the README: {sorted(marked)}; known to update_readme.py: {sorted(update_readme.TABLES)}"
    opening = re.findall(r"^<!-- table: [a-z0-9_]+ -->$", README, re.M)
    assert len(opening) == len(re.findall(r"^<!-- /table -->$", README, re.M)) == len(marked)


def test_each_table_says_where_it_came_from():
    for name, body in update_readme.tables(README).items():
        lines = body.splitlines()
        for pattern, line in zip(PROVENANCE, lines[:4]):
            assert re.match(pattern, line), f"table {name}: expected a line matching {pattern!r}, got {line!r}"
        assert len(lines) > 5 and lines[4] == "", f"table {name}: a blank line after the provenance"


def test_each_table_is_well_formed():
    for name, body in update_readme.tables(README).items():
        tables = markdown_tables(body)
        assert tables, f"table {name} holds no markdown table"
        for t in tables:
            width = len(cells(t[0]))
            assert len(t) >= 3, f"table {name}: a header, a separator and at least one row: {t}"
            assert all(re.fullmatch(r"-{3,}:?", c) for c in cells(t[1])), f"table {name}: bad separator {t[1]!r}"
            for line in t[1:]:
                assert len(cells(line)) == width, f"table {name}: {len(cells(line))} cells, header has {width}: {line!r}"


def test_each_table_is_its_results_file():
    for name in update_readme.TABLES:
        assert update_readme.tables(README)[name] == update_readme.generated(name), \
            f"benchmarks/README.md's table {name} is stale: run python3 benchmarks/update_readme.py {name}"


def test_replace_puts_a_block_between_its_markers_only():
    text = "a\n<!-- table: x -->\nold\n<!-- /table -->\nb\n<!-- table: y -->\nkeep\n<!-- /table -->\n"
    out = update_readme.replace(text, "x", "new")
    assert out == "a\n<!-- table: x -->\nnew\n<!-- /table -->\nb\n<!-- table: y -->\nkeep\n<!-- /table -->\n"
