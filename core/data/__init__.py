"""Data engines shared by packs: MLLM JSON reading, bad-sample policy, sharded sample storage."""
