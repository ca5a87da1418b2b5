"""Every file dpmf reads or writes goes through here (bottom layer, next to :mod:`dpmf.errors`).

Readers (strategy files, GDP ledgers, Monte Carlo checkpoints, MMCC row caches, matrices given
as ``.npy``/``.npz``, JSON reports) call :func:`read_npz`, :func:`read_array` or :func:`read_json`,
and build their object inside :func:`reading`. Whatever is wrong with the input — a missing,
empty, truncated or random file, a foreign archive, a ``.npy`` where an ``.npz`` belongs, pickled
(object) arrays, bad metadata, a missing or mistyped field — becomes one
:class:`~dpmf.errors.InvalidParameterError` whose message names the file and what is wrong, in
dpmf's words. Nothing is ever unpickled (``allow_pickle=False`` everywhere), and no message
suggests unpickling.

Writers check their destination *before* the work starts (:func:`check_output_file`,
:func:`check_output_dir`: the folder exists, is a folder and takes a new file -- tried for real,
since permission bits do not tell for root or ``/proc``; the file is not a folder; a plot's
extension is one matplotlib writes) and turn an ``OSError`` while writing into the same one-line error (:func:`writing`).

Every file dpmf writes is replaced atomically (:func:`atomic_write`, and :func:`write_npz` for
``.npz`` archives): the bytes go to a temporary file beside the destination, which is flushed,
fsynced and renamed over it only once complete. A failed write (a full disk, a file-size limit,
an interrupt) removes the temporary file and leaves the previous file byte-identical; a killed
process leaves at most a ``.<name>.*.tmp`` beside it, never a damaged destination.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from dpmf.errors import DPMFError, InvalidParameterError

__all__ = [
    "NpzContents",
    "read_npz",
    "read_array",
    "read_json",
    "reading",
    "writing",
    "atomic_write",
    "write_npz",
    "save_figure",
    "check_output_file",
    "check_output_dir",
    "check_input_dir",
    "plot_formats",
    "label",
]

_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a zip member / an empty archive
_NPY_MAGIC = b"\x93NUMPY"
#: Exceptions that malformed input can raise from numpy's readers, zipfile, zlib and json.
_READ_ERRORS = (
    OSError, ValueError, EOFError, KeyError, TypeError, IndexError, AttributeError, OverflowError,
    MemoryError, RecursionError, UnicodeError, zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error,
    NotImplementedError, AssertionError,
)


def label(source: object) -> str:
    """How a message names ``source``: the path, or ``<in-memory file>`` for a file object."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    name = getattr(source, "name", None)
    return str(name) if isinstance(name, str) else "<in-memory file>"


@dataclass(frozen=True)
class NpzContents:
    """What :func:`read_npz` read: the JSON ``metadata`` record (``None`` when not asked for)
    and every other array, fully read into memory."""

    path: str
    metadata: dict | None
    arrays: dict = field(repr=False)


def _reason(exc: BaseException) -> str:
    """A malformed-input exception in dpmf's words (never numpy's advice to unpickle)."""
    text = str(exc)
    if isinstance(exc, (zipfile.BadZipFile, zlib.error, EOFError)):
        return "truncated or damaged archive"
    if "pickle" in text.lower() or "object arrays" in text.lower():
        return "it holds pickled (object) data, which dpmf never loads"
    if isinstance(exc, MemoryError):
        return "an array in it is too large to load"
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, IsADirectoryError):
        return "it is a directory"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, OSError):
        return exc.strerror or text or type(exc).__name__
    text = text.replace("\n", " ").strip()
    if len(text) > 120:
        text = text[:117] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _open_bytes(source, where: str, what: str) -> bytes | None:
    """The first bytes of a path or a seekable file object (``None`` when they cannot be peeked);
    raises for a missing / unreadable / empty file."""
    if not isinstance(source, (str, os.PathLike)):
        try:
            pos = source.tell()
            head = source.read(8)
            source.seek(pos)
        except (AttributeError, OSError, ValueError):
            return None
        if not head:
            raise InvalidParameterError(f"{where}: not a {what} (the file is empty)")
        return head
    path = Path(source)
    try:
        if path.is_dir():
            raise InvalidParameterError(f"{where}: cannot read the {what} (it is a directory)")
        with open(path, "rb") as fh:
            head = fh.read(8)
    except DPMFError:
        raise
    except OSError as exc:
        raise InvalidParameterError(f"{where}: cannot read the {what} ({_reason(exc)})") from None
    if not head:
        raise InvalidParameterError(f"{where}: not a {what} (the file is empty)")
    return head


