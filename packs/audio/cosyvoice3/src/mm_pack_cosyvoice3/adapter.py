"""The state-dict adapter: the converted safetensors already use the training model's names
(``<part>.<public key>``), so nothing is renamed. The LM's ``lm_head`` (tied to the Qwen2
embedding in Qwen2-0.5B) is left out of the safetensors by :func:`~mm_pack_cosyvoice3.model.
pt_to_safetensors` only where it shares the embedding's storage, and restored by
:func:`~mm_pack_cosyvoice3.model.safetensors_to_pt`; an untied one goes through like any tensor.
So ``tied`` stays empty (it would drop an untied ``lm_head`` on the way back)."""

from __future__ import annotations

from mmcore.engines import RenameAdapter

ADAPTER = RenameAdapter(rules=[], tied=[])
