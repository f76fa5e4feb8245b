"""Batching policies: configuration only, validated at the boundary.

One module per policy: its class, what it declares to the registry
(:mod:`.base` says what), how a sweep's parameters build it and, for a
token-level policy, how the event kernel runs it.  The registry
(:mod:`mbbatch.registry`) lists them, and :mod:`mbbatch` exports them:

- :mod:`.multibin`: :class:`~mbbatch.MultiBin`, the multi-bin paper's;
- :mod:`.static`: :class:`~mbbatch.StaticBatching`;
- :mod:`.dynamic`: :class:`~mbbatch.DynamicBatching` and
  :class:`~mbbatch.MultiBinDynamic`;
- :mod:`.laps`: :class:`~mbbatch.LAPS`;
- :mod:`.cluster`: :class:`~mbbatch.Cluster` and its programs and events;
- :mod:`.spf`: :class:`~mbbatch.ShortestPredictedFirst`;
- :mod:`.continuous`: :class:`~mbbatch.ContinuousBatching`, an engine that
  batches at every iteration;
- :mod:`.disaggregated`: :class:`~mbbatch.Disaggregated`, prefill and decode
  on pools of their own, and :class:`~mbbatch.KVTransfer`, the link between.
"""
