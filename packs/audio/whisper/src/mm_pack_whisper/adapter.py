"""State-dict adapter: hub Whisper checkpoints already use the transformers model's names.

``proj_out.weight`` is tied to the decoder's token embedding: hub checkpoints store only the
embedding, and so do exports.
"""

from mmcore.engines import RenameAdapter

ADAPTER = RenameAdapter(rules=[], tied=["proj_out.weight"])
