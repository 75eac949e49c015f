"""The daemon's one configuration file, ``DIR/kz.yaml``: defaults, loading, checking.

Every setting has a default that works out of the box, so an empty (or missing)
file is a valid configuration. Unknown keys are rejected with a message naming
the key and the keys allowed there: a typo must never be silently ignored.
Relative paths are resolved against the state directory.

The documented default file (``DEFAULT_YAML``) is what ``write_default`` puts on
disk at first start; ``tests/test_daemon_config.py`` checks that it loads to the
same values as the built-in defaults.
"""
from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kz_daemon.core.errors import ZooError
from kz_daemon.guards.harness_lock import parse_maintainers
from kz_daemon.guards.physics import Physics, parse_physics
from kz_daemon.guards.static_rules import RuleSettings, parse_rules
from kz_events import defaults, durable
from kz_runner.contract.tarball import Limits as TarballLimits

MIB = 1024 * 1024

DEFAULT_YAML = f"""\
# kernel_zoo daemon configuration (kz.yaml). Every key is optional; the values
# shown are the defaults. Unknown keys are an error. Relative paths are resolved
# against the state directory that holds this file.

paths:
  repo: repo              # the kernel repo: a non-bare git worktree written with dulwich
  spool: spool            # spool/tmp -> spool/inbox (+ spool/rejected/<uuid>/)
  pending: pending        # pending/<uuid>/package.tar.gz + submission.json
  runs: runs              # runs/<uuid>/result.json, logs, env.json
  events: events          # the event log (kz_events)
  index: index.json       # the leaderboard index, atomically replaced

repo:
  branch: main
  author: "kernel_zoo <kernel-zoo@localhost>"
  fsync: true             # fsync every object file and its directory before moving the branch

limits:                   # checked on every upload before anything touches the repo
  max_compressed_bytes: 67108864    # 64 MiB: the tar.gz as uploaded
  max_members: 4096                 # entries (files + directories) in the tarball
  max_member_bytes: 67108864        # 64 MiB: one file, unpacked
  max_total_bytes: 268435456        # 256 MiB: all files, unpacked
  max_ratio: 200                    # unpacked total / compressed size
  min_free_bytes: 536870912         # 512 MiB: uploads are refused (503 STORAGE_FULL) when a disk the
  min_free_percent: 5.0             # daemon writes has less free than the smaller of these two; 0 = off
  idempotency_ttl_s: 86400          # 24 h: how long an upload's Idempotency-Key names its submission

queue:
  lease_seconds: 300      # a claim's lease; runners renew it while they work
  claim_confirm_s: 30     # a new claim's lease until its runner fetches the package or renews (a claim
                          # whose answer never reached a runner is back in the queue this soon)
  max_attempts: 3         # claims per submission before it fails (ATTEMPTS_EXHAUSTED)
  reaper_interval_s: 1.0  # how often expired leases are looked for

timeouts:                 # handed to runners with each claim
  build_s: {defaults.BUILD_TIMEOUT_S:g}
  benchmark_s: {defaults.BENCHMARK_TIMEOUT_S:g}

intake:
  rescan_interval_s: 5.0  # periodic inbox scan besides the watchdog observer

policy:
  allow_new_packages: true          # a submission may create a new kernel_id
  submissions_require_token: false  # the HTTP shim asks submitters for a token

http:                     # the HTTP shim (kz up, kz daemon)
  host: {defaults.HTTP_HOST}
  port: {defaults.HTTP_PORT}
  max_json_bytes: 1048576       # body cap of claim/renew/release/cancel requests
  max_result_bytes: 50331648    # body cap of a result report (benchmark JSON + base64 logs)
  submit_rate_per_s: 0.5        # with a token: one bucket per token holder, submissions per second ...
  submit_burst: 20              # ... and burst; over it the API answers 429 with Retry-After
  submit_rate_per_address_per_s: 2.0  # uploads without a token: a bucket per client address, whatever
  submit_burst_per_address: 60        # ids they name (never below the per-submitter figures)
  trusted_proxies: []           # addresses/CIDRs whose X-Forwarded-For names the client (default: none)
  status_max_wait_s: 60         # upper bound of the status long poll's ?wait=
  claim_max_wait_s: 60          # upper bound of a runner claim's wait
  intake_wait_s: 30             # how long POST /api/submissions waits for intake to finish
  header_timeout_s: 10          # a request head must arrive whole within this (else 408 and closed)
  body_timeout_s: 30            # a request body may stall this long while the server waits (else 408)
  keep_alive_s: 5               # an idle kept-alive connection is closed after this
  max_connections: 1024         # open connections at once; more are answered 503 and closed ...
  max_connections_per_address: 64  # ... and from one client address (trusted proxies: the first cap only)
  fd_reserve: 256               # file descriptors never spent on connections (git, event log, spool);
                                # the soft RLIMIT_NOFILE is raised to the hard one at start

mirrors: []               # e.g. [{{name: backup, url: /srv/git/kernels.git}}]

maintainers: {{}}         # kernel_id prefix -> submitter ids who may change an existing kernel's
                          # desc.yaml/build_test_env.py/benchmark.py (token-bound ids only; admin
                          # tokens always may), e.g. {{gfx928/Attention: [alice, bob]}}

physics:                  # the floor under reported figures (IMPLAUSIBLE_RESULT); per-arch figures
  enabled: true           # (hbm_tbps, l2_tbps, l2_mib, tflops: {{dtype: n}}) override the defaults
  margin: 2.0             # a figure must beat margin x the arch's ceiling to be refused

rules:                    # static rules over the source area (docs/architecture.md, "Trust")
  disabled: []            # rule ids switched off

confirmation:             # a new best, and every first record, is run twice before it is committed; the
                          # second run times the operator's reference kernel beside it (a ratio)
  margin: 0.1             # GPU arches (sm_*, gfx*): re-run when a case's primary metric beats the non-seed
                          # best by more than 10 % (0: never); honest GPU re-runs differ by well under 1 %
  cpu_margin: 0.25        # the same for arch cpu, whose timings on a shared host move by 10 % and more
  first_records: true     # re-run a kernel's first record (no non-seed record yet) on every lane
  agreement: 0.1          # per case, the first run's ratio to the reference (its value / the reference's
                          # record) and the confirmation's measured ratio may differ by at most 10 %
                          # (without a reference: the two runs' primary metrics)
  cpu_agreement: 0.25     # the same for arch cpu
  cpu_reference_in_first_run: true  # cpu: every run that may be confirmed times the reference too, so the
                          # confirmation compares two measured ratios (a shared host's load moves
                          # between jobs); a CPU Softmax job took 24-26 s with it, 7.6 s without
  host_spread: 1.0        # where both runs timed the reference (cpu; an unrecorded one): the reference's
                          # figure in the first run may beat its figure in the confirmation by at most
                          # 1 + this (2x): a host changes speed between jobs, a runner that reports more
                          # than it ran makes the reference look faster than any host does
  exclusive_s: 120        # for this long only another runner may take the confirmation run; then any

retention:                # what a finished submission leaves on disk (`kz gc`; the daemon sweeps hourly)
  pending_days: 7         # pending/<uuid>/ of a terminal submission: the package and runner tarball go
  run_logs_days: 30       # runs/<uuid>/ logs and env; a run that was not accepted goes whole (0: keep forever)
  sweep_interval_s: 3600  # how often the daemon sweeps (and once at start); the event log and git are never pruned
  rejected_keep: 1000                 # spool/rejected/<uuid>/: the newest 1000 rejected tarballs stay ...
  rejected_max_bytes: 1073741824      # ... at most 1 GiB of them, none older than rejected_days (0: no bound)
  rejected_days: 30
  rejected_reason_days: 365           # reason.json outlives its tarball; then the folder goes (0: keep forever)
"""


