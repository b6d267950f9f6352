"""mmcore pack for the Qwen3-Omni thinker (pack ``qwen3omni``).

Model-specific code only: the family as the VLM kit sees it (``family``: model classes, the
state-dict adapter, media fields, packed M-RoPE positions across modalities, the thinker's
export config), the conversation encoding (``data``), tiny presets (``tiny``), the processor
without torchvision (``processor``) and the frozen audio/vision cache (``extract``). The shared
pieces live in mmcore (audio clips: :mod:`mmcore.kits.mel_audio`; the image-plus-tone demo)
and mm-qwen-vision (vision patches, DeepStack cache, the extract stage).
"""
