"""The step launcher: applies a job step's containment, then becomes the step (exec).

The runner starts ``python -I -S launcher.py SPEC_JSON ARGV...`` instead of ``ARGV``.
It runs as the runner's user (root on a hardened host), does what the spec asks
in the order the kernel needs it (a new network namespace and the resource
limits while it still has the privilege, then ``setgroups``/``setgid``/``setuid``
and ``no_new_privs``), writes one JSON report of what it applied and what it could
not (with the reason) to the spec's ``report_fd``, closes it, and ``execv``s ARGV
with its environment unchanged.

Doing this in a separate program instead of a ``preexec_fn`` keeps the runner's
threads out of the forked child (a ``preexec_fn`` is unsafe with threads). The
file is stdlib-only and imports nothing of this project: ``-I -S`` means it never
looks at the environment's ``PYTHON*`` variables or at site-packages.

A privilege drop that was asked for and fails stops the step (exit status 126)
rather than running it as the runner's user; every other measure is best effort
and reported.
"""
import ctypes
import fcntl
import json
import os
import resource
import socket
import struct
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
IFREQ = "16sH22x"  # struct ifreq on 64-bit Linux: name, flags, padding to 40 bytes
EXIT_REFUSED = 126
EXIT_EXEC_FAILED = 127


class Report:
    """What was applied and what not (the ``env.containment`` facts of one step)."""

    def __init__(self):
        self.entries = []

    def applied(self, measure, detail=None):
        """Record a measure that is in force."""
        entry = {"measure": measure, "applied": True}
        if detail:
            entry["detail"] = detail
        self.entries.append(entry)

    def not_applied(self, measure, reason):
        """Record a measure that could not be applied, with the reason."""
        self.entries.append({"measure": measure, "applied": False, "reason": reason})


def _errno_text(err):
    return f"{os.strerror(err)} (errno {err})"


def _loopback_up():
    """Bring ``lo`` up in the new namespace: the step may talk to itself over 127.0.0.1,
    which is this namespace's own loopback, not the host's."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        req = struct.pack(IFREQ, b"lo", 0)
        flags = struct.unpack(IFREQ, fcntl.ioctl(sock, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))


def _map_self(uid, gid):
    """Map this process's own ids inside a fresh user namespace (so files keep their owners)."""
    with open("/proc/self/setgroups", "w") as fh:
        fh.write("deny")
    with open("/proc/self/uid_map", "w") as fh:
        fh.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as fh:
        fh.write(f"{gid} {gid} 1")


def new_network_namespace(libc, report):
    """``unshare(CLONE_NEWNET)``; without the privilege, inside a new user namespace."""
    measure = "network namespace"
    if libc.unshare(CLONE_NEWNET) == 0:
        how = "unshare(CLONE_NEWNET)"
    else:
        first = ctypes.get_errno()
        uid, gid = os.geteuid(), os.getegid()
        if uid == 0 or libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            report.not_applied(measure, f"unshare(CLONE_NEWNET) refused: {_errno_text(first)}")
            return
        try:
            _map_self(uid, gid)
        except OSError as exc:
            report.not_applied(measure, f"user namespace id mapping failed: {exc}")
            return
        how = "unshare(CLONE_NEWUSER|CLONE_NEWNET)"
    try:
        _loopback_up()
        report.applied(measure, f"{how}; only its own loopback")
    except OSError as exc:
        report.applied(measure, f"{how}; no interface up ({exc.strerror})")


def set_limits(limits, final_uid, report):
    """setrlimit for each ``{"NAME": [soft, hard]}``; RLIMIT_NPROC is reported as not
    enforced when the step keeps uid 0 (the kernel does not apply it to root)."""
    for name, (soft, hard) in sorted(limits.items()):
        measure = f"RLIMIT_{name}"
        if name == "NPROC" and final_uid == 0:
            report.not_applied(measure, "not enforced for a step that runs as root")
            continue
        try:
            resource.setrlimit(getattr(resource, measure), (soft, hard))
            report.applied(measure, f"soft {soft}, hard {hard}")
        except (OSError, ValueError, AttributeError) as exc:
            report.not_applied(measure, f"setrlimit failed: {exc}")


def drop_privileges(uid, gid):
    """Become ``uid``/``gid`` with no supplementary groups; an error text, or None."""
    try:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    except OSError as exc:
        return f"cannot become uid {uid} gid {gid}: {exc}"
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid:
        return f"ids after the drop are uid {os.getuid()} gid {os.getgid()}, not {uid}/{gid}"
    try:
        os.setuid(0)
    except OSError:
        return None
    return "uid 0 could be regained after the drop"


def main(argv):
    """Apply ``argv[1]`` (the spec), report, exec ``argv[2:]``."""
    spec = json.loads(argv[1])
    target = argv[2:]
    report = Report()
    libc = ctypes.CDLL(None, use_errno=True)
    uid = spec.get("uid")
    os.umask(0o077)
    if spec.get("network"):
        new_network_namespace(libc, report)
    final_uid = os.geteuid() if uid is None else uid
    set_limits(spec.get("limits") or {}, final_uid, report)
    if uid is not None:
        problem = drop_privileges(uid, spec["gid"])
        if problem:
            sys.stderr.write(f"kz-runner launcher: {problem}; the step is not run\n")
            return EXIT_REFUSED
        report.applied("unprivileged user", f"uid {uid} gid {spec['gid']}")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        report.applied("no_new_privs")
    else:
        report.not_applied("no_new_privs", _errno_text(ctypes.get_errno()))
    fd = spec.get("report_fd")
    if fd is not None:
        data = json.dumps(report.entries).encode("utf-8")
        while data:
            data = data[os.write(fd, data):]
        os.close(fd)
    sys.stdout.flush()
    try:
        os.execv(target[0], target)
    except OSError as exc:
        sys.stderr.write(f"kz-runner launcher: cannot execute {target[0]}: {exc}\n")
        return EXIT_EXEC_FAILED
    return EXIT_EXEC_FAILED  # not reached: execv does not return


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
