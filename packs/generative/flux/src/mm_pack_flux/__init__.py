"""mmcore pack for FLUX text-to-image (pack ``flux``).

Model-specific code only: the family as the diffusion kit sees it (``family``: the frozen VAE,
CLIP and T5 used as ``FluxPipeline`` uses them, the 2 x 2 latent packing and the guidance
embedding in the denoiser's call), tiny presets (``tiny``) and the demo's images (``demo``).
"""
