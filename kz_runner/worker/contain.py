"""The runner's containment options: the job user and the limits each step's sandbox gets.

The sandbox itself is :mod:`kz_runner.worker.sandbox` (bubblewrap, failing closed);
:func:`kz_runner.worker.job.run_sandboxed` turns these options into its
:class:`~kz_runner.worker.sandbox.SandboxSpec` for each step:

- the job user (uid/gid, 65534 by default): the real uid on the host when the runner
  is root (``drop`` mode), the uid inside a user namespace otherwise (``userns``);
- ``RLIMIT_CPU`` (the step's timeout plus :data:`CPU_SLACK_S`, per process),
  ``RLIMIT_FSIZE`` (largest file a step may write), ``RLIMIT_NPROC`` (processes of
  the job's uid), ``RLIMIT_NOFILE``, ``RLIMIT_CORE=0``.

``unconfined`` is the one way to run steps without a sandbox: a development switch
(``kz runner --unconfined-dev``), never for untrusted packages. Every run made that
way says so in its ``env.containment`` (``"unconfined": true``), and the daemon never
accepts such a run (``UNCONFINED_RUN``).
"""
from __future__ import annotations

import grp
import math
import pwd
from dataclasses import dataclass

GiB = 1024 ** 3
NOBODY = 65534
DEFAULT_FSIZE = 8 * GiB
DEFAULT_NPROC = 4096
DEFAULT_NOFILE = 4096
# Extra CPU seconds past the step's timeout before SIGXCPU (SIGKILL follows 5 s later).
CPU_SLACK_S = 5


@dataclass(frozen=True)
class Containment:
    """The runner's containment options (``kz runner --job-user/--job-fsize/--job-nproc``)."""

    # True: run the steps directly, as the runner's user, with no sandbox (development only;
    # the runs are marked unconfined and never accepted)
    unconfined: bool = False
    # the job's uid/gid inside the sandbox (never 0)
    uid: int = NOBODY
    gid: int = NOBODY
    # RLIMIT_FSIZE in bytes
    fsize_bytes: int = DEFAULT_FSIZE
    # RLIMIT_NPROC (processes of the job's uid)
    nproc: int = DEFAULT_NPROC
    # RLIMIT_NOFILE
    nofile: int = DEFAULT_NOFILE

    def cpu_seconds(self, timeout_s: float) -> int:
        """RLIMIT_CPU for a step with this wall-clock timeout."""
        return int(math.ceil(timeout_s)) + CPU_SLACK_S


UNCONFINED = Containment(unconfined=True)


def parse_user(text: str) -> tuple[int, int]:
    """``"65534"``, ``"65534:65534"``, ``"nobody"`` or ``"nobody:nogroup"`` as (uid, gid).

    Raises ValueError for an unknown name or uid 0.
    """
    user, _, group = text.partition(":")
    if user.isdigit():
        uid = gid = int(user)  # a group given below replaces the gid
    else:
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise ValueError(f"no such user {user!r}") from None
        uid, gid = entry.pw_uid, entry.pw_gid
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            try:
                gid = grp.getgrnam(group).gr_gid
            except KeyError:
                raise ValueError(f"no such group {group!r}") from None
    if uid == 0 or gid == 0:
        raise ValueError("the job user must not be root")
    return uid, gid
