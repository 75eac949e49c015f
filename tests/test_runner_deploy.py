"""docs/deploy/: the Slurm script and the Kubernetes manifest call `kz runner` with options it accepts."""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kz_runner.commands import runner as runner_cmd

DEPLOY = Path(__file__).resolve().parent.parent / "docs" / "deploy"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kz runner", exit_on_error=False)
    runner_cmd.add_arguments(parser)
    return parser.parse_args(argv)


def test_slurm_script_runs_kz_runner_once_named_after_the_array_task(tmp_path):
    bash = shutil.which("bash")
    if not bash:
        pytest.skip("bash is not installed here")
    script = (DEPLOY / "kz-runner.sbatch").read_text()
    assert "#SBATCH --array=" in script and "#SBATCH --gres=gpu:1" in script
    # Run the script for real with `kz` on PATH replaced by one that records its argv.
    fake = tmp_path / "bin" / "kz"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin", "HOME": str(tmp_path), "KZ_SERVER": "http://zoo:8470",
           "SLURM_ARRAY_JOB_ID": "41", "SLURM_ARRAY_TASK_ID": "3", "TMPDIR": str(tmp_path)}
    done = subprocess.run([bash, str(DEPLOY / "kz-runner.sbatch")], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)
    assert argv[0] == "runner"
    args = _parse(argv[1:])
    assert args.once and args.server == "http://zoo:8470" and args.runner_id == "slurm-41-3"
    assert args.token_file == f"{tmp_path}/.config/kz/runner.token" and args.gpu is None
    assert args.work_root == f"{tmp_path}/kz-runner-slurm-41-3" and args.wait == 300


def test_slurm_script_refuses_to_start_without_a_server(tmp_path):
    bash = shutil.which("bash")
    if not bash:
        pytest.skip("bash is not installed here")
    done = subprocess.run([bash, str(DEPLOY / "kz-runner.sbatch")], env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "KZ_SERVER" in done.stderr


def test_kubernetes_indexed_job_runs_kz_runner_once_per_index():
    job = yaml.safe_load((DEPLOY / "kz-runner-job.yaml").read_text())
    assert job["kind"] == "Job" and job["spec"]["completionMode"] == "Indexed"
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    container = pod["containers"][0]
    assert container["command"] == ["kz", "runner"]
    args = _parse(container["args"])
    assert args.once and args.gpu == "0" and "$(RUNNER_INDEX)" in args.runner_id
    env = {e["name"]: e for e in container["env"]}
    assert "job-completion-index" in env["RUNNER_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert "secretKeyRef" in env["KZ_RUNNER_TOKEN"]["valueFrom"]
    assert "--token" not in container["args"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["terminationGracePeriodSeconds"] > args.grace


def test_kubernetes_pod_gives_bwrap_its_namespaces_and_proc_with_the_least_privilege():
    """bwrap needs to make a user namespace (seccomp and AppArmor defaults refuse it) and mount a
    fresh /proc (refused under a masked /proc); nothing else: no privileged container, no
    capability, no privilege escalation, not root, in a user namespace of its own."""
    job = yaml.safe_load((DEPLOY / "kz-runner-job.yaml").read_text())
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    ctx = container["securityContext"]
    assert pod["hostUsers"] is False  # procMount: Unmasked is allowed only in a user namespace
    assert ctx["procMount"] == "Unmasked"
    assert pod["securityContext"]["seccompProfile"] == {"type": "Unconfined"}
    assert pod["securityContext"]["appArmorProfile"] == {"type": "Unconfined"}
    assert ctx.get("privileged", False) is False and ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]} and "add" not in ctx["capabilities"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert ctx["readOnlyRootFilesystem"] is True and pod["automountServiceAccountToken"] is False
    assert not any(key in pod for key in ("hostPID", "hostIPC", "hostNetwork"))
    # each step's memory stays under the pod's own limit, so the runner keeps room of its own
    args = _parse(container["args"])
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Gi") and 0 < args.job_memory < int(limit[:-2]) * 1024 ** 3
    assert args.job_cgroup is None and not args.unconfined_dev
