"""Distributed backends: where the model lives and how it computes, behind one protocol.

* :mod:`~mmcore.backends.protocol` — :class:`~mmcore.backends.protocol.Backend`, what the one
  training loop (:func:`mmcore.train.loop.run_training`) asks of a backend.
* :mod:`~mmcore.backends.fsdp2` — ``parallel.backend: fsdp2`` (torch ``fully_shard``), the default.
* :mod:`mmcore.backends.megatron` — ``parallel.backend: megatron`` (megatron-core: tensor and
  pipeline parallelism), its tensor-name table (:mod:`~mmcore.backends.megatron.tensor_map`) and
  MindSpeed-MM checkpoints (:mod:`~mmcore.backends.megatron.mindspeed_mm`).

Backends register through the ``mmcore_register_backends`` hook (``mmcore_plugins.fsdp2``,
``mmcore_plugins.megatron``), as a third party's would.
"""
