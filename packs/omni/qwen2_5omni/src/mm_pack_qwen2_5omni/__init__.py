"""mmcore pack for the Qwen2.5-Omni thinker (pack ``qwen2.5omni``).

Model-specific code only: tiny presets and the processor (``tiny``, ``processor``), the
state-dict adapter (``adapter``), the audio placeholder and the conversation encoding
(``data``), the family as the VLM kit sees it (``family``: media fields, packed M-RoPE
positions, the thinker's export config) and the frozen audio/vision cache (``extract``); the
image-plus-tone demo is :func:`mmcore.data.synthetic.write_shape_tone_questions`.
"""
