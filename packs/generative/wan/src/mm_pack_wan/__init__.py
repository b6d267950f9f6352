"""mmcore pack for Wan2.1 / Wan2.2 text-to-video (pack ``wan``), on diffusers' Wan classes.

Model-specific code only: tiny presets (``tiny``), video + caption preprocessing into buckets
(``preprocess``), the VAE/UMT5 feature cache (``extract``), the flow-matching objective
(``model``), the diffusers export with sample videos (``export``) and the demo data (``demo``).
"""
