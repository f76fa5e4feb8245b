"""What a policy declares: the class attributes :mod:`mbbatch.registry` reads.

A policy is a frozen dataclass of its settings (validated at the boundary)
that declares, once, as class attributes:

``kind``
    its name: a spec's ``kind``, the command line's ``--policy``, the
    result's ``kind``;
``planner``
    the planner that checks and runs it (a module of :mod:`mbbatch.planners`:
    ``"multibin"``, ``"tokens"``, ``"cluster"``, ``"laps"`` or
    ``"continuous"``);
``reports``
    the metric tags it reports (:data:`mbbatch.metrics.TAGS`): the metrics of
    the table with one of these tags are its results' attributes;
``settings``
    the spec keys of its settings (rows of :data:`mbbatch.sweeps.spec.SPEC_PARAMS`);
``models``
    the batch service models it takes, by their spec name, the default first;
``paper``
    whether it takes the multi-bin paper's ``service=`` shorthand;
``engine``, ``decode_stage``
    whether it can run as a :class:`~mbbatch.Cluster`'s engines or as
    :class:`~mbbatch.LAPS`'s decode stage;
``resumable``
    whether its engine is a resumable stage: advanced to an instant, handed
    requests and resumed (:func:`mbbatch._kernels.continuous.advance`), so
    that a composite runs it under a driver of its own (a cluster's engines
    behind the continuous cluster driver, LAPS's decode stage on the first
    tokens) rather than in its engines' token-level form;
``prefill_stage``
    the prefill pool it forms in a :class:`~mbbatch.Disaggregated`
    deployment, a stage of :data:`mbbatch.planners.disaggregated.STAGES`:
    ``"engines"`` (its engines behind the deployment's router:
    continuous batching), ``"laps"`` (its own instances behind its own
    router: LAPS), or ``""`` (none: it cannot be a prefill pool);
``classes``
    whether it runs a :meth:`~mbbatch.Workload.mixture`'s request classes
    (their metrics and objectives, its admission orders reading them), alone
    or as a cluster's engines;
``prefixes``
    whether it runs requests sharing prompt prefixes (a workload's
    :class:`~mbbatch.SystemPrompts`) and can cache them, alone or as a
    cluster's engines;
``spec_names``
    the spec keys of the arguments its refusals name, where they differ
    (LAPS's ``decode.kv_tokens`` is a spec's ``decode_eta``);
``spec_defaults``
    its own defaults of spec keys whose parameter table default is another
    kind's (a disaggregated deployment's ``programs`` is ``"none"``, a
    cluster's ``"synthetic"``: a spec written before it took programs runs
    none);

the classmethod ``from_spec(params, ctx)``: the policy of a sweep
cell's parameters (:class:`SpecContext`); and ``carries()``, how a
capacity search judges its runs (:class:`Carries`).  A token-level policy (``planner
= "tokens"``) also says how the event kernel runs it: ``event_config()``
(:class:`EventPolicy`); an engine policy that is not token-level gives the
token-level form its engines run (``engine_form()``).
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import numpy as np

__all__ = ["Policy", "Carries", "EventPolicy", "SpecContext", "declaring", "TOKEN_MODELS", "predictor_from_spec",
           "memory_from_spec", "controller_from_spec", "memory_kw"]

#: the batch service models of the token-level policies (spec names), the default first
TOKEN_MODELS = ("decode", "linear", "max", "calibrated", "iteration", "profile")


class Carries(NamedTuple):
    """How a capacity search (:func:`mbbatch.find_capacity`) judges whether a
    policy's run carries its arrival rate.

    ``load``
        ``rate x mean batch service / (servers x mean batch size)`` is the
        arrival rate over its service rate at the run's batching (the
        servers' busy fraction in a stable run, above 1 in an overloaded
        one), and tells the two apart: its batches hold their servers from
        start to completion, at a batching the load does not change (the
        multi-bin paper's full batches; LAPS's prefill batches).  False where
        a batch is one iteration of a continuous-batching engine (a request
        holds its slot over many of them: that ratio is about 1 / (output
        tokens), below 1 at any rate), and where batches take whatever waits
        (static, shortest-first, dynamic batching): near the limit the
        server is always busy and the batches grow with the backlog, so the
        ratio is 1 within any interval over a range of rates below it (from
        4.4 to 6.3 requests/s, as the seeds went, for
        ShortestPredictedFirst(8)), and a finite run's throughput, a percent
        under the rate, puts it just above 1 there.
    ``backlog``
        the backlog check decides at every probe, not only at the
        replication cap: where there is no load (``load`` False), or where it
        covers part of the system only (LAPS's prefill instances, before its
        decode stage).
    ``held``
        the most requests one of its servers holds at once (a batch, every
        bin's batch, the running sequences; a cluster's engines together): a
        capacity probe simulates many times this
        (:func:`mbbatch.capacity.min_requests`), or its start-up and drain
        are most of the run.
    ``iterations``
        its batches are the iterations of a continuous-batching engine: the
        requests it holds turn over once per output, not once per batch, so
        a probe needs more of them (:data:`mbbatch.capacity.MIN_TURNOVERS`).
    """

    load: bool
    backlog: bool
    held: int
    iterations: bool = False


class Policy:
    """The declarations every policy makes (see the module docstring)."""

    kind: ClassVar[str] = ""
    planner: ClassVar[str] = ""
    reports: ClassVar[frozenset] = frozenset()
    settings: ClassVar[tuple] = ()
    models: ClassVar[tuple] = TOKEN_MODELS
    paper: ClassVar[bool] = False
    engine: ClassVar[bool] = False
    decode_stage: ClassVar[bool] = False
    resumable: ClassVar[bool] = False
    prefill_stage: ClassVar[str] = ""
    classes: ClassVar[bool] = False
    prefixes: ClassVar[bool] = False
    #: the spec keys of the arguments its refusals name, where they differ (a sweep's errors say the key)
    spec_names: ClassVar[dict] = {}
    #: its own defaults of spec keys, where they differ from the parameter table's
    spec_defaults: ClassVar[dict] = {}

    @classmethod
    def from_spec(cls, params: dict, ctx: "SpecContext"):
        """The policy of a sweep cell's parameters ``params``."""
        raise NotImplementedError

    @property
    def title(self) -> str:
        """The policy's name in messages (its class's)."""
        return type(self).__name__

    def engine_form(self):
        """The token-level policy a :class:`~mbbatch.Cluster`'s engines run for
        this one (itself, for a token-level policy)."""
        return self

    def carries(self) -> Carries:
        """How a capacity search judges this policy's runs (:class:`Carries`):
        by default batches that hold their servers to completion, one
        request each."""
        return Carries(load=True, backlog=False, held=1)

    def request_engine(self) -> "Policy":
        """The policy whose declarations (``classes``, ``prefixes``) decide
        which requests this one runs: itself, or a composite's engines (a
        :class:`~mbbatch.Cluster`'s)."""
        return self


