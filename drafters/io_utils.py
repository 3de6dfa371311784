"""Atomic writes shared by everything that publishes a file or a folder other code will read:
a reader sees the old version or the new one, never a half-written one (a replaced folder is
missing only for the instant between two renames)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path


def write_json_atomic(path: Path, obj) -> None:
    """Write `obj` as JSON to `path` through a temporary file in the same folder."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, ensure_ascii=False, indent=1))
    os.replace(tmp, path)


def replace_dir(src: Path, dst: Path) -> None:
    """Rename the folder `src` to `dst`. An existing `dst` is first moved aside (a rename, so `dst`
    is never missing for longer than two renames) and deleted only after `src` is in place."""
    src, dst = Path(src), Path(dst)
    old = None
    if dst.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
        os.replace(dst, old / dst.name)
    try:
        os.replace(src, dst)
    except BaseException:
        if old is not None:  # put the previous version back rather than leave nothing
            os.replace(old / dst.name, dst)
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
