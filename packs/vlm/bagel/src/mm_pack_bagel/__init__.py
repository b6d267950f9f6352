"""BAGEL (ByteDance-Seed/BAGEL-7B-MoT) for mmcore."""
