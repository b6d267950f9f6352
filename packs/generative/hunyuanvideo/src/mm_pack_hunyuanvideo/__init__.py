"""mmcore pack for HunyuanVideo text-to-video (pack ``hunyuanvideo``).

Model-specific code only: the family as the diffusion kit sees it (``family``: the frozen 3D
VAE, Llama and CLIP used as ``HunyuanVideoPipeline`` uses them, the denoiser's call with the
caption's mask, pooled vector and guidance value) and tiny presets (``tiny``); the 1.0 demo's
videos are the kit's moving shapes (:func:`mmcore.data.synthetic.write_moving_shapes`, checked by
:func:`mmcore.data.caption_agreement`), the 1.5 demo's its moving squares.
"""
