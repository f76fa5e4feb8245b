"""Sweeps: parameter grids run into resumable Zarr stores.

- :mod:`~mbbatch.sweeps.spec`: the TOML spec, validated before anything runs;
- :mod:`~mbbatch.sweeps.cells`: one grid point's seeds, simulations and closed forms;
- :mod:`~mbbatch.sweeps.schema`: the stored Dataset's variables, from the metric table;
- :mod:`~mbbatch.sweeps.store`: the store (checksums, verification, one writer, safe overwrite);
- :mod:`~mbbatch.sweeps.executors`: in-process, process-pool and dask.distributed execution;
- :mod:`~mbbatch.sweeps.run`: running and resuming a sweep, and checking a store.
"""

from .run import StoreReport, Summary, check_store, open_store, run_sweep, run_sweeps, verify_store
from .spec import SpecError, SweepSpec, load_spec, parse_spec
from .store import StoreNote, SweepError

__all__ = ["run_sweep", "run_sweeps", "check_store", "verify_store", "open_store", "load_spec", "parse_spec",
           "SweepSpec", "SpecError", "SweepError", "StoreNote", "StoreReport", "Summary"]
