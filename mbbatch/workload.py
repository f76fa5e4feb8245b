"""The request model's requests: prompt and output lengths and a predicted
output length, in tokens.

A :class:`Workload` holds where the lengths come from (a distribution drawn
in the kernel, or a trace's arrays replayed) and the predictor of the output
length.  The batch service models are in :mod:`mbbatch.service_models`.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field


from ._validation import check, check_fields
from .params import default
from .lengths import as_service

__all__ = ["Workload", "Mixture", "SystemPrompts"]


@dataclass(frozen=True, eq=False)
class SystemPrompts:
    """System prompts that requests share: a prompt prefix ``count``
    distinct ones of, which an engine with prefix caching
    (``ContinuousBatching(prefix_caching=True)``) prefills once and keeps.

    Each request carries one with probability ``share`` (the same for every
    policy: a stream of its own), which of them uniformly; its prompt is the
    system prompt followed by its own tokens (the workload's ``prompt``
    length), so the system prompt's length adds to its prompt.  The
    ``count`` lengths are drawn once per run from ``length`` (rounded up to
    whole tokens), or all equal ``length`` when it is a number.

    Parameters
    ----------
    count : int
        The distinct system prompts, >= 1.  Default 1.
    length : float or scipy.stats frozen distribution
        Their length, tokens (>= 0), or the distribution each is drawn from.
    share : float
        The share of the requests that carry one, in [0, 1].  Default 1.
    """

    length: object
    count: int = default("SystemPrompts.count")
    share: float = default("SystemPrompts.share")

    def __post_init__(self):
        check_fields(self, {"count": "SystemPrompts.count", "share": "SystemPrompts.share"})
        if self.drawn:
            as_service(self.length, "SystemPrompts.length")
        else:
            check("SystemPrompts.length", self.length)

    @property
    def drawn(self) -> bool:
        """Whether the lengths are drawn (``length`` a frozen distribution)."""
        import scipy.stats as st

        return isinstance(self.length, st.distributions.rv_frozen)

    def draw(self, gen, n: int) -> tuple:
        """``(chain, shared)`` of ``n`` requests from the generator ``gen``:
        each request's system prompt (-1: none) and its length, tokens (0:
        none), as floats (the kernel's inputs)."""
        import numpy as np

        if self.drawn:
            lengths = np.maximum(np.ceil(self.length.rvs(size=self.count, random_state=gen)), 1.0)
        else:
            lengths = np.full(self.count, float(math.ceil(self.length)))
        carries = gen.random(n) < self.share
        which = gen.integers(0, self.count, n)
        chain = np.where(carries, which, -1).astype(float)
        shared = np.where(carries, lengths[which], 0.0)
        return chain, shared

    def mean_length(self) -> float:
        """The mean tokens a request's system prompt adds to its prompt."""
        mean = float(self.length.mean()) if self.drawn else self.length
        return self.share * mean

    def describe(self) -> dict:
        length = f"{self.length.dist.name}{self.length.args}" if self.drawn else self.length
        return {"system_prompts": self.count, "system_prompt_share": self.share, "system_prompt_length": length}


@dataclass(frozen=True, eq=False)
class Workload:
    """Token-level requests.

    Parameters
    ----------
    prompt, output : scipy.stats frozen distribution, Empirical or array_like
        Prompt and output lengths, tokens: any frozen continuous
        distribution (uniform, expon, lognorm, gamma, weibull_min are drawn
        in the kernel, any other before the run from its ``rvs``), an
        :class:`~mbbatch.lengths.Empirical` resampling of observed values, or
        an array replayed in order (a trace; see :meth:`from_trace`).
        Values, and a distribution's draws, must lie in [0, 1e290]; see
        :func:`~mbbatch.lengths.as_service`.
    integer_lengths : bool
        Round draws up to whole tokens (at least 1).  Default True.
    predictor_sigma : float
        Log-normal error of the output-length predictor:
        ``predicted = output * exp(sigma Z)``.  0 (default) is the oracle.
    ttft_slo : float
        The requests' objective on their time to first token, seconds
        (default inf: none): the deadline, after its arrival, by which
        earliest-deadline-first admission
        (``ContinuousBatching(admission="edf")``) orders a request.
    tpot_slo : float
        The requests' objective on their time per output token, s/token
        (default inf: none): ``(last token - first token) / (output - 1)``.
        A run with either objective reports ``goodput``, the share of the
        requests that met both (Zhong et al., 2024, "DistServe",
        arXiv:2401.09670); ``Objective(goodput=...)`` bounds it from below.
    system_prompts : SystemPrompts, optional
        Prompt prefixes shared by requests (:class:`SystemPrompts`), which an
        engine with prefix caching prefills once.  Default None: none.

    Several kinds of requests in one stream (clients, tenants, each with its
    lengths and objective): :meth:`mixture`.
    """

    prompt: object
    output: object
    integer_lengths: bool = default("integer_lengths")
    predictor_sigma: float = default("predictor_sigma")
    ttft_slo: float = default("ttft_slo")
    tpot_slo: float = default("tpot_slo")
    system_prompts: SystemPrompts | None = None
    _prompt: object = field(init=False, repr=False)
    _output: object = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "_prompt", as_service(self.prompt, "prompt"))
        object.__setattr__(self, "_output", as_service(self.output, "output"))
        check_fields(self, {"integer_lengths": "integer_lengths", "predictor_sigma": "predictor_sigma",
                            "ttft_slo": "ttft_slo", "tpot_slo": "tpot_slo"})
        if self.system_prompts is not None and not isinstance(self.system_prompts, SystemPrompts):
            raise TypeError(f"system_prompts must be an mbbatch.SystemPrompts; got "
                            f"{type(self.system_prompts).__name__}")

    @classmethod
    def mixture(cls, classes: dict) -> "Mixture":
        """Requests of several classes, ``{name: (share, workload)}``: each
        request's class is drawn independently, with probability its share
        over the shares' sum, and its lengths and objective are its class's
        workload's.  See :class:`Mixture`.

        >>> import scipy.stats as st
        >>> chat = Workload(prompt=st.uniform(16, 240), output=st.expon(scale=64), ttft_slo=0.5)
        >>> batch = Workload(prompt=st.uniform(512, 1536), output=st.expon(scale=512))
        >>> Workload.mixture({"chat": (3, chat), "batch": (1, batch)}).shares
        (0.75, 0.25)
        """
        return Mixture(classes)

    @classmethod
    def from_trace(cls, trace, *, resample: bool = False, **kw) -> "Workload":
        """The prompt and output lengths of a :class:`~mbbatch.traces.Trace`:
        replayed in the trace's order (pair it with ``Replay(trace)`` for the
        trace's own arrivals), or, with ``resample``, each drawn independently
        from the trace's values (:class:`~mbbatch.lengths.Empirical`, which
        loses the pairing of a request's prompt and output).  Other keywords
        go to the constructor."""
        from .lengths import Empirical
        from .traces import Trace

        if not isinstance(trace, Trace):
            raise TypeError(f"trace must be an mbbatch.traces.Trace (from a loader); got {type(trace).__name__}")
        prompt, output = trace.prompt_tokens.astype(float), trace.output_tokens.astype(float)
        if resample:
            prompt, output = Empirical(prompt), Empirical(output)
        return cls(prompt=prompt, output=output, **kw)

    @property
    def has_objectives(self) -> bool:
        """Whether it sets an objective (``ttft_slo`` or ``tpot_slo``): goodput counts the requests within them."""
        return math.isfinite(self.ttft_slo) or math.isfinite(self.tpot_slo)

    def length_specs(self, name: str = "workload") -> list:
        """``[(parameter, spec)]``: its prompt and output lengths' specs, named as the parameters that set them."""
        return [(f"{name}.prompt", self._prompt), (f"{name}.output", self._output)]

    def mean(self, which: str) -> float:
        """The mean ``"prompt"`` (its system prompt's tokens included) or ``"output"`` length, tokens."""
        extra = self.system_prompts.mean_length() if which == "prompt" and self.system_prompts is not None else 0.0
        return getattr(self, "_" + which).mean + extra

    def describe(self) -> dict:
        d = {f"prompt_{k.removeprefix('service_')}" if k != "service" else "prompt": v
             for k, v in self._prompt.description.items()}
        d.update({f"output_{k.removeprefix('service_')}" if k != "service" else "output": v
                  for k, v in self._output.description.items()})
        d.update(integer_lengths=bool(self.integer_lengths), predictor_sigma=self.predictor_sigma)
        for slo in ("ttft_slo", "tpot_slo"):
            if getattr(self, slo) != float("inf"):
                d[slo] = getattr(self, slo)
        if self.system_prompts is not None:
            d.update(self.system_prompts.describe())
        return d


