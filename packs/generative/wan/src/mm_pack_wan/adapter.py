"""State-dict adapter: the diffusers Wan transformer is trained under its own parameter names."""

from mmcore.engines import RenameAdapter

ADAPTER = RenameAdapter(rules=[])
