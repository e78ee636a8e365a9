"""petra's ``dp``, ``cdp1`` and ``cdp2`` replica rules beside the official Cyclic Data Parallelism code
(``fournierlouis/Cyclic_Data_Parallelism``), on one tiny problem.

The official rules are the methods of its ``cdp_utils.CDP`` wrapper (``weights_to_vec``,
``all_reduce``, ``all_reduce_grad``, ``update``) with the optimizers of ``net_utils.load_optimizer``;
its ``main.run`` reads ImageNet/CIFAR from disk, builds torchvision models and opens NCCL, so this
script runs what ``main.run`` runs around them, in its order, on 2 ranks of a real
``torch.distributed`` gloo process group (two local processes: the official all-reduces run as
written): ``CDP(model, ...)``, one ``load_optimizer`` per official stage (``--filter_bias_and_bn``
off, its default: every parameter decayed, petra ``decay_1d=true``), ``weights_to_vec`` and the
first ``all_reduce``, then per step the forward, ``nn.CrossEntropyLoss()``, every optimizer's
``zero_grad``, ``backward``, ``all_reduce_grad`` and ``update(..., update_rule)``, and after training
the final ``all_reduce`` (the replicas' average the official code evaluates: petra
``evaluated_model=average``). Rank r's t-th minibatch is petra's minibatch t·2 + r.

The model is petra's tiny ResNet18 (width 4, 5 classes, 16 px images) in float64. The official
code cuts the model into stages by counting *parameter tensors* (``--partition_strategy
nb_stages``), petra into groups of its *stages* (``rule_stages``); to make the two cuts the same the
official side is given petra's stages with each stage's parameters held as one flat parameter
(the stage computes with views of it: the same numbers, and SGD is element-wise), so the official
split of J flat parameters into L groups is petra's split of J stages into L groups. SGD with
momentum 0.9 (no Nesterov, petra ``nesterov=false``), weight decay 5e-4, a constant rate over the
steps compared (the official StepLR steps once per epoch, every 30; no epoch ends here).

Changes to the official code: none to what runs. Imports it never runs here are stubbed with empty
modules where not installed: ``fvcore.nn`` (``FlopCountAnalysis``, used only by ``--partition_strategy flops``).

Nothing of the official code is copied here: it is imported from ``--official PATH``.

    python benchmarks/compare_official_cdp.py --official ~/src/Cyclic_Data_Parallelism [--steps 20] \\
        [--out results/official]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

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
from petra_core.run.population import average_model  # noqa: E402
from petra_core.run.runio import write_text  # noqa: E402

REPO = "fournierlouis/Cyclic_Data_Parallelism"
NEEDED = ("cdp_utils.py", "net_utils.py", "slice_model.py", "main.py")
REPLICAS = 2
RULES = {"dp": "DP", "cdp1": "CDP1", "cdp2": "CDP2"}  # petra rule -> official --update_rule
TOLERANCE = 0.0  # float64, the same operations in the same order: bit for bit


def import_official(path: Path):
    """The official ``cdp_utils`` and ``net_utils`` modules, and the imports stubbed (not installed)."""
    stubbed = stub_modules({"fvcore.nn": {"FlopCountAnalysis": type("NotRunHere", (), {})}})
    sys.path.insert(0, str(path))
    import cdp_utils  # the repository's cdp_utils.py
    import net_utils  # the repository's net_utils.py

    return cdp_utils, net_utils, stubbed


class FlatStages(nn.Module):
    """petra's stages, each stage's parameters one flat parameter of this module (the stage
    computes with views of it); the stages stay submodules, so their batch-norm statistics are
    what the official ``all_reduce`` averages."""

    def __init__(self, model):
        super().__init__()
        self.stages = nn.ModuleList(list(model))
        self.flat = nn.ParameterList()
        self.layout: list[list[tuple[nn.Module, str, torch.Size]]] = []
        for stage in self.stages:
            named = list(stage.named_parameters())
            self.flat.append(nn.Parameter(nn.utils.parameters_to_vector([p for _, p in named]).detach().clone()))
            places = []
            for name, p in named:
                owner, _, attr = name.rpartition(".")
                module = stage.get_submodule(owner)
                del module._parameters[attr]  # now a plain attribute, set before each forward
                places.append((module, attr, p.shape))
            self.layout.append(places)

    def forward(self, x):
        for stage, flat, places in zip(self.stages, self.flat, self.layout, strict=True):
            at = 0
            for module, attr, shape in places:
                n = shape.numel()
                setattr(module, attr, flat[at : at + n].view(shape))
                at += n
            x = stage(x)
        return x


def make_model():
    torch.manual_seed(0)
    return build_model("resnet18", num_classes=5, width=4).to(torch.float64)


def make_batches(args) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(args.seed)
    return [
        (
            torch.randn(args.batch, 3, 16, 16, generator=g, dtype=torch.float64),
            torch.randint(0, 5, (args.batch,), generator=g),
        )
        for _ in range(args.steps * REPLICAS)
    ]


def official_rank(rank: int, port: int, path: str, rule: str, args: argparse.Namespace, out: str) -> None:
    """One official worker: ``main.run``'s calls around ``CDP`` (module docstring)."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=REPLICAS)
    cdp_utils, net_utils, stubbed = import_official(Path(path))
    data = make_batches(args)
    model, criterion = FlatStages(make_model()), nn.CrossEntropyLoss(reduction="mean")  # create_model's criterion
    cdp = cdp_utils.CDP(model, rank, "cpu", REPLICAS, args.stages, "nb_stages", 16)
    optimizer, scheduler = [], []
    for params in cdp.stages_params:  # --filter_bias_and_bn off: every parameter in one group
        o, s = net_utils.load_optimizer(params, args.lr, 0.9, args.weight_decay, filter_bias_and_bn=False)
        optimizer.append(o)
        scheduler.append(s)
    cdp.weights_to_vec()
    cdp.all_reduce(None, first_reduce=True)  # main.run's group is init_process_group's None
    cdp.train()
    losses = []
    for t in range(args.steps):
        images, labels = data[t * REPLICAS + rank]
        loss = criterion(cdp(images), labels)
        for o in optimizer:
            o.zero_grad()
        loss.backward()
        cdp.all_reduce_grad(None)
        cdp.update(None, optimizer, scheduler, RULES[rule])
        losses.append(float(loss.detach()))
    weights = cdp.params.detach().clone()
    cdp.all_reduce(None)  # after training: the average the official code evaluates
    torch.save(
        {
            "losses": losses,
            "weights": weights,
            "average": cdp.params.detach().clone(),
            "stages": cdp.nb_sub_stages,
            "stubbed": stubbed,
        },
        f"{out}/rank{rank}.pt",
    )
    dist.destroy_process_group()


