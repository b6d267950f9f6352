"""mmcore pack for CogVideoX text-to-video (pack ``cogvideox``).

Model-specific code only: the family as the diffusion kit sees it (``family``: the frozen 3D
VAE and T5 used as ``CogVideoXPipeline`` uses them, the denoiser's call with its rotary
positions, v-prediction from the checkpoint's scheduler) and tiny presets (``tiny``: the demo's
VAE trained to reconstruct its clips); the demo's videos are the kit's moving shapes
(:func:`mmcore.data.write_moving_shapes`), its samples checked against their captions
(:func:`mmcore.data.caption_agreement`).
"""
