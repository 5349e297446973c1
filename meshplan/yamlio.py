"""Safe YAML/JSON reading and atomic writing (temp file + rename: nothing half-written on disk)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from meshplan.errors import InputError


def load_yaml_file(path: str | os.PathLike, what: str) -> Any:
    """Load a YAML (or JSON) file safely; a missing or malformed file is an InputError naming `what`."""
    p = Path(path)
    if not p.is_file():
        raise InputError(what, f"file not found: {p}")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(what, f"cannot read {p}: {exc.__class__.__name__}")
    if p.suffix.lower() == ".json":
        # JSON through PyYAML would read 1e-05 as a string (YAML 1.1 floats need a dot).
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(what, f"{p} is not valid JSON (line {exc.lineno})")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise InputError(what, f"{p} is not valid YAML{where}")


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temp file in the same folder, then rename."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        # mkstemp creates 0600; give the file the mode a plain open() would (0666 less the umask).
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_yaml(path: str | os.PathLike, data: Any) -> None:
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100))


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")
