"""The README's quickstart is exactly two commands, and .ci/run runs the second one verbatim;
its measured figures name results files that exist and hold those figures."""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quickstart_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S)]


def test_quickstart_has_exactly_two_commands():
    commands = quickstart_commands()
    assert len(commands) == 2
    assert all("\n" not in c for c in commands), "each quickstart command is one line"
    assert commands[0].endswith("kz up")
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    test_command = quickstart_commands()[1]
    assert test_command in (ROOT / ".ci/run").read_text(encoding="utf-8")


def measured_figures_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.split("## Measured figures", 1)[1].split("\n## ", 1)[0]


def result_numbers() -> set[int]:
    """Every number in the committed benchmark results, rounded to an integer."""
    found: set[int] = set()

    def walk(value) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found.add(round(value))

    for path in (ROOT / "benchmarks" / "results").rglob("*.json"):
        walk(json.loads(path.read_text(encoding="utf-8")))
    return found


def test_every_results_file_the_readme_names_exists():
    section = measured_figures_section()
    results = ROOT / "benchmarks" / "results"
    named = set(re.findall(r"`([\w.-]+\.(?:json|txt|md))`", section))  # bare names live in results/
    named |= {m for m in re.findall(r"`(benchmarks/results/[\w./-]+)`", section)}
    assert named, "the section names its results files"
    for name in sorted(named):
        path = ROOT / name if name.startswith("benchmarks/") else results / name
        assert path.exists(), name


def test_every_script_the_readme_quotes_exists():
    for script in set(re.findall(r"`(\w+\.py)`", measured_figures_section())):
        assert (ROOT / "benchmarks" / script).is_file(), script


def test_every_large_figure_of_the_readme_is_in_the_results():
    """Figures like 27,535 or 3,185 must be values some committed results file holds."""
    numbers = result_numbers()
    quoted = {int(n.replace(",", "")) for n in re.findall(r"\b\d{1,3}(?:,\d{3})+\b", measured_figures_section())}
    assert quoted, "the section quotes figures"
    missing = sorted(n for n in quoted if n not in numbers)
    assert not missing, f"README figures not in benchmarks/results: {missing}"
