"""mmcore pack for DeepSeek-OCR-2 (SAM + causal-flow query encoder + DeepSeek-MoE decoder) on the transformers model class."""
