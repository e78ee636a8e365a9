"""petra beside the authors' PETRA simulator (``stephane-rivaud/PETRA``), on one tiny problem.

Both train the same RevNet18 (the official code's widths: streams of 64 to 512 channels, CIFAR
stem) in float64 on the same random minibatches, from the same weights (the official model's,
copied into petra's), with the same recipe: SGD with Nesterov momentum 0.9, weight decay 5e-4 on
convolution and linear weights only (the official ``--no-bn-weight-decay``), a linear warm-up over
the first epoch counted per call (petra's ``warmup_clock=call``, docs/conventions.md), k = 1. Per
method the official flags are those the paper's runs used:

    backprop  --synchronous                            petra method backprop
    delayed   (stores input and weights)               petra method delayed
    dsp       --remove-ctx-param                       petra method dsp
    petra     --remove-ctx-input --remove-ctx-param    petra method petra

The official side is driven by its own ``main.train`` (one call per minibatch, then
``synchronize_layers``), epoch by epoch, with its learning-rate rule between epochs as its
``main`` applies it; its asynchronous pipeline never drains, so both sides are compared over the
same number of calls (petra's ticks): every loss the head computed, minibatch by minibatch, and
every parameter at the end. One change is made to the official model and said in the record: its
convolution biases are set to zero and left out of its optimizers, since petra's convolutions have
none (batch norm follows each one: a bias changes nothing but rounding, yet its gradient, zero
up to rounding, would move it by ~1e-17 and the two runs would part by an ulp from the first step).

Nothing of the official code is copied here: it is imported from ``--official PATH`` (a checkout
or archive of the repository). Its ``main.py`` imports ``wandb`` at the top, which this script
replaces by an empty module before the import (no run logs anything).

    python benchmarks/compare_official_petra.py --official ~/src/PETRA [--calls 40] [--out results/official]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from official_common import check_official, official_commit  # noqa: E402

from petra_core import build_model  # noqa: E402
from petra_core.engine import Simulator  # noqa: E402
from petra_core.optim import Recipe  # noqa: E402
from petra_core.run.runio import write_text  # noqa: E402

METHODS = ("backprop", "delayed", "dsp", "petra")
# the official get_model's storage flags per method (main.py: store_input = not --remove-ctx-input, ...)
OFFICIAL_FLAGS = {
    "backprop": {"synchronous": True, "store_input": True, "store_param": True},
    "delayed": {"synchronous": False, "store_input": True, "store_param": True},
    "dsp": {"synchronous": False, "store_input": True, "store_param": False},
    "petra": {"synchronous": False, "store_input": False, "store_param": False},
}
TOLERANCE = 1e-12  # float64, the same operations in the same order: losses agree to rounding
NEEDED = ("main.py", "async_torch/models/models_RevNet.py", "async_torch/sequential_layers/sequential.py")


def import_official(path: Path) -> types.ModuleType:
    """The official ``main`` module (its training loop and the names it imports)."""
    sys.modules.setdefault("wandb", types.ModuleType("wandb"))  # imported by main.py, used only with --use-wandb
    sys.path.insert(0, str(path))
    import main as official  # the repository's main.py

    return official


# ---- the problem ---------------------------------------------------------------------------------
def make_batches(calls: int, batch: int, size: int, classes: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(batch, 3, size, size, generator=g, dtype=torch.float64),
            torch.randint(0, classes, (batch,), generator=g),
        )
        for _ in range(calls)
    ]


def official_net(official, method: str, args):
    """The official RevNet18 with main.py's optimizers (``--no-bn-weight-decay``), in float64."""
    flags = OFFICIAL_FLAGS[method]
    torch.manual_seed(args.seed)
    layers = official.get_model(
        "cifar10",
        "revnet18",
        False,
        store_input=flags["store_input"],
        store_param=flags["store_param"],
        accumulation_steps=1,
        accumulation_averaging=True,
    )
    for layer in layers:  # main.py's zeroed convolution biases: see the module docstring
        for name in layer.list_parameters:
            if frozen(name):
                for mode in ("forward", "backward"):
                    layer.get_parameter(name, mode).zero_()
    kwargs = {"lr": args.lr, "momentum": 0.9, "dampening": 0.0, "nesterov": True, "maximize": False}
    for layer in layers:  # as main.py with --no-bn-weight-decay
        official.add_optimizer(
            layer, "sgd", {**kwargs, "weight_decay": args.weight_decay}, lambda n: "_bn" not in n and "bias" not in n
        )  # (a name with "bias" is never decayed, so the frozen biases are in neither group)
        official.add_optimizer(
            layer, "sgd", {**kwargs, "weight_decay": 0.0}, lambda n: ("_bn" in n or "bias" in n) and not frozen(n)
        )
    container = official.SynchronousSequential if flags["synchronous"] else official.AsynchronousSequential
    return container(layers).to("cpu", torch.float64)


