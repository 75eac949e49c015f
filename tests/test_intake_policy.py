"""intake.admit.policy_check against a real git repository: the repo-dependent refusals."""
from __future__ import annotations

from kz_daemon.intake.admit import Outcome, policy_check
from kz_daemon.storage.gitstore import GitStore

AUTHOR = "kz test <test@kernel-zoo.invalid>"


def test_a_kernel_id_naming_a_folder_that_holds_packages_is_refused_nested_package(tmp_path):
    git = GitStore.init(tmp_path / "repo")
    git.commit_changes({"cpu/Op/Name/fp32/group/inner/.kernel_package/desc.yaml": b"name: inner\n"},
                       "a package below a folder", AUTHOR, None)
    kid = "cpu/Op/Name/fp32/group"
    out = policy_check(Outcome(True, kid, arch="cpu"), {}, git, allow_new=True)
    assert (out.ok, out.code) == (False, "NESTED_PACKAGE"), out
    assert out.details == {"folder": kid}
    assert "holds other packages" in out.message


def test_a_kernel_id_inside_another_package_is_refused_nested_package(tmp_path):
    git = GitStore.init(tmp_path / "repo")
    git.commit_changes({"cpu/Op/Name/fp32/outer/.kernel_package/desc.yaml": b"name: outer\n"},
                       "a package", AUTHOR, None)
    out = policy_check(Outcome(True, "cpu/Op/Name/fp32/outer/src/x", arch="cpu"), {}, git, allow_new=True)
    assert (out.ok, out.code) == (False, "NESTED_PACKAGE"), out
    assert out.details == {"outer": "cpu/Op/Name/fp32/outer"}
