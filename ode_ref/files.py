"""Writing a user's file: whole or not at all.

    replacing(path)   a context manager yielding a temporary path in path's folder (same suffix);
                      renamed onto path when the block ends without an error, removed otherwise
    writing_set(dir)  a context manager yielding the folder to write a set of files into (a GenAI
                      folder, `odeattn init`'s files): a new folder appears whole, in one rename
    write_text        text to a file, through replacing
    save_npy          an array to a .npy file, through replacing, under the very name given

Every file the project writes for its user (parameters, arrays, ONNX models, reports, plots, the
golden set) goes through replacing: a writer that fails half-way (an unsupported dtype, a full
disk, Ctrl-C) leaves the file that was there before as it was, never truncated. The temporary
file is a sibling, so the rename is atomic on the same file system.

A set of files (writing_set) whose folder is new (missing, or empty and neither a link, a mount
point nor the working folder) is written into a hidden sibling folder that one rename then makes
the folder: a kill at any point leaves none of the set in the folder or all of it, never a part.
Into a folder that holds files already (the user's own beside the set, or an earlier set replaced
with --force), the files are replaced one by one, each whole: a kill between two leaves some new
and some old. A kill -9 gives no chance to clean up, so it may
leave the hidden temporary file or folder (.NAME.*) beside its target; nothing reads them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
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


@contextlib.contextmanager
def writing_set(folder):
    """Yield the folder a set of files is written into, each through replacing. Where folder is
    missing or empty (_replaceable): a fresh hidden sibling, renamed onto folder when the block ends
    without an error (removed otherwise), so that the set appears whole; else folder itself."""
    folder = Path(os.path.abspath(folder))  # "." and "a/.." name their folder, and have a parent
    if not _replaceable(folder):
        yield folder
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        yield staging
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp's 0700 would otherwise become the folder's
        if folder.is_dir():
            folder.rmdir()  # empty, as checked: a folder that gained files meanwhile is kept, and this fails
        os.rename(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _replaceable(folder: Path) -> bool:
    """folder is missing, or an empty folder that a rename may replace: not a link, a mount point
    or the working folder (removing that one would leave the process in a deleted folder)."""
    if not os.path.lexists(folder):
        return True
    return (folder.is_dir() and not folder.is_symlink() and not os.path.ismount(folder)
            and not os.path.samefile(folder, os.getcwd()) and not any(folder.iterdir()))


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
