"""mmcore pack for DeepSeek-VL2 (SigLIP-SO400M + 2x2 downsample MLP + DeepSeek-MoE decoder), composed of transformers modules."""
