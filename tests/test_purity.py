"""gm_core stays pure: no I/O, no clock, no unseeded randomness, no frameworks.

Theory of operation
-------------------
Three tests guard the boundary between gm_core (values and total functions) and
gm_shell (effects):

1. ``test_gm_core_is_pure`` parses every ``.py`` file under ``src/gm_core`` with
   :mod:`ast` and reports each place that could do I/O, read a clock or draw
   unseeded randomness (the rules are listed on :class:`Rule`). It is static, so
   it sees code paths no test executes; it is best effort against deliberate
   evasion (``getattr(np.random, "seed")``), which review catches.
2. ``test_checker_catches`` runs the same checker over small synthetic sources,
   one or more per rule, and asserts each is caught — so (1) cannot pass because
   the checker went blind. ``test_checker_accepts`` guards against false alarms
   on the idioms the core is meant to use.
3. ``test_gm_core_runtime_imports`` imports every gm_core module in a fresh
   interpreter and looks at ``sys.modules``. Its dependencies already pull in
   much of the stdlib (attrs and numpy.random import ``threading``; numpy
   imports ``os``, ``io``, ``pathlib``, ``datetime``, ``random`` and ``secrets``
   internally), so it checks two things: modules that must never be loaded at
   all (asyncio, sockets, subprocesses, frameworks, gm_shell), and that gm_core
   adds no forbidden module beyond those its dependencies load themselves. The
   static check is what forbids gm_core's *own* use of ``threading`` and friends.

Decisions:
- ``logging`` and ``warnings`` are forbidden: both write to streams. The core
  reports what happened as event values; gm_shell logs them.
- ``print``/``input``/``open``/``exec``/``eval``/``compile``/``__import__`` and
  ``importlib`` are forbidden: I/O or imports the checker cannot see.
- ``hash()`` is forbidden: str and bytes hashes are salted per process
  (PYTHONHASHSEED), which breaks "same seed, same trace". Use hashlib.
- ``sys`` is allowed only for constants (``sys.maxsize``, ``sys.float_info``...).
- Third-party imports are limited to gm_core's declared dependencies (attrs,
  cattrs, numpy) and typing_extensions.
- ``numpy.random`` is allowed only as ``Generator``, the bit generators and
  ``SeedSequence``/``default_rng`` with an explicit seed: randomness enters the
  core as a Generator passed in. numpy's file functions and ``.tofile`` are
  forbidden, and so is ``np.datetime64("now")`` (a clock read).
"""

from __future__ import annotations

import ast
import enum
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "src" / "gm_core"


class Rule(enum.StrEnum):
    FORBIDDEN_MODULE = "forbidden-module"  # an I/O, clock, randomness or concurrency module
    FOREIGN_MODULE = "foreign-module"  # a third-party package gm_core does not depend on
    SHELL_IMPORT = "shell-import"  # gm_core must not import gm_shell
    RELATIVE_ESCAPE = "relative-escape"  # a relative import that leaves the gm_core package
    FORBIDDEN_BUILTIN = "forbidden-builtin"  # open, print, input, exec, eval, __import__, hash...
    RESTRICTED_ATTR = "restricted-attr"  # numpy.random.<global state>, sys.<stream/argv/exit>
    MODULE_AS_VALUE = "module-as-value"  # `r = np.random` hides later uses from the checker
    UNSEEDED_RNG = "unseeded-rng"  # default_rng(), PCG64(), SeedSequence() draw OS entropy
    FILE_IO = "file-io"  # np.load, np.save, ndarray.tofile, json.dump, pickle.load, ...
    CLOCK_READ = "clock-read"  # np.datetime64("now")


def _words(text: str) -> list[str]:
    return text.split()


_IO = "does I/O"
_CLOCK = "reads a clock"
_RANDOM = "draws unseeded randomness"
_CONCURRENCY = "belongs to the shell's event loop/concurrency"
_STREAMS = "writes to streams (the core returns event values; gm_shell logs them)"
_DYNAMIC = "imports or runs code the checker cannot see"

FORBIDDEN_MODULES: dict[str, str] = {
    **dict.fromkeys(
        _words(
            """
            os io pathlib shutil tempfile glob fileinput filecmp linecache tokenize mmap fcntl
            termios tty pty getpass netrc mailbox sqlite3 dbm shelve zipfile tarfile gzip bz2
            lzma zipimport pkgutil site sysconfig platform locale gettext ctypes resource
            faulthandler atexit pdb inspect socket socketserver ssl select selectors signal
            urllib http ftplib smtplib poplib imaplib xmlrpc webbrowser wsgiref
            """
        ),
        _IO,
    ),
    **dict.fromkeys(_words("time datetime zoneinfo sched timeit cProfile profile"), _CLOCK),
    **dict.fromkeys(_words("random secrets uuid"), _RANDOM),
    **dict.fromkeys(
        _words("asyncio threading _thread multiprocessing concurrent subprocess"), _CONCURRENCY
    ),
    **dict.fromkeys(_words("logging warnings"), _STREAMS),
    **dict.fromkeys(_words("importlib builtins runpy code codeop"), _DYNAMIC),
}
"""Top-level stdlib modules gm_core may not import, with the reason."""