def run_official(path: Path, rule: str, args) -> dict:
    with tempfile.TemporaryDirectory() as out, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        mp.spawn(official_rank, args=(port, str(path), rule, args, out), nprocs=REPLICAS, join=True)
        ranks = [torch.load(f"{out}/rank{r}.pt") for r in range(REPLICAS)]
    return {
        "losses": [ranks[i % REPLICAS]["losses"][i // REPLICAS] for i in range(args.steps * REPLICAS)],
        "weights": [r["weights"] for r in ranks],
        "average": ranks[0]["average"],
        "stages": ranks[0]["stages"],
        "stubbed": ranks[0]["stubbed"],
    }


def run_petra(rule: str, args) -> dict:
    torch.set_num_threads(1)
    data = make_batches(args)
    recipe = Recipe(
        base_lr=args.lr, momentum=0.9, nesterov=False, weight_decay=args.weight_decay, decay_1d=True, scale_lr=False
    )
    sim = Simulator(
        make_model(),
        "backprop",
        num_batches=args.steps,
        get_batch=data.__getitem__,
        batch_size=args.batch,
        recipe=recipe,
        replicas=REPLICAS,
        rule=get_rule(rule, stages=args.stages if rule != "dp" else None),
    ).run()
    models = [rep.model for rep in sim.replicas]
    return {
        "losses": [float(r.loss) for r in sim.head_log],
        "weights": [nn.utils.parameters_to_vector(m.parameters()).detach() for m in models],
        "average": nn.utils.parameters_to_vector(average_model(models).parameters()).detach(),
    }


def compare(path: Path, rule: str, args) -> dict:
    start = time.perf_counter()
    theirs = run_official(path, rule, args)
    official_s = time.perf_counter() - start
    start = time.perf_counter()
    ours = run_petra(rule, args)
    petra_s = time.perf_counter() - start
    losses = diffs(ours["losses"], theirs["losses"], TOLERANCE)
    per_replica = [tensor_diff(a, b) for a, b in zip(ours["weights"], theirs["weights"], strict=True)]
    average = tensor_diff(ours["average"], theirs["average"])
    n = losses["losses_compared"]
    return {
        "rule": rule,
        "official_update_rule": RULES[rule],
        "official_stages": theirs["stages"],
        "stubbed": theirs["stubbed"],
        **losses,
        "max_abs_param_diff_per_replica": per_replica,
        "max_abs_average_diff": average,
        "replicas_differ": tensor_diff(theirs["weights"][0], theirs["weights"][1]) > 0,
        "first_losses": {"petra": ours["losses"][:4], "official": theirs["losses"][:4]},
        "last_loss": {"petra": ours["losses"][n - 1], "official": theirs["losses"][n - 1]},
        "match": losses["losses_official"] == losses["losses_petra"]
        and losses["max_abs_loss_diff"] <= TOLERANCE
        and max(per_replica) <= TOLERANCE
        and average <= TOLERANCE,
        "seconds": {"official": round(official_s, 1), "petra": round(petra_s, 1)},
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--official", required=True, type=Path, help=f"a copy of github.com/{REPO}")
    p.add_argument("--rules", nargs="+", choices=list(RULES), default=list(RULES))
    p.add_argument("--steps", type=int, default=20, help="optimizer steps, one minibatch per replica each (20)")
    p.add_argument(
        "--stages", type=int, default=3, help="L, the groups of stages (official --split_n_stages; default 3)"
    )
    p.add_argument("--batch", type=int, default=4, help="minibatch size (default 4)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write OUT/cdp.json, atomically")
    args = p.parse_args(argv)
    J = len(build_model("resnet18", num_classes=5, width=4))
    if not 1 <= args.stages <= J:
        p.error(f"--stages {args.stages} is not allowed; allowed: 1 to {J} (the model's stages)")
    if args.steps < 1:
        p.error(f"--steps {args.steps} is not allowed; allowed: an integer >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    path = check_official(args.official, REPO, NEEDED)
    results = []
    for rule in args.rules:
        r = compare(path, rule, args)
        results.append(r)
        print(f"{rule}:")
        print_losses(
            r["losses"]["petra"], r["losses"]["official"], lambda i: f"step {i // REPLICAS}, replica {i % REPLICAS}"
        )
        print(
            f"{rule:5s} {r['losses_compared']} losses: max |diff| {r['max_abs_loss_diff']:.2e}, parameters after "
            f"{args.steps} steps: max |diff| {max(r['max_abs_param_diff_per_replica']):.2e} per replica, "
            f"{r['max_abs_average_diff']:.2e} averaged -> {'match' if r['match'] else 'DIFFER'} "
            f"(official {r['seconds']['official']} s, petra {r['seconds']['petra']} s)"
        )
    record = {
        "official": REPO,
        "official_commit": official_commit(path),
        "setup": {
            **{k: v for k, v in vars(args).items() if k not in ("official", "out")},
            "replicas": REPLICAS,
            "model": "petra resnet18, width 4, 5 classes, 16 px, each stage's parameters one flat tensor",
            "official_flags": "--partition_strategy nb_stages --split_n_stages STAGES, --filter_bias_and_bn off, "
            "--momentum 0.9",
            "petra": "method backprop, rule_stages STAGES, sgd momentum 0.9 without nesterov, decay_1d true",
        },
        "dtype": "float64",
        "tolerance": TOLERANCE,
        "ran_official": "cdp_utils.CDP (__init__, weights_to_vec, all_reduce, forward, all_reduce_grad, update) "
        "and net_utils.load_optimizer on 2 gloo ranks, in main.run's order",
        "change_to_official": [
            f"stubbed imports (not installed here): {', '.join(results[0]['stubbed']) or 'none'} (fvcore.nn: "
            "FlopCountAnalysis, only for --partition_strategy flops)"
        ],
        "match": all(r["match"] for r in results),
        "rules": results,
        "torch": torch.__version__,
    }
    if args.out is not None:
        write_text(args.out / "cdp.json", json.dumps(record, indent=2) + "\n")
    return 0 if record["match"] else 1


if __name__ == "__main__":
    sys.exit(main())
