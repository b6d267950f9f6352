"""mmcore pack for Qwen2-VL and Qwen2.5-VL (packs ``qwen2vl`` and ``qwen2.5vl``), on the VLM kit
(:mod:`mmcore.kits.vlm`).

Model-specific code only: the declaration (``pack``), config (``config``), the family as the kit
sees it (``family``), the chat template and media processing (``data``), the state-dict adapter
(``adapter``), the frozen-vision cache (``extract``), kernels (``kernels``), Megatron's layout
(``megatron``) and tiny random checkpoints (``tiny``). Everything else is mmcore's.
"""
