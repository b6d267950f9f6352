"""The state-dict adapter: the converted safetensors already use the training model's names
(``<part>.<public key>``), so it only declares the LM's ``lm_head`` tied to the Qwen2 embedding."""

from __future__ import annotations

from mmcore.engines import RenameAdapter

ADAPTER = RenameAdapter(rules=[], tied=["llm.llm.model.lm_head.weight"])