@dataclass(frozen=True)
class Paths:
    """Where the daemon keeps its state (absolute after loading)."""

    repo: Path
    spool: Path
    pending: Path
    runs: Path
    events: Path
    index: Path


@dataclass(frozen=True)
class RepoSettings:
    """The kernel repo's branch, commit author and durability switch."""

    branch: str = "main"
    author: str = "kernel_zoo <kernel-zoo@localhost>"
    fsync: bool = True


@dataclass(frozen=True)
class DaemonLimits:
    """Caps on an uploaded tarball (see kz_runner.contract.tarball)."""

    max_compressed_bytes: int = 64 * MIB
    max_members: int = 4096
    max_member_bytes: int = 64 * MIB
    max_total_bytes: int = 256 * MIB
    max_ratio: float = 200.0
    #: disk headroom: uploads are refused below the smaller of these (either 0 turns the guard off)
    min_free_bytes: int = 512 * MIB
    min_free_percent: float = 5.0
    #: how long a submitter's Idempotency-Key keeps naming the submission it created
    idempotency_ttl_s: float = 86400.0

    @property
    def contract_limits(self) -> TarballLimits:
        """These limits as the contract library's tarball ``Limits`` (the one validator's input)."""
        return TarballLimits(compressed_bytes=self.max_compressed_bytes, members=self.max_members,
                             member_bytes=self.max_member_bytes, total_bytes=self.max_total_bytes,
                             ratio=float(self.max_ratio))


