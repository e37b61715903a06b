"""The assembly API resolves every name, and the library stays light at import time."""

from __future__ import annotations

import subprocess
import sys

import focus
import focus.extend


def test_every_exported_name_resolves():
    for name in focus.__all__:
        assert getattr(focus, name) is not None, name


def test_extend_exposes_every_extension_interface_the_guide_names():
    wanted = {
        "Env",
        "Workspace",
        "Policy",
        "ChatCodec",
        "ActionParser",
        "ContextManager",
        "BranchPoints",
        "Priority",
        "Critic",
        "Estimator",
    }
    assert wanted <= set(focus.extend.__all__)
    import abc

    for name in wanted:
        assert isinstance(getattr(focus.extend, name), abc.ABCMeta), name


def test_library_import_pulls_no_torch_prefect_or_dask():
    code = (
        "import sys, focus, focus.extend, focus.collector, focus.backends, focus.agent, focus.critic, focus.toy\n"
        "for n in focus.__all__: getattr(focus, n)\n"
        "print(sorted(m for m in ('torch', 'prefect', 'distributed', 'dask', 'tinker') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


PIPELINE = ("tasks", "flows", "storage", "deployments")


def _imported_modules(path):
    """Every module an ``import``/``from`` statement in ``path`` names, at any depth
    (imports inside functions count: a lazy import is still a dependency)."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node.lineno


def test_library_imports_nothing_from_the_pipeline():
    """Layers point one way: focus -> (nothing of the pipeline). The check is static, so
    it also sees imports that only run in a rarely used function."""
    from pathlib import Path

    root = Path(focus.__file__).parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        for module, line in _imported_modules(path):
            if module.split(".")[0] in PIPELINE:
                bad.append(f"{path.relative_to(root.parent)}:{line} imports {module}")
    assert not bad, "the library imports the pipeline:\n" + "\n".join(bad)


def test_the_import_check_sees_lazy_imports(tmp_path):
    """The checker itself: a function-level ``from storage import X`` is found."""
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from storage import BatchStore\n    import flows.collect\n")
    found = {m for m, _ in _imported_modules(src)}
    assert {"storage", "flows.collect"} <= found


def test_extend_exports_every_interface_the_readme_table_names():
    # README.md: "subclass the interface that owns the behaviour (all re-exported by
    # focus.extend)"; its table's first column names them
    import re
    from pathlib import Path

    readme = Path(__file__).resolve().parents[1].joinpath("README.md").read_text(encoding="utf-8")
    table = readme.split("Where your code fits", 1)[1].split("\n\n", 2)[1]
    named = {n for line in table.splitlines()[2:] for n in re.findall(r"`(\w+)`", line.split("|")[1])}
    assert {"Env", "ToolEnv", "Tool", "Priority", "Execution"} <= named
    assert named <= set(focus.extend.__all__), named - set(focus.extend.__all__)


def test_every_builtin_part_of_a_run_is_exported_from_focus():
    # "use focus to assemble a run": a run's critic came from focus.critic and the
    # estimators other than DirectBranchTd from focus.estimation only
    import importlib
    import inspect

    for module, interface in [
        ("focus.branching", "BranchPoints"),
        ("focus.context", "ContextManager"),
        ("focus.priority", "Priority"),
        ("focus.critic", "Critic"),
        ("focus.estimation", "Estimator"),
    ]:
        mod = importlib.import_module(module)
        base = getattr(focus.extend, interface)
        builtins = [
            n
            for n, c in vars(mod).items()
            if inspect.isclass(c)
            and issubclass(c, base)
            and c is not base
            and c.__module__ == module
            and not n.startswith("_")
            and not inspect.isabstract(c)
        ]
        assert builtins, module
        assert [n for n in builtins if n not in focus.__all__] == [], module


def test_the_command_line_and_its_configuration_load_no_batch_or_checkpoint_store():
    """``storage``'s names load on first use: the configuration's read-ahead defaults
    (``storage.read_ahead``) loaded the whole package, the batch and checkpoint stores
    with it, for every ``focus`` command (``--help`` too): ``import cli.app`` took 0.33 s,
    now 0.25 s. The names still resolve, and ``from storage import X`` still works."""
    code = (
        "import sys, cli.app, tasks.config, storage\n"
        "print(sorted(m for m in ('storage.batches', 'storage.checkpoints', 'storage.lease') if m in sys.modules))\n"
        "from storage import BatchStore, CheckpointStore, SchemaError, Retry\n"
        "print(all(getattr(storage, n) is not None for n in storage.__all__), 'BatchStore' in dir(storage))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True True"], out.stdout
