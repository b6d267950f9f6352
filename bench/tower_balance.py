"""Tower work across data-parallel ranks on a long-tailed VLM mix: how much of a step's vision
work the busiest rank does over the ranks' mean, with the samplers' tower balancing
(``training.balance_towers``, the default) and without (plain shuffling), at 2, 4 and 8 ranks.

The mix (:func:`mmcore.data.synthetic.vlm_mix_work`, 3000 samples): 45 % text-only turns, 35 %
one image, 15 % several images, 5 % a video; tower tokens are the media's vision patches. The
figure is, over an epoch's steps, the sum of the busiest rank's tower tokens over the sum of the
ranks' mean (1: even; the share of tower time ranks wait for the busiest one, plus one). A
second figure counts the fillers (:mod:`mmcore.data.fillers`) a step needs: micro-batch x media
kind pairs where some ranks hold the kind and others lack it, per step. Exact counts from the
samplers' plans (no model runs, no repetitions); the train stage logs the same two per step
(``tower_balance``, ``fillers``).

    python bench/tower_balance.py [--quick]

Goal (issue 40): balanced <= 1.1 for the epoch sampler (micro-batches of samples) and the
token-budget sampler (packed rows).
"""

from __future__ import annotations

from common import emit, figure, parser


def step_figures(samplers: list, towers: list[int], kinds: list[str]) -> tuple[float, float]:  # type: ignore[type-arg]
    """(sum of busiest / sum of mean tower tokens, fillers per step) over the first epoch."""
    busiest = mean = fillers = 0.0
    steps = len(samplers[0].steps(0))
    for _ in range(steps):
        batches = [s.next_batch()[0] for s in samplers]
        work = [sum(towers[i] for i in b) for b in batches]
        busiest, mean = busiest + max(work), mean + sum(work) / len(work)
        held = [{kinds[i] for i in b} - {"text"} for b in batches]
        for kind in {"image", "video"}:
            having = sum(kind in h for h in held)
            fillers += len(held) - having if having else 0
    return busiest / mean, fillers / steps


def main() -> None:
    p = parser(__doc__)
    args = p.parse_args()
    from mmcore.data.synthetic import vlm_mix_work
    from mmcore.train.sampler import EpochSampler, TokenBudgetSampler

    lengths, towers = vlm_mix_work(1000 if args.quick else 3000)
    kinds = ["text" if t == 0 else "video" if n > 2000 else "image" for n, t in zip(lengths, towers)]
    cases = [("epoch", world, 1) for world in (2, 4, 8)] + [("epoch", 4, 2), ("budget", 4, 8192)]
    for sampler, world, size in cases:

        def make(costs: list[int] | None) -> list:  # type: ignore[type-arg]
            if sampler == "epoch":
                return [EpochSampler(len(lengths), 0, r, world, size, costs=costs) for r in range(world)]
            return [TokenBudgetSampler(lengths, size, 0, r, world, costs=costs) for r in range(world)]

        (balanced, filled), (plain, plain_filled) = step_figures(make(towers), towers, kinds), step_figures(make(None), towers, kinds)
        what = f"micro-batches of {size}" if sampler == "epoch" else f"packed rows of {size} tokens"
        case = f"{sampler}-{world}x{size}"
        emit(
            figure(
                f"tower_balance/{case}",
                f"busiest rank's tower tokens / mean, {world} ranks, {what}",
                "ratio",
                [balanced],
                [plain],
                baseline_name="plain shuffling (training.balance_towers=false)",
                ratio_is="mmcore/baseline",
                goal=("<=", 1.1),
                goal_of="mmcore",
                how=f"{len(lengths)} samples of mmcore.data.synthetic.vlm_mix_work, one epoch of the sampler's plan, summed over steps (an exact count, no repetitions)",
            )
        )
        emit(
            figure(
                f"tower_balance/fillers-{case}",
                f"fillers per step, {world} ranks, {what}",
                "fillers",
                [filled],
                [plain_filled],
                baseline_name="plain shuffling",
                ratio_is="mmcore/baseline",
                how="micro-batch x media kind pairs some ranks hold and others lack, per step of the same epoch (an exact count)",
            )
        )


if __name__ == "__main__":
    main()
