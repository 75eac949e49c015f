"""Path components git refuses in a tree: every path in a package must pass these.

Accepted packages are committed to the kernel repo, so a name git's own checks
(``verify_path``, ``fsck``'s tree checks) refuse would make the repo unusable: a
committed ``src/.GIT/hooks/post-commit`` is a hook on a case-insensitive file
system, and clones with ``fsck`` on refuse the whole repository. The rules, per
path component:

- ``.git`` in any letter case; on NTFS also followed by any run of dots and spaces
  or by ``:`` (an alternate data stream), and its 8.3 short name ``git~1``; on HFS+
  also with Unicode characters HFS+ ignores (zero-width joiners, direction marks,
  the BOM) anywhere in it;
- ``.gitmodules`` (with the same tricks, plus its NTFS short names ``gitmod~N`` and
  ``gi7eba~N``) as a symbolic link;
- empty components, ``.``, ``..``, and components holding ``/``, ``\\`` or NUL.

>>> git_component_problem(".GIT") is not None, git_component_problem("src") is None
(True, True)
"""
from __future__ import annotations

import re

__all__ = ["git_component_problem", "git_symlink_problem", "is_dotgit"]

#: code points HFS+ ignores when it compares names (git's ``next_hfs_char``)
_HFS_IGNORABLE = dict.fromkeys([*range(0x200C, 0x2010), *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF])
_NTFS_DOTGIT = re.compile(r"(?:\.git|git~1)[. ]*(?::.*)?", re.IGNORECASE | re.DOTALL)
_NTFS_DOTGITMODULES = re.compile(r"(?:\.gitmodules|gitmod~[1-4]|gi7eba~[1-9])[. ]*(?::.*)?",
                                 re.IGNORECASE | re.DOTALL)


def _hfs_fold(name: str) -> str:
    return name.translate(_HFS_IGNORABLE).lower()


def is_dotgit(name: str) -> bool:
    """True when a file system (case-insensitive, NTFS or HFS+) may take ``name`` for ``.git``."""
    return _hfs_fold(name) == ".git" or _NTFS_DOTGIT.fullmatch(name) is not None


def _is_dotgitmodules(name: str) -> bool:
    return _hfs_fold(name) == ".gitmodules" or _NTFS_DOTGITMODULES.fullmatch(name) is not None


def git_component_problem(name: str) -> str | None:
    """Why git refuses ``name`` as a tree entry of any kind, or None when it is fine."""
    if name in ("", ".", ".."):
        return f"{name!r} is not a file name"
    if "/" in name or "\\" in name or "\0" in name:
        return f"{name!r} holds a '/', a backslash or a NUL"
    if is_dotgit(name):
        return f"{name!r} names git's own .git directory on some file system"
    return None


def git_symlink_problem(name: str) -> str | None:
    """Why git refuses a symbolic link named ``name`` (``.gitmodules`` and its aliases)."""
    if _is_dotgitmodules(name):
        return f"{name!r} is .gitmodules on some file system and must not be a symbolic link"
    return None
