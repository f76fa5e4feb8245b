"""Engine presets: :class:`~mbbatch.ContinuousBatching` with the scheduler
settings released serving engines ship by default.

Each preset sets what the engine's own defaults set (the running sequences'
cap, the iteration's token budget, chunked prefill, the KV block size), each
with its source below, and leaves the rest to :class:`ContinuousBatching`'s
defaults; any setting may be overridden by keyword (``vllm("v1",
kv_tokens=4e5)``).  The KV memory (``kv_tokens``) depends on the model and
the hardware: it stays infinite unless given.  The overheads a real server
pays beyond the forward pass (``iteration_overhead``, ``request_overhead``)
are 0 here: :func:`mbbatch.validation.calibrate` fits them to measured
serving runs, and ``mbbatch validate`` reports them and the error held out.

Sources (the release's code, ``vllm/engine/arg_utils.py`` and
``vllm/config.py`` for vLLM, ``python/sglang/srt/server_args.py`` for
SGLang):

- vLLM 0.6 (V0 engine, OpenAI API server): ``max_num_seqs`` 256;
  ``block_size`` 16; chunked prefill switched on by itself when the
  model's context (``max_model_len``) exceeds 32,768 tokens, with
  ``max_num_batched_tokens`` 512, and otherwise off with
  ``max_num_batched_tokens = max(max_model_len, 2048)``.
- vLLM V1 (0.8 and later, OpenAI API server): chunked prefill always on;
  on GPUs of at least 70 GiB other than the A100 ``max_num_batched_tokens``
  8,192 and ``max_num_seqs`` 1,024, else 2,048 and 256
  (``EngineArgs.get_batch_defaults``); ``block_size`` 16.
- SGLang: chunked prefill on, ``chunked_prefill_size`` 2,048 on GPUs below
  35 GB, 8,192 below 160 GB, 16,384 above; ``page_size`` 1.  SGLang derives
  its running requests' cap from the KV pool rather than a fixed default:
  the preset sets ``max_num_seqs`` to the chunk size (the most a chunked
  iteration can decode), so the memory, ``kv_tokens``, binds first.
- Multi-step scheduling (``num_scheduler_steps``): off (1) in every preset,
  as vLLM 0.6 ships it (``--num-scheduler-steps`` defaults to 1; V1 has no
  multi-step scheduling); ``vllm("0.6", num_scheduler_steps=8)`` turns it
  on as a server started with ``--num-scheduler-steps 8`` runs.

For example:

>>> from mbbatch import engines
>>> e = engines.vllm("0.6", max_model_len=131072)
>>> e.max_num_seqs, e.chunked_prefill, e.max_batched_tokens, e.block_size
(256, True, 512, 16)
>>> engines.vllm("0.6", max_model_len=8192).max_batched_tokens    # chunked prefill off
8192
>>> e = engines.vllm("v1", gpu_memory_gib=24)
>>> e.max_num_seqs, e.max_batched_tokens
(256, 2048)
>>> engines.sglang(gpu_memory_gib=80).max_batched_tokens
8192
"""

from __future__ import annotations

from .policies.continuous import ContinuousBatching

__all__ = ["vllm", "sglang", "VLLM_VERSIONS"]

#: the vLLM releases with a preset
VLLM_VERSIONS = ("0.6", "v1")
#: vLLM 0.6 switches chunked prefill on by itself above this context length (tokens)
_V0_CHUNKED_ABOVE = 32_768


def _check_memory(gpu_memory_gib) -> float:
    if isinstance(gpu_memory_gib, bool) or not isinstance(gpu_memory_gib, (int, float)) or not (
            0 < gpu_memory_gib < 1e6):
        raise ValueError(f"gpu_memory_gib must be a GPU's memory in GiB, in (0, 1e6); got {gpu_memory_gib!r}")
    return float(gpu_memory_gib)


def vllm(version: str = "v1", *, gpu_memory_gib: float = 80.0, a100: bool = False, max_model_len: int = 131_072,
         **settings) -> ContinuousBatching:
    """vLLM's engine as release ``version`` sets it by default (the module
    docstring gives the sources).

    Parameters
    ----------
    version : {"0.6", "v1"}
        ``"0.6"``: the V0 engine of vLLM 0.6; ``"v1"``: the V1 engine (vLLM
        0.8 and later).
    gpu_memory_gib : float
        One GPU's memory, GiB (V1 picks its budget by it); default 80 (an H100).
    a100 : bool
        Whether the GPU is an A100 (V1 keeps the small budget on it).
    max_model_len : int
        The model's context, tokens (vLLM 0.6 turns chunked prefill on by it);
        default 131,072 (Llama-3.1's).
    **settings
        Any :class:`ContinuousBatching` setting, overriding the preset's.
    """
    memory = _check_memory(gpu_memory_gib)
    if version not in VLLM_VERSIONS:
        raise ValueError(f"version must be one of {', '.join(map(repr, VLLM_VERSIONS))}; got {version!r}")
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
        raise ValueError(f"max_model_len must be a context length in tokens, an int >= 1; got {max_model_len!r}")
    if version == "0.6":
        chunked = max_model_len > _V0_CHUNKED_ABOVE
        preset = dict(max_num_seqs=256, block_size=16, chunked_prefill=chunked,
                      max_batched_tokens=512 if chunked else max(max_model_len, 2048))
    else:
        large = memory >= 70.0 and not a100
        preset = dict(max_num_seqs=1024 if large else 256, max_batched_tokens=8192 if large else 2048,
                      chunked_prefill=True, block_size=16)
    return ContinuousBatching(**{**preset, **settings})


def sglang(*, gpu_memory_gib: float = 80.0, **settings) -> ContinuousBatching:
    """SGLang's engine as it sets itself by default (the module docstring
    gives the sources): chunked prefill of ``chunked_prefill_size`` tokens
    by the GPU's memory, pages of one token.

    Parameters
    ----------
    gpu_memory_gib : float
        One GPU's memory, GiB; default 80.
    **settings
        Any :class:`ContinuousBatching` setting, overriding the preset's.
    """
    memory = _check_memory(gpu_memory_gib)
    chunk = 2048 if memory < 35.0 else 8192 if memory < 160.0 else 16384
    preset = dict(max_num_seqs=chunk, max_batched_tokens=chunk, chunked_prefill=True, block_size=1)
    return ContinuousBatching(**{**preset, **settings})
