"""Kits: what a family of packs shares, so that a pack holds only what is its own.

* :mod:`mmcore.kits.vlm` — transformers conversational models (VLMs, omni thinkers): chat-template
  preprocessing, padded or packed collation, loss, shard and freeze groups, held-out accuracy,
  export with reload and a ``generate()`` check. A pack declares a :class:`~mmcore.kits.vlm.VLMFamily`.
"""