class EventPolicy(NamedTuple):
    """How the event kernel runs a token-level policy: its batch formation
    step (a ``FORM_*`` code of :mod:`mbbatch._kernels.formation`) and the
    settings that step reads.

    ``bins`` queues by predicted output length (1: one FIFO); ``b_max`` the
    largest batch; ``pin`` a fixed target size (0: the controller's);
    ``max_candidates`` requests looked at per batch; ``selection``
    Algorithm 5's rule (``SEL_*``); ``warmup`` Algorithm 6's window (1: no
    bins to set); ``memory_on`` whether the token capacity bounds a batch;
    ``sla`` and ``memory`` the :class:`~mbbatch.SLAController` and
    :class:`~mbbatch.Memory` (a static policy's give its SLA metrics and
    token capacity only); ``predictor`` what it sorts or bins requests by;
    ``bin_b_max`` per-bin limits (None: none); ``controlled`` whether
    Algorithm 7 feeds its controllers back; ``max_wait`` the age (s) after
    which a request goes first (inf: never); ``preset`` where bins set
    before the run come from (``""``: none, or Algorithm 6's warm-up;
    ``"presample"``, ``"optimal"``, or ``"edges"``: ``edges`` in tokens, or
    equal mass on the workload's output lengths when None); ``scratch`` the
    floats of scratch its rule works in, for a batch of ``b_max``.
    """

    formation: int
    bins: int
    b_max: int
    pin: int
    max_candidates: int
    selection: int
    warmup: int
    memory_on: bool
    sla: object
    memory: object
    predictor: object
    bin_b_max: np.ndarray | None = None
    controlled: bool = False
    max_wait: float = float("inf")
    preset: str = ""
    edges: np.ndarray | None = None
    scratch: int = 0


