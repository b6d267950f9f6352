"""The train/eval split of ``data.eval_fraction``: stable across runs, machines and folders."""

from __future__ import annotations

from mmcore.data.shards import held_out, split_key


def test_the_held_out_split_is_the_same_wherever_the_data_lies() -> None:
    """A dataset copied to another machine or folder keeps its split, so a model is never
    evaluated there on samples it trained on here (the key is the file's name and the index)."""
    here = [held_out(split_key("/home/me/data/train.json", i), 0.3) for i in range(400)]
    there = [held_out(split_key("/mnt/shared/copy/train.json", i), 0.3) for i in range(400)]
    assert here == there
    assert 0.2 < sum(here) / len(here) < 0.4
    assert here != [held_out(split_key("/home/me/data/other.json", i), 0.3) for i in range(400)]  # another file, another draw
