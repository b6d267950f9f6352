"""The state-dict adapter: the training model's names are the public keys (``talker.*``), so
nothing is renamed and nothing is tied (the public talker stores ``codec_head`` and every
embedding on its own)."""

from __future__ import annotations

from mmcore.engines import RenameAdapter

ADAPTER = RenameAdapter(rules=[], tied=[])
