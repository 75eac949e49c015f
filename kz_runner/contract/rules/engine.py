"""Static rules over a package's source area: what the zoo refuses, or holds for an admin, before a run.

The source area (everything beside ``.kernel_package/``) is the submitter's free
area, but some things in it defeat the measurement rather than speed up the kernel.
Each :class:`Rule` has an id, a reason, an action and the test it applies:

- ``reject``: the submission is refused at intake (``RULE_VIOLATION``);
- ``hold``: the submission waits in status ``held`` until an admin approves it
  (then it is queued) or rejects it.

Python files are read with ``ast`` (never imported); other text files (C, C++,
CUDA, HIP, shell) are matched line by line with simple patterns. The rules are
pure: :func:`check_sources` takes ``{path: bytes}`` and returns :class:`Finding`
values, one per rule, file and line. Import aliases are followed (``import cupy as
cp`` makes ``cp.matmul`` read as ``cupy.matmul``); anything that hides a name
behind ``getattr`` or ``exec`` is what the hold rules and an admin's review are for.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

__all__ = ["Rule", "Finding", "RULES", "RULES_BY_ID", "REJECT", "HOLD", "DEFAULT_VENDOR_CALLS",
           "DEFAULT_GEMM_OP_CLASSES", "SHADOWED_MODULES", "check_sources", "rule_table_markdown"]

REJECT = "reject"
HOLD = "hold"


@dataclass(frozen=True)
class Rule:
    """One static rule: ``id``, ``action`` (reject or hold), why it exists, what it looks for."""

    id: str
    action: str
    reason: str
    test: str


@dataclass(frozen=True)
class Finding:
    """One place a rule matched: the rule, the file (relative to the package), the line, the text."""

    rule: str
    action: str
    file: str
    line: int
    text: str

    def to_json(self) -> dict:
        """The finding as a JSON object (event payloads, the API, the CLI)."""
        return {"rule": self.rule, "action": self.action, "file": self.file, "line": self.line,
                "text": self.text}

    def render(self) -> str:
        """``rule file:line: text``."""
        return f"{self.rule} {self.file}:{self.line}: {self.text}"


RULES: tuple[Rule, ...] = (
    Rule("timing-patch", REJECT,
         "replacing a timing function or the harness's own objects falsifies every measurement",
         "an assignment to, setattr on, or del of an attribute of time, timeit, cupy.cuda, "
         "torch.cuda, kz_runner or kz_events (e.g. time.perf_counter = ..., cupy.cuda.Event = ...)"),
    Rule("expected-read", REJECT,
         "the expected outputs and the scorecard are for the harness; a kernel that reads them "
         "can copy the answer or tune to the record",
         "a string naming the expected/ folder (\"expected\", \"expected/...\") or bench_result "
         "in a Python file; expected/ or bench_result in any other text file"),
    Rule("shadow-module", REJECT,
         "a module named like one the harness imports replaces it once src/ is on sys.path",
         "a file or folder in the source area named time, numpy, cupy, kz_runner or kz_events "
         "(time.py, numpy/, cupy.cpython-311-x86_64-linux-gnu.so ...)"),
    Rule("introspection", REJECT,
         "the harness's checks live in the benchmark's own process: code that walks up the call "
         "stack or through the garbage collector reaches them (a kernel that found the harness's "
         "trial state that way and switched its output checks off was accepted)",
         "sys._getframe, sys._current_frames, sys.settrace/setprofile, inspect's frame functions "
         "(currentframe, stack, getouterframes, trace ...), gc.get_objects/get_referrers/get_referents; "
         "the frame and closure attributes f_back, f_locals, f_globals, tb_frame, gi_frame, cr_frame, "
         "ag_frame, __closure__, __globals__, cell_contents, also as string literals (getattr); a "
         "private name (one starting with _) of kz_runner or kz_events; in native code "
         "PyEval_GetFrame, PyThreadState_GetFrame, PyFrame_*, PyEval_SetTrace/SetProfile, PyGC_*"),
    Rule("concurrency", HOLD,
         "work left running on other streams, threads or processes escapes the timed region",
         "import of threading, _thread, multiprocessing or concurrent.futures; os.fork; "
         "cupy.cuda.Stream or torch.cuda.Stream; in native code cudaStreamCreate, hipStreamCreate, "
         "std::thread, pthread_create, fork("),
    Rule("network-subprocess", HOLD,
         "a kernel has no business talking to the network or starting programs",
         "import of socket, urllib, http, requests, subprocess or ctypes; os.system, os.popen, "
         "os.exec*, os.spawn*; in native code system(, popen(, <sys/socket.h>"),
    Rule("dynamic-code", HOLD,
         "a name built at run time hides from the other rules what the code reaches; an admin reads it",
         "exec, eval or compile; __import__ or importlib.import_module of a name that is not a "
         "string literal; getattr, setattr, delattr or hasattr with a computed name on sys, gc, "
         "inspect, builtins, time, kz_runner or kz_events; sys.modules; __builtins__ or import of builtins"),
    Rule("vendor-call", HOLD,
         "the zoo ranks kernels: calling a vendor library for an op that is not a GEMM ranks the library",
         "a call to a configured vendor function (cupy.matmul, cupy.linalg.*, torch.* ...) in a "
         "file that is not one of desc.yaml's reference_sources, when the package's op_class is "
         "not a GEMM class"),
)
RULES_BY_ID = {rule.id: rule for rule in RULES}

#: dotted names (a trailing ``.*`` means the whole namespace) the vendor-call rule holds.
DEFAULT_VENDOR_CALLS: tuple[str, ...] = (
    "cupy.matmul", "cupy.dot", "cupy.einsum", "cupy.tensordot", "cupy.inner", "cupy.linalg.*",
    "cupy.fft.*", "cupyx.scipy.*", "numpy.matmul", "numpy.dot", "numpy.einsum", "numpy.linalg.*",
    "torch.*", "tensorflow.*", "jax.*",
)
#: op_class values (compared case-insensitively) for which matrix products are the kernel itself.
DEFAULT_GEMM_OP_CLASSES: tuple[str, ...] = ("GEMM", "MatMul", "BatchedGEMM", "Linear", "GroupedGEMM")
#: module names the harness imports; the source area must not provide them.
SHADOWED_MODULES = frozenset({"time", "numpy", "cupy", "kz_runner", "kz_events"})

_TIMING_ROOTS = ("time", "timeit", "cupy.cuda", "torch.cuda", "kz_runner", "kz_events")
_INTROSPECTION_NAMES = ("sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
                        "inspect.currentframe", "inspect.stack", "inspect.trace", "inspect.getouterframes",
                        "inspect.getinnerframes", "inspect.getframeinfo", "inspect.getclosurevars",
                        "gc.get_objects", "gc.get_referrers", "gc.get_referents")
_HARNESS_PACKAGES = ("kz_runner", "kz_events")
_CODE_CALLS = ("exec", "eval", "compile", "builtins.exec", "builtins.eval", "builtins.compile")
_IMPORT_CALLS = ("__import__", "builtins.__import__", "importlib.import_module", "importlib.__import__")
_ATTR_CALLS = ("getattr", "setattr", "delattr", "hasattr")
_GUARDED_MODULES = ("sys", "gc", "inspect", "builtins", "time", "kz_runner", "kz_events")
_INTROSPECTION_ATTRS = frozenset({"f_back", "f_locals", "f_globals", "f_builtins", "tb_frame", "gi_frame",
                                  "cr_frame", "ag_frame", "__closure__", "__globals__", "cell_contents",
                                  "_getframe", "_current_frames"})
_CONCURRENCY_IMPORTS = ("threading", "_thread", "multiprocessing", "concurrent.futures", "concurrent")
_CONCURRENCY_CALLS = ("os.fork", "os.forkpty", "cupy.cuda.Stream", "torch.cuda.Stream")
_NETWORK_IMPORTS = ("socket", "urllib", "http", "requests", "subprocess", "ctypes")
_NETWORK_CALLS = ("os.system", "os.popen", "os.exec*", "os.spawn*", "os.posix_spawn*")
_EXPECTED_STR = re.compile(r"^expected$|(^|[/\\])expected[/\\]|bench_result")
_TEXT_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hh", ".hpp", ".hip", ".cl",
                  ".sh", ".cmake", ".mk", ".s", ".ptx", ".ll")
_NATIVE_PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    ("expected-read", re.compile(r"expected/|bench_result")),
    ("introspection", re.compile(r"\b(PyEval_GetFrame|PyThreadState_GetFrame|PyFrame_\w+|PyEval_SetTrace|"
                                 r"PyEval_SetProfile|PyGC_\w+)\b")),
    ("concurrency", re.compile(r"\b(cudaStreamCreate\w*|hipStreamCreate\w*|pthread_create|fork\s*\()|std::thread")),
    ("network-subprocess", re.compile(r"\b(system|popen|execv\w*|execl\w*)\s*\(|<sys/socket\.h>")),
)
MAX_TEXT = 200


def _matches(name: str, patterns: Iterable[str]) -> bool:
    for pattern in patterns:
        if pattern.endswith("*"):
            stem = pattern[:-1]
            if name.startswith(stem) or name == stem.rstrip("."):
                return True
        elif name == pattern or name.startswith(pattern + "."):
            return True
    return False


def _harness_private(name: str) -> bool:
    """Whether a dotted name reaches a private part of the harness's packages (``kz_runner.bench._x``)."""
    root, *rest = name.split(".")
    return root in _HARNESS_PACKAGES and any(part.startswith("_") and part != "__version__" for part in rest)


