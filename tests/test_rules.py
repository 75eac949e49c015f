"""The static source rules: each rule fires on its pattern with file:line evidence, and clean code passes."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kz_runner.contract.rules.engine import HOLD, REJECT, RULES, check_sources, rule_table_markdown

ROOT = Path(__file__).resolve().parents[1]


def findings(source: str, path: str = "src/kernel.py", **kw):
    return check_sources({path: source.encode()}, **kw)


@pytest.mark.parametrize("source, rule, action", [
    ("import time\ntime.perf_counter = lambda: 0.0\n", "timing-patch", REJECT),
    ("import time as t\nt.perf_counter_ns = None\n", "timing-patch", REJECT),
    ("import time\nsetattr(time, 'perf_counter', lambda: 0)\n", "timing-patch", REJECT),
    ("import cupy as cp\ncp.cuda.Event = object\n", "timing-patch", REJECT),
    ("from cupy import cuda\ncuda.Event.elapsed_time = None\n", "timing-patch", REJECT),
    ("from kz_runner import bench\nbench.Harness.run = None\n", "timing-patch", REJECT),
    ("import numpy as np\nx = np.load('expected/n1m_out.npy')\n", "expected-read", REJECT),
    ("import os\np = os.path.join(os.environ['W'], 'expected', 'o.npy')\n", "expected-read", REJECT),
    ("open('../.kernel_package/bench_result.yaml').read()\n", "expected-read", REJECT),
    ("import sys\nf = sys._getframe(1)\n", "introspection", REJECT),
    ("from sys import _getframe as g\nf = g()\n", "introspection", REJECT),
    ("import inspect\nfor fi in inspect.stack():\n    pass\n", "introspection", REJECT),
    ("import gc\nobjs = [o for o in gc.get_objects()]\n", "introspection", REJECT),
    ("def f(fr):\n    return fr.f_back.f_locals['probe']\n", "introspection", REJECT),
    ("import sys\nfr = getattr(sys, '_getframe')()\n", "introspection", REJECT),
    ("def f(g):\n    return g.__globals__['_state']\n", "introspection", REJECT),
    ("import sys\nsys.settrace(lambda *a: None)\n", "introspection", REJECT),
    ("from kz_runner.bench import pristine\npristine._SEALED.clear()\n", "introspection", REJECT),
    ("import os\nfrom kz_runner.bench.channel import _send\n", "introspection", REJECT),
    ("exec(open('k.txt').read())\n", "dynamic-code", HOLD),
    ("import importlib\nm = importlib.import_module('s' + 'ys')\n", "dynamic-code", HOLD),
    ("import sys\nf = getattr(sys, '_get' + 'frame')\n", "dynamic-code", HOLD),
    ("g = __builtins__\n", "dynamic-code", HOLD),
    ("import sys\nm = sys.modules['kz_runner.bench.pristine']\n", "dynamic-code", HOLD),
    ("import numpy as np\nlib = np.ctypeslib.load_library('k', '.')\n", "dynamic-code", HOLD),
    ("from numpy import ctypeslib\n", "dynamic-code", HOLD),
    ("import sys\nf = sys.__dict__['_get' + 'frame']\n", "dynamic-code", HOLD),
    ("import sys\nns = vars(sys)\n", "dynamic-code", HOLD),
    ("import __main__\n", "dynamic-code", HOLD),
    ("from __main__ import REGRESSION_TOLERANCE\n", "dynamic-code", HOLD),
    ("import os\nrun = getattr(os, 'sys' + 'tem')\n", "dynamic-code", HOLD),
    ("import os\nrun = getattr(os, 'system')\n", "dynamic-code", HOLD),
    ("import importlib\nb = importlib.import_module('kz_runner.bench')\n", "dynamic-code", HOLD),
    ("s = __import__('kz_schemas')\n", "dynamic-code", HOLD),
    ("import importlib\nm = importlib.import_module('__main__')\n", "dynamic-code", HOLD),
    ("import runpy\n", "dynamic-code", HOLD),
    ("import importlib.util\ns = importlib.util.spec_from_file_location('m', 'k.txt')\n", "dynamic-code", HOLD),
    ("import importlib\np = importlib.import_module('kz_runner.bench._pristine')\n", "introspection", REJECT),
    ("__import__('os').system('ls')\n", "network-subprocess", HOLD),
    ("import importlib\nsp = importlib.import_module('subprocess')\n", "network-subprocess", HOLD),
    ("import os\ngetattr(os, 'system')('ls')\n", "network-subprocess", HOLD),
    ("import threading\n", "concurrency", HOLD),
    ("from concurrent.futures import ThreadPoolExecutor\n", "concurrency", HOLD),
    ("import multiprocessing as mp\n", "concurrency", HOLD),
    ("import os\nos.fork()\n", "concurrency", HOLD),
    ("import cupy\ns = cupy.cuda.Stream(non_blocking=True)\n", "concurrency", HOLD),
    ("import socket\n", "network-subprocess", HOLD),
    ("from urllib.request import urlopen\n", "network-subprocess", HOLD),
    ("import subprocess\n", "network-subprocess", HOLD),
    ("import os\nos.system('nvidia-smi')\n", "network-subprocess", HOLD),
    ("import ctypes\n", "network-subprocess", HOLD),
    ("import cupy as cp\ndef f(a, b):\n    return cp.matmul(a, b)\n", "vendor-call", HOLD),
    ("import cupy\ncupy.linalg.norm(x)\n", "vendor-call", HOLD),
    ("import torch\ntorch.softmax(x, 1)\n", "vendor-call", HOLD),
])
def test_each_rule_fires_with_its_evidence(source, rule, action):
    found = [f for f in findings(source, op_class="Elementwise") if f.rule == rule]
    assert found, findings(source)
    hit = found[0]
    assert hit.action == action and hit.file == "src/kernel.py"
    assert hit.line >= 1 and hit.text == source.splitlines()[hit.line - 1].strip()


@pytest.mark.parametrize("path", ["src/time.py", "src/numpy/__init__.py", "cupy/core.py", "kz_runner/bench.py",
                                  "src/kz_events.py", "lib/numpy.cpython-311-x86_64-linux-gnu.so"])
def test_a_module_the_harness_imports_cannot_be_shadowed(path):
    (hit,) = [f for f in check_sources({path: b""}) if f.rule == "shadow-module"]
    assert hit.action == REJECT and hit.file == path


@pytest.mark.parametrize("line, rule", [
    ('FILE* f = fopen("expected/o.bin", "rb");', "expected-read"),
    ("PyFrameObject *f = PyEval_GetFrame();", "introspection"),
    ("PyObject *l = PyFrame_GetLocals(f);", "introspection"),
    ("cudaStreamCreate(&s);", "concurrency"),
    ("std::thread t(work);", "concurrency"),
    ('system("curl x");', "network-subprocess"),
    ("#include <sys/socket.h>", "network-subprocess"),
])
def test_native_sources_are_matched_line_by_line(line, rule):
    found = check_sources({"src/k.cu": f"// kernel\n{line}\n".encode()})
    assert [(f.rule, f.line) for f in found] == [(rule, 2)]


def test_clean_code_docstrings_and_the_contract_area_pass():
    source = '''"""Reads nothing from expected/ and never touches bench_result.yaml."""
import numpy as np
import time


def axpy(a, x, y, out):
    """out = a * x + y (the expected output is the harness's business)."""
    t0 = time.perf_counter()
    np.multiply(x, a, out=out)
    return out, time.perf_counter() - t0
'''
    assert findings(source) == []
    assert check_sources({".kernel_package/benchmark.py": b"import threading\nimport time\ntime.time = 0\n"}) == []


def test_everyday_uses_of_gc_inspect_and_sys_are_not_introspection():
    source = """import gc
import inspect
import sys


def f(x):
    gc.collect()
    print(inspect.signature(f), sys.version_info, file=sys.stderr)
    return x
"""
    assert findings(source) == []
    assert findings("from kz_runner import bench\nt = bench.time_fn\n") == []  # the public library
    assert findings("import importlib\nimport numpy as np\nimport re\ncp = importlib.import_module('cupy')\n"
                    "f = getattr(np, dtype_name)\nr = re.compile('[a-z]+')\n") == []  # literal or not guarded


def test_vendor_calls_are_free_in_reference_sources_and_for_gemm_kernels():
    source = "import cupy as cp\nout = cp.matmul(a, b)\n"
    assert findings(source, op_class="Attention")
    assert findings(source, op_class="Attention", reference_sources=["src/kernel.py"]) == []
    assert findings(source, op_class="gemm") == []
    assert findings(source, op_class="Attention", vendor_calls=()) == []


def test_every_example_passes_the_rules():
    for desc in sorted((ROOT / "examples").rglob(".kernel_package/desc.yaml")):
        pkg = desc.parent.parent
        doc = yaml.safe_load(desc.read_text())
        files = {p.relative_to(pkg).as_posix(): p.read_bytes() for p in pkg.rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts}
        found = check_sources(files, op_class=doc["category"]["op_class"],
                              reference_sources=doc.get("reference_sources") or [])
        assert found == [], (pkg, [f.render() for f in found])


def test_the_rule_table_lists_every_rule():
    table = rule_table_markdown()
    for rule in RULES:
        assert f"| `{rule.id}` | {rule.action} |" in table


def test_python_is_decoded_by_its_coding_declaration():
    source = "# -*- coding: latin-1 -*-\n# r\u00e9sum\u00e9\nimport sys\nf = sys._getframe(1)\n".encode("latin-1")
    (hit,) = check_sources({"src/k.py": source})
    assert (hit.rule, hit.line, hit.text) == ("introspection", 4, "f = sys._getframe(1)")
    utf7 = b"# coding: utf-7\nimport sys\n+AGY- = sys._getframe\n"  # '+AGY-' is 'f' in UTF-7
    assert [(f.rule, f.line) for f in check_sources({"src/k.py": utf7})] == [("introspection", 3)]


@pytest.mark.parametrize("source, why", [
    (b"x = '\xe9'\n", "invalid or missing encoding declaration"),
    (b"# coding: rot13\nx = 1\n", "not a text encoding"),
    (b"# coding: no-such-codec\nx = 1\n", "unknown encoding"),
    (b"\xef\xbb\xbf# coding: latin-1\nx = 1\n", "encoding problem"),
    (b"# coding: ascii\nx = '\xe9'\n", "not ascii at byte"),
])
def test_a_python_file_that_does_not_decode_is_held(source, why):
    (hit,) = check_sources({"src/k.py": source})
    assert (hit.rule, hit.action, hit.file) == ("unreadable-source", HOLD, "src/k.py") and why in hit.text


def test_native_sources_in_another_encoding_are_still_matched():
    found = check_sources({"src/k.cu": b"// caf\xe9\nsystem(\"curl x\");\n"})
    assert [(f.rule, f.line) for f in found] == [("network-subprocess", 2)]


@pytest.mark.parametrize("path", ["deps.zip", "lib/x.whl", "vendor/a.egg", "src/app.pyz", "b.tar", "b.tar.gz",
                                  "b.tgz", "b.tar.xz", "src/_k.cpython-311-x86_64-linux-gnu.so", "libk.so.1",
                                  "k.pyd", "k.dylib", "k.dll", "k.o", "libk.a", "src/k.pyc", "src/k.pyo",
                                  "src/__pycache__/k.cpython-311.pyc", "src/__pycache__/notes.txt"])
def test_binaries_and_caches_in_the_submission_are_held_by_name(path):
    (hit,) = check_sources({path: b"\x00\x01binary"})
    assert (hit.rule, hit.action, hit.file) == ("prebuilt-binary", HOLD, path)


def test_sources_of_the_same_names_are_not_binaries():
    files = {"src/zipper.py": b"import zipfile\n", "src/so.py": b"x = 1\n", "src/k.cu": b"// .so .zip\n",
             "docs/a.tar.md": b"notes\n"}
    assert check_sources(files) == []


def test_walk_nodes_gives_ast_walks_nodes_in_its_order():
    """The rules' one walk per file visits what ``ast.walk`` visits, breadth first, in the same order."""
    import ast

    from kz_runner.contract.rules.pysource import walk_nodes
    sources = [path.read_text() for path in sorted((ROOT / "examples").rglob("*.py"))]
    sources.append("def f(a, *b, c=1, **d):\n    '''doc'''\n    return [x async for x in y] if a else {**d}\n")
    for source in sources:
        tree = ast.parse(source)
        walked = list(ast.walk(tree))
        listed = walk_nodes(tree)
        assert len(listed) == len(walked) and all(a is b for a, b in zip(listed, walked))
