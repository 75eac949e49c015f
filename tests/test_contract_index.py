"""The index: schema-valid, deterministic, and an incremental update equals a full rebuild."""
from __future__ import annotations

import json
import math
import shutil

import jsonschema
import pytest

import kz_schemas
from kz_daemon.cli import main
from kz_runner.contract.indexing.build import build_index, dumps, find_packages, update_index, write_index
from kz_runner.contract.indexing.cache import ContentsCache
from kz_runner.contract.schema_check import nonfinite_paths
from tests.helpers.contract_fixtures import NEWCOMER_ID, ROOT, copy_newcomer, mark_repo, write_package
from tests.test_contract_validate import RULES

A = "cpu/Elementwise/Axpy/fp32/a"
B = "cpu/Elementwise/Axpy/fp32/b"
BAD = "cpu/Elementwise/Axpy/fp32/broken"
ODD = "cpu/Reduce/Sum/fp32/odd"


@pytest.fixture
def repo(tmp_path):
    root = mark_repo(tmp_path / "repo")
    write_package(root, A, best=0.25, current=0.3, submitter="alice", sha="abcdef1")
    write_package(root, B, status="frozen", cases=("only",))
    broken = write_package(root, BAD)
    (broken / ".kernel_package" / "benchmark.py").unlink()
    write_package(root, ODD, category=("cpu", "Reduce", "Add", "fp32"))  # category mismatch: an error
    copy_newcomer(root)
    (root / ".git" / "objects" / "x" / ".kernel_package").mkdir(parents=True)  # never scanned
    return root


def by_id(doc):
    return {k["kernel_id"]: k for k in doc["kernels"]}


def test_index_matches_its_schema_and_content(repo):
    doc = build_index(repo, head="f" * 40)
    jsonschema.Draft202012Validator.check_schema(kz_schemas.load("index"))
    jsonschema.validate(doc, kz_schemas.load("index"))
    assert [k["kernel_id"] for k in doc["kernels"]] == sorted([A, B, BAD, ODD, NEWCOMER_ID])
    assert doc["head"] == "f" * 40 and doc["generated_at"] is None
    assert doc["counts"] == {"kernels": 5, "valid": 3, "invalid": 2, "frozen": 1, "deprecated": 0,
                             "with_warnings": 2, "cases": 8}  # the newcomer: HARNESS_NOT_JUDGED
    kernels = by_id(doc)
    case = kernels[A]["cases"][0]
    assert case == {"test_case_id": "small", "primary_metric": "latency_ms", "direction": "lower_better",
                    "unit": "ms", "correctness_current": "passed",
                    "best": {"value": 0.25, "submitter": "alice", "commit_sha": "abcdef1",
                             "recorded_at": "2026-08-02T00:00:00Z", "seed": False},
                    "current": {"value": 0.3, "submitter": "alice", "commit_sha": "abcdef1",
                                "recorded_at": "2026-08-02T00:00:00Z", "seed": False}}
    assert kernels[NEWCOMER_ID]["cases"][0]["best"]["seed"] is True
    assert kernels[BAD]["valid"] is False
    assert [p["code"] for p in kernels[BAD]["problems"]] == ["FILE_MISSING"]
    assert kernels[ODD]["valid"] is False  # the path decides the operator and the lane: a mismatch is an error
    assert [(p["code"], p["severity"]) for p in kernels[ODD]["problems"]] == [("CATEGORY_MISMATCH", "error")]
    assert [p["code"] for p in kernels[B]["problems"]] == ["STATUS_FROZEN"] and kernels[B]["status"] == "frozen"
    assert kernels[A]["category"] == {"arch": "cpu", "op_class": "Elementwise", "sub_class": "Axpy", "quant": "fp32"}


def test_same_repo_gives_byte_identical_json(repo, tmp_path):
    first = dumps(build_index(repo))
    other = mark_repo(tmp_path / "other")
    # the same packages written in a different order, at another path
    copy_newcomer(other)
    for kernel_id in (ODD, BAD, B, A):
        shutil.copytree(repo / kernel_id, other / kernel_id)
    assert dumps(build_index(repo)) == first == dumps(build_index(other))


