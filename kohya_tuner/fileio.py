"""The one file writer for configs, plan files and the run journal.

Three promises: a reader never sees a half-written file under the real name (write a
temporary file beside it, fsync, rename); a file the user already has is never lost —
with `force` it is kept as `<name>.bak`, and a write that fails (disk full, I/O error,
read-only folder) leaves the original in place; and files get the permissions any
other program would give them under the user's umask (mkstemp's 0600 would hide
configs from a second training user or a container).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path

from kohya_tuner.errors import UserError


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    # Reading the umask means setting it; this is the only portable way.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_mode(executable: bool = False) -> int:
    return (0o777 if executable else 0o666) & ~_umask()


def replaced_mode(path: str | os.PathLike, executable: bool = False) -> int | None:
    """The permission bits of the file `path` names, so a file written over it is never
    readable by more people than the one it replaces; None when there is none. An
    executable script keeps its execute bits only for those who could read it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    mode = stat.S_IMODE(st.st_mode)
    if executable:
        mode |= (mode & 0o444) >> 2
    return mode


def copied_mode(source: str | os.PathLike) -> int:
    """What `cp` gives a copy: the source's permission bits (of a link's target), never
    more than the umask allows, and no execute or set-id bits (captions and images)."""
    try:
        src = stat.S_IMODE(os.stat(source).st_mode) & 0o666
    except OSError:
        src = 0o666
    return src & ~_umask()


def _utf8_or_refuse(path: Path, text: str) -> None:
    """Every file written is UTF-8 (sd-scripts reads its configs so). A path that holds bytes
    which are not UTF-8 (kept by Python as lone surrogates) cannot be written into one."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        from kohya_tuner.errors import UserError
        from kohya_tuner.printable import printable

        start = text.rfind("\n", 0, exc.start) + 1
        end = text.find("\n", exc.end)
        line = printable(text[start:end if end >= 0 else len(text)])
        raise UserError(f"Cannot write {printable(str(path))}: it would hold a name with bytes that are not UTF-8 "
                        f"(shown as \ufffd) in the line {line!r}; sd-scripts reads its files as UTF-8 and would not "
                        "find that path.",
                        "Rename the file or folder to a UTF-8 name (or run with a UTF-8 locale, e.g. LANG=C.UTF-8).") \
            from None


def atomic_write(path: str | os.PathLike, text: str, *, mode: int | None = None, executable: bool = False) -> None:
    """Write `text` through a temporary file and a rename, so an interrupted or failed
    write never leaves a half-written file under the real name. Raises OSError. Without
    `mode`, a file that is replaced keeps its mode (a 0600 file stays 0600); a new one
    gets the umask's."""
    path = Path(path)
    _utf8_or_refuse(path, text)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        mode = replaced_mode(path, executable)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, default_mode(executable) if mode is None else mode)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def free_backup_name(path: Path) -> Path:
    backup = path.with_name(path.name + ".bak")
    n = 1
    while os.path.lexists(backup):
        backup = path.with_name(f"{path.name}.bak{n}")
        n += 1
    return backup


def _keep_as_backup(path: Path, backup: Path) -> None:
    """Make `backup` hold the original while `path` still does, so no moment exists
    without the user's file under one of the two names."""
    try:
        os.link(path, backup)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO):
            raise
        shutil.copy2(path, backup)  # a filesystem without hard links


def why(exc: OSError) -> str:
    if exc.errno == errno.EROFS:
        return "the folder is on a read-only filesystem"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied (the folder is read-only for you)"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full"
    return (exc.strerror or str(exc)).rstrip(".")


def holds_exactly(p: Path, text: str) -> bool:
    """Whether the file's bytes are those `atomic_write` would write. Bytes, not text: a text
    read turns CRLF (launch.bat) into LF. Only a regular file is read (a FIFO or a device may
    never end), and its size is compared first, so a large file is never read."""
    try:
        data = text.encode("utf-8")
        st = p.stat()
        return stat.S_ISREG(st.st_mode) and st.st_size == len(data) and p.read_bytes() == data
    except (OSError, UnicodeEncodeError):
        return False


def write_new(path: str | os.PathLike, text: str, force: bool = False, *, executable: bool = False,
              private: bool = False) -> Path | None:
    """Write `text` to `path` atomically. An existing file is the user's: refuse unless
    `force`, and even then keep it as `<name>.bak` (the path is returned). Identical
    content is left alone. On any failure the original is where it was and a UserError
    says so."""
    p = Path(path)
    backup = None
    if p.is_dir():
        raise UserError(f"{p} is a directory; cannot write a file there.")
    if p.exists() and not p.is_file():
        # Renaming over /dev/null or a named pipe would replace it for every program.
        raise UserError(f"{p} is not a regular file (a device or a pipe); cannot write a file there.")
    if os.path.lexists(p):
        if holds_exactly(p, text):
            return None
        if not force:
            raise UserError(f"{p} already exists; kohya-tuner never overwrites your files.",
                            "Choose another --out, or pass --force (the old file is kept as .bak).")
        backup = free_backup_name(p)
        try:
            _keep_as_backup(p, backup)
        except OSError as exc:
            raise UserError(f"Cannot keep a backup of {p} as {backup.name} ({why(exc)}); {p} is unchanged.") from None
    try:
        # A file holding a secret is readable by its owner only, whatever it replaces.
        atomic_write(p, text, executable=executable, mode=0o600 if private else None)
    except OSError as exc:
        kept = ""
        if backup is not None:
            try:
                os.unlink(backup)  # the original never left `p`; the backup is a second name for it
            except OSError:
                kept = f" (a copy is also at {backup})"
            return_note = f"{p} is unchanged{kept}."
        else:
            return_note = "nothing was written."
        raise UserError(f"Cannot write {p}: {why(exc)}; {return_note}") from None
    return backup