def frozen(name: str) -> bool:
    """The official convolution biases, held at zero (module docstring)."""
    return name.startswith("bias_conv")


# official parameter name -> petra parameter name, per kind of stage
STEM = {"weight_conv": "body.0.weight", "weight_bn": "body.1.weight", "bias_bn": "body.1.bias"}
BLOCK = {
    "weight_conv_1": "F.0.0.weight",
    "weight_bn_1": "F.0.1.weight",
    "bias_bn_1": "F.0.1.bias",
    "weight_conv_2": "F.1.0.weight",
    "weight_bn_2": "F.1.1.weight",
    "bias_bn_2": "F.1.1.bias",
}
DOWNSAMPLING = {
    **BLOCK,
    "weight_conv_ds": "proj.0.weight",
    "weight_bn_ds": "proj.1.weight",
    "bias_bn_ds": "proj.1.bias",
}
HEAD = {"weight": "fc.weight", "bias": "fc.bias"}


def name_map(stage) -> dict[str, str]:
    return {"Stem": STEM, "ReversibleBlock": BLOCK, "DownsamplingBlock": DOWNSAMPLING, "Head": HEAD}[
        type(stage).__name__
    ]


def petra_model_from(net):
    """petra's RevNet18 holding the official model's weights (every petra parameter is set)."""
    model = build_model("revnet18", num_classes=10, width=64).to(torch.float64)
    assert len(model) == len(net.modules), (len(model), len(net.modules))
    with torch.no_grad():
        for stage, layer in zip(model, net.modules, strict=True):
            params = dict(stage.named_parameters())
            mapping = name_map(stage)
            assert set(mapping.values()) == set(params), (type(stage).__name__, sorted(params))
            for official_name, petra_name in mapping.items():
                params[petra_name].copy_(layer.get_parameter(official_name, "backward"))
    return model


def official_params(net, model) -> list[dict[str, torch.Tensor]]:
    return [
        {petra: layer.get_parameter(name, "backward") for name, petra in name_map(stage).items()}
        for stage, layer in zip(model, net.modules, strict=True)
    ]


