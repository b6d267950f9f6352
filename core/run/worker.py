"""Entry point of each process of a distributed stage (started by torchrun, never by users).

``python -m mmcore.run.worker --run-dir R --pack P --stage S --plan H [--resume] [--debug] [--trust-remote-code]``
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

from mmcore.config import Layer, build_config
from mmcore.framework.context import WorldInfo
from mmcore.errors import MmcoreError
from mmcore.run.lifeline import die_with_launcher
from mmcore.framework.plugins import Plugins
from mmcore.run.rundir import RunDir
from mmcore.run.lock import hold_as_worker
from mmcore.run.runner import Runner
from mmcore.run.session import config_class, run_dir_layer
from mmcore.run.worker_errors import report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mmcore.run.worker")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--pack", required=True)
    parser.add_argument("--stage", required=True)
    parser.add_argument("--plan", required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--trust-remote-code", action="store_true")
    args = parser.parse_args(argv)
    die_with_launcher()  # never outlive the run: its next attempt may already be resuming
    world = WorldInfo.from_env()

    import torch.distributed as dist

    try:
        plugins = Plugins.load()
        entry = plugins.pack(args.pack)
        run_dir = RunDir(args.run_dir)
        held = hold_as_worker(run_dir.root)  # noqa: F841 (a rerun waits while any worker of this run lives)
        # the permission comes from the parent's command line, never from config.yaml
        granted = [Layer("the launching command", {"model": {"trust_remote_code": True}})] if args.trust_remote_code else []
        config = build_config(config_class(entry), [run_dir_layer(run_dir), *granted])
        runner = Runner(plugins, args.pack, config, run_dir, debug=args.debug, world=world)
        accelerator = plugins.registry.accelerator(config.run.device)
        accelerator.set_device(world.local_rank)
        dist.init_process_group(backend=accelerator.dist_backend, timeout=datetime.timedelta(seconds=config.parallel.collective_timeout_s))
        resume = args.resume
        if world.world_size > world.local_world_size:  # several nodes: one shared run directory, node 0's decision to resume
            from mmcore.run.nodes import check_shared

            check_shared(run_dir.root, world)
            box = [resume]
            dist.broadcast_object_list(box, src=0)
            resume = bool(box[0])
        upstream = runner.upstream(args.stage)
        plan = runner.plan(args.stage, upstream)
        if plan != args.plan:
            raise MmcoreError(f"rank {world.rank}: the run directory changed while stage {args.stage!r} was starting")
        runner.execute(args.stage, plan, upstream, resume=resume)
        code = 0
    except MmcoreError as exc:
        code = exc.exit_code
        report(world.rank, str(exc), exc.hint, code)
    except Exception as exc:
        if args.debug:
            raise
        code = 1
        report(world.rank, f"{type(exc).__name__}: {' '.join(str(exc).split())}", None, code)
    # Tear down in this order, then leave without interpreter shutdown: on gloo, DTensor/FSDP2
    # workers otherwise abort at exit now and then ("terminate called without an active exception").
    if dist.is_initialized():
        if code == 0:
            dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
