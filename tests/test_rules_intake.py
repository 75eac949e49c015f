"""The static rules' second line over the real daemon: each family of hidden code is held or rejected at intake.

Every package of the corpus (``tests/helpers/cheats.py``, ``rule_cheat_packages``) is
packed whole, as a submitter's own tar would hold it (bytecode caches included), and
dropped into a running zoo's spool; intake must hold it for review or refuse it, with
evidence naming the file. The examples, packed the same way, are queued.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from kz_runner.contract.validate import validate_tarball
from tests.helpers.cheats import RuleCheat, rule_cheat_packages
from tests.helpers.daemon import EXAMPLES, drop_and_decide, tarball_bytes

SOFTMAX_ID = "cpu/Reduction/Softmax/fp32/numpy_ref"
CPU_EXAMPLES = ("cpu/Elementwise/Axpy/fp32/numpy_ref", SOFTMAX_ID)


def _whole(pkg: Path, kernel_id: str, skip_caches: bool = False) -> bytes:
    """Every file of ``pkg`` (bench_result.yaml aside) in a tar.gz under ``kernel_id``."""
    files = {p.relative_to(pkg).as_posix(): p.read_bytes() for p in sorted(pkg.rglob("*")) if p.is_file()}
    files.pop(".kernel_package/bench_result.yaml", None)
    if skip_caches:
        files = {rel: data for rel, data in files.items() if "__pycache__" not in rel}
    return tarball_bytes(kernel_id, files)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, RuleCheat]:
    return {c.name: c for c in rule_cheat_packages(tmp_path_factory.mktemp("rule-cheats"))}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    state = tmp_path_factory.mktemp("zoo") / "state"
    running = Zoo(init_state_dir(state, seed_from=EXAMPLES))
    running.start()
    yield running
    running.stop()


NAMES = ["latin1_declared", "undecodable_source", "prebuilt_module", "bytecode_cache", "zipped_code",
         "numpy_ctypeslib", "sys_dict", "main_namespace", "getattr_os", "harness_import"]


def test_the_corpus_has_one_package_per_family(corpus):
    assert sorted(corpus) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_intake_stops_each_family_with_evidence_naming_the_file(name, corpus, zoo, tmp_path):
    cheat = corpus[name]
    data = _whole(cheat.path, SOFTMAX_ID)
    view = drop_and_decide(zoo, f"{name}.tar.gz", data)
    if cheat.action == "reject":
        assert view.status == "rejected", view
        (reason,) = view.reasons
        assert reason["code"] == "RULE_VIOLATION"
        assert cheat.rule in reason["message"] and f"{cheat.file}:" in reason["message"], reason
    else:
        assert view.status == "held", view
        (row,) = [r for r in zoo.reviews() if r["uuid"] == view.uuid]
        assert cheat.rule in row["rules"], row
        assert any(f["rule"] == cheat.rule and f["file"] == cheat.file for f in row["evidence"]), row["evidence"]
        zoo.cancel(view.uuid, "test")
    # kz validate reads the same tarball the same way: the finding, at the same file
    archive = tmp_path / f"{name}.tar.gz"
    archive.write_bytes(data)
    report = validate_tarball(archive, archive.name, rules=True)
    found = [p for p in report.problems if p.code == cheat.rule and p.file == cheat.file]
    assert found and all(p.severity == ("error" if cheat.action == "reject" else "warning") for p in found)


def test_the_latin1_source_is_read_in_its_declared_encoding(corpus):
    """Its findings carry the decoded line, so an admin reads what Python will run."""
    from kz_runner.contract.rules.engine import check_sources

    source = (corpus["latin1_declared"].path / "src/softmax.py").read_bytes()
    with pytest.raises(UnicodeDecodeError):
        source.decode("utf-8")  # what the rules used to skip
    found = [f for f in check_sources({"src/softmax.py": source}) if f.rule == "introspection"]
    lines = source.decode("latin-1").splitlines()
    assert [f.text for f in found] == [lines[f.line - 1].strip() for f in found] and "_getframe" in found[0].text


@pytest.mark.parametrize("kernel_id", CPU_EXAMPLES)
def test_the_examples_packed_by_hand_are_queued(kernel_id, zoo):
    view = drop_and_decide(zoo, "example.tar.gz", _whole(EXAMPLES / kernel_id, kernel_id, skip_caches=True))
    assert view.status == "queued", view.reasons
    zoo.cancel(view.uuid, "test")
