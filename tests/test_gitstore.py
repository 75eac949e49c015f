"""GitStore: commits built from the object store, CAS on the branch, readable by git."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from dulwich.objects import Blob

from kz_daemon.storage.gitstore import CommitConflict, GitStore, format_message, parse_trailers

GIT = shutil.which("git")
AUTHOR = "kz test <kz@test>"


def git(repo: Path, *args: str) -> str:
    """Run the real git CLI on ``repo`` (tests only; the daemon never does)."""
    return subprocess.run([GIT, "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture
def store(tmp_path):
    s = GitStore.init(tmp_path / "repo", clock=lambda: 1_700_000_000)
    yield s
    s.close()


def test_first_commit_and_read_back(store):
    sha = store.commit_changes({"a/b/c.txt": b"hello", "top.txt": b"t"}, "first", AUTHOR, None)
    assert store.head() == sha
    assert store.read_file("a/b/c.txt") == b"hello"
    assert store.read_file("a/b") is None and store.is_dir("a/b")
    assert store.list_files() == ["a/b/c.txt", "top.txt"]
    assert store.read_file("missing") is None


def test_only_changed_paths_touch_trees(store):
    base = store.commit_changes({"x/1.txt": b"1", "y/2.txt": b"2"}, "base", AUTHOR, None)
    y_tree_before = store._lookup("y", base)
    sha = store.commit_changes({"x/1.txt": b"one"}, "edit", AUTHOR, base)
    assert store._lookup("y", sha) == y_tree_before  # untouched subtree shared
    assert store.read_file("x/1.txt") == b"one"
    assert store.read_file("y/2.txt") == b"2"


def test_delete_folder_then_write_replaces_wholesale(store):
    base = store.commit_changes({"k/.kp/keep.yaml": b"keep", "k/src/old.py": b"old",
                                 "k/other.txt": b"o", "z.txt": b"z"}, "base", AUTHOR, None)
    sha = store.commit_changes({"k": None, "k/.kp/keep.yaml": b"keep", "k/src/new.py": b"new"},
                               "replace", AUTHOR, base)
    assert store.list_files("k", sha) == ["k/.kp/keep.yaml", "k/src/new.py"]
    assert store.read_file("z.txt", sha) == b"z"


def test_delete_last_file_drops_empty_folders(store):
    base = store.commit_changes({"a/b/c": b"1", "d": b"2"}, "base", AUTHOR, None)
    sha = store.commit_changes({"a/b/c": None}, "rm", AUTHOR, base)
    assert not store.exists("a", sha)
    assert store.list_files("", sha) == ["d"]


def test_cas_refuses_a_stale_parent(store):
    base = store.commit_changes({"f": b"1"}, "base", AUTHOR, None)
    store.commit_changes({"f": b"2"}, "second", AUTHOR, base)
    with pytest.raises(CommitConflict) as info:
        store.commit_changes({"f": b"3"}, "stale", AUTHOR, base)
    assert info.value.code == "CONFLICT"
    assert store.read_file("f") == b"2"


def test_trailers_round_trip_and_find(store):
    msg = format_message("accept k", {"Kz-Submission": "u1", "Kz-Step": "source"})
    assert parse_trailers(msg) == {"Kz-Submission": "u1", "Kz-Step": "source"}
    a = store.commit_changes({"f": b"1"}, msg, AUTHOR, None)
    b = store.commit_changes({"g": b"1"}, format_message("bench_result update (source x)",
                             {"Kz-Submission": "u1", "Kz-Step": "scorecard"}), AUTHOR, a)
    found = store.find_commits("Kz-Submission", "u1")
    assert [c.sha for c in found] == [a, b]
    assert [c.trailers["Kz-Step"] for c in found] == ["source", "scorecard"]
    assert store.find_commits("Kz-Submission", "u1", since=a)[0].sha == b
    assert parse_trailers("just a subject\n") == {}


def test_clear_stale_locks(store):
    store.commit_changes({"f": b"1"}, "base", AUTHOR, None)
    lock = store.git_dir / "refs" / "heads" / "main.lock"
    lock.write_text("junk")
    assert store.clear_stale_locks() == ["refs/heads/main.lock"]
    assert not lock.exists()


def test_executable_mode_kept(store):
    sha = store.commit_changes({"run.sh": (b"#!/bin/sh\n", 0o100755)}, "x", AUTHOR, None)
    assert list(store.walk_files("", sha))[0][1] == 0o100755


@pytest.mark.skipif(GIT is None, reason="git CLI not installed")
def test_git_cli_reads_the_repo_and_worktree_is_clean(store):
    base = store.commit_changes({"k/a.txt": b"a", "k/b/c.txt": b"c", "keep.txt": b"k"},
                                "base", AUTHOR, None)
    assert store.sync_worktree() == 3
    sha = store.commit_changes({"k": None, "k/new.txt": b"n"}, "replace", AUTHOR, base)
    assert store.sync_worktree() == 3  # a and b/c removed, new written; keep untouched
    root = store.root
    assert (root / "k" / "new.txt").read_bytes() == b"n"
    assert not (root / "k" / "b").exists()
    git(root, "fsck", "--strict")
    assert git(root, "rev-parse", "HEAD").strip() == sha
    assert git(root, "status", "--porcelain").strip() == ""
    assert "replace" in git(root, "log", "--format=%s")
    assert store.sync_worktree() == 0


def test_reopen_sees_the_same_head(store, tmp_path):
    sha = store.commit_changes({"f": b"1"}, "base", AUTHOR, None)
    again = GitStore.open_or_init(tmp_path / "repo")
    assert again.head() == sha
    again.close()


def test_the_parsed_tree_cache_is_bounded_in_count_and_cost(store, monkeypatch):
    import kz_daemon.storage.gitstore as gs

    monkeypatch.setattr(gs, "TREE_CACHE_TREES", 8)
    monkeypatch.setattr(gs, "TREE_CACHE_BYTES", 8 * 1024 * 1024)
    head = None
    for i in range(20):  # each commit makes new trees along its path
        head = store.commit_changes({f"k{i}/src/a.txt": b"%d" % i}, f"c{i}", AUTHOR, head)
        assert store.read_file(f"k{i}/src/a.txt") == b"%d" % i
    assert len(store._trees) <= 8
    assert store._tree_bytes == sum(gs._tree_cost(t) for t in store._trees.values())

    wide = {f"w/f{j:03d}.txt": b"x" for j in range(200)}  # a tree of 200 entries costs 20,200
    head = store.commit_changes(wide, "wide", AUTHOR, head)
    monkeypatch.setattr(gs, "TREE_CACHE_BYTES", 30_000)
    store._trees.clear()
    store._tree_bytes = 0
    assert store.is_dir("w") and store.read_file("w/f000.txt") == b"x"
    assert store._tree_bytes <= 30_000
    assert store.read_file("k3/src/a.txt") == b"3"  # still readable once evicted


class _Stop(Exception):
    pass


def test_the_hook_before_the_ref_update_runs_once_objects_are_written_and_the_branch_has_not_moved(store):
    base = store.commit_changes({"k/a.txt": b"1"}, "base", AUTHOR, None)
    seen = []

    def hook() -> None:  # the saga's crash point between the objects and the branch
        seen.append(store.head())
        raise _Stop

    with pytest.raises(_Stop):
        store.commit_changes({"k/a.txt": b"2"}, "edit", AUTHOR, base, before_ref_update=hook)
    assert seen == [base] and store.head() == base  # called once, before the branch moved
    assert Blob.from_string(b"2").id in store.store  # the new objects are written already
    again = store.commit_changes({"k/a.txt": b"2"}, "edit", AUTHOR, base)  # no hook: nothing left behind
    assert store.head() == again and store.read_file("k/a.txt") == b"2"


def test_the_commit_to_tree_cache_is_bounded_in_count(store, monkeypatch):
    import kz_daemon.storage.gitstore as gs

    monkeypatch.setattr(gs, "TREE_CACHE", 4)
    head, commits = None, []
    for i in range(12):  # every commit's parent is looked up once; reading each commit looks up its own
        head = store.commit_changes({f"k{i}/a.txt": b"%d" % i}, f"c{i}", AUTHOR, head)
        commits.append(head)
        assert store.read_file(f"k{i}/a.txt", head) == b"%d" % i
        assert len(store._commit_trees) <= 4
    assert store.read_file("k0/a.txt", commits[0]) == b"0"  # an evicted commit is read again from the store
    assert len(store._commit_trees) <= 4
