"""``build_manifest.json``: generation parameters and the sha256 of every file built.

build_test_env.py scripts call :func:`write_build_manifest` last. The output is
deterministic (sorted keys and paths, no timestamps), so two builds of the same
package produce byte-identical manifests, which ``kz dry-run`` checks.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BUILT_FOLDERS = ("inputs", "expected", "build")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_build_manifest(
    workdir: str | Path,
    *,
    seed: int,
    test_cases: Mapping[str, Mapping[str, Any]],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Hash every file under inputs/, expected/ and build/ and write build_manifest.json.

    ``test_cases`` maps each case id to its parameters; each case lists the files
    whose name starts with ``<case>_``. Returns the manifest written.
    """
    root = Path(workdir)
    files: dict[str, str] = {}
    for folder in BUILT_FOLDERS:
        base = root / folder
        if base.is_dir():
            for path in sorted(p for p in base.rglob("*") if p.is_file()):
                files[path.relative_to(root).as_posix()] = sha256_file(path)
    cases = {}
    for case_id in sorted(test_cases):
        prefix = f"{case_id}_"
        cases[case_id] = {
            "params": dict(test_cases[case_id]),
            "files": {k: v for k, v in files.items() if Path(k).name.startswith(prefix)},
        }
    manifest: dict[str, Any] = {"seed": seed, "test_cases": cases, "files": files}
    if extra:
        manifest.update(dict(extra))
    text = json.dumps(manifest, indent=2, sort_keys=True, allow_nan=False) + "\n"
    (root / "build_manifest.json").write_text(text, encoding="utf-8")
    return manifest
