"""petra's ``papa`` replica rule beside the official PAPA code (``SamsungSAILMontreal/PAPA``), on one tiny problem.

PAPA as the paper's main method (``--ema_alpha < 1``): every ``--ema_every_k`` steps of each epoch
(step index i from 0 in each epoch, i % k == 0) every network moves towards the population's
average, θ_i ← α·θ_i + (1 − α)·mean(θ). The official ``main.main`` reads CIFAR/ImageNet from disk
and ends with soups and evaluations, so this script runs what its training loop runs, in its
order, in one process (the official default ``--world_size 1``: the whole population on one
device): the official ``models.combined.net_list`` (its per-network data iterators, forward,
``SoftTargetCrossEntropy`` loss through ``TransformTarget`` with mixup, cutmix and smoothing off, and
``get_optimizers_schedulers``: one SGD per network, ``--lr_scheduler none``), and per step every
optimizer's ``zero_grad``, the forward and loss, ``backward``, every ``step``, every scheduler's
``step``, then, where ``i % ema_every_k == 0``, the official EMA block: ``mix_weights_direct``
(``recombine.permutations``) to make the uniform average and again to move each network towards
it (``--lr_scaling linear``: the rate never changes here, so neither does α).

The networks are petra's tiny ResNet18 (width 4, 5 classes, 16 px images) in float64, two of them
from different initialisations (petra ``init: different``; the official networks are given the
same initial weights, state dict by state dict); network r's t-th minibatch is petra's minibatch
t·2 + r, both in channels-last memory as the official forward makes them. Recipe: SGD, momentum
0.9, no Nesterov (petra ``nesterov=false``), weight decay 5e-4 on every parameter (petra
``decay_1d=true``), constant rate; petra ``rule_options={rate: 1 − α, every: k, scale_with_lr:
true, phase: official}`` with ``batches_per_epoch`` the official loader's length.

Tolerance 1e-12 (float64) on the losses, not 0: the official loss is a different expression of
the same number (``SoftTargetCrossEntropy`` on one-hot targets, ``-Σ_c t_c·log_softmax``, then a
mean over the batch, summed over the population) from petra's ``F.cross_entropy`` mean, so a
loss may differ in its last bit (measured: 4.4e-16). The weights and batch-norm statistics are
compared with the same tolerance; they come out equal bit for bit (the gradients of the two
losses are the same numbers). ``--phase petra`` runs petra's own phase instead, to show where the
two part (the averaging steps are the difference).

Changes to the official code: none to what runs. Imports it never runs here are stubbed with empty
modules where not installed: ``timm`` (only ``--timm_models``) and ``scipy.optimize`` (only ``--permutation``). The
official ``net_list`` is given the networks (``my_net_list``) and each network's minibatches as a
list (``data_loaders``) instead of building them from a data set.

Nothing of the official code is copied here: it is imported from ``--official PATH``.

    python benchmarks/compare_official_papa.py --official ~/src/PAPA [--steps 20] [--out results/official]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from official_common import (  # noqa: E402
    check_official,
    diffs,
    official_commit,
    print_losses,
    stub_modules,
    tensor_diff,
)

from petra_core import Recipe, Simulator, build_model  # noqa: E402
from petra_core.replicas import get_rule  # noqa: E402
from petra_core.run.runio import write_text  # noqa: E402

REPO = "SamsungSAILMontreal/PAPA"
NEEDED = ("main.py", "models/combined.py", "recombine/permutations.py", "utils/loss_fn.py", "utils/schedule.py")
POPULATION = 2
TOLERANCE = 1e-12  # float64; the averaging's two forms may differ by an ulp (module docstring)


def import_official(path: Path):
    """The official ``net_list`` class and ``mix_weights_direct`` function, and the imports stubbed."""
    placeholder = type("NotRunHere", (), {})
    stubbed = stub_modules({"timm": {}, "scipy.optimize": {"linear_sum_assignment": placeholder}})
    sys.path.insert(0, str(path))
    from models.combined import net_list  # the repository's models/combined.py
    from recombine.permutations import mix_weights_direct  # the repository's recombine/permutations.py

    return net_list, mix_weights_direct, stubbed


def make_batches(args) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(args.seed)
    return [
        (
            torch.randn(args.batch, 3, 16, 16, generator=g, dtype=torch.float64).to(memory_format=torch.channels_last),
            torch.randint(0, 5, (args.batch,), generator=g),
        )
        for _ in range(args.steps * POPULATION)
    ]


def petra_run(args) -> Simulator:
    """petra's run, built (the replicas initialised) but not run."""
    data = make_batches(args)
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=5, width=4).to(torch.float64)
    recipe = Recipe(
        base_lr=args.lr, momentum=0.9, nesterov=False, weight_decay=args.weight_decay, decay_1d=True, scale_lr=False
    )
    options = {"rate": args.rate, "every": args.every, "phase": args.phase, "init": "different"}
    return Simulator(
        model,
        "backprop",
        num_batches=args.steps,
        get_batch=data.__getitem__,
        batch_size=args.batch,
        recipe=recipe,
        replicas=POPULATION,
        rule=get_rule("papa", options=options),
        batches_per_epoch=args.batches_per_epoch,
    )


