"""State-dict adapter: the pack's denoiser is trained under the public checkpoint's own names."""

from mmcore.engines import RenameAdapter

ADAPTER = RenameAdapter(rules=[])
