"""mmcore pack for Qwen3-VL (dense and MoE) on the transformers model classes."""
