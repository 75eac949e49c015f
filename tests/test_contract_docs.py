"""docs/kernel_package_format.md is generated from the schemas and is never stale."""
from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

import kz_schemas
from kz_daemon.cli import main
from kz_runner.contract.codes import CODES
from kz_runner.tools.docgen import render

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "kernel_package_format.md"


def test_committed_reference_is_current(capsys):
    """Fails while the committed file is stale: run `kz docs` and commit docs/kernel_package_format.md."""
    assert main(["docs", "--check", "--out", str(DOC)]) == 0, capsys.readouterr().err


def test_every_schema_and_code_is_documented():
    text = render()
    for name in kz_schemas.names():
        assert f"`schemas/{name}.json`" in text
    for code in CODES:
        assert f"| `{code}` |" in text
    assert "| `cases[].metrics_best.<name>.commit_sha` | string | yes | pattern `^[0-9a-f]{7,40}$` |" in text


def test_new_schema_appears_without_code_changes():
    extra = {"zeta": {"title": "Zeta", "type": "object", "required": ["a"],
                      "properties": {"a": {"type": "string", "enum": ["x|y"], "description": "A | pipe."}}}}
    text = render(extra)
    assert "## zeta: Zeta" in text
    assert "| `a` | string | yes | one of `x\\|y` | A \\| pipe. |" in text


def test_check_detects_a_stale_file_and_write_repairs_it(tmp_path, capsys):
    out = tmp_path / "fmt.md"
    assert main(["docs", "--check", "--out", str(out)]) == 1  # missing
    assert main(["docs", "--out", str(out)]) == 0
    assert main(["docs", "--check", "--out", str(out)]) == 0
    out.write_text(out.read_text().replace("desc.yaml", "desk.yaml", 1))
    assert main(["docs", "--check", "--out", str(out)]) == 1
    assert "stale" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["desc", "bench_result", "test_case_meta", "benchmark_output", "index"])
def test_package_schemas_are_valid_and_describe_every_property(name):
    schema = kz_schemas.load(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    missing = []

    def walk(node, path):
        if isinstance(node, dict):
            for key, sub in (node.get("properties") or {}).items():
                if not isinstance(sub, dict) or not sub.get("description"):
                    missing.append(f"{path}.{key}")
            for key, sub in node.items():
                walk(sub, f"{path}.{key}")
        elif isinstance(node, list):
            for index, sub in enumerate(node):
                walk(sub, f"{path}[{index}]")

    walk(schema, name)
    assert missing == []