def read_npz(
    source,
    what: str,
    *,
    kind: str | None = None,
    metadata: bool = True,
    required: tuple[str, ...] = (),
) -> NpzContents:
    """Read an ``.npz`` archive fully (``allow_pickle=False``) and check its shape.

    ``source`` is a path or a binary file object. With ``metadata`` the archive must hold a
    ``metadata`` entry with a JSON object, whose ``"kind"`` must equal ``kind`` when given;
    ``required`` names arrays that must be present. Anything else is an
    :class:`InvalidParameterError` like ``"f.npz: not a dpmf strategy file (truncated or damaged
    archive)"``.
    """
    import numpy as np

    where = label(source)
    head = _open_bytes(source, where, what)
    if head is not None and not head.startswith(_ZIP_MAGIC):
        if head.startswith(_NPY_MAGIC):
            raise InvalidParameterError(f"{where}: not a {what} (a single .npy array, not an .npz archive)")
        raise InvalidParameterError(f"{where}: not a {what} (not an .npz archive)")
    try:
        with np.load(source, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise InvalidParameterError(f"{where}: not a {what} (a single array, not an .npz archive)")
            arrays = {k: np.asarray(data[k]) for k in data.files}
    except DPMFError:
        raise
    except _READ_ERRORS as exc:
        raise InvalidParameterError(f"{where}: not a {what} ({_reason(exc)})") from None
    meta = None
    if metadata:
        raw = arrays.pop("metadata", None)
        if raw is None:
            raise InvalidParameterError(f"{where}: not a {what} (no metadata record)")
        if raw.ndim != 0 or raw.dtype.kind != "U":
            raise InvalidParameterError(f"{where}: not a {what} (the metadata is not a text record)")
        try:
            meta = json.loads(str(raw))
        except (ValueError, RecursionError) as exc:
            raise InvalidParameterError(f"{where}: not a {what} (metadata is not JSON: {exc})") from None
        if not isinstance(meta, dict):
            raise InvalidParameterError(f"{where}: not a {what} (metadata is a JSON {type(meta).__name__})")
        if kind is not None and meta.get("kind") != kind:
            raise InvalidParameterError(f"{where}: not a {what} (kind {meta.get('kind')!r}, expected {kind!r})")
    missing = [k for k in required if k not in arrays]
    if missing:
        raise InvalidParameterError(f"{where}: not a {what} (missing array(s) {', '.join(missing)})")
    return NpzContents(where, meta, arrays)


def read_array(source, what: str = "matrix file", *, key: str | None = None):
    """One numeric array from a ``.npy`` file, or from an ``.npz`` archive (entry ``key``, or its
    only entry). Object, string and structured arrays are refused."""
    import numpy as np

    where = label(source)
    head = _open_bytes(source, where, what)
    if head is not None and head.startswith(_ZIP_MAGIC):
        arrays = read_npz(source, what, metadata=False).arrays
        if key is None:
            numeric = [k for k, v in arrays.items() if v.dtype.kind in "biuf"]
            if len(numeric) != 1:
                raise InvalidParameterError(
                    f"{where}: the .npz archive holds {len(numeric)} numeric arrays; expected exactly one"
                )
            key = numeric[0]
        if key not in arrays:
            raise InvalidParameterError(f"{where}: no array {key!r} in the archive")
        arr = arrays[key]
    else:
        if head is not None and not head.startswith(_NPY_MAGIC):
            raise InvalidParameterError(f"{where}: not a {what} (expected a .npy or .npz file written by numpy)")
        try:
            arr = np.load(source, allow_pickle=False)
        except _READ_ERRORS as exc:
            raise InvalidParameterError(f"{where}: not a {what} ({_reason(exc)})") from None
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "biuf":
        raise InvalidParameterError(
            f"{where}: not a {what} (an array of {getattr(arr, 'dtype', type(arr).__name__)}, expected numbers)"
        )
    return arr


def read_json(source, what: str):
    """The JSON value in a UTF-8 text file (a path or a binary file object)."""
    where = label(source)
    try:
        if isinstance(source, (str, os.PathLike)):
            if Path(source).is_dir():
                raise InvalidParameterError(f"{where}: cannot read the {what} (it is a directory)")
            raw = Path(source).read_bytes()
        else:
            raw = source.read()
    except DPMFError:
        raise
    except OSError as exc:
        raise InvalidParameterError(f"{where}: cannot read the {what} ({_reason(exc)})") from None
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    except UnicodeDecodeError:
        raise InvalidParameterError(f"{where}: not a {what} (not a JSON text file)") from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidParameterError(f"{where}: not a {what} (not JSON: {exc})") from None


@contextmanager
def reading(source, what: str) -> Iterator[None]:
    """Turn any error raised while building an object from a read file into one
    :class:`InvalidParameterError` naming the file (``"f.npz: corrupt GDP ledger (...)"``).
    A :class:`~dpmf.errors.DPMFError` raised inside keeps its class and gets the file's name."""
    where = label(source)
    try:
        yield
    except DPMFError as exc:
        if where in str(exc):
            raise
        try:
            renamed = type(exc)(f"{where}: corrupt {what} ({exc})")
        except Exception:  # pragma: no cover - a subclass with another constructor
            raise exc from None
        raise renamed from None
    except _READ_ERRORS as exc:
        detail = f"missing field {exc}" if isinstance(exc, KeyError) else _reason(exc)
        raise InvalidParameterError(f"{where}: corrupt {what} ({detail})") from None


def _cannot_create_in(folder: Path) -> str | None:
    """Why no new file can be created in the existing ``folder`` (``None`` if one can): a real
    attempt -- an empty temporary file, removed at once -- since permission bits do not tell (root
    passes ``os.access`` everywhere; ``/proc`` or a read-only mount refuse anyway)."""
    import errno
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".dpmf-write-check-")
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL):
            return "it accepts no new files"
        if exc.errno == errno.EROFS:
            return "read-only file system"
        return _reason(exc)
    os.close(fd)
    try:
        os.unlink(tmp)
    except OSError:  # pragma: no cover - removed by someone else
        pass
    return None