ALLOWED_THIRD_PARTY = frozenset({"attrs", "attr", "cattrs", "numpy", "typing_extensions"})
"""gm_core's declared runtime dependencies (see pyproject.toml), plus typing_extensions."""

RESTRICTED: dict[str, frozenset[str]] = {
    "numpy.random": frozenset(
        _words(
            "Generator BitGenerator default_rng SeedSequence PCG64 PCG64DXSM Philox SFC64 MT19937"
        )
    ),
    "sys": frozenset(_words("version_info maxsize float_info int_info hash_info byteorder")),
}
"""Namespaces whose members are allowed only from a list (the rest is global state or I/O)."""

SEEDED_CONSTRUCTORS = frozenset(
    f"numpy.random.{name}"
    for name in ("default_rng", "SeedSequence", "PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937")
)
"""Calls that draw entropy from the OS unless given a seed."""

FILE_IO = frozenset(
    [
        *(
            f"numpy.{name}"
            for name in _words(
                """
                load save savez savez_compressed loadtxt savetxt genfromtxt fromfile fromregex
                memmap DataSource lib.npyio lib.format ctypeslib f2py show_config show_runtime info
                """
            )
        ),
        *(f"{m}.{f}" for m in ("json", "pickle", "marshal") for f in ("dump", "load")),
    ]
)
"""Functions and submodules that read or write files (or a file object) or print."""

IO_ATTRIBUTES = frozenset({"tofile"})
"""Method names that do I/O whatever object they are called on (ndarray.tofile)."""

FORBIDDEN_BUILTINS: dict[str, str] = {
    **dict.fromkeys(["open", "print", "input", "breakpoint", "help", "exit", "quit"], _IO),
    **dict.fromkeys(["exec", "eval", "compile", "__import__", "__builtins__"], _DYNAMIC),
    "hash": "is salted per process for str/bytes (PYTHONHASHSEED); use hashlib",
}


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    rule: Rule
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.detail}"


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name the file binds itself (a parameter called `input` is not the builtin)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif (isinstance(node, ast.ExceptHandler) and node.name) or (
            isinstance(node, ast.MatchAs | ast.MatchStar) and node.name
        ):
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
    return names


