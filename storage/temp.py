"""Private per-user folders under the temporary folder.

The weights cache, the trainer's working copies, the log file's and Prefect's
fallbacks each want a fixed name under ``/tmp``; on a machine shared by several users
a fixed name is taken by whoever came first.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def user_temp_folder(name: str) -> Path:
    """``<temporary folder>/<name>-<uid>``, made private (mode 0700) and this user's: a
    fixed name in a shared ``/tmp`` is made by whichever user came first, and the next
    user could not write in it (``PermissionError``), or would read files that user
    put there. One that another user owns or can write into is refused for a fresh
    private folder."""
    path = Path(tempfile.gettempdir()) / f"{name}-{os.getuid()}"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if path.is_symlink() or not path.is_dir() or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return Path(tempfile.mkdtemp(prefix=f"{name}-{os.getuid()}-"))
    return path
