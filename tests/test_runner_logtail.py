"""Log tails for the submitter: bounded, redacted."""
from __future__ import annotations

from pathlib import Path

from kz_runner.worker.logtail import MAX_BYTES, MAX_LINES, Redactor, tail


def test_a_tail_keeps_the_last_lines_within_the_byte_bound():
    data = b"".join(f"line {i}\n".encode() for i in range(1000))
    out = tail(data)
    assert out.splitlines()[-1] == "line 999" and len(out.splitlines()) == MAX_LINES
    wide = ("\u00e9" * 300 + "\n").encode() * 40
    out = tail(wide)
    assert len(out.encode()) <= MAX_BYTES and out.endswith("\u00e9\n")


def test_invalid_utf8_is_replaced():
    assert tail(b"ok \xff\xfe end\n") == "ok \ufffd\ufffd end\n"


def test_secrets_from_the_environment_and_the_token_are_redacted(tmp_path):
    job_dir = tmp_path / "job-abc"
    environ = {"MY_API_KEY": "k-1234567890", "DB_PASSWORD": "hunter2hunter2", "PATH": "/usr/bin",
               "SHORT_TOKEN": "1"}
    red = Redactor(["kzr-the-token-xyz"], job_dir, environ)
    text = (f"token kzr-the-token-xyz key k-1234567890 pw hunter2hunter2 path /usr/bin one 1\n"
            f"file {job_dir}/build/inputs/x.npy\n").encode()
    out = tail(text, red)
    assert "kzr-the-token-xyz" not in out and "k-1234567890" not in out and "hunter2hunter2" not in out
    assert out.count("[redacted]") == 3
    assert "/usr/bin" in out and "one 1" in out  # not secret-looking, or too short to be a secret
    assert "file <workdir>/build/inputs/x.npy" in out
    assert "k-1234567890" not in repr(red)


def test_redaction_happens_before_the_cut():
    secret = "s3cr3t-value-" + "q" * 20
    red = Redactor([secret], None, {})
    out = tail((secret + "\n").encode() * 3, red, max_bytes=30)
    assert "q" * 5 not in out


def test_logs_bytes_are_redacted_too():
    red = Redactor(["kzr-the-token-xyz"], Path("/tmp/job-1"), {})
    assert red.data(b"a kzr-the-token-xyz b /tmp/job-1") == b"a [redacted] b /tmp/job-1"
