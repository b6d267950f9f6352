"""Stage functions for tests/test_stage_contract.py, declared by import path as a pack would."""

from __future__ import annotations

from mmcore import StageResult


def download(ctx, upstream):  # type: ignore[no-untyped-def]
    (ctx.stage_dir / "model").mkdir()
    return StageResult(outputs={"model": "model"})


def convert_misnamed(ctx, upstream):  # type: ignore[no-untyped-def]
    (ctx.stage_dir / "dcp").mkdir()
    return StageResult(outputs={"ckpt": "dcp"})  # the contract says "checkpoint"


def convert_dict(ctx, upstream):  # type: ignore[no-untyped-def]
    return {"outputs": {"checkpoint": "dcp"}}


def convert_missing_path(ctx, upstream):  # type: ignore[no-untyped-def]
    return StageResult(outputs={"checkpoint": "dcp"})  # never written


def convert_bound(ctx, upstream, *, source, suffix):  # type: ignore[no-untyped-def]
    (ctx.stage_dir / f"dcp{suffix}").mkdir()
    return StageResult(outputs={"checkpoint": f"dcp{suffix}"}, metrics={"source": source})


SOURCE = "bound part"