def _dotted(node: ast.AST, aliases: Mapping[str, str]) -> str | None:
    """``a.b.c`` of a Name/Attribute chain with its root alias resolved, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _aliases(tree: ast.AST) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


class _PyChecker:
    def __init__(self, path: str, lines: list[str], vendor: tuple[str, ...] | None) -> None:
        self.path, self.lines, self.vendor = path, lines, vendor
        self.found: list[Finding] = []

    def hit(self, rule: str, node: ast.AST) -> None:
        """Record ``rule`` at ``node``'s line (once per rule and line)."""
        line = getattr(node, "lineno", 0)
        if any(f.rule == rule and f.line == line for f in self.found):
            return
        text = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        self.found.append(Finding(rule, RULES_BY_ID[rule].action, self.path, line, text[:MAX_TEXT]))

    def run(self, tree: ast.AST) -> list[Finding]:
        aliases = _aliases(tree)
        # docstrings describe, they do not read files
        docstrings = {id(n.value) for n in ast.walk(tree)
                      if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self._import(node)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute):
                        base = _dotted(target.value, aliases)
                        if base is not None and _matches(base, _TIMING_ROOTS):
                            self.hit("timing-patch", node)
            elif isinstance(node, ast.Call):
                self._call(node, aliases)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if _EXPECTED_STR.search(node.value):
                    self.hit("expected-read", node)
                if node.value in _INTROSPECTION_ATTRS:
                    self.hit("introspection", node)
            if isinstance(node, ast.Name) and node.id == "__builtins__":
                self.hit("dynamic-code", node)
            if isinstance(node, ast.Attribute) and node.attr in _INTROSPECTION_ATTRS:
                self.hit("introspection", node)
            elif isinstance(node, (ast.Attribute, ast.Name)):
                name = _dotted(node, aliases) or ""
                if _matches(name, _INTROSPECTION_NAMES) or _harness_private(name):
                    self.hit("introspection", node)
                elif name == "sys.modules":
                    self.hit("dynamic-code", node)
        return self.found

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.ImportFrom) and not node.level and \
                any(_harness_private(f"{node.module}.{a.name}") for a in node.names):
            self.hit("introspection", node)
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if not node.level else []
        else:
            names = [a.name for a in node.names]
        for name in names:
            if _matches(name, ("builtins",)):
                self.hit("dynamic-code", node)
            if _matches(name, _CONCURRENCY_IMPORTS):
                self.hit("concurrency", node)
            if _matches(name, _NETWORK_IMPORTS):
                self.hit("network-subprocess", node)

    def _call(self, node: ast.Call, aliases: Mapping[str, str]) -> None:
        name = _dotted(node.func, aliases)
        if name is None:
            return
        if name in ("setattr", "delattr") and node.args:
            base = _dotted(node.args[0], aliases)
            if base is not None and _matches(base, _TIMING_ROOTS):
                self.hit("timing-patch", node)
        literal = bool(node.args) and isinstance(node.args[0], ast.Constant)
        if name in _CODE_CALLS or (name in _IMPORT_CALLS and not literal):
            self.hit("dynamic-code", node)
        if name in _ATTR_CALLS and len(node.args) >= 2 and not isinstance(node.args[1], ast.Constant):
            base = _dotted(node.args[0], aliases)
            if base is not None and _matches(base, _GUARDED_MODULES):
                self.hit("dynamic-code", node)
        if _matches(name, _CONCURRENCY_CALLS):
            self.hit("concurrency", node)
        if _matches(name, _NETWORK_CALLS):
            self.hit("network-subprocess", node)
        if self.vendor and _matches(name, self.vendor):
            self.hit("vendor-call", node)


