"""The sweep store: one Zarr (format 3) directory per sweep, safe to resume.

What it guarantees (the README's "What mbbatch guarantees" says it for users):

- **Created whole.**  A store is written under a name unique to the creating
  process (``.NAME.creating-PID-XXXX`` beside it), then renamed into place, so
  a store either exists whole or not at all.
- **One chunk per grid point, each with a checksum.**  Every chunk ends in a
  CRC32C (zarr's ``crc32c`` codec), and every chunk is written, fill values
  included, so a missing chunk is damage, not a silent NaN.
- **A point is done only when it is intact.**  ``done`` is written after the
  point's data; on resume every point marked done is verified (each chunk
  exists, decodes and passes its checksum) and one that fails is recomputed.
- **One writer.**  A sweep holds an exclusive lock (``.NAME.lock`` beside the
  store) for its whole run; a second sweep on the store stops at once, naming
  the holder's process id.  A lock left by a dead process is taken over.
- **Nothing but a sweep store is ever deleted.**  ``--overwrite`` removes a
  path only if it is a sweep store (its metadata says so) holding nothing but
  what a sweep writes; never a file, a symbolic link, the working directory
  or one of its parents.

Locks use ``fcntl.flock``: reliable on local file systems; on a network file
system that does not support it, do not run two sweeps on one store.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["SweepError", "StoreNote", "StoreLock", "STORE_FORMAT", "StoreState", "codecs", "create",
           "discardable", "verify", "repair_coords", "stored_attrs", "is_sweep_store", "lock_holder",
           "write_point", "consolidate", "open_dataset"]

#: Version of the store layout.  Stores without it (made before checksums)
#: cannot be verified and are rebuilt only with ``--overwrite``.
STORE_FORMAT = 1
#: The attribute (on the root group and on ``done``) that marks a sweep store.
MARK = "mbbatch_store_format"


class SweepError(RuntimeError):
    """A sweep cannot run against the given store."""


class StoreNote(UserWarning):
    """Something the user should know about a store that did not stop the run
    (a stale lock taken over, damaged points recomputed)."""


def codecs() -> list:
    """The chunk codecs after the bytes serializer: zstd (zarr's default), then
    a CRC32C checksum of the compressed chunk."""
    from zarr.codecs import Crc32cCodec, ZstdCodec

    return [ZstdCodec(level=0, checksum=False), Crc32cCodec()]


# --- the lock ----------------------------------------------------------------------

_LOCK_HEADER = "mbbatch sweep lock"


def _lock_path(out: Path) -> Path:
    return out.parent / f".{out.name}.lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parse_holder(text: str) -> dict:
    lines = text.splitlines()
    if not lines or lines[0] != _LOCK_HEADER:
        return {}
    out = {}
    for line in lines[1:]:
        key, _, value = line.partition("=")
        out[key.strip()] = value.strip()
    return out


def lock_holder(out) -> dict | None:
    """The holder of the store's lock (``pid``, ``host``, ``since``), or None if
    no live sweep holds it."""
    import fcntl

    path = _lock_path(Path(os.path.realpath(out)))
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _parse_holder(os.pread(fd, 4096, 0).decode(errors="replace")) or {"pid": "unknown"}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class StoreLock:
    """Exclusive lock on a store path for the length of a ``with`` block.

    The lock is ``flock`` on ``.NAME.lock`` beside the store, which records the
    holder's process id, host and start time.  The kernel releases it when the
    holder dies, however it dies; the next sweep then takes it over and says
    so (a :class:`StoreNote`).  The file is removed on a clean exit.
    """

    def __init__(self, out):
        self.out = Path(out)
        # the real path: two links to one store share its lock
        self.path = _lock_path(Path(os.path.realpath(out)))
        self.fd = None

    def __enter__(self):
        import fcntl

        for _ in range(100):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise SweepError(f"out: cannot create the lock file {self.path}: {exc.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = {}
                for _ in range(20):  # the holder writes its id right after taking the lock
                    holder = _parse_holder(os.pread(fd, 4096, 0).decode(errors="replace"))
                    if holder:
                        break
                    time.sleep(0.01)
                os.close(fd)
                who = (f"process {holder.get('pid', 'unknown')} on {holder.get('host', 'this host')}, "
                       f"since {holder.get('since', 'an unknown time')}") if holder else "another process"
                raise SweepError(f"out: {self.out} is being written by another sweep ({who}); "
                                 "wait for it to finish or stop it, then run again") from None
            # the file may have been removed (and recreated) by the previous
            # holder between our open and our lock: then we locked a stale inode
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:  # pragma: no cover - a lock file replaced a hundred times in a row
            raise SweepError(f"out: could not take the lock {self.path}")
        previous = os.pread(fd, 4096, 0).decode(errors="replace")
        if previous.strip() and not _parse_holder(previous):
            os.close(fd)
            raise SweepError(f"out: {self.path} exists and is not an mbbatch lock file; "
                             "move it away, then run again")
        old = _parse_holder(previous)
        if old:
            warnings.warn(f"{self.out}: took over the lock of process {old.get('pid', '?')} on "
                          f"{old.get('host', '?')} (started {old.get('since', '?')}), which ended "
                          "without releasing it; its finished points are kept", StoreNote, stacklevel=2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (f"{_LOCK_HEADER}\npid={os.getpid()}\nhost={socket.gethostname()}\n"
                       f"since={time.strftime('%Y-%m-%d %H:%M:%S')}\n").encode(), 0)
        os.fsync(fd)
        self.fd = fd
        return self

    def __exit__(self, *exc):
        import fcntl

        if self.fd is None:
            return False
        # removed while still held, so no other process can lock this inode
        # and believe it holds the store (see the inode check above)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None
        return False


# --- what a sweep store is, and what may be deleted --------------------------------------

def _json(path: Path):
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def is_sweep_store(out) -> bool:
    """Whether ``out`` is a directory a sweep made: its root metadata holds
    the sweep's spec hash and seed scheme, or (if the root metadata is
    damaged) its ``done`` array carries the store mark."""
    out = Path(out)
    if out.is_symlink() or not out.is_dir():
        return False
    root = _json(out / "zarr.json")
    attrs = root.get("attributes", {}) if isinstance(root, dict) else {}
    if isinstance(attrs, dict) and "spec_hash" in attrs and "seed_scheme" in attrs:
        return True
    done = _json(out / "done" / "zarr.json")
    d_attrs = done.get("attributes", {}) if isinstance(done, dict) else {}
    return isinstance(d_attrs, dict) and MARK in d_attrs


def _foreign_entries(out: Path) -> list[str]:
    """Entries of ``out`` that a sweep does not write (metadata, chunks and
    zarr's temporary ``*.partial`` files are what it writes)."""
    bad = []

    def ok_file(p: Path, names=("zarr.json",)) -> bool:
        return not p.is_symlink() and p.is_file() and (p.name in names or p.name.endswith(".partial"))

    for entry in sorted(out.iterdir()):
        if ok_file(entry):
            continue
        if entry.is_symlink() or not entry.is_dir():
            bad.append(entry.name)
            continue
        for sub in sorted(entry.iterdir()):
            if ok_file(sub):
                continue
            if sub.name == "c" and sub.is_dir() and not sub.is_symlink():
                for root, dirs, files in os.walk(sub):
                    for nm in dirs + files:
                        p = Path(root) / nm
                        if p.is_symlink() or not (nm.isdigit() or nm.endswith(".partial")):
                            bad.append(str(p.relative_to(out)))
                continue
            bad.append(f"{entry.name}/{sub.name}")
    return bad


def discardable(out) -> None:
    """Raise :class:`SweepError` unless ``--overwrite`` may delete ``out``: an
    existing path must be a sweep store (and nothing but one), not a symbolic
    link, the working directory or one of its parents."""
    out = Path(out)
    if out.is_symlink():
        raise SweepError(f"out: {out} is a symbolic link; --overwrite deletes only a sweep store "
                         "itself, never through a link: give the store's own path")
    if not out.exists():
        return
    if not out.is_dir():
        raise SweepError(f"out: {out} is a file, not an mbbatch sweep store; --overwrite deletes only "
                         "sweep stores: choose another path")
    real, cwd = out.resolve(), Path.cwd().resolve()
    if real == cwd or real in cwd.parents or real == Path.home().resolve():
        raise SweepError(f"out: {out} is the working directory, one of its parents or the home "
                         "directory; --overwrite never deletes those: give the store's own path")
    if not is_sweep_store(out):
        raise SweepError(f"out: {out} is not an mbbatch sweep store (no sweep metadata in it); "
                         "--overwrite deletes only sweep stores: choose another path")
    foreign = _foreign_entries(out)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise SweepError(f"out: {out} holds files a sweep did not write ({shown}); --overwrite "
                         "deletes only a sweep store's own files: move them away first")


_TEMP = re.compile(r"^\.(?P<name>.+)\.(?:creating|discarded)-(?P<pid>\d+)-[A-Za-z0-9_]+$")


def _remove_stale_temporaries(out: Path) -> None:
    """Remove what an earlier, killed sweep on ``out`` left under its own
    temporary names: only a directory named like one of ours whose process is
    gone, and which is empty or a sweep store."""
    with contextlib.suppress(OSError):
        for entry in out.parent.iterdir():
            m = _TEMP.match(entry.name)
            if not m or m["name"] != out.name or entry.is_symlink() or not entry.is_dir():
                continue
            if _pid_alive(int(m["pid"])):
                continue
            if not any(entry.iterdir()) or (is_sweep_store(entry) and not _foreign_entries(entry)):
                shutil.rmtree(entry, ignore_errors=True)


def _temp_dir(out: Path, kind: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.{kind}-{os.getpid()}-", dir=out.parent))


def create(ds, encoding: dict, out, *, replace: bool = False) -> None:
    """Write the template Dataset ``ds`` as a new store at ``out``.

    Written under a temporary name unique to this process, then renamed into
    place.  With ``replace``, an existing ``out`` (checked with
    :func:`discardable` by the caller) is discarded only once the new store
    is complete.
    """
    out = Path(out)
    _remove_stale_temporaries(out)
    ds = ds.copy()
    ds.attrs[MARK] = STORE_FORMAT
    ds["done"].attrs[MARK] = STORE_FORMAT
    enc = {name: {**encoding.get(name, {}), "compressors": codecs()} for name in ds.variables}
    tmp = _temp_dir(out, "creating")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
            ds.to_zarr(tmp, mode="w-", encoding=enc, consolidated=True, zarr_format=3,
                       write_empty_chunks=True)
        if replace and (out.exists() or out.is_symlink()):
            discardable(out)
            trash = _temp_dir(out, "discarded")
            os.replace(out, trash)          # onto the empty directory just made
            os.replace(tmp, out)
            shutil.rmtree(trash)
        elif out.exists() or out.is_symlink():
            raise SweepError(f"out: {out} appeared while the store was being created")
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# --- reading and verifying ----------------------------------------------------------------

@dataclass
class StoreState:
    """What :func:`verify` found.

    ``done`` marks the grid points that are done and intact; ``damaged``
    maps each point marked done (or whose ``done`` flag itself is damaged)
    that failed verification to the variables whose chunks failed;
    ``coords`` lists coordinate arrays that are damaged or differ from the spec.
    """

    done: np.ndarray
    damaged: dict = field(default_factory=dict)
    coords: list = field(default_factory=list)


def _chunk_files(arr_dir: Path) -> set:
    """Chunk keys present on disk, as tuples of block indices."""
    base = arr_dir / "c"
    keys = set()
    if not base.is_dir():
        return keys
    for root, _dirs, files in os.walk(base):
        rel = Path(root).relative_to(base).parts
        for f in files:
            if f.isdigit():
                keys.add(tuple(int(x) for x in (*rel, f)))
    return keys


def _open_array(out: Path, name: str):
    import zarr

    try:
        return zarr.open_array(store=str(out), path=name, mode="r")
    except Exception as exc:  # noqa: BLE001 - any unreadable metadata
        raise SweepError(f"out: {out} is damaged: the metadata {out / name / 'zarr.json'} cannot be "
                         f"read ({type(exc).__name__}: {exc}); pass --overwrite to rebuild the store "
                         "(its results are then lost)") from None


def _read_blocks(out: Path, name: str, arr):
    """Read ``arr`` whole; return ``(bad, values)``: the blocks that are missing,
    fail their checksum or do not decode, and the decoded values (fill values
    in bad blocks)."""
    import itertools

    blocks = list(itertools.product(*(range(g) for g in arr.cdata_shape)))
    present = _chunk_files(out / name)
    bad = {b for b in blocks if b not in present}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return bad, arr[...]
        except Exception:  # noqa: BLE001 - a chunk that does not decode, whatever zarr raises
            pass
        values = np.full(arr.shape, arr.metadata.fill_value, dtype=arr.dtype)
        for b in blocks:
            if b in bad:
                continue
            sel = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(b, arr.chunks, arr.shape))
            try:
                values[sel] = arr.get_block_selection(b)
            except Exception:  # noqa: BLE001
                bad.add(b)
    return bad, values


def _has_checksums(arr) -> bool:
    return any(type(c).__name__ == "Crc32cCodec" for c in arr.metadata.codecs)


def verify(out, shape: tuple, names: list, coords: dict) -> StoreState:
    """Verify every chunk of the store.

    ``shape`` is the grid's shape; every variable in ``names`` has the grid
    dimensions first, one chunk per grid point; ``coords`` maps each
    coordinate to its expected values.  Raises :class:`SweepError` naming the
    file when metadata cannot be read, or when the store predates checksums.
    """
    out = Path(out)
    arrays = {name: _open_array(out, name) for name in ["done", *names, *coords]}
    if not all(_has_checksums(arr) for arr in arrays.values()):
        raise SweepError(f"out: {out} was made by an older mbbatch, without chunk checksums, so its "
                         "damage cannot be detected; pass --overwrite to rebuild it")
    bad_done, done = _read_blocks(out, "done", arrays["done"])
    done = np.array(done, dtype=bool).reshape(shape)
    state = StoreState(done=done)
    for idx in sorted(bad_done):
        done[idx] = False
        state.damaged.setdefault(idx, []).append("done")
    for name in names:
        if name == "done":
            continue
        bad, _ = _read_blocks(out, name, arrays[name])
        for idx in sorted({b[:len(shape)] for b in bad}):
            if done[idx]:
                state.damaged.setdefault(idx, []).append(name)
    for name, values in coords.items():
        bad, stored = _read_blocks(out, name, arrays[name])
        if bad or stored.shape != np.shape(values) or not np.array_equal(stored, np.asarray(values)):
            state.coords.append(name)
    for idx in state.damaged:
        done[idx] = False
    return state


def repair_coords(out, coords: dict, names: list) -> None:
    """Rewrite the coordinate arrays ``names`` from their known values."""
    import zarr

    for name in names:
        arr = zarr.open_array(store=str(out), path=name, mode="r+")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arr[...] = np.asarray(coords[name], dtype=arr.dtype)


def write_point(out, dims: list, idx: tuple, data: dict) -> None:
    """Write one grid point's variables, then its ``done`` flag.

    ``data`` maps variable names to ``(dims, array)`` pairs shaped for the
    one point.  Zarr writes each chunk atomically, so a point is either done
    with all its data in place, or not done."""
    import xarray as xr

    lead = (1,) * len(dims)
    region = {d: slice(i, i + 1) for d, i in zip(dims, idx)}
    extra = {d: slice(None) for v in data.values() for d in v[0] if d not in region}
    xr.Dataset(data).to_zarr(out, region={**region, **extra}, consolidated=False, write_empty_chunks=True)
    # the commit mark, written only once the point's data is in place
    xr.Dataset({"done": (dims, np.ones(lead, dtype=bool))}).to_zarr(
        out, region=region, consolidated=False, write_empty_chunks=True)


def consolidate(out) -> None:
    import zarr

    with warnings.catch_warnings():
        # consolidated metadata is a zarr-python extension to format 3; xarray reads it
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        zarr.consolidate_metadata(str(out))


def open_dataset(out, *, consolidated: bool = True):
    """The store as an xarray Dataset (lazy)."""
    import xarray as xr

    try:
        return xr.open_zarr(out, consolidated=consolidated)
    except Exception as exc:  # noqa: BLE001 - any unreadable store
        raise SweepError(f"out: {out} cannot be opened as a sweep store ({type(exc).__name__}: {exc}); "
                         "pass --overwrite to rebuild it (its results are then lost)") from None


def stored_attrs(out) -> dict | None:
    """The root attributes of a store, read from its own metadata file (None
    if unreadable)."""
    root = _json(Path(out) / "zarr.json")
    if not isinstance(root, dict) or not isinstance(root.get("attributes"), dict):
        return None
    return root["attributes"]
