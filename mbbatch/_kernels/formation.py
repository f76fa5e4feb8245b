"""Batch formation in the event kernel: how a free server's batch is chosen.

Each token-level policy forms its batches by one rule, named by a code the
policy gives (:meth:`mbbatch.policies.base.Policy.event_config`):

- ``FORM_STATIC``: up to ``B`` requests from the head of one FIFO;
- ``FORM_DYNAMIC``: Algorithm 3's target size ``min(b_mem, b_SLA)`` from
  Algorithms 1 and 2, then the head of the FIFO within the token capacity;
- ``FORM_MULTIBIN_DYNAMIC``: Algorithm 5 on top, a bin chosen by
  ``SEL_ROUND_ROBIN`` or ``SEL_LONGEST_QUEUE``, its own controller;
- ``FORM_MULTIBIN``: the multi-bin paper's batching (a cluster's engines):
  full batches of ``B`` of one bin only, the first formed first.
"""

from __future__ import annotations

__all__ = ["FORM_STATIC", "FORM_DYNAMIC", "FORM_MULTIBIN_DYNAMIC", "FORM_MULTIBIN", "SEL_ROUND_ROBIN",
           "SEL_LONGEST_QUEUE", "SELECTIONS"]

FORM_STATIC = 0
FORM_DYNAMIC = 1
FORM_MULTIBIN_DYNAMIC = 2
FORM_MULTIBIN = 3
#: Algorithm 5's bin selection rules, by their names in the parameter table
SEL_ROUND_ROBIN = 0
SEL_LONGEST_QUEUE = 1
SELECTIONS = {"round_robin": SEL_ROUND_ROBIN, "longest_queue": SEL_LONGEST_QUEUE}
