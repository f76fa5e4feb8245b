"""The open-loop driver: one stage of resumable engines (or instances)
behind its router, its requests arriving in time order.

A stage is a namedtuple of its arrays and five steps of its own; each
stage's kernel is this one driver compiled with its steps
(:func:`open_loop_driver`, :func:`.common.variant`):

- ``_set_up_open(stage, streams, estop) -> carry``: the stage ready, its
  loop-carried state (scalars) before the first arrival;
- ``_arrival(stage, carry, j) -> t``: request j's arrival time;
- ``_until(stage, carry, t, stop, streams, estop) -> (code, carry)``: every
  event of the stage before an arrival at ``t``, in the stage's own order
  (an engine advanced until an iteration would start at or after ``t``,
  an instance's batch ending, an engine leaving or joining);
- ``_arrive_open(stage, carry, j, t) -> carry``: request j routed into the
  stage at ``t``;
- ``_run_out(stage, carry, n, stop, streams, estop) -> code``: after the
  ``n`` arrivals, every engine run to its end, the statistics written.

The stages: a cluster of continuous engines
(:data:`.continuous_cluster.cluster_kernel`, its steps ``_*_engines``) and
LAPS's prefill instances (:data:`.laps.laps_kernel`, its steps ``_*_laps``).
A disaggregated deployment runs its pools with them one after the other;
its closed loops run the stages' own steps for one iteration (or one batch)
at a time, with the decode pool's, in :func:`.disaggregated.closed_loop_kernel`.

Every ``stop`` check comes before an arrival, every 1,024 arrivals
(:func:`stop_asked`); a stage running out may check it too.
"""

from __future__ import annotations

from .common import ARRIVED, STOP, kernel, step, variant
# (a driver's codes, the continuous engine's: the run ended, or stop[STOP] was set)
from .continuous import DONE, STOPPED

__all__ = ["DONE", "STOPPED", "open_loop_driver", "stop_asked"]

#: arrivals between two checks of ``stop``
CHECK = 1024


@step
def stop_asked(j, stop):
    """Before request j: every :data:`CHECK` requests, whether Ctrl-C asked
    the run to stop (``stop[STOP]``), else the requests routed so far into
    ``stop[ARRIVED]``."""
    if j % CHECK == 0:
        if stop[STOP] != 0:
            return True
        stop[ARRIVED] = j
    return False


# (the stage's steps: each stage's variant of the driver binds its own)
_set_up_open = _arrival = _until = _arrive_open = _run_out = None


def open_loop(stage, n, streams, stop, estop):
    """Serve the ``n`` requests of ``stage`` as they arrive: before each,
    every event of the stage up to its instant, then the request routed;
    after the last, the stage run out (the module's steps).  ``estop``: the
    engines' own ``stop`` (a cluster's: :data:`STOP` passed on as the run
    ends).  Returns :data:`DONE`, :data:`STOPPED` or the stage's own code."""
    carry = _set_up_open(stage, streams, estop)
    for j in range(n):
        if stop_asked(j, stop):
            return STOPPED
        t = _arrival(stage, carry, j)
        code, carry = _until(stage, carry, t, stop, streams, estop)
        if code != DONE:
            return code
        carry = _arrive_open(stage, carry, j, t)
    return _run_out(stage, carry, n, stop, streams, estop)


class _Template:
    """:func:`open_loop` as :func:`.common.variant` reads a kernel (its
    ``py_func``)."""

    py_func = open_loop


def open_loop_driver(name: str, module: str, **steps):
    """The driver compiled with a stage's ``steps`` (the five, by the
    module's names), as ``name`` of ``module`` (the stage's: its disk
    cache is flushed with that module's)."""
    missing = sorted({"_set_up_open", "_arrival", "_until", "_arrive_open", "_run_out"} - set(steps))
    if missing:
        raise ValueError(f"open_loop_driver: the stage {name} has no step {missing}")
    return variant(kernel, _Template, name, module=module, **steps)
