"""The layer rules (docs/architecture.md), read from the source: every import statement of every module, found
by walking its syntax tree (imports inside functions too, relative imports resolved), against what its layer may
not import."""

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = {"ggtools": ROOT / "ggtools", "ggtools.runtime": ROOT / "runtime"}

# layer -> (module prefixes or imported names it must not import, why)
FORBIDDEN = {
    "ggtools.cli": (("ggtools.engine", "ggtools.gguf.writer", "ggtools.gguf.shards", "GGUFWriter", "ShardSet",
                     "ggtools.runtime"),
                    "the CLI parses and prints; jobs run the engine and the runtime and write files"),
    "ggtools.runtime": (("ggtools.jobs", "ggtools.cli", "ggtools.gguf.errors", "GGUFError", "ggtools.dflash.errors",
                         "DFlashError", "ggtools.quants.errors", "QuantError"),
                        "the runtime computes, jobs run it; it raises its own ModelError"),
    "ggtools.quants": (("ggtools.gguf",), "quants knows blocks, not files"),
    "ggtools.jobs": (("ggtools.cli",), "jobs are plain functions under the CLI"),
}
GGUF_MAY_IMPORT = ("ggtools.gguf", "ggtools.quants", "ggtools.errors")    # nothing above it


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def source_modules():
    """(module name, path) of every module of the installed packages, runtime/ as ggtools.runtime."""
    for package, top in PACKAGE_DIRS.items():
        for d, dirs, files in os.walk(top):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__")
            rel = Path(d).relative_to(top).parts
            for f in sorted(files):
                if f.endswith(".py"):
                    stem = () if f == "__init__.py" else (f[:-3],)
                    yield ".".join((package, *rel, *stem)), Path(d) / f


def imports(module: str, source: str, is_package: bool = False):
    """(line, imported module, imported name or None) for every import statement."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                yield node.lineno, base, alias.name


def broken_rules(module: str, source: str, is_package: bool = False) -> list[str]:
    out = []
    for line, imported, name in imports(module, source, is_package):
        targets = [imported] + ([f"{imported}.{name}"] if name else [])
        for layer, (forbidden, why) in FORBIDDEN.items():
            if _within(module, layer) and any(_within(t, f) or name == f for t in targets for f in forbidden):
                out.append(f"{module}:{line}: imports {targets[-1]} ({why})")
        if (_within(module, "ggtools.gguf") and _within(targets[-1], "ggtools")
                and not any(_within(targets[-1], m) for m in GGUF_MAY_IMPORT)):
            out.append(f"{module}:{line}: imports {targets[-1]} (the gguf layer imports nothing above it)")
    return out


def test_every_import_points_down():
    modules = list(source_modules())
    assert {"ggtools.cli.patch", "ggtools.engine.runner", "ggtools.runtime", "ggtools.quants"} <= \
        {name for name, _ in modules}
    broken = [b for name, path in modules
              for b in broken_rules(name, path.read_text(encoding="utf-8"), path.name == "__init__.py")]
    assert broken == []


def test_the_rules_catch_each_forbidden_import():
    cases = {
        "ggtools.cli.x": ["from ggtools.engine import run_plan", "from ggtools.engine.runner import run_plan",
                          "from ggtools.gguf import ShardSet", "from ggtools.gguf import GGUFWriter",
                          "import ggtools.gguf.writer", "def f():\n    from ggtools.gguf.shards import parse_shard_name",
                          "from ggtools.runtime import DraftSettings", "from ggtools.runtime.stats import DEFINITIONS",
                          "from ..runtime.greedy_decoding import greedy", "import ggtools.runtime"],
        "ggtools.runtime.x": ["from ggtools.jobs.accept import accept", "import ggtools.cli",
                              "from ggtools.gguf import GGUFError", "from ggtools.gguf.errors import located",
                              "from ..dflash.errors import CheckpointError", "from ggtools.jobs.errors import UsageError"],
        "ggtools.quants.x": ["from ..gguf import GGUFFile", "from ggtools.gguf.reader import pad"],
        "ggtools.jobs.x": ["from ggtools.cli.render import table", "from ..cli import main"],
        "ggtools.gguf.x": ["from ggtools.plan import Plan", "from ggtools.engine import run_plan",
                           "from ggtools.dflash.profiles import LLAMACPP", "from .. import jobs"],
    }
    for module, sources in cases.items():
        for source in sources:
            assert len(broken_rules(module, source)) == 1, (module, source)
    allowed = {"ggtools.cli.x": "from ggtools.gguf import ggml_type_name\nfrom ggtools.jobs.patch import patch_set\n"
                                "from ggtools.jobs.run import DraftSettings, run",
               "ggtools.quants.x": "from .registry import row_bytes\nfrom ggtools.errors import GGToolsError",
               "ggtools.runtime.x": "from ggtools.gguf import ShardSet\nfrom ggtools.errors import GGToolsError\n"
                                    "from .errors import ModelError",
               "ggtools.gguf.x": "from ggtools.gguf.reader import pad\nfrom .errors import GGUFError\nfrom .. import errors",
               "ggtools.jobs.x": "from ggtools.engine import run_plan\nfrom ggtools.gguf import ShardSet"}
    for module, source in allowed.items():
        assert broken_rules(module, source) == [], module
