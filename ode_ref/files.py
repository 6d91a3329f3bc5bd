"""Writing a user's file: whole or not at all.

    replacing(path)   a context manager yielding a temporary path in path's folder (same suffix);
                      renamed onto path when the block ends without an error, removed otherwise
    write_text        text to a file, through replacing
    save_npy          an array to a .npy file, through replacing, under the very name given

Every file the project writes for its user (parameters, arrays, ONNX models, reports, plots, the
golden set) goes through replacing: a writer that fails half-way (an unsupported dtype, a full
disk, Ctrl-C) leaves the file that was there before as it was, never truncated. The temporary
file is a sibling, so the rename is atomic on the same file system.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def replacing(path):
    """Yield a fresh temporary Path beside `path`, ending in path's suffix (a writer that infers
    the format from it, such as savefig, reads the same one); on success it replaces `path`
    (os.replace), on any exception it is removed and the exception goes on."""
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.",
                                suffix=path.suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if os.path.exists(path) and not os.path.isfile(path):
            raise IsADirectoryError(f"{os.fspath(path)!r}: expected a file path; got a folder")
        mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o666 & ~_umask()
        os.chmod(tmp, mode)  # mkstemp's 0600 would otherwise replace the file's own permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text(path, text: str) -> None:
    """text to path, whole or not at all."""
    with replacing(path) as tmp:
        tmp.write_text(text)


def save_npy(path, array) -> None:
    """np.save of array to path, whole or not at all, under that very name (through a file object:
    np.save would add .npy to X.NPY)."""
    import numpy as np

    with replacing(path) as tmp, open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