def plot_formats() -> tuple[str, ...]:
    """The file extensions matplotlib can save a figure as (``png``, ``pdf``, ``svg`` ...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return tuple(sorted(FigureCanvasBase.get_supported_filetypes()))


def check_output_file(path, name: str = "path", *, plot: bool = False, suffixes: tuple[str, ...] = ()) -> Path:
    """Check, before any work, that a file can be written at ``path``: its folder exists, is a folder
    and accepts a new file (tried for real), ``path`` is not a folder and, if it exists, can be
    overwritten. With ``plot`` its extension must be one matplotlib writes (:func:`plot_formats`);
    with ``suffixes`` (e.g. ``(".npz",)``) one of those. ``name`` is how the message names the
    argument (a library argument or a CLI option). The one check every command and library writer
    uses; returns ``path`` as a :class:`Path`."""
    if isinstance(path, (io.IOBase,)) or hasattr(path, "write"):
        return path  # a file object: the caller owns it
    p = Path(path)
    if str(path) == "":
        raise InvalidParameterError(f"{name} must be a file path, got an empty string")
    if p.is_dir():
        raise InvalidParameterError(f"{name} {str(p)!r} is a directory, expected a file path")
    if plot:
        formats = plot_formats()
        ext = p.suffix.lower().lstrip(".")
        if ext not in formats:
            got = f"has the extension {p.suffix!r}" if ext else "has no file extension"
            raise InvalidParameterError(
                f"{name} {str(p)!r} {got}: a plot is saved as one of .{', .'.join(formats)} (e.g. .png)"
            )
    if suffixes and p.suffix.lower() not in suffixes:
        raise InvalidParameterError(f"{name} {str(p)!r} must end in {' or '.join(suffixes)} (dpmf recognizes such "
                                    "a file by its extension when it is given back, e.g. '--strategy FILE.npz')")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise InvalidParameterError(f"{name} {str(p)!r}: the folder {str(parent)!r} does not exist")
    if not parent.is_dir():
        raise InvalidParameterError(f"{name} {str(p)!r}: {str(parent)!r} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidParameterError(f"{name} {str(p)!r}: the folder {str(parent)!r} is not writable")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise InvalidParameterError(f"{name} {str(p)!r}: the file exists and is not writable")
        if p.is_file():
            try:
                open(p, "r+b").close()  # opened for writing, not truncated
            except OSError as exc:
                raise InvalidParameterError(f"{name} {str(p)!r}: the file exists and cannot be written "
                                            f"({_reason(exc)})") from None
    why = _cannot_create_in(parent)
    if why is not None:
        raise InvalidParameterError(f"{name} {str(p)!r}: cannot write in the folder {str(parent)!r} ({why})")
    return p


def check_output_dir(path, name: str = "directory", *, create: bool = True) -> Path:
    """Check (and with ``create`` make) a folder that files will be written to: it is a folder and
    accepts a new file (tried for real, as :func:`check_output_file`)."""
    p = Path(path)
    if str(path) == "":
        raise InvalidParameterError(f"{name} must be a folder path, got an empty string")
    if p.exists() and not p.is_dir():
        raise InvalidParameterError(f"{name} {str(p)!r} exists and is not a folder")
    if create:
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            why = _reason(exc)
            if isinstance(exc, FileNotFoundError) and p.parent.is_dir():
                why = f"the folder {str(p.parent)!r} accepts no new folders"
            raise InvalidParameterError(f"{name} {str(p)!r} cannot be created: {why}") from None
    if p.exists() and not os.access(p, os.W_OK | os.X_OK):
        raise InvalidParameterError(f"{name} {str(p)!r} is not writable")
    if p.is_dir():
        why = _cannot_create_in(p)
        if why is not None:
            raise InvalidParameterError(f"{name} {str(p)!r}: cannot write in it ({why})")
    return p


def check_input_dir(path, name: str = "directory") -> Path:
    """A folder dpmf will read from (e.g. the dense matrices ``dpmf verify --matrices`` searches):
    it must exist and be a folder. A mistyped path would otherwise be searched as an empty folder
    and look like "nothing needed from it"."""
    p = Path(path)
    if str(path) == "":
        raise InvalidParameterError(f"{name} must be a folder path, got an empty string")
    if not p.exists():
        raise InvalidParameterError(f"{name} {str(p)!r} does not exist (give an existing folder)")
    if not p.is_dir():
        raise InvalidParameterError(f"{name} {str(p)!r} is not a folder")
    return p


@contextmanager
def writing(path, what: str) -> Iterator[None]:
    """Turn an ``OSError`` while writing ``path`` into one :class:`InvalidParameterError`."""
    try:
        yield
    except OSError as exc:
        raise InvalidParameterError(f"{label(path)}: cannot write the {what}: {_reason(exc)}") from None


def _temporary_beside(path: Path) -> tuple[int, Path]:
    """A new, empty file in ``path``'s folder (opened for writing; the mode a plain ``open`` would
    give it, i.e. the umask applies, or the replaced file's mode): ``(fd, its path)``."""
    import secrets
    import stat

    folder = path.parent if str(path.parent) else Path(".")
    while True:
        tmp = folder / f".{path.name[:200]}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:  # pragma: no cover - 32 random bits taken
            continue
        break
    try:
        os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
    except OSError:
        pass  # a new destination (or a mode we may not set): keep the umask's
    return fd, tmp


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (best effort: not every system opens a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_write(path, what: str, *, fsync: bool = True) -> Iterator[io.BufferedWriter]:
    """Write ``path`` all or nothing: yields a binary file open on a temporary file in the same
    folder; on a clean exit it is flushed (and with ``fsync`` synced to disk, the folder too) and
    ``os.replace``-d over ``path``. On any failure -- an ``OSError`` (as one
    :class:`InvalidParameterError` naming the file, like :func:`writing`), an exception of the
    writer, an interrupt -- the temporary file is removed and ``path`` is left as it was. The one
    way dpmf writes a file (a test guards it); ``fsync=False`` for caches, whose loss costs only
    a recomputation."""
    path = Path(path)
    try:
        fd, tmp = _temporary_beside(path)
    except OSError as exc:
        raise InvalidParameterError(f"{label(path)}: cannot write the {what}: {_reason(exc)}") from None
    try:
        try:
            with os.fdopen(fd, "wb") as fh:
                yield fh
                fh.flush()
                if fsync:
                    os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as exc:
        raise InvalidParameterError(f"{label(path)}: cannot write the {what}: {_reason(exc)}") from None
    if fsync:
        _sync_folder(path.parent if str(path.parent) else Path("."))


def write_npz(path, arrays: dict, what: str, *, compressed: bool = True, fsync: bool = True) -> None:
    """Write ``arrays`` (name -> array) as an ``.npz`` archive at ``path`` through
    :func:`atomic_write` (what ``np.savez`` / ``np.savez_compressed`` write, numeric arrays only:
    ``allow_pickle=False``). A write that fails part-way leaves no half-written archive behind and
    no zip object that would try to finish it later (numpy's own ``savez`` leaves one, whose
    ``__del__`` prints ``Exception ignored ... seek of closed file``)."""
    import numpy as np

    compression = zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED
    with atomic_write(path, what, fsync=fsync) as fh:
        archive = zipfile.ZipFile(fh, mode="w", compression=compression, allowZip64=True)
        try:
            for name, value in arrays.items():
                with archive.open(f"{name}.npy", mode="w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
            archive.close()
        except BaseException:
            archive.fp = None  # abandoned: the temporary file is removed; nothing left to finish
            raise


def save_figure(fig, path, what: str = "plot"):
    """Save a matplotlib ``fig`` to ``path`` (its extension is the format; 120 dpi, tight box)
    through :func:`atomic_write`, close it (whatever happens) and return ``path``."""
    import matplotlib.pyplot as plt

    try:
        with atomic_write(path, what) as fh:
            fig.savefig(fh, format=Path(path).suffix.lstrip(".").lower() or None, dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path