def test_cache_gives_the_same_document(repo, tmp_path):
    plain = dumps(build_index(repo))
    cache = ContentsCache()
    assert dumps(build_index(repo, cache=cache)) == plain and cache.misses == 5
    cache.save(tmp_path / "cache.json")
    loaded = ContentsCache.load(tmp_path / "cache.json")
    assert dumps(build_index(repo, cache=loaded)) == plain
    assert loaded.hits == 5 and loaded.misses == 0
    (repo / A / ".kernel_package" / "desc.yaml").write_text("name: [\n")  # a change is a new key
    assert dumps(build_index(repo, cache=loaded)) == dumps(build_index(repo))
    assert loaded.misses == 1


def test_cache_from_another_validator_version_is_ignored(repo, tmp_path):
    path = tmp_path / "cache.json"
    cache = ContentsCache()
    build_index(repo, cache=cache)
    cache.save(path)
    data = json.loads(path.read_text())
    data["fingerprint"] = "0" * 64
    path.write_text(json.dumps(data))
    stale = ContentsCache.load(path)
    build_index(repo, cache=stale)
    assert stale.hits == 0
    path.write_text("{not json")
    assert ContentsCache.load(path).hits == 0


def _edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


CHANGES = [
    ("new best", [A], lambda r: _edit(r / A / ".kernel_package" / "bench_result.yaml", "value: 0.25", "value: 0.2")),
    ("made invalid", [A], lambda r: (r / A / ".kernel_package" / "desc.yaml").write_text("- x\n")),
    ("repaired", [BAD], lambda r: write_package(r, BAD)),
    ("removed", [B], lambda r: shutil.rmtree(r / B)),
    ("added", ["cpu/New/Op/fp32/x"], lambda r: write_package(r, "cpu/New/Op/fp32/x")),
    ("nested added", [A], lambda r: write_package(r / A / "src", "inner")),
    ("source removed", [A], lambda r: (r / A / "src" / "axpy.py").unlink()),
    ("package dir replaced by a plain dir holding packages", [B],
     lambda r: (shutil.rmtree(r / B), write_package(r, B + "/x"))),
]


@pytest.mark.parametrize("label,changed,change", CHANGES, ids=[c[0] for c in CHANGES])
def test_incremental_update_equals_full_rebuild(repo, label, changed, change):
    before = build_index(repo, head="1" * 40)
    snapshot = dumps(before)
    change(repo)
    incremental = update_index(before, repo, changed, head="2" * 40)
    full = build_index(repo, head="2" * 40)
    assert dumps(incremental) == dumps(full)
    assert dumps(before) == snapshot  # the old document is left alone
    jsonschema.validate(incremental, kz_schemas.load("index"))


def test_nested_packages_are_reported(repo):
    write_package(repo / A / "src", "inner")
    kernels = by_id(build_index(repo))
    assert "NESTED_PACKAGE" in [p["code"] for p in kernels[A]["problems"]]
    inner = kernels[A + "/src/inner"]
    assert inner["valid"] is False and "NESTED_PACKAGE" in [p["code"] for p in inner["problems"]]


def test_find_packages_skips_git_and_does_not_enter_packages(repo):
    write_package(repo / A / "src", "inner")
    assert find_packages(repo) == sorted([A, B, BAD, ODD, NEWCOMER_ID])


def test_write_index_is_atomic_and_replaces(repo, tmp_path):
    target = tmp_path / "out" / "index.json"
    write_index({"old": True}, target)
    doc = build_index(repo)
    write_index(doc, target)
    assert json.loads(target.read_text()) == doc
    assert sorted(p.name for p in target.parent.iterdir()) == ["index.json"]


