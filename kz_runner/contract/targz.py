"""The one deterministic ``.tar.gz`` writer: the same entries always give the same bytes.

Both the submitter's ``kz pack`` and the daemon's runner tarball are written here, so
a package's archive hash never depends on which side built it. Members are written
in sorted name order in PAX format with mtime 0, uid/gid 0 and empty owner names;
modes are normalised to 0644/0755 (directories and owner-executable files 0755);
the gzip header carries mtime 0 and no file name.
"""
from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Mapping

from kz_runner.contract.tarball import normalized_mode

__all__ = ["deterministic_targz"]

#: ``{member name: (kind, mode, data)}``; kind is ``"file"`` or ``"dir"`` (a dir's data is ignored).
Entries = Mapping[str, tuple[str, int, bytes]]


def deterministic_targz(entries: Entries) -> bytes:
    """tar.gz bytes of ``{name: (kind, mode, data)}`` in sorted order with fixed metadata."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            kind, mode, data = entries[name]
            is_dir = kind == "dir"
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = normalized_mode(mode, is_dir)
            if is_dir:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.type = tarfile.REGTYPE
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="", compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()
