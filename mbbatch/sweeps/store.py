"""The sweep store: one Zarr (format 3) directory per sweep, safe to resume.

What it guarantees (the user guide's docs/guide/guarantees.md says it for users):

- **Created whole.**  A store is written under a name unique to the creating
  process (``.NAME.creating-PID-XXXX`` beside it), then renamed into place, so
  a store either exists whole or not at all.
- **Chunks of grid points, each with a checksum.**  A chunk holds up to
  :data:`POINTS_PER_CHUNK` grid points (all their replications); every
  chunk ends in a CRC32C (zarr's ``crc32c`` codec), and every chunk is
  written, fill values included, so a missing chunk is damage, not a silent
  NaN.
- **A point is done only when it is intact.**  Points are written in
  batches, ``done`` after their data; on resume every point marked done is
  verified (each chunk exists, decodes and passes its checksum) and the
  points of a chunk that fails are recomputed.
- **One writer.**  A sweep holds an exclusive lock (``.NAME.lock`` beside the
  store) for its whole run; a second sweep on the store stops at once, naming
  the holder's process id.  A lock left by a dead process is taken over.
- **Nothing but a sweep store is ever deleted.**  ``--overwrite`` removes a
  path only if it is a sweep store (its metadata says so) holding nothing but
  what a sweep writes; never a file, a symbolic link, the working directory
  or one of its parents.  A NetCDF export (:func:`write_netcdf`) replaces
  only a NetCDF file mbbatch wrote, checked before the sweep runs, and is
  written whole (a temporary file renamed into place).

Locks use ``fcntl.flock``: reliable on local file systems; on a network file
system that does not support it, do not run two sweeps on one store.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
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
           "discardable", "verify", "stored_layout", "repair_coords", "stored_attrs", "is_sweep_store", "lock_holder",
           "BlockWriter", "grid_chunks", "stored_grid_chunks", "block_of", "points_of", "consolidate",
           "open_dataset", "POINTS_PER_CHUNK", "check_export", "write_netcdf"]

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


def _gather(coroutines) -> list:
    """Run zarr coroutines concurrently, from synchronous code, on zarr's own
    event loop (as zarr's synchronous API does)."""
    from zarr.core.sync import sync

    async def gather():
        return await asyncio.gather(*coroutines)

    return sync(gather())


def create(ds, encoding: dict, out, *, replace: bool = False) -> None:
    """Write the template Dataset ``ds`` as a new store at ``out``.

    Written under a temporary name unique to this process, then renamed into
    place.  With ``replace``, an existing ``out`` (checked with
    :func:`discardable` by the caller) is discarded only once the new store
    is complete.
    """
    from zarr.storage import LocalStore, MemoryStore

    out = Path(out)
    _remove_stale_temporaries(out)
    ds = ds.copy()
    ds.attrs[MARK] = STORE_FORMAT
    ds["done"].attrs[MARK] = STORE_FORMAT
    enc = {name: {**encoding.get(name, {}), "compressors": codecs()} for name in ds.variables}
    tmp = _temp_dir(out, "creating")
    try:
        # built in memory (metadata, attributes, closed forms and fill values:
        # over a hundred small steps, each a round trip to zarr's event loop),
        # then every file written at once
        files: dict = {}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
            ds.to_zarr(MemoryStore(files), mode="w-", encoding=enc, consolidated=True, zarr_format=3,
                       write_empty_chunks=True)
        local = LocalStore(str(tmp))
        _gather(local.set(key, value) for key, value in files.items())
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

#: grid points per chunk at most: few files and few writes (a small sweep
#: has one chunk per variable), while damage costs at most this many points
POINTS_PER_CHUNK = 128


def grid_chunks(shape: tuple) -> tuple:
    """Chunk sizes along the grid dimensions of every variable: whole axes,
    from the last one back, while a chunk holds at most
    :data:`POINTS_PER_CHUNK` points; then a part of the next axis."""
    chunks = [1] * len(shape)
    room = POINTS_PER_CHUNK
    for d in reversed(range(len(shape))):
        take = min(shape[d], room)
        chunks[d] = max(take, 1)
        if take < shape[d]:
            break
        room //= max(shape[d], 1)
    return tuple(chunks)


def stored_grid_chunks(out) -> tuple:
    """The grid chunks a store was made with (those of its ``done`` array)."""
    return tuple(_open_array(Path(out), "done").chunks)


def block_of(idx: tuple, chunks: tuple) -> tuple:
    """The grid block (chunk index along the grid dimensions) of a point."""
    return tuple(i // c for i, c in zip(idx, chunks))


def points_of(block: tuple, chunks: tuple, shape: tuple) -> list:
    """The grid points of a block."""
    ranges = [range(b * c, min((b + 1) * c, n)) for b, c, n in zip(block, chunks, shape)]
    return list(itertools.product(*ranges))


def _block_slices(block: tuple, chunks: tuple, shape: tuple) -> tuple:
    return tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(block, chunks, shape))


@dataclass
class StoreState:
    """What :func:`verify` found.

    ``done`` marks the grid points that are done and intact; ``damaged``
    maps each point marked done (or whose ``done`` flag itself is damaged)
    that failed verification to the variables whose chunks failed;
    ``coords`` lists coordinate arrays that are damaged or differ from the
    spec; ``values`` holds every data variable as read (fill values where a
    chunk failed).
    """

    done: np.ndarray
    damaged: dict = field(default_factory=dict)
    coords: list = field(default_factory=list)
    values: dict = field(default_factory=dict)


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


def _open_array(out: Path, name: str, mode: str = "r"):
    import zarr

    try:
        return zarr.open_array(store=str(out), path=name, mode=mode)
    except Exception as exc:  # noqa: BLE001 - any unreadable metadata
        raise SweepError(f"out: {out} is damaged: the metadata {out / name / 'zarr.json'} cannot be "
                         f"read ({type(exc).__name__}: {exc}); pass --overwrite to rebuild the store "
                         "(its results are then lost)") from None


def _read_blocks(out: Path, name: str, arr):
    """Read ``arr`` whole; return ``(bad, values)``: the blocks that are missing,
    fail their checksum or do not decode, and the decoded values (fill values
    in bad blocks)."""
    blocks = list(itertools.product(*(range(g) for g in arr.cdata_shape)))
    present = _chunk_files(out / name)
    bad = {b for b in blocks if b not in present}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not bad:
            try:
                return bad, arr[...]
            except Exception:  # noqa: BLE001 - a chunk that does not decode, whatever zarr raises
                pass
        values = np.full(arr.shape, arr.metadata.fill_value, dtype=arr.dtype)
        for b in blocks:
            if b in bad:
                continue
            try:
                values[_block_slices(b, arr.chunks, arr.shape)] = arr.get_block_selection(b)
            except Exception:  # noqa: BLE001
                bad.add(b)
    return bad, values


def _has_checksums(arr) -> bool:
    return any(type(c).__name__ == "Crc32cCodec" for c in arr.metadata.codecs)


def verify(out, shape: tuple, names: list, coords: dict) -> StoreState:
    """Verify every chunk of the store.

    ``shape`` is the grid's shape; every variable in ``names`` has the grid
    dimensions first, chunked like ``done``; ``coords`` maps each
    coordinate to its expected values.  Raises :class:`SweepError` naming the
    file when metadata cannot be read, or when the store predates checksums.
    """
    out = Path(out)
    arrays = {name: _open_array(out, name) for name in ["done", *names, *coords]}
    if not all(_has_checksums(arr) for arr in arrays.values()):
        raise SweepError(f"out: {out} was made by an older mbbatch, without chunk checksums, so its "
                         "damage cannot be detected; pass --overwrite to rebuild it")
    chunks = tuple(arrays["done"].chunks)
    nd = len(shape)

    def points(bad_blocks):
        return sorted({p for b in bad_blocks for p in points_of(b[:nd], chunks, shape)})

    bad_done, done = _read_blocks(out, "done", arrays["done"])
    done = np.array(done, dtype=bool).reshape(shape)
    state = StoreState(done=done)
    for idx in points(bad_done):
        done[idx] = False
        state.damaged.setdefault(idx, []).append("done")
    for name in names:
        if name == "done":
            continue
        bad, state.values[name] = _read_blocks(out, name, arrays[name])
        for idx in points(bad):
            if done[idx]:
                state.damaged.setdefault(idx, []).append(name)
    for name, values in coords.items():
        bad, stored = _read_blocks(out, name, arrays[name])
        if bad or stored.shape != np.shape(values) or not np.array_equal(stored, np.asarray(values)):
            state.coords.append(name)
    for idx in state.damaged:
        done[idx] = False
    return state


def stored_layout(out) -> tuple[tuple, list, dict]:
    """A store's layout as its own metadata records it: the arguments of
    :func:`verify` without the spec that made the store (``mbbatch plot``
    verifies a store whatever spec, of whatever mbbatch version, made it).

    Returns the grid's shape (``done``'s), the data variables, and each
    coordinate (an array named as its one dimension) with its values as
    stored, fill values where a chunk fails (:func:`verify` then finds a
    damaged coordinate by its chunks).  An array whose metadata cannot be
    read is listed, for :func:`verify` to name its file."""
    out = Path(out)
    shape = tuple(_open_array(out, "done").shape)
    names, coords = [], {}
    for entry in sorted(out.iterdir()):
        if entry.name == "done" or not entry.is_dir() or not (entry / "zarr.json").exists():
            continue
        meta = _json(entry / "zarr.json")
        if isinstance(meta, dict) and meta.get("node_type") != "array":
            continue
        if isinstance(meta, dict) and list(meta.get("dimension_names") or []) == [entry.name]:
            coords[entry.name] = _read_blocks(out, entry.name, _open_array(out, entry.name))[1]
        else:
            names.append(entry.name)
    return shape, names, coords


def repair_coords(out, coords: dict, names: list) -> None:
    """Rewrite the coordinate arrays ``names`` from their known values."""
    for name in names:
        arr = _open_array(Path(out), name, mode="r+")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arr[...] = np.asarray(coords[name], dtype=arr.dtype)


class BlockWriter:
    """Writes grid blocks of the data variables ``names`` of a store and of
    its ``done``, the arrays opened once, here (a sweep writes every few
    seconds; opening an array reads its metadata).  ``shape`` is the grid's
    shape."""

    def __init__(self, out, shape: tuple, names):
        import zarr

        self.out = Path(out)
        self.shape = tuple(shape)
        # (an array takes zarr's configuration when opened: every chunk written, fill values included)
        with zarr.config.set({"array.write_empty_chunks": True}):
            self.arrays = {name: _open_array(self.out, name, mode="r+") for name in [*names, "done"]}
        if not all(arr.config.write_empty_chunks for arr in self.arrays.values()):
            raise RuntimeError("zarr did not take write_empty_chunks: a fill-valued chunk would go unwritten")
        self.chunks = tuple(self.arrays["done"].chunks)

    def write(self, values: dict, blocks, done: np.ndarray) -> None:
        """Write the grid ``blocks`` of every variable of ``values`` (whole
        arrays, in memory), then the same blocks of ``done``.

        Each chunk is written whole, atomically (a temporary file renamed
        into place), fill values included; the variables' chunks are
        written concurrently.  ``done`` is written last: a kill before it
        leaves the blocks' new points not done, to be recomputed, and the
        points done before keep their values (they are in ``values`` too)."""
        blocks = sorted(set(blocks))
        if not blocks:
            return
        chunks, shape = self.chunks, self.shape
        every = len(blocks) == math.prod(-(-n // c) for n, c in zip(shape, chunks))
        sels = [...] if every else [_block_slices(b, chunks, shape) for b in blocks]

        def puts(items):
            return [self.arrays[name].async_array.setitem(sel, data if sel is Ellipsis else data[sel])
                    for name, data in items for sel in sels]

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _gather(puts(values.items()))
            _gather(puts([("done", done)]))


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


def _ours(path: Path, ds=None) -> bool:
    """Whether the file at ``path`` is a NetCDF file mbbatch wrote: a sweep's
    export (the store mark, or mbbatch's version, in its attributes), or an
    earlier export of ``ds`` itself (the same description and variables)."""
    import xarray as xr

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with xr.open_dataset(path) as old:
                attrs, names = dict(old.attrs), set(old.data_vars)
    except Exception:  # noqa: BLE001 - not a NetCDF file xarray reads: not ours
        return False
    if MARK in attrs or "mbbatch_version" in attrs:
        return True
    return ds is not None and "description" in attrs and attrs["description"] == ds.attrs.get("description") \
        and names == set(ds.data_vars)


def check_export(path, param: str, ds=None) -> Path:
    """Raise :class:`SweepError` unless a NetCDF export may be written at
    ``path`` (``param``: the argument that named it): not a folder, not under
    a file, and, if a file is there, one mbbatch wrote (see :func:`_ours`;
    nothing else is ever replaced)."""
    path = Path(path)
    if path.is_dir():
        raise SweepError(f"{param}: {path} is a folder; give the path of the NetCDF file to write")
    for folder in (path.absolute().parent, *path.absolute().parent.parents):
        if folder.exists():
            if not folder.is_dir():
                raise SweepError(f"{param}: {folder} is a file, not a folder to put {path.name} in")
            break
    if path.is_symlink() or (path.exists() and not _ours(path, ds)):
        raise SweepError(f"{param}: {path} exists and is not a NetCDF file mbbatch wrote; an export replaces "
                         "only mbbatch's own: choose another path")
    return path


def _netcdf_attrs(attrs: dict) -> dict:
    """Attributes NetCDF can hold: a boolean (which it has no type for) as
    the integer 0 or 1."""
    return {k: np.int8(v) if isinstance(v, (bool, np.bool_)) else v for k, v in attrs.items()}


def write_netcdf(ds, path, param: str = "netcdf") -> Path:
    """Export ``ds`` to the NetCDF file ``path`` (checked by
    :func:`check_export`; folders made as needed), whole: written beside it
    under a temporary name, then renamed into place.  Boolean attributes (a
    spec's ``kv_reuse = true``, say) are stored as 0 or 1; boolean
    variables and coordinates read back as booleans (xarray's encoding)."""
    path = check_export(path, param, ds)
    ds = ds.copy(deep=False)
    ds.attrs = _netcdf_attrs(ds.attrs)
    for var in ds.variables.values():
        var.attrs = _netcdf_attrs(var.attrs)
    path.absolute().parent.mkdir(parents=True, exist_ok=True)
    tmp = path.absolute().parent / f".{path.name}.{os.getpid()}.tmp"   # (created with the umask's mode)
    try:
        ds.to_netcdf(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path