def official_args(args) -> argparse.Namespace:
    """The official options this run uses (``main.load_config``'s names)."""
    return argparse.Namespace(
        device="cpu",
        batch_size=args.batch,
        EPOCHS=args.steps // args.batches_per_epoch,
        every_k_epochs=5,
        num_workers=0,
        pin_memory=False,
        n_pop=POPULATION,
        seperate_optim=True,
        optim="sgd",
        lr=args.lr,
        momentum=0.9,
        wd=args.weight_decay,
        lr_scheduler="none",
        multisteplr_mile=[0.5, 0.75],
        multisteplr_gamma=0.1,
        lr_min=1e-4,
        ema_alpha=1.0 - args.rate,
        ema_every_k=args.every,
        lr_scaling="linear",
        mixed_precision=False,
        grad_scaler=False,
        clip_grad=0,
        test=False,
    )


class EpochLoader:
    """One network's minibatches, a new epoch's ``per_epoch`` of them at each ``iter`` (as a
    shuffling DataLoader gives a new order each epoch): the official ``net_list.forward`` starts
    the next epoch itself when an iterator runs out."""

    def __init__(self, batches: list, per_epoch: int):
        self.batches, self.per_epoch, self.epoch = batches, per_epoch, -1

    def __len__(self) -> int:
        return self.per_epoch

    def __iter__(self):
        self.epoch += 1
        return iter(self.batches[self.epoch * self.per_epoch : (self.epoch + 1) * self.per_epoch])


def run_official(path: Path, nets: list, args) -> tuple[list[float], list, list[str]]:
    """The official training loop's steps (``main.main``, ``--ema_alpha < 1``): the per-step loss
    (the population's sum, as the official code computes it), the networks, the imports stubbed."""
    net_list, mix_weights_direct, stubbed = import_official(path)
    opt = official_args(args)
    data = make_batches(args)
    loaders = [EpochLoader(data[r::POPULATION], args.batches_per_epoch) for r in range(POPULATION)]
    hyper = [{"mixup": "0.0", "smooth": "0.0", "cutmix": "0.0", "re": "0.0"}] * POPULATION
    models = net_list(
        args=opt, hyperparams=hyper, n_pop=POPULATION, train_dset=[None], num_classes=5, my_net_list=nets,
        data_loaders=loaders,
    )  # fmt: skip
    optimizer, lr_scheduler = models.get_optimizers_schedulers()
    # from here, main.main's lines for --ema_alpha < 1, in its order
    ema_alpha = torch.tensor([opt.ema_alpha, 1 - opt.ema_alpha], device=opt.device)
    net_avg = copy.deepcopy(models.get_nets()[0])
    unif_weights = torch.ones(opt.n_pop, device=opt.device) / opt.n_pop
    len_data_loader = len(models.data_loaders[0])
    losses = []
    for _epoch in range(opt.EPOCHS):
        models.train()
        for i in range(len_data_loader):
            for o in optimizer:
                o.zero_grad()
            outputs, labels = models()
            loss = models.loss_fn(outputs, labels)
            loss.backward()
            for o in optimizer:
                o.step()
            for s in lr_scheduler:
                s.step()
            losses.append(float(loss.detach()))
            if opt.ema_alpha != 1.0 and (i % opt.ema_every_k == 0):
                if opt.lr_scaling == "linear":
                    lr_scale = lr_scheduler[0].get_last_lr()[0] / opt.lr
                    if lr_scale != 1:
                        new_ema = lr_scale * (1 - opt.ema_alpha)
                        ema_alpha = torch.tensor([1 - new_ema, new_ema], device=opt.device)
                nets_ = models.get_nets()
                mix_weights_direct(opt.device, unif_weights, net_avg, nets_)
                for k in range(opt.n_pop):
                    mix_weights_direct(opt.device, ema_alpha, nets_[k], [nets_[k], net_avg])
    return losses, models.get_nets(), stubbed


def float_state(model) -> torch.Tensor:
    """Every floating-point entry of the state dict (parameters, batch-norm statistics), flat."""
    return torch.cat([v.detach().reshape(-1).double() for v in model.state_dict().values() if v.is_floating_point()])


