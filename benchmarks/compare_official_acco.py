"""petra's ``acco`` replica rule beside the official ACCO trainer (``edouardoyallon/acco``), on one tiny problem.

The official code trains GPT-Neo on GPUs: its rounds run on a communication thread and CUDA
streams, and how many micro-batches a worker accumulates while a round runs depends on timing. Its
rule itself is three module-level functions of ``trainer_decoupled.py`` (``gradient_step``,
``update_buffers_step``, ``communication_step``) and the trainer's set-up methods
(``get_weights``, ``set_weights``, ``prepare_grads``, ``prepare_buffer_com``, ``prepare_opt``,
``load_next_batch_into_static_memory``); this script calls those, unchanged, on 2 ranks of a real
``torch.distributed`` gloo process group (two local processes: the official all-reduce,
reduce-scatter and all-gather run as written), in the order ``train_acco`` calls them when every
round of communication ends before the worker's ``n_grad_accumulation`` micro-batches do (the fixed
count petra's rule assumes): round c's ``communication_step``, then ``n`` ``gradient_step``s, then
``update_buffers_step`` (the two sides touch disjoint buffers until the update, so running them one
after the other computes what the two streams compute). With ``n_warmup_steps = 0``, as the
official ACCO configuration, petra's step t of k = 2n micro-batches is the official rounds 2t
(tentative) and 2t + 1 (real).

The model is petra's tiny RevNet18 (width 4, 5 classes, 16 px images, float32: the official code
keeps its sharded parameters in float32), wrapped so that the official ``gradient_step`` can call
it as it calls GPT-Neo (``model(input_ids=images, labels=labels)[0]`` is the mean cross-entropy);
the same weights on both ranks and in petra; rank r's i-th micro-batch is petra's minibatch
i·2 + r. Recipe: AdamW, weight decay 0.1 on every parameter (petra ``decay_1d=true``), betas
(0.9, 0.95), eps 1e-8 (the official ``config/train/acco.yaml``; petra ``adam_betas``),
``first_round: official``, a constant rate of 2^-10 (the official configuration's cosine schedule
with 1000 warm-up steps is not compared; ``prepare_opt`` holds the rate in a float32 tensor, petra
is given that tensor's value, and 2^-10 is exact there).

Changes to the official code, all said in the record:

* **round-0 optimizer state** (the official bug, docs/conventions.md): after the tentative round 0
  the official line ``sharded_optimizer.state_dict()['state'] = {}`` assigns into a copy and the
  state survives; the script empties ``sharded_optimizer.state`` there, as the line means to
  (``--keep-round0-bug`` leaves it, and shows where the two part);
* **AdamW on CPU**: ``prepare_opt`` builds ``AdamW(capturable=True)`` with a tensor learning rate,
  which torch steps only on accelerators; the script puts into the module's ``AdamW`` name a
  factory that builds torch's AdamW with ``capturable=False`` and the float the tensor holds (the
  same update through torch's CPU path, the one petra's shards take);
* imports the comparison never runs are stubbed with empty modules where not installed: ``datasets``,
  ``torch.utils.tensorboard`` (``SummaryWriter``), ``utils.trainer_utils`` (``LabelSmoother``),
  ``transformers`` (``DataCollatorForLanguageModeling``, and ``get_scheduler``, which
  ``prepare_opt`` calls: it returns transformers' ``constant`` schedule, ``LambdaLR(opt, lambda
  _: 1)``); the trainer object is made without its ``__init__`` (which loads data sets, SLURM
  settings and NCCL) and given the attributes ``__init__`` and ``initialize_com`` set.

``--rule dpu`` runs the official ``train_dpu`` (``n_warmup_steps`` 0; its order: the micro-batches,
then the round, then the buffers' update) beside petra's ``dpu`` (warm-up 0), which differ by
design (docs/conventions.md): the record shows where they part and how many gradients each
official round averages.

Nothing of the official code is copied here: it is imported from ``--official PATH``.

    python benchmarks/compare_official_acco.py --official ~/src/acco [--steps 20] [--out results/official]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

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

REPO = "edouardoyallon/acco"
NEEDED = ("trainer_decoupled.py", "trainer_base.py", "utils/logs_utils.py", "config/train/acco.yaml")
REPLICAS = 2
TOLERANCE = 0.0  # the same float32 operations in the same order on both sides (module docstring)


# ---- the official side ----------------------------------------------------------------------------
def constant_schedule(name, optimizer, num_warmup_steps=None, num_training_steps=None):
    """transformers' ``get_scheduler("constant", ...)``: ``LambdaLR(optimizer, lambda _: 1)``."""
    if name != "constant":
        raise ValueError(f"scheduler_name={name!r} is not allowed here; allowed: constant (transformers is stubbed)")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1)