@dataclass(frozen=True)
class QueueSettings:
    """Lease length (and a new claim's shorter one until confirmed), attempts per submission, reaper period."""

    lease_seconds: float = 300.0
    claim_confirm_s: float = 30.0
    max_attempts: int = 3
    reaper_interval_s: float = 1.0


@dataclass(frozen=True)
class Timeouts:
    """Build and benchmark time limits handed to runners with each claim."""

    build_s: float = defaults.BUILD_TIMEOUT_S
    benchmark_s: float = defaults.BENCHMARK_TIMEOUT_S


@dataclass(frozen=True)
class IntakeSettings:
    """How often the inbox is rescanned besides the watchdog observer."""

    rescan_interval_s: float = 5.0


@dataclass(frozen=True)
class Policy:
    """Operator policies."""

    allow_new_packages: bool = True
    submissions_require_token: bool = False


@dataclass(frozen=True)
class HttpSettings:
    """Where the HTTP shim listens, its request limits and long-poll bounds."""

    host: str = "127.0.0.1"
    port: int = defaults.HTTP_PORT
    max_json_bytes: int = 1024 * 1024
    max_result_bytes: int = 48 * 1024 * 1024
    submit_rate_per_s: float = 0.5
    submit_burst: int = 20
    submit_rate_per_address_per_s: float = 2.0
    submit_burst_per_address: int = 60
    trusted_proxies: tuple = ()
    status_max_wait_s: float = 60.0
    claim_max_wait_s: float = 60.0
    intake_wait_s: float = 30.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    max_connections: int = 1024
    max_connections_per_address: int = 64
    fd_reserve: int = 256


@dataclass(frozen=True)
class ConfirmationSettings:
    """When a result is run a second time before it is committed, and how close the runs must be.

    A result is run again when a case beats its recorded best by more than its lane's margin,
    and when it would be the kernel's first record (``first_records``). The confirmation run
    times the operator's reference kernel beside the candidate, so it measures a ratio in which
    the host's noise cancels (``kz_daemon.queue.confirm``).

    The margin is per lane. On GPU arches (``sm_*``, ``gfx*``) honest resubmissions vary
    little (the examples on an H200: a CV of 0.02-0.15 % between runs), so a result more
    than 10 % ahead of the best (``margin`` 0.1) is far outside honest noise. On the ``cpu``
    arch a shared host moves timings by 10 % and more between runs, so ``cpu_margin`` is
    0.25, and the ratios may differ by ``cpu_agreement`` (0.25) instead of ``agreement``
    (0.1). A margin of 0 disables that lane's new-best trigger.
    """

    margin: float = 0.1
    cpu_margin: float = 0.25
    first_records: bool = True
    agreement: float = 0.1
    cpu_agreement: float = 0.25
    cpu_reference_in_first_run: bool = True
    host_spread: float = 1.0
    exclusive_s: float = 120.0

    def margin_for(self, arch: str) -> float:
        """The margin that applies to a submission of ``arch`` (``cpu_margin`` for ``cpu``)."""
        return self.cpu_margin if arch == "cpu" else self.margin

    def agreement_for(self, arch: str) -> float:
        """The agreement that applies to a submission of ``arch`` (``cpu_agreement`` for ``cpu``)."""
        return self.cpu_agreement if arch == "cpu" else self.agreement