def compare(path: Path, args) -> dict:
    sim = petra_run(args)
    initial = [copy.deepcopy(rep.model) for rep in sim.replicas]  # petra's initialisations, given to both
    start = time.perf_counter()
    theirs, their_nets, stubbed = run_official(path, initial, args)
    official_s = time.perf_counter() - start
    start = time.perf_counter()
    sim.run()
    petra_s = time.perf_counter() - start
    per_mb = [float(r.loss) for r in sim.head_log]
    ours = [sum(per_mb[t * POPULATION : (t + 1) * POPULATION]) for t in range(len(per_mb) // POPULATION)]
    losses = diffs(ours, theirs, TOLERANCE)
    per_net = [
        tensor_diff(float_state(rep.model), float_state(net)) for rep, net in zip(sim.replicas, their_nets, strict=True)
    ]
    # the official rule, 0-based steps: i, from 0 in each epoch, has i % every == 0
    averaged_after = [s for s in range(args.steps) if (s % args.batches_per_epoch) % args.every == 0]
    n = losses["losses_compared"]
    return {
        **losses,
        "loss": "per step, the population's sum of each network's mean cross-entropy (the official loss_fn)",
        "max_abs_state_diff_per_network": per_net,
        "official_averages_after_steps": averaged_after,
        "networks_differ": tensor_diff(float_state(their_nets[0]), float_state(their_nets[1])) > 0,
        "first_losses": {"petra": ours[:3], "official": theirs[:3]},
        "last_loss": {"petra": ours[n - 1], "official": theirs[n - 1]},
        "match": losses["losses_official"] == losses["losses_petra"]
        and losses["max_abs_loss_diff"] <= TOLERANCE
        and max(per_net) <= TOLERANCE,
        "seconds": {"official": round(official_s, 1), "petra": round(petra_s, 1)},
        "stubbed": stubbed,
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--official", required=True, type=Path, help=f"a copy of github.com/{REPO}")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps of each network (default 20)")
    p.add_argument("--batches-per-epoch", type=int, default=10, help="each network's epoch, in steps (default 10)")
    p.add_argument("--every", type=int, default=4, help="official --ema_every_k, petra every (default 4)")
    p.add_argument(
        "--rate",
        type=float,
        default=2**-4,
        help="petra's rate, the official 1 - ema_alpha (default 2^-4: the official code holds it in float32)",
    )
    p.add_argument(
        "--phase",
        choices=("official", "petra"),
        default="official",
        help="petra's averaging phase: official (default) or petra's own (shows where the two part)",
    )
    p.add_argument("--batch", type=int, default=4, help="minibatch size (default 4)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write OUT/papa.json, atomically")
    args = p.parse_args(argv)
    if args.steps < 1 or args.steps % args.batches_per_epoch:
        p.error(
            f"--steps {args.steps} is not allowed; allowed: a positive multiple of --batches-per-epoch "
            f"{args.batches_per_epoch} (the official loop runs whole epochs)"
        )
    if not 0.0 < args.rate < 1.0:
        p.error(f"--rate {args.rate} is not allowed; allowed: 0 < rate < 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    path = check_official(args.official, REPO, NEEDED)
    torch.set_num_threads(1)
    r = compare(path, args)
    print_losses(r["losses"]["petra"], r["losses"]["official"], lambda t: f"step {t} (both networks)")
    print(
        f"papa {r['losses_compared']} losses: max |diff| {r['max_abs_loss_diff']:.2e}, state after {args.steps} "
        f"steps: max |diff| {max(r['max_abs_state_diff_per_network']):.2e} (the official code averages after steps "
        f"{r['official_averages_after_steps']}) -> {'match' if r['match'] else 'DIFFER'} "
        f"(official {r['seconds']['official']} s, petra {r['seconds']['petra']} s)"
    )
    record = {
        "official": REPO,
        "official_commit": official_commit(path),
        "setup": {
            **{k: v for k, v in vars(args).items() if k not in ("official", "out")},
            "population": POPULATION,
            "model": "petra resnet18, width 4, 5 classes, 16 px, channels-last inputs, different initialisations",
            "official_flags": "--ema_alpha 1-RATE --ema_every_k EVERY --lr_scaling linear --optim sgd "
            "--momentum 0.9 --lr_scheduler none --mixed_precision false --grad_scaler false --world_size 1",
            "petra": "method backprop, rule papa {rate: RATE, every: EVERY, phase: PHASE, init: different}, "
            "sgd momentum 0.9 without nesterov, decay_1d true",
        },
        "dtype": "float64",
        "tolerance": TOLERANCE,
        "ran_official": "models.combined.net_list (forward, loss_fn, get_optimizers_schedulers, train, get_nets) "
        "and recombine.permutations.mix_weights_direct, in main.main's training-loop order, in one process",
        "change_to_official": [
            f"stubbed imports (not installed here): {', '.join(r['stubbed']) or 'none'} (timm: only "
            "--timm_models; scipy.optimize: only --permutation)",
            "net_list given the networks (my_net_list) and each network's minibatches, epoch by epoch "
            "(data_loaders), instead of data sets read from disk",
        ],
        "match": r["match"],
        "result": r,
        "torch": torch.__version__,
    }
    if args.out is not None:
        name = "papa.json" if args.phase == "official" else f"papa_{args.phase}_phase.json"
        write_text(args.out / name, json.dumps(record, indent=2) + "\n")
    return 0 if record["match"] else 1


if __name__ == "__main__":
    sys.exit(main())
