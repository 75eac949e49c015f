"""web.commits.tree_diff on a commit that deletes a file (dulwich gives the change no new entry)."""
from __future__ import annotations

from dulwich.objects import Blob, Tree
from dulwich.repo import Repo

from kz_daemon.web.commits import tree_diff


def _tree(repo: Repo, files: dict[bytes, bytes]) -> bytes:
    tree = Tree()
    for name, data in files.items():
        blob = Blob.from_string(data)
        repo.object_store.add_object(blob)
        tree.add(name, 0o100644, blob.id)
    repo.object_store.add_object(tree)
    return tree.id


def test_a_deleted_file_is_listed_by_its_old_path_and_shows_in_the_diff(tmp_path):
    repo = Repo.init(str(tmp_path), mkdir=False)
    old = _tree(repo, {b"kept.py": b"x = 1\n", b"gone.py": b"y = 2\n"})
    new = _tree(repo, {b"kept.py": b"x = 1\n", b"added.py": b"z = 3\n"})
    files, cut, lines, diff_cut = tree_diff(repo, old, new)
    assert not cut and not diff_cut
    assert sorted((f.path, f.kind) for f in files) == [("added.py", "add"), ("gone.py", "delete")]
    text = "\n".join(line.text for line in lines)
    assert "gone.py" in text and "y = 2" in text and "z = 3" in text
