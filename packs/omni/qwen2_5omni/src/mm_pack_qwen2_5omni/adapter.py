"""State-dict adapter: Qwen2.5-Omni hub checkpoints <-> the transformers 5 thinker model.

The full Omni checkpoint prefixes the thinker with ``thinker.`` and also holds the talker and
the token2wav vocoder, which the thinker does not use (left out). A thinker saved alone has no
prefix. Both name the language model ``model.*``, the towers ``audio_tower.*`` and
``visual.*``; in memory they nest under ``model.language_model.*``, ``model.audio_tower.*``
and ``model.visual.*``. Exports are written thinker-only (what ``save_pretrained`` writes).
"""

from mmcore.engines import RenameAdapter

ADAPTER = RenameAdapter(
    rules=[
        # hub pattern, model replacement, model pattern, hub replacement
        (r"^(thinker\.)?audio_tower\.", "model.audio_tower.", r"^model\.audio_tower\.", "audio_tower."),
        (r"^(thinker\.)?visual\.", "model.visual.", r"^model\.visual\.", "visual."),
        (r"^(thinker\.)?model\.", "model.language_model.", r"^model\.language_model\.", "model."),
        (r"^(thinker\.)?lm_head\.", "lm_head.", r"^lm_head\.", "lm_head."),
    ],
    ignore=[r"^talker\.", r"^token2wav\."],
)
