"""`kz runner`: serve one GPU for a kernel_zoo server (claim, run, report; see kz_runner/worker/runner.py).

The token: in the environment variable ``KZ_RUNNER_TOKEN`` (recommended; under
systemd from a root-owned ``EnvironmentFile=`` that the runner's own user cannot
read), or ``--token-file F``, or (least safe: visible in ``ps`` while the process
starts) ``--token T``. The runner reads it, then re-executes itself at once (same
pid) with the token handed over through an inherited pipe (``--token-fd``), so
neither ``/proc/<pid>/environ`` nor ``/proc/<pid>/cmdline`` of the running runner
holds the token or the file's path, and it marks itself non-dumpable so other
non-root processes of its user cannot read its memory. The runner warns when a token
file is readable by its group or others.

The sandbox (kz_runner/worker/sandbox.py): every step runs in a bubblewrap sandbox that
shows it only its package, the staged harness library, its own job folders, the
interpreter and ``/usr``: the token file, the state directory, other jobs and other
processes do not exist there, there is no network, and the step runs as ``--job-user``
(65534 by default; the real uid when the runner is root, else inside a user namespace)
with CPU-time, file-size, process-count, open-file and core limits. No sandbox, no jobs:
the runner checks before its first claim and exits 78 when none can be made (the log says
why and how to fix it). ``$KZ_BWRAP`` names another bwrap than the bundled one.
``--unconfined-dev`` runs steps without a sandbox, for developing the runner itself: the
runs are marked unconfined and the zoo never accepts them.

Exit codes: 0 stopped normally (or ``--once``: reported one job, or none came);
1 ``--once`` job that could not be reported; 2 usage or environment error
(no token, token refused, work root in use, server unreachable with ``--once``, the
harness library changed under a running runner); 78 no sandbox can be made on this host
(``SANDBOX_UNAVAILABLE``).
"""
from __future__ import annotations

import argparse
import os
import sys

