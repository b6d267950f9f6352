"""mmcore pack for Qwen3.5 (hybrid Gated DeltaNet + full attention) on the transformers model classes."""
