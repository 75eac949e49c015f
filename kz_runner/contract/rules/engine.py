"""Static rules over a package's source area: what the zoo refuses, or holds for an admin, before a run.

The source area (everything beside ``.kernel_package/``) is the submitter's free
area, but some things in it defeat the measurement rather than speed up the kernel.
Each :class:`Rule` has an id, a reason, an action and the test it applies:

- ``reject``: the submission is refused at intake (``RULE_VIOLATION``);
- ``hold``: the submission waits in status ``held`` until an admin approves it
  (then it is queued) or rejects it.

Python files are decoded as Python decodes them (their PEP 263 coding declaration,
else UTF-8) and read with ``ast`` (never imported); a Python file that cannot be
decoded is itself a finding. Other text files (C, C++, CUDA, HIP, shell) are matched
line by line with simple patterns (bytes that are not UTF-8 read as Latin-1, so an
identifier is still seen). Files no rule can read (archives, compiled modules,
bytecode caches) are findings by their names. The rules are pure:
:func:`check_sources` takes ``{path: bytes}`` and returns :class:`RuleFinding` values,
one per rule, file and line. Import aliases are followed (``import cupy as cp``
makes ``cp.matmul`` read as ``cupy.matmul``); anything that hides a name behind
``getattr`` or ``exec`` is what the hold rules and an admin's review are for.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kz_runner.contract.rules.pysource import walk_nodes

__all__ = ["Rule", "RuleFinding", "RULES", "RULES_BY_ID", "REJECT", "HOLD", "DEFAULT_VENDOR_CALLS",
           "DEFAULT_GEMM_OP_CLASSES", "SHADOWED_MODULES", "SOURCE_SUFFIXES", "check_sources", "decode_python",
           "prebuilt_kind", "rule_table_markdown"]

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
class RuleFinding:
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
         "torch.cuda, kz_runner, kz_events or kz_schemas (e.g. time.perf_counter = ..., "
         "cupy.cuda.Event = ...)"),
    Rule("expected-read", REJECT,
         "the expected outputs and the scorecard are for the harness; a kernel that reads them "
         "can copy the answer or tune to the record",
         "a string naming the expected/ folder (\"expected\", \"expected/...\") or bench_result "
         "in a Python file; expected/ or bench_result in any other text file"),
    Rule("shadow-module", REJECT,
         "a module named like one the harness imports replaces it once src/ is on sys.path",
         "a file or folder in the source area named time, numpy, cupy, kz_runner, kz_events or "
         "kz_schemas (time.py, numpy/, cupy.cpython-311-x86_64-linux-gnu.so ...)"),
    Rule("introspection", REJECT,
         "the harness's checks live in the benchmark's own process: code that walks up the call "
         "stack or through the garbage collector reaches them (a kernel that found the harness's "
         "trial state that way and switched its output checks off was accepted)",
         "sys._getframe, sys._current_frames, sys.settrace/setprofile, inspect's frame functions "
         "(currentframe, stack, getouterframes, trace ...), gc.get_objects/get_referrers/get_referents; "
         "the frame and closure attributes f_back, f_locals, f_globals, tb_frame, gi_frame, cr_frame, "
         "ag_frame, __closure__, __globals__, cell_contents, also as string literals (getattr); a "
         "private name (one starting with _) of kz_runner, kz_events or kz_schemas, imported, "
         "reached or named in a literal import; in native code "
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
         "a name built at run time, a module's namespace taken whole or code loaded from elsewhere "
         "hides from the other rules what the code reaches; an admin reads it",
         "exec, eval or compile; __import__ or importlib.import_module of a name that is not a "
         "string literal, or of a literal naming kz_runner, kz_events, kz_schemas or __main__; "
         "runpy, importlib.machinery, importlib.util.spec_from_file_location/spec_from_loader; "
         "getattr, setattr, delattr or hasattr with a computed name on sys, os, gc, inspect, builtins, "
         "time, kz_runner, kz_events or kz_schemas, and getattr, setattr or delattr on os with any name; "
         "sys.modules; the __dict__ or vars() of those modules; import of __main__ or a name read from "
         "it; numpy.ctypeslib; __builtins__ or import of builtins"),
    Rule("unreadable-source", HOLD,
         "a Python file the rules cannot decode is code they cannot read; an admin reads it",
         "a .py file that does not decode under its PEP 263 coding declaration (or as UTF-8 without "
         "one): an unknown or non-text encoding, bytes invalid in it, a declaration that contradicts "
         "a UTF-8 BOM"),
    Rule("prebuilt-binary", HOLD,
         "an archive, a compiled module or a bytecode cache runs code no rule has read; build "
         "them from the package's sources in build_test_env.py instead (build outputs are not "
         "checked, only what is submitted)",
         "a submitted file named *.zip, *.whl, *.egg, *.pyz, *.tar, *.tar.gz, *.tgz, *.tar.bz2, "
         "*.tar.xz, *.tar.zst; *.so (also versioned, *.so.1), *.pyd, *.dylib, *.dll, *.o, *.a; "
         "*.pyc, *.pyo; anything under a __pycache__/ folder"),
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
SHADOWED_MODULES = frozenset({"time", "numpy", "cupy", "kz_runner", "kz_events", "kz_schemas"})

#: the harness's own packages: what a benchmark process imports besides the kernel
_HARNESS_PACKAGES = ("kz_runner", "kz_events", "kz_schemas")
_TIMING_ROOTS = ("time", "timeit", "cupy.cuda", "torch.cuda") + _HARNESS_PACKAGES
_INTROSPECTION_NAMES = ("sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
                        "inspect.currentframe", "inspect.stack", "inspect.trace", "inspect.getouterframes",
                        "inspect.getinnerframes", "inspect.getframeinfo", "inspect.getclosurevars",
                        "gc.get_objects", "gc.get_referrers", "gc.get_referents")
_CODE_CALLS = ("exec", "eval", "compile", "builtins.exec", "builtins.eval", "builtins.compile")
_IMPORT_CALLS = ("__import__", "builtins.__import__", "importlib.import_module", "importlib.__import__")
#: loaders of a file or spec as a module: code reached without an import statement the rules read
_LOADER_CALLS = ("runpy.*", "importlib.machinery.*", "importlib.util.spec_from_file_location",
                 "importlib.util.spec_from_loader")
_ATTR_CALLS = ("getattr", "setattr", "delattr", "hasattr")
_GUARDED_MODULES = ("sys", "os", "gc", "inspect", "builtins", "time") + _HARNESS_PACKAGES
#: literal module names whose import into an untracked name is held: the harness's packages
#: (their attributes, private ones included, then escape the alias tracking) and the
#: benchmark script's own namespace
_HELD_IMPORT_LITERALS = _HARNESS_PACKAGES + ("__main__",)
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
#: files the rules read as source (everything else only by its name)
SOURCE_SUFFIXES = (".py",) + _TEXT_SUFFIXES
MAX_TEXT = 200
_ARCHIVE = re.compile(r"\.(zip|whl|egg|pyz|tar|tgz|tbz2?|txz|tar\.(gz|bz2|xz|zst|lz4))$", re.IGNORECASE)
_COMPILED = re.compile(r"\.(so(\.\d+)*|pyd|dylib|dll|o|a)$", re.IGNORECASE)
_BYTECODE = re.compile(r"\.py[co]$", re.IGNORECASE)


def prebuilt_kind(path: str) -> str | None:
    """What kind of file the rules cannot read ``path`` is (archive, compiled module, bytecode), or None."""
    name = path.rsplit("/", 1)[-1]
    if "__pycache__" in path.split("/")[:-1] or _BYTECODE.search(name):
        return "bytecode cache"
    if _ARCHIVE.search(name):
        return "archive"
    if _COMPILED.search(name):
        return "compiled module"
    return None


def decode_python(data: bytes) -> str:
    """The text of a Python file as Python decodes it: its PEP 263 declaration, else UTF-8.

    Raises ``ValueError`` saying why Python would not read it either: an unknown or
    non-text encoding, a declaration that contradicts a UTF-8 BOM, bytes invalid in
    the encoding.
    """
    try:
        encoding, _lines = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:  # an unknown encoding, a declaration against a BOM, no declaration
        raise ValueError(exc.msg) from None
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise ValueError(f"not {encoding} at byte {exc.start}") from None
    except LookupError as exc:  # a codec that is not a text encoding (rot13 ...): Python refuses it too
        raise ValueError(str(exc)) from None


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
    """``a.b.c`` of a Name/Attribute chain with its root alias resolved, else None.

    A chain may start at a call whose result the rules can name (:func:`_call_target`):
    ``__import__("os").system`` reads as ``os.system``.
    """
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(aliases.get(node.id, node.id))
    elif isinstance(node, ast.Call):
        root = _call_target(node, aliases)
        if root is None:
            return None
        parts.append(root)
    else:
        return None
    return ".".join(reversed(parts))


def _literal_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _call_target(node: ast.Call, aliases: Mapping[str, str]) -> str | None:
    """The dotted name of what a call returns, where a literal says it, else None.

    ``importlib.import_module("a.b")`` is ``a.b``; ``__import__("a.b")`` is ``a`` (``a.b``
    with a fromlist); ``getattr(x, "name")`` is ``x.name``: the same object as a plain
    import or attribute, so the same rules apply to it.
    """
    func = _dotted(node.func, aliases)
    first = _literal_str(node.args[0]) if node.args else None
    if func in _IMPORT_CALLS and first:
        if func.endswith("__import__") and len(node.args) < 4 and not node.keywords:
            return first.split(".")[0]
        return first
    if func == "getattr" and len(node.args) >= 2:
        base, attr = _dotted(node.args[0], aliases), _literal_str(node.args[1])
        if base is not None and attr:
            return f"{base}.{attr}"
    return None


def _aliases(nodes: Iterable[ast.AST]) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in nodes:
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
        self.found: list[RuleFinding] = []

    def hit(self, rule: str, node: ast.AST) -> None:
        """Record ``rule`` at ``node``'s line (once per rule and line)."""
        line = getattr(node, "lineno", 0)
        if any(f.rule == rule and f.line == line for f in self.found):
            return
        text = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        self.found.append(RuleFinding(rule, RULES_BY_ID[rule].action, self.path, line, text[:MAX_TEXT]))

    def run(self, tree: ast.AST) -> list[RuleFinding]:
        nodes = walk_nodes(tree)  # one walk, read three times
        aliases = _aliases(nodes)
        # docstrings describe, they do not read files
        docstrings = {id(n.value) for n in nodes
                      if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        for node in nodes:
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
            if isinstance(node, ast.Name) and node.id in ("__builtins__", "__main__"):
                self.hit("dynamic-code", node)
            if isinstance(node, ast.Attribute) and node.attr in _INTROSPECTION_ATTRS:
                self.hit("introspection", node)
            elif isinstance(node, (ast.Attribute, ast.Name)):
                name = _dotted(node, aliases) or ""
                if _matches(name, _INTROSPECTION_NAMES) or _harness_private(name):
                    self.hit("introspection", node)
                elif _held_name(name):
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
        if isinstance(node, ast.ImportFrom) and not node.level:
            names += [f"{node.module}.{a.name}" for a in node.names]  # from numpy import ctypeslib
        for name in names:
            self._imported(name, node)

    def _imported(self, name: str, node: ast.AST) -> None:
        """The rules on importing the module ``name`` (an import statement or a literal import call)."""
        if _matches(name, ("builtins", "__main__", "runpy", "importlib.machinery")) or _held_name(name):
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
        module = _literal_str(node.args[0]) if node.args and name in _IMPORT_CALLS else None
        if name in _CODE_CALLS or (name in _IMPORT_CALLS and not module) or _matches(name, _LOADER_CALLS):
            self.hit("dynamic-code", node)
        if module:  # a literal import: the rules of an import statement, and the harness's packages held
            self._imported(module, node)
            if _harness_private(module):
                self.hit("introspection", node)
            elif _matches(module, _HELD_IMPORT_LITERALS):
                self.hit("dynamic-code", node)
        if name in _ATTR_CALLS and len(node.args) >= 2:
            base = _dotted(node.args[0], aliases)
            computed = not isinstance(node.args[1], ast.Constant)
            if base is not None and ((computed and _matches(base, _GUARDED_MODULES))
                                     or (base == "os" and name != "hasattr")):
                self.hit("dynamic-code", node)
        if name == "vars" and node.args:
            base = _dotted(node.args[0], aliases)
            if base is not None and _matches(base, _GUARDED_MODULES):
                self.hit("dynamic-code", node)
        if _matches(name, _CONCURRENCY_CALLS):
            self.hit("concurrency", node)
        if _matches(name, _NETWORK_CALLS):
            self.hit("network-subprocess", node)
        if self.vendor and _matches(name, self.vendor):
            self.hit("vendor-call", node)


def _held_name(name: str) -> bool:
    """A dotted name dynamic-code holds: sys.modules, a guarded module's ``__dict__``, numpy.ctypeslib."""
    if name == "sys.modules" or _matches(name, ("numpy.ctypeslib",)):
        return True
    return name.endswith(".__dict__") and _matches(name[:-len(".__dict__")], _GUARDED_MODULES)


def _shadowing(path: str) -> bool:
    for part in path.split("/"):
        if part.split(".", 1)[0] in SHADOWED_MODULES:
            return True
    return False


def check_sources(files: Mapping[str, bytes], *, op_class: str = "",
                  reference_sources: Iterable[str] = (),
                  vendor_calls: Iterable[str] = DEFAULT_VENDOR_CALLS,
                  gemm_op_classes: Iterable[str] = DEFAULT_GEMM_OP_CLASSES) -> list[RuleFinding]:
    """Every finding of the rules in the source area ``files`` ({path relative to the package: bytes}).

    Paths under ``.kernel_package/`` are skipped (the contract area is checked by the
    validator and, for existing kernels, locked). ``reference_sources`` (desc.yaml's)
    are exempt from the vendor-call rule: a trusted reference may call a library.
    """
    gemm = {c.lower() for c in gemm_op_classes}
    vendor = tuple(vendor_calls) if op_class.lower() not in gemm else ()
    references = set(reference_sources)
    found: list[RuleFinding] = []
    for path in sorted(files):
        if path.startswith(".kernel_package/") or path == ".kernel_package":
            continue
        if _shadowing(path):
            found.append(RuleFinding("shadow-module", REJECT, path, 0, f"{path} shadows a module the harness imports"))
        kind = prebuilt_kind(path)
        if kind is not None:
            found.append(RuleFinding("prebuilt-binary", HOLD, path, 0,
                                 f"{path}: a submitted {kind}, which no rule reads"))
            continue
        data = files[path]
        if path.endswith(".py"):
            try:
                text = decode_python(data)
            except ValueError as exc:
                found.append(RuleFinding("unreadable-source", HOLD, path, 0,
                                     f"{path} cannot be decoded as Python source: {exc}"[:MAX_TEXT]))
                continue
            try:
                tree = ast.parse(text, filename=path)
            except (SyntaxError, ValueError):
                continue  # Python cannot compile it either: it fails at build time, nothing to judge
            checker = _PyChecker(path, text.splitlines(), vendor if path not in references else ())
            found.extend(sorted(checker.run(tree), key=lambda f: f.line))  # ast.walk goes breadth first
        elif path.lower().endswith(_TEXT_SUFFIXES):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:  # a compiler reads bytes: the identifiers are still ASCII
                text = data.decode("latin-1")
            for number, line in enumerate(text.splitlines(), 1):
                for rule, pattern in _NATIVE_PATTERNS:
                    if pattern.search(line):
                        found.append(RuleFinding(rule, RULES_BY_ID[rule].action, path, number,
                                             line.strip()[:MAX_TEXT]))
    return found


def rule_table_markdown() -> str:
    """The rule table as Markdown (the guides and docs/architecture.md quote it)."""
    rows = ["| rule | action | what it looks for | why |", "|---|---|---|---|"]
    for rule in RULES:
        rows.append(f"| `{rule.id}` | {rule.action} | {rule.test} | {rule.reason} |")
    return "\n".join(rows) + "\n"