def test_cli_honours_environment(repo, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERNEL_ZOO_KERNEL_REPO_PATH", str(repo))
    monkeypatch.setenv("KERNEL_ZOO_INDEX_PATH", str(tmp_path / "i.json"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert main(["index"]) == 0
    out = capsys.readouterr().out
    assert "5 kernel(s), 3 valid, 2 invalid" in out and f"invalid {BAD}: FILE_MISSING" in out
    assert f"invalid {ODD}: CATEGORY_MISMATCH" in out
    assert json.loads((tmp_path / "i.json").read_text()) == build_index(repo)
    assert list((tmp_path / "cache" / "kernel_zoo").iterdir())  # the cache was written
    # flags win over the environment; --json prints the document
    assert main(["index", "--repo", str(repo / "cpu"), "--out", str(tmp_path / "j.json"), "--json",
                 "--no-cache", "--head", "abc"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["head"] == "abc"
    assert [k["kernel_id"] for k in doc["kernels"]][:2] == ["Elementwise/Axpy/fp32/a", "Elementwise/Axpy/fp32/b"]


def test_cli_default_paths_are_cwd(repo, tmp_path, monkeypatch):
    monkeypatch.delenv("KERNEL_ZOO_KERNEL_REPO_PATH", raising=False)
    monkeypatch.delenv("KERNEL_ZOO_INDEX_PATH", raising=False)
    monkeypatch.chdir(repo)
    assert main(["index", "--no-cache"]) == 0
    assert json.loads((repo / "index.json").read_text())["counts"]["kernels"] == 5


def test_cli_usage_error(tmp_path, capsys):
    assert main(["index", "--repo", str(tmp_path / "missing"), "--no-cache"]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_parallel_build_equals_serial_and_fills_the_cache(tmp_path, monkeypatch):
    import kz_runner.contract.indexing.build as index_module

    root = mark_repo(tmp_path / "many")
    for i in range(12):
        write_package(root, f"cpu/Op{i % 3}/Sub/fp32/impl{i}", best=0.1 * (i + 1))
    write_package(root / "cpu/Op0/Sub/fp32/impl0/src", "nested")
    monkeypatch.setattr(index_module, "PARALLEL_MIN_PACKAGES", 2)
    serial = dumps(build_index(root))
    cache = ContentsCache()
    assert dumps(build_index(root, cache=cache, workers=2)) == serial
    assert cache.misses == 13
    cache.save(tmp_path / "c.json")
    again = ContentsCache.load(tmp_path / "c.json")
    assert dumps(build_index(root, cache=again, workers=2)) == serial and again.hits == 13


def test_parallel_counts_are_right_when_one_worker_runs_every_chunk(tmp_path, monkeypatch):
    import kz_runner.contract.indexing.build as index_module

    root = mark_repo(tmp_path / "many")
    for i in range(6):
        write_package(root, f"cpu/Op/Sub/fp32/impl{i}")
    monkeypatch.setattr(index_module, "PARALLEL_MIN_PACKAGES", 2)
    cache = ContentsCache()
    index_module._FORK_STATE = (root, cache, {})
    try:  # run two chunks in this process, one after the other, as a single pool worker would
        learned = [index_module._scan_chunk(chunk)[1] for chunk in (["cpu/Op/Sub/fp32/impl0"],
                                                                     ["cpu/Op/Sub/fp32/impl1"])]
    finally:
        index_module._FORK_STATE = None
    assert [(hits, misses) for _used, _fresh, hits, misses in learned] == [(0, 1), (0, 1)]


def test_index_of_the_examples_is_valid(tmp_path):
    repo = mark_repo(tmp_path / "repo")
    for arch in ("cpu", "gfx928", "sm_90"):
        shutil.copytree(ROOT / "examples" / arch, repo / arch, dirs_exist_ok=True, symlinks=True)
    doc = build_index(repo)
    assert doc["kernels"] and all(k["valid"] for k in doc["kernels"]), [k["kernel_id"] for k in doc["kernels"]]


@pytest.mark.parametrize("rule,mutate,code,still_valid", RULES, ids=[r[0] for r in RULES])
def test_index_names_the_problem_of_every_failing_fixture(tmp_path, rule, mutate, code, still_valid):
    repo = mark_repo(tmp_path / "repo")
    mutate(write_package(repo))
    write_package(repo, "cpu/Elementwise/Axpy/fp32/other")  # a valid neighbour
    text = dumps(build_index(repo))
    assert '"kernel_id":"cpu/Elementwise/Axpy/fp32/other"' in text
    if code not in ("KERNEL_ID_INVALID", "KERNEL_PACKAGE_MISSING"):  # those are not packages to the index
        assert f'"code":"{code}"' in text


def walk_nonfinite(value, path=""):
    """The paths of NaN/infinite floats by plain recursion (what nonfinite_paths must name)."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path or "$"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in walk_nonfinite(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in walk_nonfinite(v, f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("value", [
    {"a": [1.0, {"b": 2}], "c": "x"},
    {"a": [1.0, {"b": float("nan")}], "c": float("inf")},
    {"when": __import__("datetime").date(2026, 8, 2), "v": float("-inf")},   # not JSON: the walk decides
    {float("nan"): 1.0},                                                       # a NaN key is not a value
    [(1.0, float("nan"))],
    {"deep": [[[[float("inf")]]]]},
    float("nan"),
    [],
])
def test_nonfinite_paths_names_every_nan_and_infinity(value):
    assert list(nonfinite_paths(value)) == walk_nonfinite(value)