def cpu_adamw(params, lr, capturable=False, **kwargs):
    """torch's AdamW as ``prepare_opt`` asks for it, on torch's CPU path (module docstring)."""
    return torch.optim.AdamW(params, lr=float(lr), capturable=False, **kwargs)


def import_official(path: Path):
    """The official ``trainer_decoupled`` module (its unused imports stubbed where they are not
    installed, ``AdamW`` replaced) and the names stubbed."""
    placeholder = type("NotRunHere", (), {})
    sys.path.insert(0, str(path))
    import utils  # noqa: F401  the repository's utils package, before one of its modules is stubbed

    stubbed = stub_modules(
        {
            "datasets": {},
            "torch.utils.tensorboard": {"SummaryWriter": placeholder},
            "utils.trainer_utils": {"LabelSmoother": placeholder},
            "transformers": {"DataCollatorForLanguageModeling": placeholder, "get_scheduler": constant_schedule},
        }
    )
    import trainer_decoupled as official  # the repository's trainer_decoupled.py

    official.AdamW = cpu_adamw
    return official, stubbed


class AsOfficialModel(torch.nn.Module):
    """petra's model called as the official code calls GPT-Neo: ``(loss,)`` from ``input_ids`` and
    ``labels``; it keeps every loss it computes (the official code keeps only the last)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.losses: list[float] = []

    def forward(self, input_ids, labels):
        loss = F.cross_entropy(self.model(input_ids), labels)
        self.losses.append(float(loss.detach()))
        return (loss,)


def official_rank(rank: int, port: int, path: str, args: argparse.Namespace, out: str) -> None:
    """One official worker: set up as ``DecoupledTrainer`` does, then ``train_acco``'s calls."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*(CUDA is not available|deprecated)")  # autocast('cuda'), gloo names
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=REPLICAS)
    official, stubbed = import_official(Path(path))
    n = args.k // 2 if args.rule == "acco" else args.k
    data = make_batches(args)
    mine = [{"input_ids": x, "labels": y} for x, y in data[rank::REPLICAS]]
    t = official.DecoupledTrainer.__new__(official.DecoupledTrainer)
    t.model = AsOfficialModel(make_model())
    t.args = SimpleNamespace(
        n_warmup_steps=0,
        n_grad_accumulation=n,
        learning_rate=args.lr,
        weight_decay=args.weight_decay,
        adam_beta1=0.9,
        adam_beta2=args.beta2,
        scheduler_name="constant",
        warmup=0,
    )
    t.rank, t.world_size, t.local_rank, t.process_group = rank, REPLICAS, "cpu", None  # init_process_group's None
    t.dtype = torch.float32  # use_mixed_precision: false
    t.log = logging.getLogger("acco")
    t.train_dataloader, t.train_iterator = mine, iter(mine)
    t.nb_grad_tot = args.steps * args.k * REPLICAS
    t.loss_static, t.n_grad_acc_ddp = torch.zeros(1, dtype=torch.float32), 1  # as __init__
    t.params = t.get_weights()  # as initialize_com (every rank holds the same weights: no first average)
    t.set_weights(t.params)
    t.prepare_grads()
    t.prepare_buffer_com()
    t.prepare_opt()
    t.count_grad_local = torch.ones(1, dtype=torch.int)  # train_acco / train_dpu with n_warmup_steps == 0
    if args.rule == "dpu":
        weights, counts = official_dpu(official, t, args)
    else:
        weights, counts = official_acco(official, t, rank, args)
    result = {"losses": t.model.losses, "weights": weights, "counts": counts, "stubbed": stubbed}
    torch.save(result, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


def official_acco(official, t, rank: int, args) -> tuple[torch.Tensor, list[int]]:
    """``train_acco``'s calls, round by round: θ_steps and each round's gradient count (all ranks)."""
    n, rounds, counts = args.k // 2, 2 * args.steps, []
    for c in range(rounds):  # count_after_init
        official.communication_step(
            rank,
            t.size_slice,
            t.size_local_slice,
            t.process_group,
            t.count_grad_this_round,
            t.com_buffer,
            t.params_opt,
            t.sharded_optimizer,
            t.scheduler,
            c,
        )
        counts.append(int(t.count_grad_this_round[0]))
        if c == 0 and not args.keep_round0_bug:
            t.sharded_optimizer.state.clear()  # what `state_dict()['state'] = {}` means to do
        if c == rounds - 1:  # the real round of the last step: θ_steps is in com_buffer
            return t.com_buffer[: t.len_params].clone(), counts
        for _ in range(n):
            official.gradient_step(
                t.dtype,
                t.model,
                t.count_grad_local,
                t.load_next_batch_into_static_memory(),
                t.loss_static,
                t.n_grad_acc_ddp,
            )
        official.update_buffers_step(
            t.params, t.com_buffer, t.len_params, t.count_grad_this_round, t.count_grad_local, c
        )
    raise AssertionError("unreachable: the last round returns")


def official_dpu(official, t, args) -> tuple[torch.Tensor, list[int]]:
    """``train_dpu``'s calls (``n_warmup_steps`` 0), round by round: its micro-batches, then the
    round, then the buffers' update; θ_steps and each round's gradient count (all ranks)."""
    counts = []
    for count_com in range(args.steps):
        for _ in range(args.k):
            official.gradient_step(
                t.dtype, t.model, t.count_grad_local, t.load_next_batch_into_static_memory(), t.loss_static,
                t.n_grad_acc_ddp,
            )  # fmt: skip
        official.communication_step(
            t.rank, t.size_slice, t.size_local_slice, t.process_group, t.count_grad_this_round, t.com_buffer,
            t.params_opt, t.sharded_optimizer, t.scheduler,
        )  # fmt: skip
        counts.append(int(t.count_grad_this_round[0]))
        official.update_buffers_step(
            t.params, t.com_buffer, t.len_params, t.count_grad_this_round, t.count_grad_local, count_com
        )
    return t.params.detach().clone(), counts


def run_official(path: Path, args) -> tuple[list[float], list[torch.Tensor], list[str], list[int]]:
    """The losses in petra's minibatch order (i·2 + r), each rank's final weights, the imports
    stubbed, and each round's gradient count summed over the ranks."""
    with tempfile.TemporaryDirectory() as out, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        mp.spawn(official_rank, args=(port, str(path), args, out), nprocs=REPLICAS, join=True)
        ranks = [torch.load(f"{out}/rank{r}.pt") for r in range(REPLICAS)]
    per_rank = [r["losses"] for r in ranks]
    losses = [per_rank[i % REPLICAS][i // REPLICAS] for i in range(sum(map(len, per_rank)))]
    return losses, [r["weights"] for r in ranks], ranks[0]["stubbed"], ranks[0]["counts"]


# ---- the problem and petra's side ------------------------------------------------------------------
def make_batches(args) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(args.seed)
    return [
        (torch.randn(args.batch, 3, 16, 16, generator=g), torch.randint(0, 5, (args.batch,), generator=g))
        for _ in range(args.steps * args.k * REPLICAS)
    ]


def float32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def make_model():
    torch.manual_seed(0)
    return build_model("revnet18", num_classes=5, width=4)


def run_petra(args) -> tuple[list[float], list[torch.Tensor]]:
    torch.set_num_threads(1)
    data = make_batches(args)
    recipe = Recipe(
        base_lr=float32(args.lr),  # the rate the official code steps with (prepare_opt's float32 tensor)
        weight_decay=args.weight_decay,
        optimizer="adamw",
        betas=(0.9, args.beta2),
        eps=1e-8,
        decay_1d=True,
        scale_lr=False,
    )
    sim = Simulator(
        make_model(),
        "backprop",
        num_batches=args.steps * args.k,
        get_batch=data.__getitem__,
        batch_size=args.batch,
        k=args.k,
        recipe=recipe,
        replicas=REPLICAS,
        rule=get_rule("acco", options={"first_round": "official"})
        if args.rule == "acco"
        else get_rule("dpu", options={"warmup": 0}),
    ).run()
    losses = [float(r.loss) for r in sim.head_log]
    weights = [torch.nn.utils.parameters_to_vector(rep.model.parameters()).detach() for rep in sim.replicas]
    return losses, weights


def compare(path: Path, args) -> dict:
    start = time.perf_counter()
    theirs, their_weights, stubbed, counts = run_official(path, args)
    official_s = time.perf_counter() - start
    start = time.perf_counter()
    ours, our_weights = run_petra(args)
    petra_s = time.perf_counter() - start
    losses = diffs(ours, theirs, TOLERANCE)
    param_diff = max(tensor_diff(a, b) for a in our_weights for b in their_weights)
    n = losses["losses_compared"]
    return {
        **losses,
        "max_abs_param_diff": param_diff,
        "first_losses": {"petra": ours[:4], "official": theirs[:4]},
        "last_loss": {"petra": ours[n - 1], "official": theirs[n - 1]},
        "match": losses["losses_official"] == losses["losses_petra"]
        and losses["max_abs_loss_diff"] <= TOLERANCE
        and param_diff <= TOLERANCE,
        "seconds": {"official": round(official_s, 1), "petra": round(petra_s, 1)},
        "stubbed": stubbed,
        "official_gradients_per_round": counts,
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--official", required=True, type=Path, help=f"a copy of github.com/{REPO}")
    p.add_argument(
        "--rule",
        choices=("acco", "dpu"),
        default="acco",
        help="acco (default), or dpu: the official train_dpu beside petra's dpu, which differ by design",
    )
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    p.add_argument(
        "--k",
        type=int,
        default=None,
        help="micro-batches per step: acco 2 x the official n_grad_accumulation (default 2), dpu the official "
        "n_grad_accumulation (default 1)",
    )
    p.add_argument("--batch", type=int, default=4, help="micro-batch size (default 4)")
    p.add_argument(
        "--lr",
        type=float,
        default=2**-10,
        help="AdamW's rate (default 2^-10: the official code holds it in a float32 tensor; petra is given that "
        "float32 value, so pick one it holds exactly or the record says which it used)",
    )
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--keep-round0-bug",
        action="store_true",
        help="acco: leave the official round-0 optimizer state as the official code leaves it (shows where they part)",
    )
    p.add_argument("--out", type=Path, default=None, help="write OUT/acco.json (acco_<variant>.json), atomically")
    args = p.parse_args(argv)
    if args.k is None:
        args.k = 2 if args.rule == "acco" else 1
    if args.rule == "acco" and (args.k < 2 or args.k % 2):
        p.error(f"--k {args.k} is not allowed; allowed: an even number >= 2 (two official rounds of k/2 each)")
    if args.rule == "dpu" and (args.k < 1 or args.keep_round0_bug):
        p.error(f"--rule dpu --k {args.k} is not allowed; allowed: k >= 1 (and no --keep-round0-bug: no round 0)")
    if args.steps < 1:
        p.error(f"--steps {args.steps} is not allowed; allowed: an integer >= 1")
    return args


def record_name(args) -> str:
    if args.rule == "dpu":
        return "dpu.json" if args.k == 1 else f"dpu_k{args.k}.json"
    variant = [*(["round0_bug"] if args.keep_round0_bug else []), *([f"k{args.k}"] if args.k != 2 else [])]
    return "acco.json" if not variant else f"acco_{'_'.join(variant)}.json"


def make_record(args, path: Path, r: dict) -> dict:
    acco = args.rule == "acco"
    patch = ["after round 0, sharded_optimizer.state emptied (the official line assigns {} into a copy)"]
    return {
        "official": REPO,
        "official_commit": official_commit(path),
        "setup": {
            **{k: v for k, v in vars(args).items() if k not in ("official", "out")},
            "replicas": REPLICAS,
            "lr_float32": float32(args.lr),
            "official_n_grad_accumulation": args.k // 2 if acco else args.k,
            "model": "petra revnet18, width 4, 5 classes, 16 px",
            "petra": f"method backprop, rule {'acco {first_round: official}' if acco else 'dpu {warmup: 0}'}, "
            "adamw, decay_1d true, constant lr",
        },
        "dtype": "float32",
        "tolerance": TOLERANCE,
        "ran_official": "trainer_decoupled.gradient_step, update_buffers_step, communication_step and "
        "DecoupledTrainer.get_weights, set_weights, prepare_grads, prepare_buffer_com, prepare_opt, "
        "load_next_batch_into_static_memory, on 2 gloo ranks, "
        + (
            "in train_acco's order with every round ending before the worker's n_grad_accumulation micro-batches"
            if acco
            else "in train_dpu's order (n_warmup_steps 0)"
        ),
        "change_to_official": [
            *(patch if acco and not args.keep_round0_bug else []),
            "AdamW(capturable=True, lr=tensor) built as AdamW(capturable=False, lr=float): torch has no "
            "capturable AdamW on CPU",
            f"stubbed imports (not installed here): {', '.join(r['stubbed']) or 'none'} (a stubbed "
            "transformers.get_scheduler gives the constant schedule LambdaLR(opt, lambda _: 1))",
            "DecoupledTrainer made without __init__ (data sets, SLURM, NCCL); its attributes set as "
            "__init__ and initialize_com set them",
        ],
        "match": r["match"],
        "result": r,
        "torch": torch.__version__,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    path = check_official(args.official, REPO, NEEDED)
    r = compare(path, args)
    print_losses(
        r["losses"]["petra"],
        r["losses"]["official"],
        lambda i: f"mb {i} (step {i // REPLICAS // args.k}, replica {i % REPLICAS})",
    )
    print(
        f"{args.rule} {r['losses_compared']} losses: max |diff| {r['max_abs_loss_diff']:.2e}"
        f" (first beyond tolerance: {r['first_loss_beyond_tolerance']}), parameters after {args.steps} steps:"
        f" max |diff| {r['max_abs_param_diff']:.2e} -> {'match' if r['match'] else 'DIFFER'}"
        f" (official {r['seconds']['official']} s, petra {r['seconds']['petra']} s);"
        f" official gradients per round (all ranks): {r['official_gradients_per_round'][:8]}"
    )
    record = make_record(args, path, r)
    if args.out is not None:
        write_text(args.out / record_name(args), json.dumps(record, indent=2) + "\n")
    return 0 if record["match"] else 1


if __name__ == "__main__":
    sys.exit(main())