@dataclass(frozen=True)
class Retention:
    """How long a terminal submission's files stay in pending/ and runs/ (days; 0 keeps them forever)."""

    pending_days: float = 7.0
    run_logs_days: float = 30.0
    sweep_interval_s: float = 3600.0
    #: spool/rejected/: tarballs kept (newest first) by count, bytes and age; their reason.json longer
    rejected_keep: int = 1000
    rejected_max_bytes: int = 1024 * MIB
    rejected_days: float = 30.0
    rejected_reason_days: float = 365.0


@dataclass(frozen=True)
class MirrorSettings:
    """A remote the repo is pushed to after each accept (a path or URL dulwich can push to)."""

    name: str
    url: str


@dataclass(frozen=True)
class Config:
    """The whole configuration; build it with :meth:`load` or :meth:`default`."""

    state_dir: Path
    paths: Paths
    repo: RepoSettings = field(default_factory=RepoSettings)
    limits: DaemonLimits = field(default_factory=DaemonLimits)
    queue: QueueSettings = field(default_factory=QueueSettings)
    timeouts: Timeouts = field(default_factory=Timeouts)
    intake: IntakeSettings = field(default_factory=IntakeSettings)
    policy: Policy = field(default_factory=Policy)
    http: HttpSettings = field(default_factory=HttpSettings)
    mirrors: tuple[MirrorSettings, ...] = ()
    source_file: Path | None = None
    confirmation: ConfirmationSettings = field(default_factory=ConfirmationSettings)
    maintainers: dict = field(default_factory=dict)   # kernel_id prefix -> submitter ids
    physics: Physics = field(default_factory=Physics)
    rules: RuleSettings = field(default_factory=RuleSettings)
    retention: Retention = field(default_factory=Retention)

    # Derived locations, so no caller joins path segments by hand.
    @property
    def spool_tmp(self) -> Path:
        """Writers create files here first."""
        return self.paths.spool / "tmp"

    @property
    def spool_inbox(self) -> Path:
        """Files are renamed in here; the daemon watches it."""
        return self.paths.spool / "inbox"

    @property
    def spool_rejected(self) -> Path:
        """Rejected submissions are archived here, one folder per uuid."""
        return self.paths.spool / "rejected"

    @classmethod
    def default(cls, state_dir: str | Path) -> Config:
        """The built-in defaults for ``state_dir`` (no file read)."""
        return cls.from_dict({}, state_dir)

    @classmethod
    def load(cls, state_dir: str | Path, config_file: str | Path | None = None) -> Config:
        """Read ``config_file`` (default ``state_dir/kz.yaml``; missing file = defaults).

        Raises ZooError(CONFIG_INVALID) naming the offending key on any bad value.
        """
        state_dir = Path(state_dir).resolve()
        path = Path(config_file) if config_file else state_dir / "kz.yaml"
        data: Any = {}
        if path.exists():
            try:
                data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            except yaml.YAMLError as exc:
                raise _invalid(f"{path} is not valid YAML: {exc}", path=str(path)) from None
        config = cls.from_dict(data, state_dir, source=str(path))
        return dataclasses.replace(config, source_file=path if path.exists() else None)

    @classmethod
    def from_dict(cls, data: Any, state_dir: str | Path, source: str = "kz.yaml") -> Config:
        """Build a Config from a parsed YAML mapping; unknown keys and bad types raise CONFIG_INVALID."""
        state_dir = Path(state_dir).resolve()
        if not isinstance(data, dict):
            raise _invalid(f"{source}: the top level must be a mapping of sections", path=source)
        sections: dict[str, type | None] = {
            "paths": None, "repo": RepoSettings, "limits": DaemonLimits, "queue": QueueSettings,
            "timeouts": Timeouts, "intake": IntakeSettings, "policy": Policy,
            "http": HttpSettings, "mirrors": None,
        }
        sections.update({"maintainers": None, "physics": None, "rules": None})  # parsed by their modules
        sections["confirmation"] = ConfirmationSettings
        sections["retention"] = Retention
        _reject_unknown(data, sections, source, "")
        raw_paths = data.get("paths") or {}
        if not isinstance(raw_paths, dict):
            raise _invalid(f"{source}: 'paths' must be a mapping", path=source, key="paths")
        default_paths = {"repo": "repo", "spool": "spool", "pending": "pending", "runs": "runs",
                         "events": "events", "index": "index.json"}
        _reject_unknown(raw_paths, default_paths, source, "paths.")
        resolved = {}
        for key, default in default_paths.items():
            value = raw_paths.get(key, default)
            if not isinstance(value, str) or not value:
                raise _invalid(f"{source}: paths.{key} must be a non-empty string", path=source,
                               key=f"paths.{key}")
            resolved[key] = (state_dir / value).resolve()
        built: dict[str, Any] = {}
        for name, klass in sections.items():
            if klass is None:
                continue
            built[name] = _section(klass, data.get(name), source, name)
        mirrors = _mirrors(data.get("mirrors"), source)
        config = cls(state_dir=state_dir, paths=Paths(**resolved), mirrors=mirrors,
                     maintainers=parse_maintainers(data.get("maintainers"), source),
                     physics=parse_physics(data.get("physics"), source),
                     rules=parse_rules(data.get("rules"), source), **built)
        _check_ranges(config, source)
        return config

    def with_paths(self, **overrides: str | Path) -> Config:
        """A copy with some paths replaced (e.g. ``repo=`` from ``kz daemon --repo``)."""
        new = dataclasses.replace(self.paths, **{k: Path(v).resolve() for k, v in overrides.items()})
        return dataclasses.replace(self, paths=new)

    def ensure_dirs(self) -> None:
        """Create every directory the daemon writes to (not the repo: gitstore does that)."""
        for directory in (self.spool_tmp, self.spool_inbox, self.spool_rejected,
                          self.paths.pending, self.paths.runs, self.paths.events,
                          self.paths.index.parent):
            directory.mkdir(parents=True, exist_ok=True)


