"""mmcore pack for HunyuanVideo text-to-video (pack ``hunyuanvideo``).

Model-specific code only: the family as the diffusion kit sees it (``family``: the frozen 3D
VAE, Llama and CLIP used as ``HunyuanVideoPipeline`` uses them, the denoiser's call with the
caption's mask, pooled vector and guidance value) and tiny presets (``tiny``); the demo's videos
are the kit's moving squares (:func:`mmcore.data.synthetic.write_moving_squares`).
"""
