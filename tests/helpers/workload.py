"""Mixed load against a ``ZooProcess``: concurrent submitters, runners, readers, and the figures it gives.

``run_load`` drives one batch: ``clients`` threads submit ``submissions`` tiny packages
spread over ``kernels`` (each upload with an ``Idempotency-Key``; a 429 or 503 is
retried after its ``Retry-After``, a dropped connection with the same key), runners
(wire-protocol threads and real ``kz runner`` processes) work the queue, and readers
poll the API and the pages meanwhile. Submit-to-terminal times come from the event
log (the ts of each submission's terminal status) against the client's clock before
its upload began: the same machine's clock on both sides.
"""
from __future__ import annotations

import itertools
import random
import threading
import time
import uuid as uuidlib
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Self

import httpx

from kz_events.status import TERMINAL
from tests.helpers.submissions import logged
from tests.helpers.system import Ack, ProtocolRunner, RunnerProcess, ZooProcess, submit, tiny_tarball


@dataclass
class LoadFigures:
    """What one load batch measured (figures only; the suites assert behaviour)."""

    submissions: int
    clients: int
    protocol_runners: int
    real_runners: int
    kernels: int
    wall_s: float = 0.0
    throughput_per_s: float = 0.0
    p50_submit_to_terminal_s: float = 0.0
    p99_submit_to_terminal_s: float = 0.0
    max_submit_to_terminal_s: float = 0.0
    upload_p50_s: float = 0.0
    upload_p99_s: float = 0.0
    rss_start_bytes: int = 0
    rss_max_bytes: int = 0
    rss_end_bytes: int = 0
    reader_requests: int = 0
    reader_5xx: int = 0
    retried_uploads: int = 0
    refused: dict = field(default_factory=dict)
    statuses: dict = field(default_factory=dict)
    jobs_by_real_runners: int = 0

    def to_json(self) -> dict:
        """The figures as a JSON-able dict."""
        return asdict(self)


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class LoopThreads:
    """``n`` daemon threads each running ``self._loop(i)`` until ``stop()`` sets ``stop_event``.

    A subclass writes ``_loop`` (which must return soon after ``stop_event`` is set) and may
    raise ``join_s``, how long ``stop`` waits for each thread.
    """

    join_s = 90.0

    def __init__(self, n: int) -> None:
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(n)]

    def _loop(self, i: int) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        """Start the threads."""
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        """Stop and join the threads."""
        self.stop_event.set()
        for t in self.threads:
            t.join(self.join_s)


class Readers(LoopThreads):
    """Threads that read the API and the pages while the load runs; they count 5xx answers."""

    def __init__(self, zoo: ZooProcess, kernels: list[str], acks: list[Ack], n: int = 4, pause: float = 0.3) -> None:
        super().__init__(n)
        self.zoo, self.kernels, self.acks = zoo, kernels, acks
        self.requests = 0
        self.errors: list[str] = []
        self.pause = pause

    def _get(self, client: httpx.Client, path: str, **params) -> None:
        try:
            resp = client.get(path, params=params)
        except httpx.HTTPError:
            return  # a daemon being killed on purpose (chaos, soak) drops connections
        with self.lock:
            self.requests += 1
            if resp.status_code >= 500 and resp.status_code != 503:
                self.errors.append(f"{resp.status_code} {path}: {resp.text[:200]}")

    def _loop(self, i: int) -> None:
        rng = random.Random(i)
        with httpx.Client(base_url=self.zoo.url, timeout=60) as client:
            while not self.stop_event.is_set():
                kind = i % 4
                if kind == 0:
                    self._get(client, "/api/kernels", per_page=50)
                elif kind == 1 and self.acks:
                    ack = self.acks[rng.randrange(len(self.acks))]
                    self._get(client, f"/api/submissions/{ack.uuid}/status", wait=2)
                elif kind == 2:
                    self._get(client, "/")
                else:
                    self._get(client, f"/kernels/{rng.choice(self.kernels)}")
                self.stop_event.wait(self.pause)


