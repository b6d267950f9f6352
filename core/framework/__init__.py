"""The framework every layer stands on: the plugin contract and its machinery.

* :mod:`~mmcore.framework.pack` — what a pack declares (:class:`~mmcore.framework.pack.PackSpec`,
  :class:`~mmcore.framework.pack.Stage`) and a stage hands back.
* :mod:`~mmcore.framework.hookspecs` — the hooks a pack or plugin implements.
* :mod:`~mmcore.framework.plugins` — loading packs and plugins from entry points into pluggy.
* :mod:`~mmcore.framework.registry` — accelerators, kernels and backends registered by hooks.
* :mod:`~mmcore.framework.context` — what a stage receives; :mod:`~mmcore.framework.stages` —
  the declared stages and their outputs.
* :mod:`~mmcore.framework.accelerator` — the device abstraction accelerator plugins implement.
* Shared services: :mod:`~mmcore.framework.files` (crash-safe writes, hashing),
  :mod:`~mmcore.framework.console` (status lines, progress bars), :mod:`~mmcore.framework.versions`,
  :mod:`~mmcore.framework.tracking` (what tracker plugins share), :mod:`~mmcore.framework.faults`
  (named crash points), :mod:`~mmcore.framework.conformance_record`,
  :mod:`~mmcore.framework.moved` (SDK 1.x module paths).
"""
