"""kernel_id: a package's POSIX path relative to the kernel repo root, and the one rule for it.

Every check of a kernel_id (the validator, the tarball checks, the daemon's form
field, the HTTP routes) calls :func:`kernel_id_errors`. A kernel_id is:

- the whole string (no trailing newline or anything else) made of ``/``-separated
  segments, each matching ``[A-Za-z0-9._-]+``; no empty, ``.`` or ``..`` segment and
  no leading or trailing ``/``;
- no segment git refuses in a tree (``.git`` in any case, ``git~1``, ``.git.`` ...:
  see :mod:`.gitpath`);
- exactly ``SEGMENTS`` (5) segments, ``<arch>/<op_class>/<sub_class>/<quant>/<name>``:
  the first four are the operator (``desc.yaml``'s ``category`` must equal them, and the
  runner lane is the arch segment), the last names the implementation;
- at most ``MAX_SEGMENT_BYTES`` (100) per segment and ``MAX_KERNEL_ID_BYTES`` (255) in
  all: every common file system takes a name of 255 bytes, and the runner unpacks a
  package below a work directory of its own, so the kernel_id leaves room for that
  prefix and for the package's own files beneath it.

>>> check_kernel_id("gfx928/Attention/MHA/fp16/reference_impl")
[]
>>> category_segments("gfx928/Attention/MHA/fp16/reference_impl")
('gfx928', 'Attention', 'MHA', 'fp16')
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from kz_runner.contract.codes import problem
from kz_runner.contract.gitpath import git_component_problem

#: one segment, matched against the whole segment (``fullmatch``: no ``$``-before-newline)
SEGMENT_RE = re.compile(r"[A-Za-z0-9._-]+")
MAX_SEGMENT_BYTES = 100
MAX_KERNEL_ID_BYTES = 255
#: ``<arch>/<op_class>/<sub_class>/<quant>/<name>``
SEGMENTS = 5
SHAPE = "<arch>/<op_class>/<sub_class>/<quant>/<name>"
#: The same rule as one JSON Schema ``pattern`` (with ``maxLength: MAX_KERNEL_ID_BYTES``; the
#: characters are ASCII, so bytes and characters agree) for schemas and the OpenAPI document.
#: It reads the same in ECMA 262 and Python's ``re.search`` (which jsonschema uses): ``$(?!\n)``
#: refuses the trailing newline Python's ``$`` would let through. Inside ``[A-Za-z0-9._-]`` the
#: only names git refuses are ``.git`` in any case followed by dots, hence the lookahead.
_SEGMENT_PATTERN = (r"(?!\.{1,2}(?:/|$))(?!\.[Gg][Ii][Tt]\.*(?:/|$))"
                    rf"[A-Za-z0-9._-]{{1,{MAX_SEGMENT_BYTES}}}")
KERNEL_ID_PATTERN = rf"^{_SEGMENT_PATTERN}(?:/{_SEGMENT_PATTERN}){{{SEGMENTS - 1}}}$(?!\n)"
#: A file or directory whose presence marks a kernel repo root (nearest wins).
REPO_MARKERS = (".kernel_zoo_root", ".git")
CATEGORY_FIELDS = ("arch", "op_class", "sub_class", "quant")


def _reasons(kernel_id: object) -> list[tuple[bool, str]]:
    """Every reason ``kernel_id`` is invalid, each with whether it is a segment git refuses."""
    if not isinstance(kernel_id, str):
        return [(False, f"kernel_id must be a string, got {type(kernel_id).__name__}")]
    if not kernel_id:
        return [(False, "kernel_id is empty")]
    reasons: list[tuple[bool, str]] = []
    if kernel_id.startswith("/"):
        reasons.append((False, "kernel_id must not start with '/'"))
    if kernel_id.endswith("/"):
        reasons.append((False, "kernel_id must not end with '/'"))
    size = len(kernel_id.encode("utf-8", "surrogatepass"))
    if size > MAX_KERNEL_ID_BYTES:
        reasons.append((False, f"kernel_id is {size} bytes long; at most {MAX_KERNEL_ID_BYTES} are allowed"))
    parts = kernel_id.strip("/").split("/")
    if len(parts) != SEGMENTS:
        reasons.append((False, f"kernel_id has {len(parts)} segment{'s' if len(parts) != 1 else ''}; it must "
                               f"have exactly {SEGMENTS}: {SHAPE}"))
    for index, segment in enumerate(parts):
        if segment == "":
            reasons.append((False, f"segment {index + 1} is empty ('//')"))
        elif segment in (".", ".."):
            reasons.append((False, f"segment {index + 1} is {segment!r}"))
        elif not SEGMENT_RE.fullmatch(segment):
            reasons.append((False, f"segment {segment!r} has characters outside [A-Za-z0-9._-]"))
        elif len(segment) > MAX_SEGMENT_BYTES:
            reasons.append((False, f"segment {index + 1} is {len(segment)} bytes long; "
                                   f"at most {MAX_SEGMENT_BYTES} are allowed"))
        elif (why := git_component_problem(segment)) is not None:
            reasons.append((True, f"segment {index + 1}: {why}"))
    return reasons


def kernel_id_errors(kernel_id: object) -> list[str]:
    """Reasons (plain sentences) why ``kernel_id`` is not a valid kernel_id; empty when valid."""
    return [text for _git, text in _reasons(kernel_id)]


def kernel_id_problems(kernel_id: object, field: str | None = "kernel_id"):
    """The reasons as coded problems, with the codes a spooled tarball's checks give them.

    A segment git refuses (``.git.``, ``.GIT`` ...) is one ``GIT_PATH_REFUSED`` each (the
    tarball check names it so before the kernel_id is read); every other reason goes into
    one ``KERNEL_ID_INVALID``, listed first. Empty when the kernel_id is valid.
    """
    reasons = _reasons(kernel_id)
    other = [text for git, text in reasons if not git]
    found = [problem("KERNEL_ID_INVALID", "; ".join(other), field=field)] if other else []
    return found + [problem("GIT_PATH_REFUSED", f"git refuses {text}", field=field) for git, text in reasons if git]


def is_valid_kernel_id(kernel_id: object) -> bool:
    """True when ``kernel_id`` is a well-formed kernel_id."""
    return not kernel_id_errors(kernel_id)


def check_kernel_id(kernel_id: object, file: str | None = None, field: str | None = None):
    """One ``KERNEL_ID_INVALID`` problem naming every reason (an empty list when it is valid)."""
    reasons = kernel_id_errors(kernel_id)
    if not reasons:
        return []
    shown = repr(kernel_id) if not isinstance(kernel_id, str) or len(kernel_id) <= 120 \
        else repr(kernel_id[:117] + "...")
    return [problem("KERNEL_ID_INVALID", f"{shown}: {'; '.join(reasons)}", file=file, field=field)]


def segments(kernel_id: str) -> list[str]:
    """The path segments of a (valid) kernel_id."""
    return kernel_id.split("/")


def category_segments(kernel_id: str) -> tuple[str, ...] | None:
    """The first four segments ``(arch, op_class, sub_class, quant)``, or None when fewer exist."""
    parts = kernel_id.split("/")
    return tuple(parts[:4]) if len(parts) >= 4 else None


def category_mismatches(kernel_id: str, category: dict) -> list[tuple[str, str | None, object]]:
    """``(field, segment, category value)`` for every category field that differs from the path."""
    parts = kernel_id.split("/")
    out = []
    for index, name in enumerate(CATEGORY_FIELDS):
        segment = parts[index] if index < len(parts) else None
        value = category.get(name) if isinstance(category, dict) else None
        if segment != value:
            out.append((name, segment, value))
    return out


def find_repo_root(start: str | os.PathLike, markers: tuple[str, ...] = REPO_MARKERS) -> Path | None:
    """The nearest directory at or above ``start`` holding one of ``markers``, else None."""
    path = Path(start).resolve()
    for candidate in (path, *path.parents):
        if any((candidate / marker).exists() for marker in markers):
            return candidate
    return None


def kernel_id_from_path(package_dir: str | os.PathLike, repo_root: str | os.PathLike) -> str:
    """The kernel_id of ``package_dir`` under ``repo_root``; ValueError when it is not under it."""
    package = Path(package_dir).resolve()
    root = Path(repo_root).resolve()
    try:
        rel = package.relative_to(root)
    except ValueError:
        raise ValueError(f"{package} is not under the repo root {root}") from None
    if not rel.parts:
        raise ValueError(f"{package} is the repo root itself, not a package under it")
    return rel.as_posix()


def path_ends_with(package_dir: str | os.PathLike, kernel_id: str) -> bool:
    """True when the last segments of ``package_dir`` spell ``kernel_id``."""
    parts = Path(package_dir).resolve().parts
    wanted = tuple(kernel_id.split("/"))
    return len(parts) > len(wanted) and parts[-len(wanted):] == wanted