class Submitters:
    """``clients`` threads that upload ``total`` submissions; the 2xx answers are appended to ``acks``."""

    def __init__(self, zoo: ZooProcess, kernels: list[str], total: int, clients: int, tag: str) -> None:
        self.zoo, self.kernels, self.total, self.tag = zoo, kernels, total, tag
        self.counter = itertools.count()
        self.acks: list[Ack] = []
        self.uploads: list[float] = []
        self.refused: dict[str, int] = {}
        self.retried = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(clients)]

    def _one(self, client: httpx.Client, i: int) -> None:
        kernel_id = self.kernels[i % len(self.kernels)]
        data = tiny_tarball(kernel_id, f"{self.tag}-{i}")
        key = str(uuidlib.uuid4())
        started = time.time()
        for _ in range(60):
            try:
                resp = submit(self.zoo.url, kernel_id, data, f"user{i % 7}", key=key, client=client)
            except httpx.HTTPError:
                with self.lock:
                    self.retried += 1
                time.sleep(0.5)  # a daemon being restarted; retried with the same key
                continue
            if resp.status_code in (429, 503):
                with self.lock:
                    self.retried += 1
                time.sleep(min(5.0, float(resp.headers.get("Retry-After", "0.5") or 0.5)))
                continue
            with self.lock:
                if 200 <= resp.status_code < 300:
                    self.acks.append(Ack(resp.json()["uuid"], kernel_id, started))
                    self.uploads.append(time.time() - started)
                else:
                    code = resp.json().get("error", {}).get("code", str(resp.status_code))
                    self.refused[code] = self.refused.get(code, 0) + 1
            return

    def _loop(self) -> None:
        with httpx.Client(timeout=120) as client:
            while True:
                i = next(self.counter)
                if i >= self.total:
                    return
                self._one(client, i)

    def start(self) -> Submitters:
        """Start the threads."""
        for t in self.threads:
            t.start()
        return self

    def join(self, timeout: float) -> None:
        """Wait for every upload to be answered."""
        end = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))


