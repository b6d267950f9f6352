"""mmcore pack for the Qwen2.5-Omni thinker (pack ``qwen2.5omni``).

Model-specific code only: tiny presets and the processor (``tiny``, ``processor``), the
state-dict adapter (``adapter``), the audio placeholder and the conversation encoding
(``data``), batch -> loss with packing across modalities (``model``), the frozen audio/vision
cache (``extract``), the export check (``export``) and the image-plus-tone demo (``demo``).
"""
