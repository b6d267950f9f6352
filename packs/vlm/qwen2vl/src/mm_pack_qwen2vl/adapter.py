"""State-dict adapter: Qwen2-VL / Qwen2.5-VL hub checkpoints <-> the transformers 5 model.

Hub checkpoints name the language model ``model.*`` and the vision tower ``visual.*``; the
in-memory model (what training shards and checkpoints) nests them as
``model.language_model.*`` and ``model.visual.*``. ``lm_head.*`` is the same in both.
"""

from mmcore.engines import RenameAdapter

ADAPTER = RenameAdapter(
    rules=[
        # hub pattern, model replacement, model pattern, hub replacement
        (r"^visual\.", "model.visual.", r"^model\.visual\.", "visual."),
        (r"^model\.(?!visual\.|language_model\.)", "model.language_model.", r"^model\.language_model\.", "model."),
    ]
)
