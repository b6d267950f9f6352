"""mmcore pack for Wan2.1 / Wan2.2 text-to-video (pack ``wan``) and image-to-video (``wan-i2v``),
on diffusers' Wan classes and the diffusion kit (:mod:`mmcore.kits.diffusion`).

Model-specific code only: the declaration (``pack``), the config with Wan's bucket rules
(``config``), the family as the kit sees it (``family``; image-to-video in ``i2v``), the
state-dict adapter (``adapter``) and tiny random pipelines built from config (``tiny``).
"""
