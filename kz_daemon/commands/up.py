"""`kz up`: the embedded default — daemon, HTTP on localhost, and a local runner, in one command.

Creates (or reuses) the state directory: kz.yaml, the kernel repo seeded from
``examples/`` as its first commit, the spool, hashed tokens in auth.yaml with the
plaintext copies in DIR/tokens/ (mode 0600). Serves the API and the web pages on
127.0.0.1, starts ``kz runner`` for the detected arch as a supervised child process
named ``local-runner`` (unless --no-runner; restarted with backoff when it dies, a
runner that keeps dying is reported by /readyz and in the log), prints the URL and copy-paste submit commands, and stops everything
cleanly on Ctrl-C or SIGTERM.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kz_events import defaults

NAME = "up"
#: the local runner's one name: its token's id, its logs, the queue view
LOCAL_RUNNER = "local-runner"
HELP = f"run the whole zoo locally: daemon + HTTP on {defaults.HTTP_HOST} + a local runner (state in {defaults.STATE_DIR})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Fill the ``kz up`` parser."""
    parser.add_argument("--state-dir", default=defaults.STATE_DIR, help=f"state directory (default {defaults.STATE_DIR})")
    parser.add_argument("--port", type=int, default=None,
                        help=f"HTTP port (default: kz.yaml's http.port, {defaults.HTTP_PORT}; 0 picks a free one)")
    parser.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--no-runner", action="store_true", help="do not start a local runner")
    parser.add_argument("--arch", default=None, help="the local runner's arch (default: detected)")
    parser.add_argument("--seed-from", default=None,
                        help="packages for the first commit of a new repo (default: the project's examples/)")


def default_examples() -> Path | None:
    """The project's examples/ folder (source checkout), or ./examples."""
    for candidate in (Path(__file__).resolve().parents[2] / "examples", Path.cwd() / "examples"):
        if candidate.is_dir():
            return candidate
    return None


def example_arches(seed: Path | None) -> list[str]:
    """The arches of the example packages (the first segment of each kernel_id under ``seed``)."""
    if seed is None or not seed.is_dir():
        return []
    return sorted({p.relative_to(seed).parts[0] for p in seed.rglob(".kernel_package") if p.is_dir()})


def arch_warning(arch: str | None, arches: list[str]) -> str | None:
    """A banner line when the local runner's arch serves none of the examples (their jobs would wait)."""
    if not arch or not arches or arch in arches:
        return None
    return (f"warning: the local runner serves arch {arch}, but the examples are for {', '.join(arches)}: "
            f"their submissions wait until a runner of that arch asks for work "
            f"(kz runner --arch ARCH, or kz up --arch ARCH)")


def _runner_argv(url: str, token_file: Path, arch: str) -> list[str] | None:
    """The local runner's command line, or None when this install has no ``kz runner``."""
    try:
        import importlib

        importlib.import_module("kz_runner.commands.runner")
    except ImportError:
        return None
    # --grace 10: on Ctrl-C a running job gets 10 s, then the runner kills it and releases its
    # lease, well inside the 15 s kz up waits for the runner before it stops the server.
    return [sys.executable, "-m", "kz_daemon", "runner", "--server", url, "--token-file", str(token_file),
            "--arch", arch, "--grace", "10", "--runner-id", LOCAL_RUNNER]


def banner(url: str, state_dir: Path, tokens: dict[str, Path], runner: str | None) -> str:
    """What `kz up` prints once it serves."""
    example = "cpu/Elementwise/Axpy/fp32/my_impl"
    lines = [
        f"kz up: serving {url}",
        f"  leaderboard   {url}/",
        f"  queue         {url}/queue",
        f"  API           {url}/openapi.json  (docs/api_reference.md)",
        f"  state         {state_dir}",
        f"  tokens        {tokens['runner'].parent}/ (runner.token, admin.token; mode 0600)",
        f"  runner        {runner or 'none (--no-runner)'}",
        "",
        "Submit a package (validates and packs it first):",
        f"  kz submit path/to/{example} --server {url} --submitter alice",
        "or, with the guide's curl line (a tarball packed by `kz pack`):",
        f"  curl -X POST {url}/api/submissions \\",
        '    -H "X-Submitter-Id: alice" \\',
        f'    -F "kernel_id={example}" \\',
        '    -F "submitter_id=alice" \\',
        '    -F "package=@package.tar.gz;type=application/gzip"',
        "",
        "Ctrl-C stops everything.",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Set up the state directory, then serve until a signal."""
    from kz_daemon.config.tokens import ensure_local_tokens
    from kz_daemon.core.errors import ZooError
    from kz_daemon.http.serve import serve_config
    from kz_daemon.ops.runtime import init_state_dir, open_failure, prepare_daemon_process
    from kz_events.log.segments import LogError, LogLocked

    prepare_daemon_process()  # the heap tuned before any thread; the log lines on stderr
    state_dir = Path(args.state_dir).resolve()
    seed = Path(args.seed_from) if args.seed_from else default_examples()
    try:
        config = init_state_dir(state_dir, seed_from=seed)
    except ZooError as exc:
        print(f"kz up: {exc.message}", file=sys.stderr)
        return 2
    tokens = ensure_local_tokens(state_dir, runner_id=LOCAL_RUNNER)
    runner_desc: list[str | None] = [None]
    runner_arch: list[str | None] = [None]

    def runner_argv_for(url: str) -> list[str] | None:
        if args.no_runner:
            return None
        arch = args.arch
        if arch is None:
            from kz_runner.contract.arch import detect_arch

            arch = detect_arch().arch
        argv = _runner_argv(url, tokens["runner"], arch)
        runner_arch[0] = arch if argv else None
        runner_desc[0] = f"{LOCAL_RUNNER} (kz runner --arch {arch}, restarted if it dies)" if argv else "unavailable (no kz runner in this install)"
        return argv

    def show(url: str) -> None:
        print(banner(url, state_dir, tokens, runner_desc[0]), flush=True)
        warning = arch_warning(runner_arch[0], example_arches(seed))
        if warning:
            print(warning, flush=True)

    os.environ.pop("KZ_TOKEN", None)
    try:
        return serve_config(config, host=args.host, port=args.port, runner_argv_for=runner_argv_for,
                            banner=show)
    except LogLocked as exc:
        print(f"kz up: another daemon holds {config.paths.events} ({exc}); stop it first", file=sys.stderr)
        return 2
    except LogError as exc:
        print(open_failure("kz up", state_dir, exc), file=sys.stderr)
        return 2
