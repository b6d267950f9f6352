"""Checkpoint I/O: every file format weights are read from or written to.

* :mod:`~mmcore.checkpoint.training` — the converted start and resumable training checkpoints.
* :mod:`~mmcore.checkpoint.safe_dcp` — torch distributed checkpoints read without running code.
* :mod:`~mmcore.checkpoint.safetensors_files` — safetensors one tensor at a time, compared bit for bit.
* :mod:`~mmcore.checkpoint.sharded_load` — build without memory, shard, load each rank's part.

Megatron's own layouts (megatron-core's ``dist_checkpointing``, MindSpeed-MM's) are the megatron
backend's: :mod:`mmcore.backends.megatron`.
"""