def write_default(path: str | Path) -> bool:
    """Write the documented default ``kz.yaml`` at ``path`` unless a file is there; True if written."""
    path = Path(path)
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    durable.atomic_write(path, DEFAULT_YAML.encode("utf-8"))
    return True


def _invalid(message: str, **details: Any) -> ZooError:
    return ZooError("CONFIG_INVALID", message, details)


def _reject_unknown(data: dict, allowed: dict, source: str, prefix: str) -> None:
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise _invalid(
            f"{source}: unknown key {prefix}{unknown[0]} (allowed here: {', '.join(sorted(allowed))})",
            path=source, key=f"{prefix}{unknown[0]}", allowed=sorted(allowed))


def _section(klass: type, raw: Any, source: str, name: str) -> Any:
    if raw is None:
        return klass()
    if not isinstance(raw, dict):
        raise _invalid(f"{source}: '{name}' must be a mapping", path=source, key=name)
    fields = {f.name: f for f in dataclasses.fields(klass)}
    _reject_unknown(raw, fields, source, f"{name}.")
    values = {}
    for key, value in raw.items():
        default = fields[key].default
        values[key] = _coerce(value, default, source, f"{name}.{key}")
    return klass(**values)


def _coerce(value: Any, default: Any, source: str, key: str) -> Any:
    """Check ``value`` has the default's type (ints allowed where floats are)."""
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, tuple):  # a YAML list of non-empty strings
        ok = isinstance(value, list) and all(isinstance(v, str) and v for v in value)
        value = tuple(value) if ok else value
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, str) and value != ""
    if not ok:
        raise _invalid(f"{source}: {key} must be a {type(default).__name__} like {default!r}, "
                       f"got {value!r}", path=source, key=key)
    return value


