"""mmcore pack for Qwen2-VL and Qwen2.5-VL (packs ``qwen2vl`` and ``qwen2.5vl``).

Model-specific code only: tiny presets (``tiny``), the state-dict adapter (``adapter``), the
chat template and media processing (``data``), batch -> loss and the sharding plan
(``model``), and the synthetic demo (``demo``). Everything else is mmcore's.
"""
