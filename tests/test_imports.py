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