def _mirrors(raw: Any, source: str) -> tuple[MirrorSettings, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _invalid(f"{source}: 'mirrors' must be a list of {{name, url}}", path=source, key="mirrors")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise _invalid(f"{source}: mirrors[{i}] must be a mapping {{name, url}}", path=source,
                           key=f"mirrors[{i}]")
        _reject_unknown(item, {"name": 1, "url": 1}, source, f"mirrors[{i}].")
        name, url = item.get("name"), item.get("url")
        if not isinstance(url, str) or not url:
            raise _invalid(f"{source}: mirrors[{i}].url must be a non-empty string", path=source,
                           key=f"mirrors[{i}].url")
        out.append(MirrorSettings(name=str(name or f"mirror{i}"), url=url))
    return tuple(out)


def _check_ranges(config: Config, source: str) -> None:
    positive = {
        "limits.max_compressed_bytes": config.limits.max_compressed_bytes,
        "limits.max_members": config.limits.max_members,
        "limits.max_member_bytes": config.limits.max_member_bytes,
        "limits.max_total_bytes": config.limits.max_total_bytes,
        "limits.max_ratio": config.limits.max_ratio,
        "queue.lease_seconds": config.queue.lease_seconds,
        "queue.claim_confirm_s": config.queue.claim_confirm_s,
        "queue.max_attempts": config.queue.max_attempts,
        "queue.reaper_interval_s": config.queue.reaper_interval_s,
        "timeouts.build_s": config.timeouts.build_s,
        "timeouts.benchmark_s": config.timeouts.benchmark_s,
        "intake.rescan_interval_s": config.intake.rescan_interval_s,
        "http.max_json_bytes": config.http.max_json_bytes,
        "http.max_result_bytes": config.http.max_result_bytes,
        "http.submit_rate_per_s": config.http.submit_rate_per_s,
        "http.submit_burst": config.http.submit_burst,
        "http.submit_rate_per_address_per_s": config.http.submit_rate_per_address_per_s,
        "http.submit_burst_per_address": config.http.submit_burst_per_address,
        "http.status_max_wait_s": config.http.status_max_wait_s,
        "http.claim_max_wait_s": config.http.claim_max_wait_s,
        "http.intake_wait_s": config.http.intake_wait_s,
        "http.header_timeout_s": config.http.header_timeout_s,
        "http.body_timeout_s": config.http.body_timeout_s,
        "http.keep_alive_s": config.http.keep_alive_s,
        "http.max_connections": config.http.max_connections,
        "http.max_connections_per_address": config.http.max_connections_per_address,
        "limits.idempotency_ttl_s": config.limits.idempotency_ttl_s,
    }
    for key, value in positive.items():
        if value <= 0:
            raise _invalid(f"{source}: {key} must be > 0, got {value!r}", path=source, key=key)
    not_negative = {
        "limits.min_free_bytes": config.limits.min_free_bytes,
        "limits.min_free_percent": config.limits.min_free_percent,
        "http.fd_reserve": config.http.fd_reserve,
    }
    for key, value in not_negative.items():
        if value < 0:
            raise _invalid(f"{source}: {key} must be >= 0, got {value!r}", path=source, key=key)
    for key in ("margin", "cpu_margin", "agreement", "cpu_agreement", "host_spread", "exclusive_s"):
        if getattr(config.confirmation, key) < 0:
            raise _invalid(f"{source}: confirmation.{key} must be >= 0", path=source, key=f"confirmation.{key}")
    for key in ("pending_days", "run_logs_days", "rejected_keep", "rejected_max_bytes", "rejected_days",
                "rejected_reason_days"):
        if getattr(config.retention, key) < 0:
            raise _invalid(f"{source}: retention.{key} must be >= 0 (0: keep forever)", path=source,
                           key=f"retention.{key}")
    if config.retention.sweep_interval_s <= 0:
        raise _invalid(f"{source}: retention.sweep_interval_s must be > 0", path=source,
                       key="retention.sweep_interval_s")
    for entry in config.http.trusted_proxies:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise _invalid(f"{source}: http.trusted_proxies: {entry!r} is not an address or CIDR range",
                           path=source, key="http.trusted_proxies") from None
    if not 0 < config.http.port < 65536:
        raise _invalid(f"{source}: http.port must be 1..65535", path=source, key="http.port")
    if "/" in config.repo.branch or not config.repo.branch.strip():
        raise _invalid(f"{source}: repo.branch must be a simple branch name", path=source,
                       key="repo.branch")