# ---- the two runs ------------------------------------------------------------------------------------
def run_official(official, net, batches, args) -> list[float]:
    """``args.calls`` calls of the official training loop; the head's losses in minibatch order."""
    losses: list[float] = []
    forward_and_update = net.forward_and_update

    def recorded(*a, **kw):
        L, output, labels = forward_and_update(*a, **kw)
        if output is not None:  # the head computed a loss in this call
            losses.append(float(L))
        return L, output, labels

    net.forward_and_update = recorded
    opt = argparse.Namespace(warm_up=args.warmup_epochs, scheduler="steplr", print_freq=10**9, lr=args.lr)
    per_epoch = args.batches_per_epoch
    with contextlib.redirect_stdout(io.StringIO()):
        for epoch in range(args.calls // per_epoch):
            if not epoch < args.warmup_epochs:  # main.py's rule between epochs
                milestones = [m - args.warmup_epochs for m in args.milestones]
                net.set_lr(official.adjust_learning_rate_step_lr(epoch - args.warmup_epochs, milestones, 0.1, args.lr))
            loader = batches[epoch * per_epoch : (epoch + 1) * per_epoch]
            official.train(epoch, loader, net, 1, "cpu", torch.float64, opt)
    return losses


def run_petra(model, method: str, batches, args) -> list[float]:
    recipe = Recipe(
        base_lr=args.lr,
        momentum=0.9,
        nesterov=True,
        weight_decay=args.weight_decay,
        warmup_epochs=float(args.warmup_epochs),
        milestones=tuple(float(m) for m in args.milestones),
        scale_lr=False,
        warmup_clock=args.warmup_clock,
    )
    pipe = Simulator(
        model,
        method,
        num_batches=len(batches),
        get_batch=batches.__getitem__,
        batch_size=len(batches[0][1]),
        recipe=recipe,
        batches_per_epoch=args.batches_per_epoch,
    )
    if OFFICIAL_FLAGS[method]["synchronous"]:  # a call is a whole minibatch, forward and backward
        pipe.run()
    else:  # a call is a tick; the official pipeline never drains: stop where it stops
        pipe.run(ticks=args.calls)
    return [r.loss for r in sorted(pipe.head_log, key=lambda r: r.mb)]


def compare(official, method: str, args) -> dict:
    batches = make_batches(args.calls, args.batch, args.size, 10, args.seed)
    net = official_net(official, method, args)
    model = petra_model_from(net)
    start = time.perf_counter()
    theirs = run_official(official, net, batches, args)
    official_s = time.perf_counter() - start
    start = time.perf_counter()
    ours = run_petra(model, method, batches, args)
    petra_s = time.perf_counter() - start
    n = min(len(ours), len(theirs))
    diffs = [abs(a - b) for a, b in zip(ours[:n], theirs[:n])]
    loss_diff = max(diffs)
    parted = next((i for i, d in enumerate(diffs) if d > TOLERANCE), None)
    param_diff = max(
        (p - official_p).abs().max().item()
        for stage, ref in zip(model, official_params(net, model), strict=True)
        for name, p in stage.named_parameters()
        for official_p in [ref[name]]
    )
    return {
        "method": method,
        "official_flags": OFFICIAL_FLAGS[method],
        "calls": args.calls,
        "losses_compared": n,
        "losses_official": len(theirs),
        "losses_petra": len(ours),
        "max_abs_loss_diff": loss_diff,
        "first_minibatch_beyond_tolerance": parted,
        "max_abs_param_diff": param_diff,
        "first_losses": {"petra": ours[:3], "official": theirs[:3]},
        "last_loss": {"petra": ours[n - 1], "official": theirs[n - 1]},
        "match": n == len(theirs) == len(ours) and loss_diff <= TOLERANCE and param_diff <= TOLERANCE,
        "seconds": {"official": round(official_s, 1), "petra": round(petra_s, 1)},
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--official", required=True, type=Path, help="a copy of github.com/stephane-rivaud/PETRA")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--calls", type=int, default=40, help="training calls (minibatches fed; default 40)")
    p.add_argument("--batches-per-epoch", type=int, default=20, help="the epoch the warm-up counts in (default 20)")
    p.add_argument("--warmup-epochs", type=int, default=1, help="linear warm-up, epochs (default 1)")
    p.add_argument("--milestones", type=int, nargs="*", default=[100], help="lr x 0.1 at these epochs")
    p.add_argument("--lr", type=float, default=0.01, help="peak learning rate (default 0.01)")
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=16, help="image side (default 16: RevNet18's full widths stay cheap)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--warmup-clock",
        choices=("call", "step"),
        default="call",
        help="petra's warm-up clock: call (the official convention, default) or step (petra's default: shows "
        "where the two part)",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="write OUT/petra_simulator.json (_step_clock.json with step), atomically"
    )
    args = p.parse_args(argv)
    if args.calls % args.batches_per_epoch:
        p.error(f"--calls {args.calls} must be a multiple of --batches-per-epoch {args.batches_per_epoch}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    path = check_official(args.official, "stephane-rivaud/PETRA", NEEDED)
    official = import_official(path)
    results = []
    for method in args.methods:
        r = compare(official, method, args)
        results.append(r)
        print(
            f"{method:9s} {r['losses_compared']} losses: max |diff| {r['max_abs_loss_diff']:.2e}, parameters after "
            f"{args.calls} calls: max |diff| {r['max_abs_param_diff']:.2e} -> {'match' if r['match'] else 'DIFFER'} "
            f"(official {r['seconds']['official']} s, petra {r['seconds']['petra']} s)"
        )
    record = {
        "official": "stephane-rivaud/PETRA",
        "official_commit": official_commit(path),
        "setup": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("official", "out")
        },
        "dtype": "float64",
        "tolerance": TOLERANCE,
        "change_to_official": "convolution biases set to zero and left out of the optimizers (petra's convolutions "
        "have none; batch norm follows each)",
        "match": all(r["match"] for r in results),
        "methods": results,
        "torch": torch.__version__,
    }
    if args.out is not None:
        name = (
            "petra_simulator.json" if args.warmup_clock == "call" else f"petra_simulator_{args.warmup_clock}_clock.json"
        )
        write_text(args.out / name, json.dumps(record, indent=2) + "\n")
    return 0 if record["match"] else 1


if __name__ == "__main__":
    sys.exit(main())