NAME = "runner"
HELP = "serve one GPU: claim jobs of its arch, run them, report results"
TOKEN_ENV = "KZ_RUNNER_TOKEN"
SERVER_ENV = "KZ_SERVER"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Fill the ``kz runner`` parser."""
    parser.add_argument("--server", default=os.environ.get(SERVER_ENV),
                        help=f"server URL, e.g. http://zoo.example:8470 (env {SERVER_ENV})")
    token = parser.add_mutually_exclusive_group()
    token.add_argument("--token-file", metavar="FILE",
                       help=f"read the runner token from FILE (see also env {TOKEN_ENV}, the recommended way)")
    token.add_argument("--token", metavar="T",
                       help=f"the runner token (prefer --token-file or env {TOKEN_ENV}: argv is visible in ps)")
    token.add_argument("--token-fd", type=int, metavar="N", help=argparse.SUPPRESS)
    parser.add_argument("--gpu", default=None, metavar="N",
                        help="GPU index to serve (sets CUDA/HIP_VISIBLE_DEVICES for jobs); default: none")
    parser.add_argument("--arch", default=None, metavar="A",
                        help="arch to claim jobs for (gfx…, sm_XY, cpu); default: detected with CuPy")
    parser.add_argument("--once", action="store_true",
                        help="handle at most one job, then exit (batch schedulers)")
    parser.add_argument("--wait", type=float, default=30.0, metavar="S",
                        help="seconds each claim long-poll waits for a job (with --once: the whole wait)")
    parser.add_argument("--work-root", default=None, metavar="DIR",
                        help="directory for job workdirs, one per runner, locked while it runs "
                             "(default: a fresh temporary directory, removed at exit)")
    parser.add_argument("--runner-id", default=None, metavar="NAME",
                        help="this runner's name in logs and KZ_RUNNER_ID (default: <host>-gpu<N>)")
    parser.add_argument("--grace", type=float, default=60.0, metavar="S",
                        help="on SIGTERM, seconds a running job may still take before it is killed (default 60)")
    parser.add_argument("--keep-workdir", action="store_true", help="keep job directories (debugging)")
    parser.add_argument("--job-user", default=None, metavar="USER[:GROUP]",
                        help="user (name or uid) the steps run as in their sandbox (default 65534:65534; "
                             "give each root runner on a host its own)")
    parser.add_argument("--job-fsize", type=int, default=None, metavar="BYTES",
                        help="largest file a step may write (RLIMIT_FSIZE; default 8 GiB)")
    parser.add_argument("--job-nproc", type=int, default=None, metavar="N",
                        help="processes the job user may have (RLIMIT_NPROC, and pids.max of a step's cgroup; "
                             "default 4096)")
    parser.add_argument("--job-memory", type=int, default=None, metavar="BYTES",
                        help="memory a step may use (memory.max of its cgroup, else RLIMIT_DATA per process; "
                             "default 16 GiB)")
    parser.add_argument("--job-cgroup", default=None, metavar="auto|none|DIR",
                        help="where each step's cgroup is made: auto (the runner's own cgroup when delegated to "
                             "it, else the rlimit fallback), none (rlimits only), or a cgroup v2 directory the "
                             "runner may manage (unusable: no job runs); default auto")
    parser.add_argument("--unconfined-dev", action="store_true",
                        help="DEVELOPMENT ONLY: run steps without a sandbox, as this runner's user; the runs are "
                             "marked unconfined and the zoo never accepts them")


def _argv_without_token(args: argparse.Namespace, fd: int) -> list[str]:
    """The command line to re-execute with, the token replaced by ``--token-fd``."""
    argv = ["--server", args.server, "--token-fd", str(fd), "--wait", repr(args.wait), "--grace", repr(args.grace)]
    for flag, value in (("--gpu", args.gpu), ("--arch", args.arch), ("--work-root", args.work_root),
                        ("--runner-id", args.runner_id), ("--job-user", args.job_user),
                        ("--job-fsize", args.job_fsize), ("--job-nproc", args.job_nproc),
                        ("--job-memory", args.job_memory), ("--job-cgroup", args.job_cgroup)):
        if value is not None:
            argv += [flag, str(value)]
    for flag, on in (("--once", args.once), ("--keep-workdir", args.keep_workdir),
                     ("--unconfined-dev", args.unconfined_dev)):
        if on:
            argv.append(flag)
    return argv


def _reexec_with_pipe(args: argparse.Namespace, token: str) -> None:
    """Replace this process (same pid) with one that reads the token from a pipe."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, token.encode("utf-8"))
    os.close(write_fd)
    os.set_inheritable(read_fd, True)
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    argv = [sys.executable, "-m", "kz_runner.commands.runner", *_argv_without_token(args, read_fd)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


def _read_token(args: argparse.Namespace) -> tuple[str | None, bool]:
    """(token, needs re-exec); the token is None when none was given."""
    if args.token_fd is not None:
        with os.fdopen(args.token_fd, "rb") as pipe:
            return pipe.read().decode("utf-8").strip(), False
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            if mode & 0o044:
                print(f"kz runner: warning: {args.token_file} is readable by its group or others "
                      f"(mode {mode & 0o777:o}); chmod 600 it", file=sys.stderr)
            return fh.read().strip(), True
    if args.token:
        return args.token.strip(), True
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip(), True
    return None, False


def run(args: argparse.Namespace) -> int:
    """Start the runner loop; see the module docstring for the exit codes."""
    if not args.server:
        print(f"kz runner: --server URL is required (or env {SERVER_ENV})", file=sys.stderr)
        return 2
    try:
        token, reexec = _read_token(args)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"kz runner: cannot read the token: {exc}", file=sys.stderr)
        return 2
    if not token:
        print(f"kz runner: no token; give --token-file FILE, env {TOKEN_ENV} or --token", file=sys.stderr)
        return 2
    if reexec and os.environ.get("KZ_RUNNER_NO_REEXEC") != "1":
        _reexec_with_pipe(args, token)  # does not return
    os.environ.pop(TOKEN_ENV, None)

    from pathlib import Path

    from kz_runner.worker.contain import UNCONFINED, Containment, parse_user
    from kz_runner.worker.runner import Runner, RunnerConfig, default_runner_id

    runner_id = args.runner_id or default_runner_id(args.gpu)
    work_root = Path(args.work_root) if args.work_root else None
    try:
        containment = Containment()
        if args.unconfined_dev:
            containment = UNCONFINED
        else:
            changes: dict = {}
            if args.job_user:
                changes["uid"], changes["gid"] = parse_user(args.job_user)
            if args.job_fsize is not None:
                changes["fsize_bytes"] = args.job_fsize
            if args.job_nproc is not None:
                changes["nproc"] = args.job_nproc
            if args.job_memory is not None:
                changes["memory_bytes"] = args.job_memory
            if args.job_cgroup is not None:
                changes["cgroup"] = args.job_cgroup
            containment = Containment(**changes)
        config = RunnerConfig(server=args.server, gpu=args.gpu, arch=args.arch, once=args.once, wait_s=args.wait,
                              work_root=work_root, runner_id=runner_id, grace_s=args.grace,
                              keep_workdir=args.keep_workdir, containment=containment)
        runner = Runner(config, token)
    except ValueError as exc:
        print(f"kz runner: {exc}", file=sys.stderr)
        return 2
    return runner.serve()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m kz_runner.commands.runner`` (the re-executed runner)."""
    parser = argparse.ArgumentParser(prog="kz runner", description=HELP)
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
