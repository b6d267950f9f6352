"""mmcore pack for DeepSeek-OCR (v1): SAM ViT-B + CLIP-L DeepEncoder, linear projector, DeepSeek-MoE decoder; composed of transformers modules."""