@dataclass(frozen=True, eq=False)
class Mixture:
    """Requests of several classes (clients, tenants) in one stream.

    Each request's class is drawn independently (its own random stream:
    every policy sees the same classes), with probability the class's share
    over the shares' sum; its prompt and output lengths are drawn from its
    class's workload (each class's from a stream of its own), and its time
    to first token objective is its class's ``ttft_slo``.  The classes
    share one predictor (their ``predictor_sigma`` must agree) and whole
    tokens.  Runs on :class:`~mbbatch.ContinuousBatching` engines: each
    request's class is its client for fair sharing and its deadline for
    earliest-deadline-first admission, and the run reports each class's
    metrics (:attr:`~mbbatch.SimulationResult.classes`).

    Parameters
    ----------
    classes : dict
        ``{name: (share, workload)}``: a class's name (a string), its share
        (> 0) and its :class:`Workload`; at least one class.
    """

    classes: dict
    names: tuple = field(init=False)
    shares: tuple = field(init=False)
    parts: tuple = field(init=False, repr=False)

    def __post_init__(self):
        if not isinstance(self.classes, dict) or not self.classes:
            raise TypeError(f"classes must be a non-empty dict {{name: (share, Workload)}}; got {self.classes!r}")
        names, shares, parts = [], [], []
        for name, spec in self.classes.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"classes: a class's name must be a non-empty string; got {name!r}")
            if not (isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], Workload)):
                raise TypeError(f"classes[{name!r}] must be (share, Workload); got {spec!r}")
            names.append(name)
            shares.append(check("class_share", spec[0], f"classes[{name!r}] share"))
            parts.append(spec[1])
        for attr in ("predictor_sigma", "integer_lengths"):
            values = {getattr(p, attr) for p in parts}
            if len(values) > 1:
                raise ValueError(f"classes: the classes share one predictor and rounding; their {attr} differ: "
                                 f"{dict(zip(names, (getattr(p, attr) for p in parts)))}")
        total = sum(shares)
        object.__setattr__(self, "names", tuple(names))
        object.__setattr__(self, "shares", tuple(s / total for s in shares))
        object.__setattr__(self, "parts", tuple(parts))

    @property
    def predictor_sigma(self) -> float:
        return self.parts[0].predictor_sigma

    @property
    def integer_lengths(self) -> bool:
        return self.parts[0].integer_lengths

    @property
    def ttft_slo(self) -> tuple:
        """Each class's time to first token objective, seconds."""
        return tuple(p.ttft_slo for p in self.parts)

    @property
    def tpot_slo(self) -> tuple:
        """Each class's time per output token objective, s/token."""
        return tuple(p.tpot_slo for p in self.parts)

    @property
    def has_objectives(self) -> bool:
        """Whether a class sets an objective."""
        return any(p.has_objectives for p in self.parts)

    def mean(self, which: str) -> float:
        """The mean ``"prompt"`` or ``"output"`` length over the classes, tokens."""
        return sum(s * p.mean(which) for s, p in zip(self.shares, self.parts))

    def length_specs(self, name: str = "workload") -> list:
        """``[(parameter, spec)]``: each class's prompt and output lengths' specs."""
        return [spec for c, p in zip(self.names, self.parts) for spec in p.length_specs(f"{name}.classes[{c!r}]")]

    def describe(self) -> dict:
        d = {"classes": ",".join(self.names), "class_shares": ",".join(f"{s:.6g}" for s in self.shares)}
        for name, part in zip(self.names, self.parts):
            d.update({f"{name}.{k}": v for k, v in part.describe().items()})
        return d