class RssSampler:
    """Samples the daemon's RSS every ``every`` seconds."""

    def __init__(self, zoo: ZooProcess, every: float = 1.0) -> None:
        self.zoo, self.every = zoo, every
        self.samples: list[int] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            rss = self.zoo.rss_bytes()
            if rss:
                self.samples.append(rss)
            self.stop_event.wait(self.every)

    def start(self) -> RssSampler:
        """Start sampling."""
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling."""
        self.stop_event.set()
        self.thread.join(10)


class RealRunnerShifts:
    """A real ``kz runner`` that serves ``shifts`` jobs (``--once``, restarted), then leaves the queue to others.

    A real run costs seconds of CPU; a bounded number of them keeps the runner process
    in the load without letting the package's own run dominate a two-core machine.
    """

    def __init__(self, zoo: ZooProcess, runner_id: str, work_root: Path, shifts: int, stop: threading.Event) -> None:
        self.zoo, self.runner_id, self.work_root, self.shifts, self.stop_event = zoo, runner_id, work_root, shifts, stop
        self.exits: list[int] = []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        for shift in range(self.shifts):
            if self.stop_event.is_set():
                return
            proc = RunnerProcess(self.zoo, self.runner_id, self.work_root / str(shift), wait=10, extra=("--once",))
            while proc.alive() and not self.stop_event.wait(0.5):
                pass
            self.exits.append(proc.stop())

    def start(self) -> None:
        """Start serving."""
        self.thread.start()

    def join(self) -> None:
        """Wait for the current shift to end."""
        self.thread.join(120)


def wait_terminal_in_log(zoo: ZooProcess, acks: list[Ack], timeout: float) -> list[Ack]:
    """Replay the log until every ack is terminal (or ``timeout``); fills ``terminal_at``/``status``; the rest."""
    deadline = time.monotonic() + timeout
    while True:
        subs = logged(zoo.config.paths.events)
        rest = []
        for ack in acks:
            sub = subs.get(ack.uuid)
            if sub is not None and sub.status in TERMINAL:
                ack.status = sub.status
                ack.terminal_at = _ts(sub.history[-1][2])
            else:
                rest.append(ack)
        if not rest or time.monotonic() > deadline:
            return rest
        time.sleep(1.0)


def run_load(zoo: ZooProcess, base: Path, *, submissions: int, clients: int, kernels: list[str],
             protocol_runners: list[str], real_runners: list[str], readers: int = 4,
             timeout: float = 600, tag: str = "L", real_jobs_each: int = 3,
             protocol_job_s: float = 0.0) -> tuple[list[Ack], list[Ack], LoadFigures, list[str]]:
    """One load batch; (acks, acks not terminal in time, figures, reader 5xx errors).

    ``protocol_job_s``: how long each protocol runner's job takes (0: it reports at once).
    """
    figures = LoadFigures(submissions, clients, len(protocol_runners), len(real_runners), len(kernels))
    figures.rss_start_bytes = zoo.rss_bytes() or 0
    rss = RssSampler(zoo).start()
    stop = threading.Event()
    protos = [ProtocolRunner(zoo.url, rid, zoo.tokens[rid], protocol_job_s) for rid in protocol_runners]
    proto_threads = [threading.Thread(target=p.loop, args=(stop,), daemon=True) for p in protos]
    reals = [RealRunnerShifts(zoo, rid, base / f"work-{tag}-{rid}", real_jobs_each, stop) for rid in real_runners]
    started = time.time()
    subs = Submitters(zoo, kernels, submissions, clients, tag).start()
    reading = Readers(zoo, kernels, subs.acks, readers).start()
    for t in proto_threads:
        t.start()
    for r in reals:
        r.start()
    deadline = time.monotonic() + timeout
    try:
        subs.join(timeout)
        rest = wait_terminal_in_log(zoo, subs.acks, max(1.0, deadline - time.monotonic()))
    finally:
        stop.set()
        reading.stop()
        for t in proto_threads:
            t.join(60)
        for p in protos:
            p.close()
        for r in reals:
            r.join()
        rss.stop()
    ended = max([a.terminal_at for a in subs.acks if a.terminal_at] or [time.time()])
    latencies = [a.terminal_at - a.submitted_at for a in subs.acks if a.terminal_at]
    figures.wall_s = round(ended - started, 3)
    figures.throughput_per_s = round(len(latencies) / figures.wall_s, 3) if figures.wall_s else 0.0
    figures.p50_submit_to_terminal_s = round(_pct(latencies, 0.50), 3)
    figures.p99_submit_to_terminal_s = round(_pct(latencies, 0.99), 3)
    figures.max_submit_to_terminal_s = round(max(latencies or [0.0]), 3)
    figures.upload_p50_s = round(_pct(subs.uploads, 0.50), 3)
    figures.upload_p99_s = round(_pct(subs.uploads, 0.99), 3)
    figures.rss_max_bytes = max(rss.samples or [0])
    figures.rss_end_bytes = zoo.rss_bytes() or (rss.samples[-1] if rss.samples else 0)
    figures.reader_requests = reading.requests
    figures.reader_5xx = len(reading.errors)
    figures.retried_uploads = subs.retried
    figures.refused = dict(subs.refused)
    for a in subs.acks:
        figures.statuses[a.status or "not terminal"] = figures.statuses.get(a.status or "not terminal", 0) + 1
    subs_state = logged(zoo.config.paths.events)
    figures.jobs_by_real_runners = sum(1 for a in subs.acks
                                       if getattr(subs_state.get(a.uuid), "runner_id", None) in real_runners)
    return subs.acks, rest, figures, reading.errors
