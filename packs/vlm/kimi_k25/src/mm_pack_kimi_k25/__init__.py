"""mmcore pack for Kimi-K2.5 (MoonViT + patch-merger projector + DeepSeek-V3-style MoE decoder) on the transformers model class."""