class _Checker(ast.NodeVisitor):
    def __init__(self, path: str, module: str, is_package: bool) -> None:
        self.path = path
        parts = module.split(".")
        self.package = parts if is_package else parts[:-1]
        self.aliases: dict[str, str] = {}  # local name -> dotted module or member it names
        self.bound: set[str] = set()
        self.violations: list[Violation] = []

    def run(self, tree: ast.Module) -> list[Violation]:
        self.bound = _bound_names(tree)
        # Aliases first, so a use above a function-level import still resolves.
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                    else:
                        top = a.name.split(".")[0]
                        self.aliases[top] = top
            elif isinstance(node, ast.ImportFrom):
                base = self._resolve_from(node)
                if base is not None:
                    for a in node.names:
                        if a.name != "*":
                            self.aliases[a.asname or a.name] = f"{base}.{a.name}"
        self.visit(tree)
        return self.violations

    def _flag(self, node: ast.AST, rule: Rule, detail: str) -> None:
        self.violations.append(Violation(self.path, getattr(node, "lineno", 0), rule, detail))

    def _resolve_from(self, node: ast.ImportFrom) -> str | None:
        if node.level == 0:
            return node.module or ""
        up = node.level - 1
        if up >= len(self.package):
            return None
        base = self.package[: len(self.package) - up]
        return ".".join([*base, node.module] if node.module else base)

    # -- imports ---------------------------------------------------------------

    def _check_module(self, node: ast.AST, name: str) -> bool:
        """Flag an imported module; True when it is fine to look further into it."""
        top = name.split(".")[0]
        if top == "gm_shell":
            self._flag(
                node, Rule.SHELL_IMPORT, f"imports {name}: gm_core must not depend on gm_shell"
            )
        elif top in FORBIDDEN_MODULES:
            self._flag(
                node, Rule.FORBIDDEN_MODULE, f"imports {name}, which {FORBIDDEN_MODULES[top]}"
            )
        elif (
            top in ("gm_core", "__future__")
            or top in ALLOWED_THIRD_PARTY
            or top in sys.stdlib_module_names
        ):
            return True
        else:
            self._flag(
                node,
                Rule.FOREIGN_MODULE,
                f"imports {name}: gm_core depends only on {sorted(ALLOWED_THIRD_PARTY)}",
            )
        return False

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if self._check_module(node, a.name):
                self._check_reference(node, a.name, as_value=False)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self._resolve_from(node)
        if base is None:
            self._flag(node, Rule.RELATIVE_ESCAPE, "relative import climbs out of gm_core")
            return
        if not self._check_module(node, base):
            return
        for a in node.names:
            if a.name == "*":
                if base in RESTRICTED or base == "numpy":
                    self._flag(
                        node, Rule.RESTRICTED_ATTR, f"from {base} import * hides what is used"
                    )
            else:
                self._check_module(node, f"{base}.{a.name}")
                self._check_reference(node, f"{base}.{a.name}", as_value=False)

    # -- uses ------------------------------------------------------------------

    def _check_reference(self, node: ast.AST, dotted: str, *, as_value: bool) -> None:
        for prefix, allowed in RESTRICTED.items():
            if dotted == prefix and as_value:
                self._flag(
                    node,
                    Rule.MODULE_AS_VALUE,
                    f"{prefix} used as a value: name its allowed members {sorted(allowed)}",
                )
            elif dotted.startswith(prefix + "."):
                member = dotted[len(prefix) + 1 :].split(".")[0]
                if member not in allowed:
                    self._flag(
                        node,
                        Rule.RESTRICTED_ATTR,
                        f"{prefix}.{member} is not allowed in gm_core (allowed: {sorted(allowed)})",
                    )
        parts = dotted.split(".")
        for i in range(2, len(parts) + 1):
            if ".".join(parts[:i]) in FILE_IO:
                self._flag(node, Rule.FILE_IO, f"{dotted} reads or writes files")
                break

    def _dotted(self, node: ast.expr) -> tuple[str | None, list[str]]:
        """The dotted name an Attribute/Name chain names (None: not an import), and its attrs."""
        attrs: list[str] = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        attrs.reverse()
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return ".".join([self.aliases[node.id], *attrs]), attrs
        return None, attrs

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted, attrs = self._dotted(node)
        for attr in IO_ATTRIBUTES.intersection(attrs):
            self._flag(node, Rule.FILE_IO, f".{attr}() writes a file")
        if dotted is None:
            self.generic_visit(node)
        elif dotted.split(".")[0] not in FORBIDDEN_MODULES:  # already flagged at the import
            self._check_reference(node, dotted, as_value=True)

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            return
        if node.id in self.aliases:
            self._check_reference(node, self.aliases[node.id], as_value=True)
        elif node.id in FORBIDDEN_BUILTINS and node.id not in self.bound:
            self._flag(node, Rule.FORBIDDEN_BUILTIN, f"{node.id} {FORBIDDEN_BUILTINS[node.id]}")

    def visit_Call(self, node: ast.Call) -> None:
        dotted, _ = self._dotted(node.func)
        if dotted in SEEDED_CONSTRUCTORS:
            seed = node.args[0] if node.args else None
            for kw in node.keywords:
                if kw.arg in ("seed", "entropy") or kw.arg is None:
                    seed = kw.value
            if seed is None or (isinstance(seed, ast.Constant) and seed.value is None):
                self._flag(node, Rule.UNSEEDED_RNG, f"{dotted}() without a seed draws OS entropy")
        elif dotted == "numpy.datetime64" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and first.value in ("now", "today"):
                self._flag(
                    node, Rule.CLOCK_READ, f'numpy.datetime64("{first.value}") reads the clock'
                )
        self.generic_visit(node)


def check_source(
    source: str, path: str = "<string>", module: str = "gm_core.example"
) -> list[Violation]:
    """Every purity violation in one gm_core source file."""
    tree = ast.parse(source, filename=path)
    return _Checker(path, module, is_package=path.endswith("__init__.py")).run(tree)


