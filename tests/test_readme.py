"""The README's library example runs as written (so it cannot drift from the code)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_readme_library_example_runs_and_prints_a_batch_summary():
    code = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)[0]
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "'collection_id': 'demo'" in out.stdout and "'failed_rollouts': 0" in out.stdout
    assert "Unclosed" not in out.stderr, out.stderr[-2000:]