class SpecContext(NamedTuple):
    """What ``from_spec`` reads besides a cell's parameters: ``build(kind,
    params)``, the policy of another kind (a cluster's engines, LAPS's decode
    stage), ``kinds``, the registry's classes by kind, and ``trace``, the
    cell's :class:`~mbbatch.traces.Trace` (None without a [workload] table)."""

    build: object
    kinds: dict
    trace: object = None


class ComposedSettings:
    """A composite policy's ``settings`` (a class attribute): its own spec
    keys, then those of the engines it runs, the policies declaring
    ``engines`` (an attribute of :class:`Policy`, e.g. ``"engine"``), each
    renamed by ``renames`` and less ``leaves`` (the engines' settings its
    spec leaves at their defaults), in the engines' kind order.  Read from
    the classes loaded (every policy of :mod:`mbbatch.policies`) each time it
    is asked for (never cached: read while the package loads, it would miss
    the engines not loaded yet): an engine's new setting is a composite's
    too, declared once."""

    def __init__(self, own: tuple, engines: str, renames: dict | None = None, leaves: tuple = ()):
        self.own, self.engines, self.renames, self.leaves = tuple(own), engines, dict(renames or {}), set(leaves)

    def __get__(self, obj, owner) -> tuple:
        keys = list(self.own)
        for cls in sorted(_policies(), key=lambda c: c.kind):
            if getattr(cls, self.engines, False):
                keys += [self.renames.get(k, k) for k in cls.settings if k not in self.leaves]
        return tuple(dict.fromkeys(keys))


def _policies() -> list:
    """Every policy class loaded (those with a kind; not private ones)."""
    out, todo = [], list(Policy.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo.extend(cls.__subclasses__())
        if cls.kind and not cls.__name__.startswith("_") and cls not in out:
            out.append(cls)
    return out


def declaring(attr: str) -> list:
    """The names of the policy classes that declare ``attr`` true (those
    loaded: every policy of :mod:`mbbatch.policies`), sorted, for error
    messages."""
    return sorted({cls.__name__ for cls in _policies() if getattr(cls, attr, False)})


def predictor_from_spec(params: dict):
    """A binning policy's predictor from a cell's ``predictor_sigma`` (a
    log-normal error) or ``predictor_p`` (bin confusion), one of them; None
    (the oracle) when neither is set."""
    from ..predictors import BinConfusion, LogNormalError

    sigma, p = params.get("predictor_sigma", 0.0), params.get("predictor_p", 1.0)
    if sigma > 0 and p < 1:
        raise ValueError(f"predictor_sigma = {sigma:g} and predictor_p = {p:g}: set one predictor, not both")
    if sigma > 0:
        return LogNormalError(sigma)
    return BinConfusion(p) if p < 1 else None


def memory_kw(eta: float) -> dict:
    """:class:`~mbbatch.Memory`'s arguments for a token capacity of ``eta``
    tokens (a spec's ``eta``): one GB a token keeps the units plain."""
    return dict(m_max_gb=eta + 1.0, m_model_gb=1.0, kv_mem_per_token_gb=1.0)


def memory_from_spec(params: dict):
    """The :class:`~mbbatch.Memory` of a cell: ``eta`` tokens, the ``memory``
    rule (``"off"``: not enforced) and ``eps_m``."""
    from ..controller import Memory

    return Memory(variant="l0" if params["memory"] == "off" else params["memory"], eps_m=params["eps_m"],
                  enabled=params["memory"] != "off", **memory_kw(params["eta"]))


def controller_from_spec(params: dict):
    """The :class:`~mbbatch.SLAController` of a cell."""
    from ..controller import SLAController

    return SLAController(d_sla=params["d_sla"], eps_d=params["eps_d"], b_min=params["b_min"], b_max=params["b_max"],
                         variant=params["controller"])