def _core_files() -> Iterator[tuple[Path, str]]:
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(CORE.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield path, ".".join(parts)


def test_gm_core_is_pure() -> None:
    files = list(_core_files())
    assert files, f"no Python files found under {CORE}"
    violations = [
        v
        for path, module in files
        for v in check_source(path.read_text(), str(path.relative_to(ROOT)), module)
    ]
    assert not violations, "gm_core must stay pure:\n" + "\n".join(map(str, violations))


# Each source must trigger its rule. Several per rule, to cover each way in.
VIOLATIONS: list[tuple[Rule, str]] = [
    (Rule.FORBIDDEN_MODULE, "import os"),
    (Rule.FORBIDDEN_MODULE, "import os.path as p"),
    (Rule.FORBIDDEN_MODULE, "from pathlib import Path"),
    (Rule.FORBIDDEN_MODULE, "import time"),
    (Rule.FORBIDDEN_MODULE, "from datetime import datetime"),
    (Rule.FORBIDDEN_MODULE, "import random"),
    (Rule.FORBIDDEN_MODULE, "import asyncio"),
    (Rule.FORBIDDEN_MODULE, "import threading"),
    (Rule.FORBIDDEN_MODULE, "from concurrent import futures"),
    (Rule.FORBIDDEN_MODULE, "import subprocess"),
    (Rule.FORBIDDEN_MODULE, "import socket"),
    (Rule.FORBIDDEN_MODULE, "import io"),
    (Rule.FORBIDDEN_MODULE, "import shutil, tempfile"),
    (Rule.FORBIDDEN_MODULE, "from urllib.request import urlopen"),
    (Rule.FORBIDDEN_MODULE, "import http.client"),
    (Rule.FORBIDDEN_MODULE, "import logging"),
    (Rule.FORBIDDEN_MODULE, "import warnings"),
    (Rule.FORBIDDEN_MODULE, "import importlib"),
    (Rule.FORBIDDEN_MODULE, "def f():\n    import uuid\n    return uuid.uuid4()"),
    (Rule.FOREIGN_MODULE, "import torch"),
    (Rule.FOREIGN_MODULE, "import mlx.core as mx"),
    (Rule.FOREIGN_MODULE, "from obstore.store import MemoryStore"),
    (Rule.FOREIGN_MODULE, "import requests"),
    (Rule.FOREIGN_MODULE, "import blake3"),
    (Rule.SHELL_IMPORT, "from gm_shell import cli"),
    (Rule.SHELL_IMPORT, "import gm_shell.cli"),
    (Rule.RELATIVE_ESCAPE, "from ... import anything"),
    (Rule.FORBIDDEN_BUILTIN, "f = open('x')"),
    (Rule.FORBIDDEN_BUILTIN, "print('hello')"),
    (Rule.FORBIDDEN_BUILTIN, "x = input()"),
    (Rule.FORBIDDEN_BUILTIN, "m = __import__('os')"),
    (Rule.FORBIDDEN_BUILTIN, "exec('1')"),
    (Rule.FORBIDDEN_BUILTIN, "eval('1')"),
    (Rule.FORBIDDEN_BUILTIN, "h = hash('learner-1')"),
    (Rule.FORBIDDEN_BUILTIN, "f = open  # aliasing the builtin"),
    (Rule.RESTRICTED_ATTR, "import numpy as np\nnp.random.seed(0)"),
    (Rule.RESTRICTED_ATTR, "import numpy as np\nx = np.random.rand(3)"),
    (Rule.RESTRICTED_ATTR, "import numpy\nx = numpy.random.normal()"),
    (Rule.RESTRICTED_ATTR, "import numpy.random\nnumpy.random.shuffle([1])"),
    (Rule.RESTRICTED_ATTR, "import numpy.random as npr\nnpr.seed(1)"),
    (Rule.RESTRICTED_ATTR, "from numpy import random as r\nr.randint(3)"),
    (Rule.RESTRICTED_ATTR, "from numpy.random import seed"),
    (Rule.RESTRICTED_ATTR, "from numpy.random import *"),
    (Rule.RESTRICTED_ATTR, "import numpy as np\nstate = np.random.get_state()"),
    (Rule.RESTRICTED_ATTR, "import sys\nsys.stdout.write('x')"),
    (Rule.RESTRICTED_ATTR, "from sys import argv"),
    (Rule.RESTRICTED_ATTR, "import sys\nsys.exit(1)"),
    (Rule.RESTRICTED_ATTR, "from numpy import random\nrandom.seed(0)"),
    (Rule.MODULE_AS_VALUE, "import numpy as np\nr = np.random"),
    (Rule.MODULE_AS_VALUE, "import numpy.random as npr\nf(npr)"),
    (Rule.MODULE_AS_VALUE, "import sys\nm = sys"),
    (Rule.UNSEEDED_RNG, "import numpy as np\nrng = np.random.default_rng()"),
    (Rule.UNSEEDED_RNG, "import numpy as np\nrng = np.random.default_rng(None)"),
    (Rule.UNSEEDED_RNG, "import numpy as np\nrng = np.random.default_rng(seed=None)"),
    (Rule.UNSEEDED_RNG, "from numpy.random import default_rng\nrng = default_rng()"),
    (Rule.UNSEEDED_RNG, "import numpy as np\ng = np.random.Generator(np.random.PCG64())"),
    (Rule.UNSEEDED_RNG, "from numpy.random import SeedSequence\nss = SeedSequence()"),
    (Rule.FILE_IO, "import numpy as np\na = np.load('x.npy')"),
    (Rule.FILE_IO, "import numpy as np\nnp.save('x.npy', a)"),
    (Rule.FILE_IO, "from numpy import savez"),
    (Rule.FILE_IO, "import numpy as np\nm = np.memmap('f')"),
    (Rule.FILE_IO, "import numpy as np\nnp.lib.npyio.savetxt('f', a)"),
    (Rule.FILE_IO, "def f(a):\n    a.tofile('x')"),
    (Rule.FILE_IO, "import json\njson.dump(obj, fp)"),
    (Rule.FILE_IO, "from pickle import load"),
    (Rule.CLOCK_READ, "import numpy as np\nt = np.datetime64('now')"),
    (Rule.CLOCK_READ, "import numpy\nt = numpy.datetime64('today')"),
]


@pytest.mark.parametrize(("rule", "source"), VIOLATIONS, ids=lambda x: str(x)[:40])
def test_checker_catches(rule: Rule, source: str) -> None:
    found = check_source(source)
    assert rule in {v.rule for v in found}, f"{rule} not caught in {source!r}; found {found}"


def test_every_rule_has_a_synthetic_violation() -> None:
    assert {rule for rule, _ in VIOLATIONS} == set(Rule)


ACCEPTED = [
    "from __future__ import annotations\nimport enum, math, hashlib, struct, json, heapq",
    "import attrs\nimport cattrs\nfrom cattrs.preconf.json import make_converter",
    "import numpy as np\nfrom numpy.typing import NDArray\nx = np.zeros(3, dtype=np.float32)",
    "import numpy as np\ndef f(rng: np.random.Generator) -> float:\n    return rng.random()",
    "import numpy as np\nr = np.random.default_rng(42)",
    "import numpy as np\ng = np.random.Generator(np.random.PCG64(7))",
    "import numpy as np\ns = np.random.SeedSequence(entropy=3)\nr = np.random.default_rng(seed=s)",
    "from numpy.random import Generator, default_rng\nr: Generator = default_rng(seed)",
    "from . import records\nfrom .records import Reason",
    "from gm_core import records",
    "import sys\nbig = sys.maxsize",
    "def f(input, open):\n    return input + open",
    "def g(x):\n    return x.hash + x.print",
    "import numpy as np\nt = np.datetime64('2024-01-01')",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from collections.abc import Iterator",
]


@pytest.mark.parametrize("source", ACCEPTED, ids=lambda x: x.split("\n")[-1][:40])
def test_checker_accepts(source: str) -> None:
    assert check_source(source, module="gm_core.sub.mod") == []


# Must never be loaded by importing gm_core, even through its dependencies.
NEVER_LOADED = frozenset(
    _words(
        """
        asyncio obstore torch mlx jax flax optax socket subprocess ssl selectors multiprocessing
        concurrent
        logging gm_shell requests boto3 blake3 zstandard safetensors
        """
    )
)

_RUNTIME_PROBE = """
import json, pkgutil, sys
import attrs, attr, cattrs, cattrs.gen, cattrs.preconf.json, cattrs.strategies
import numpy, numpy.random, numpy.typing
deps = set(sys.modules)
import gm_core
errors = {}
for info in pkgutil.walk_packages(gm_core.__path__, "gm_core."):
    try:
        __import__(info.name)
    except Exception as exc:
        errors[info.name] = repr(exc)
print(json.dumps({"deps": sorted(deps), "after": sorted(sys.modules), "errors": errors}))
"""


def test_gm_core_runtime_imports() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(CORE.parent), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", _RUNTIME_PROBE],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=120,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["errors"] == {}, f"gm_core modules failed to import: {report['errors']}"
    after = set(report["after"])
    assert any(m.startswith("gm_core") for m in after)
    never = sorted(m for m in after if m.split(".")[0] in NEVER_LOADED)
    assert not never, f"importing gm_core loaded {never}"
    added = sorted(set(after) - set(report["deps"]))
    forbidden = [m for m in added if m.split(".")[0] in FORBIDDEN_MODULES]
    assert not forbidden, f"gm_core loads {forbidden}, beyond what its dependencies load"
