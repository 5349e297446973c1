"""Atomic writing of a folder of files: fill a temp folder, then rename it into place."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path


def atomic_write_dir(target: Path, files: dict[str, bytes]) -> None:
    """Make `target` hold exactly `files`; readers see the old folder or the new one, never half of it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        old = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            target.replace(old / target.name)
        tmp.replace(target)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
