"""The assembly API resolves every name, and the library stays light at import time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


#: Modules a command that reads no batch, trains nothing and starts nothing must not load.
DATA_MODULES = ("numpy", "pyarrow", "torch", "pandas", "prefect", "dask", "distributed", "polars", "duckdb")


def test_commands_that_do_no_data_work_load_no_numpy_pyarrow_or_torch():
    """``focus --help``, every command's ``--help``, ``focus config show`` and a wrong
    command line read the configuration's schema and print: they loaded numpy and
    pyarrow (the search's configuration imported the noise model through
    ``focus.priority``, the train settings the local trainer and its batch), 0.64 s of
    imports for ``focus --help`` under ``-X importtime``, 0.38 s of it for these. Each
    command runs in one process in turn, and the first that loads one is named."""
    root = Path(__file__).resolve().parent.parent
    commands = [
        ["--help"],
        ["collect", "--help"],
        ["train", "--help"],
        ["inspect", "--help"],
        ["serve-model", "--help"],
        ["deploy", "--help"],
        ["config", "--help"],
        ["config", "show"],
        ["config", "show", "-c", str(root / "configs" / "loop.toml")],
        ["config", "show", "--json", "-c", str(root / "configs" / "collect.toml")],
        ["collect", "--bogus"],
    ]
    code = (
        "import contextlib, io, sys\n"
        "from cli.app import run\n"
        f"for args in {commands!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        code = run(args, obj={'warm_model': None})\n"
        f"    heavy = sorted(m for m in {DATA_MODULES!r} if m in sys.modules)\n"
        "    print(' '.join(args[:3]), code, heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(commands), out.stdout + out.stderr
    assert [line for line in lines if not line.endswith(" []")] == [], out.stdout
    assert [line.split()[-2] for line in lines] == ["0"] * (len(commands) - 1) + ["2"], out.stdout
