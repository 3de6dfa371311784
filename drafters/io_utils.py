"""Atomic writes, for everything that publishes a file or a folder other code will read: a reader
sees the old version or the new one, never a half-written one (a replaced folder is missing only
for the instant between two renames). Every module writes through these; none renames by hand.

    write_json_atomic(path, obj)        a JSON file
    with atomic_file(path) as tmp: ...  any file: write `tmp` (same folder), renamed on success
    create_exclusive(path, text)        a file created once: False if it exists already
    with staged_dir(dst) as tmp: ...    a folder: fill `tmp` (beside dst), renamed on success
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` (same suffix, so `np.save` keeps it), renamed over `path`
    when the block ends without error, deleted otherwise."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: Path, obj) -> None:
    """Write `obj` as JSON to `path` through a temporary file in the same folder."""
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(obj, ensure_ascii=False, indent=1))


def create_exclusive(path: Path, text: str) -> bool:
    """Write `text` to `path` only if no file is there; True if this call wrote it. Whole or
    absent even across machines sharing the folder (a hard link never replaces a file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{platform.node()}-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


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


def share(folder: Path) -> None:
    """Modes as the umask gives a plainly created file: mkdtemp makes 0700 folders and
    safetensors 0600 files, which another user or a serving container could not read."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [Path(folder), *Path(folder).rglob("*")]:
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


@contextmanager
def staged_dir(dst: Path, replace: bool = True) -> Iterator[Path]:
    """An empty folder beside `dst` to fill; when the block ends without error it becomes `dst`
    (replacing an existing one, or with replace=False keeping a complete copy another process
    put there first). On error, or after a kill, nothing is at `dst` that was not there before."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.partial-", dir=dst.parent))
    try:
        yield tmp
        share(tmp)
        if replace:
            replace_dir(tmp, dst)
        else:
            try:
                os.replace(tmp, dst)
            except OSError:  # another process finished first: keep its copy
                if not dst.is_dir():
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