def _shadowing(path: str) -> bool:
    for part in path.split("/"):
        if part.split(".", 1)[0] in SHADOWED_MODULES:
            return True
    return False


def check_sources(files: Mapping[str, bytes], *, op_class: str = "",
                  reference_sources: Iterable[str] = (),
                  vendor_calls: Iterable[str] = DEFAULT_VENDOR_CALLS,
                  gemm_op_classes: Iterable[str] = DEFAULT_GEMM_OP_CLASSES) -> list[Finding]:
    """Every finding of the rules in the source area ``files`` ({path relative to the package: bytes}).

    Paths under ``.kernel_package/`` are skipped (the contract area is checked by the
    validator and, for existing kernels, locked). ``reference_sources`` (desc.yaml's)
    are exempt from the vendor-call rule: a trusted reference may call a library.
    """
    gemm = {c.lower() for c in gemm_op_classes}
    vendor = tuple(vendor_calls) if op_class.lower() not in gemm else ()
    references = set(reference_sources)
    found: list[Finding] = []
    for path in sorted(files):
        if path.startswith(".kernel_package/") or path == ".kernel_package":
            continue
        if _shadowing(path):
            found.append(Finding("shadow-module", REJECT, path, 0, f"{path} shadows a module the harness imports"))
        data = files[path]
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # binaries: only their names are checked
        lines = text.splitlines()
        if path.endswith(".py"):
            try:
                tree = ast.parse(text, filename=path)
            except (SyntaxError, ValueError):
                continue  # it fails at build time; nothing here to judge
            checker = _PyChecker(path, lines, vendor if path not in references else ())
            found.extend(sorted(checker.run(tree), key=lambda f: f.line))  # ast.walk goes breadth first
        elif path.lower().endswith(_TEXT_SUFFIXES):
            for number, line in enumerate(lines, 1):
                for rule, pattern in _NATIVE_PATTERNS:
                    if pattern.search(line):
                        found.append(Finding(rule, RULES_BY_ID[rule].action, path, number,
                                             line.strip()[:MAX_TEXT]))
    return found


def rule_table_markdown() -> str:
    """The rule table as Markdown (the guides and docs/architecture.md quote it)."""
    rows = ["| rule | action | what it looks for | why |", "|---|---|---|---|"]
    for rule in RULES:
        rows.append(f"| `{rule.id}` | {rule.action} | {rule.test} | {rule.reason} |")
    return "\n".join(rows) + "\n"
