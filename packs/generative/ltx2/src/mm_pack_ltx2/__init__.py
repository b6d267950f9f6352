"""mm-pack-ltx2: LTX-2 (Lightricks) joint video + audio generation on mmcore's diffusion kit.

Importing this package must stay light (no torch, no diffusers): ``mmcore list`` imports it.
"""

__version__ = "0.1.0"
