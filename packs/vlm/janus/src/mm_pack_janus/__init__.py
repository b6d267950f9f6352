"""mmcore pack for Janus-Pro (SigLIP understanding tower + Llama decoder + VQ image tokens for generation) on the transformers model class."""
