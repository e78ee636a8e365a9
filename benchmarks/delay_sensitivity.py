"""Which stage's delay costs the character-level GPT and RevViT what: the plain-PyTorch
delayed-gradient reference (petra_core/methods/delayed_reference.py) with other delays than the
pipeline's.

    python benchmarks/delay_sensitivity.py              # every setting, 2 at a time (about 3 h on 2 cores)
    python benchmarks/delay_sensitivity.py --only none pipeline

The transformers profile's revgpt run at 1,250 minibatches, seed 0 (nanoGPT's CPU size on
Shakespeare, batches of 12 windows of 64 characters, AdamW lr 1e-3, betas 0.9/0.99, weight decay 0.1
on matrices, warm-up over 1/8, x0.1 at 5/8 and 7/8; the ``muon`` settings: Muon on the blocks'
matrices; ``branch``: only that branch's parameters wait, the rest of a block steps on time;
``cosine``: the largest budget, 5,000 minibatches, under nanoGPT's cosine decay instead of the
steps; the ``vit-`` settings: the profile's RevViT run at 1,000 minibatches, seed 0, width 64 on the
first 16,000 images of CIFAR-10, Adam betas 0.9/0.999, the same steps, its 8 stages: stem, 6 blocks,
head; its result is top-1; the later ``vit-`` settings ask what might make the delay cheaper there:
another lr (1e-4 also at 250, 4,000 and 16,000 minibatches, 3e-5 also at 4,000), SGD, AdamW without
momentum or with beta2 0.95, a per-stage lr over the delay, minREV's cosine decay, shorter delays (3
stages', a quarter of the pipeline's), and every stage the stem's delay; ``vit-twin-``: the
non-reversible twin), trained with stage j's gradients applied ``delays[j]`` minibatches late
(revgpt's 6 stages: stem, 4 blocks, head). ``none`` is backprop and ``pipeline`` (2(J-1-j)) the
engine's ``delayed`` method, each the same training as the engine's
(tests/test_delayed_reference.py), so their losses are the profile's records (on RevViT ``vit-none``
gave the backprop record's top-1, 46.02, and ``vit-pipeline`` 28.77 against the delayed record's
28.66). Validation loss on the whole validation split, as the engine evaluates; ``baseline``: the
setting a row is compared with (the same model and recipe without delay). Writes
``results/transformers/delays.csv``, which the transformers report renders
(paper_tables/transformers.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from petra_core.data.bundle import build_data  # noqa: E402
from petra_core.data.text_stream import TextStream  # noqa: E402
from petra_core.families import build  # noqa: E402
from petra_core.methods.delayed_reference import train_delayed  # noqa: E402
from petra_core.optim import Recipe, make_optimizer, make_schedule  # noqa: E402
from petra_core.report.transformers import REFERENCE_BETA2, REFERENCE_RECIPE  # noqa: E402
from petra_core.run import runio  # noqa: E402
from petra_core.run.evaluation import evaluate  # noqa: E402

PIPELINE = (10, 8, 6, 4, 2, 0)  # revgpt's staleness 2(J-1-j), J = 6
VIT_PIPELINE = (14, 12, 10, 8, 6, 4, 2, 0)  # revvit's: J = 8 (stem, 6 blocks, head)
# name: (arch, delays, what it asks, options, the setting it is compared with)
SETTINGS: dict[str, tuple[str, tuple[int, ...], str, dict, str]] = {
    "none": ("revgpt", (0,) * 6, "no delay (backprop)", {}, ""),
    "pipeline": ("revgpt", PIPELINE, "the pipeline's delays (the delayed method)", {}, "none"),
    "half": ("revgpt", (5, 4, 3, 2, 1, 0), "half the pipeline's delays", {}, "none"),
    "fifth": ("revgpt", (2, 2, 1, 1, 0, 0), "a fifth of them, rounded", {}, "none"),
    "stem": ("revgpt", (10, 0, 0, 0, 0, 0), "the stem's delay only", {}, "none"),
    "first-block": ("revgpt", (0, 8, 0, 0, 0, 0), "the first block's only", {}, "none"),
    "last-block": ("revgpt", (0, 0, 0, 0, 2, 0), "the last block's only", {}, "none"),
    "blocks": ("revgpt", (0, 8, 6, 4, 2, 0), "the blocks' delays, stem and head on time", {}, "none"),
    "predict": ("revgpt", PIPELINE, "the pipeline's, with linear weight prediction", {"predict": 1.0}, "none"),
    "beta1-0": ("revgpt", PIPELINE, "the pipeline's, AdamW without momentum (beta1 = 0)", {"beta1": 0.0}, "none"),
    "lr-3e-4": ("revgpt", PIPELINE, "the pipeline's at lr 3e-4", {"lr": 3e-4}, "none-lr-3e-4"),
    "none-lr-3e-4": ("revgpt", (0,) * 6, "no delay at lr 3e-4", {"lr": 3e-4}, "none"),
    "twin-none": ("gpt", (0,) * 6, "the non-reversible twin, no delay", {}, "none"),
    "twin-pipeline": ("gpt", PIPELINE, "the twin, the pipeline's delays", {}, "twin-none"),
    "twin-last-block": ("gpt", (0, 0, 0, 0, 2, 0), "the twin, the last block's only", {}, "twin-none"),
    "muon-none": ("revgpt", (0,) * 6, "no delay, Muon on the blocks' matrices", {"muon": True}, "none"),
    "muon-pipeline": ("revgpt", PIPELINE, "the pipeline's, Muon on the blocks' matrices", {"muon": True}, "muon-none"),
    "attention": (
        "revgpt",
        PIPELINE,
        "the pipeline's on attention (F) only, the MLPs on time",
        {"branch": "F"},
        "none",
    ),
    "mlp": ("revgpt", PIPELINE, "the pipeline's on the MLPs (G) only, attention on time", {"branch": "G"}, "none"),
    "last-attention": ("revgpt", (0, 0, 0, 0, 2, 0), "the last block's attention only", {"branch": "F"}, "none"),
    "last-mlp": ("revgpt", (0, 0, 0, 0, 2, 0), "the last block's MLP only", {"branch": "G"}, "none"),
    # the largest budget (5,000 minibatches) under nanoGPT's cosine decay to 0.1 of the peak
    "cosine-none": ("revgpt", (0,) * 6, "no delay, 5,000 minibatches, cosine", {"cosine": True}, ""),
    "cosine-pipeline": (
        "revgpt",
        PIPELINE,
        "the pipeline's, 5,000 minibatches, cosine",
        {"cosine": True},
        "cosine-none",
    ),
    "cosine-predict": (
        "revgpt",
        PIPELINE,
        "the pipeline's with linear weight prediction, 5,000 minibatches, cosine",
        {"cosine": True, "predict": 1.0},
        "cosine-none",
    ),
    # RevViT on CIFAR-10 (the profile's second part): 1,000 minibatches of 64, the step recipe, where
    # PETRA and the delay alone stall (-19.3 and -17.7 points of top-1 against backprop)
    "vit-none": ("revvit", (0,) * 8, "no delay (backprop)", {}, ""),
    "vit-pipeline": ("revvit", VIT_PIPELINE, "the pipeline's delays (the delayed method)", {}, "vit-none"),
    "vit-stem": ("revvit", (14,) + (0,) * 7, "the stem's delay only", {}, "vit-none"),
    "vit-blocks": ("revvit", (0, *VIT_PIPELINE[1:]), "the blocks' delays, stem and head on time", {}, "vit-none"),
    "vit-last-block": ("revvit", (0,) * 6 + (2, 0), "the last block's only", {}, "vit-none"),
    "vit-predict": (
        "revvit",
        VIT_PIPELINE,
        "the pipeline's, with linear weight prediction",
        {"predict": 1.0},
        "vit-none",
    ),
    # what might make the delay cheaper on RevViT (1,000 minibatches but where named): another lr
    # (each against no delay at the same lr), another optimizer, a per-stage lr, minREV's cosine
    "vit-none-lr-3e-4": ("revvit", (0,) * 8, "no delay at lr 3e-4", {"lr": 3e-4}, "vit-none"),
    "vit-lr-3e-4": ("revvit", VIT_PIPELINE, "the pipeline's at lr 3e-4", {"lr": 3e-4}, "vit-none-lr-3e-4"),
    "vit-none-lr-1e-4": ("revvit", (0,) * 8, "no delay at lr 1e-4", {"lr": 1e-4}, "vit-none"),
    "vit-lr-1e-4": ("revvit", VIT_PIPELINE, "the pipeline's at lr 1e-4", {"lr": 1e-4}, "vit-none-lr-1e-4"),
    "vit-none-lr-1e-4-e1": ("revvit", (0,) * 8, "no delay at lr 1e-4, 250 minibatches", {"lr": 1e-4, "epochs": 1}, ""),
    "vit-lr-1e-4-e1": (
        "revvit",
        VIT_PIPELINE,
        "the pipeline's at lr 1e-4, 250 minibatches",
        {"lr": 1e-4, "epochs": 1},
        "vit-none-lr-1e-4-e1",
    ),
    "vit-none-lr-1e-4-e16": (
        "revvit",
        (0,) * 8,
        "no delay at lr 1e-4, 4,000 minibatches",
        {"lr": 1e-4, "epochs": 16},
        "",
    ),
    "vit-lr-1e-4-e16": (
        "revvit",
        VIT_PIPELINE,
        "the pipeline's at lr 1e-4, 4,000 minibatches",
        {"lr": 1e-4, "epochs": 16},
        "vit-none-lr-1e-4-e16",
    ),
    # 64 passes over the 16,000 images (16,000 minibatches, near the RevNet budget study's 80): does
    # the delay's cost, growing from 250 to 4,000 minibatches, turn once backprop nears its plateau?
    "vit-none-lr-1e-4-e64": (
        "revvit",
        (0,) * 8,
        "no delay at lr 1e-4, 16,000 minibatches",
        {"lr": 1e-4, "epochs": 64},
        "",
    ),
    "vit-lr-1e-4-e64": (
        "revvit",
        VIT_PIPELINE,
        "the pipeline's at lr 1e-4, 16,000 minibatches",
        {"lr": 1e-4, "epochs": 64},
        "vit-none-lr-1e-4-e64",
    ),
    "vit-none-lr-3e-5": ("revvit", (0,) * 8, "no delay at lr 3e-5", {"lr": 3e-5}, "vit-none"),
    "vit-lr-3e-5": ("revvit", VIT_PIPELINE, "the pipeline's at lr 3e-5", {"lr": 3e-5}, "vit-none-lr-3e-5"),
    "vit-none-lr-3e-5-e16": (
        "revvit",
        (0,) * 8,
        "no delay at lr 3e-5, 4,000 minibatches",
        {"lr": 3e-5, "epochs": 16},
        "",
    ),
    "vit-lr-3e-5-e16": (
        "revvit",
        VIT_PIPELINE,
        "the pipeline's at lr 3e-5, 4,000 minibatches",
        {"lr": 3e-5, "epochs": 16},
        "vit-none-lr-3e-5-e16",
    ),
    "vit-beta1-0": (
        "revvit",
        VIT_PIPELINE,
        "the pipeline's, AdamW without momentum (beta1 = 0)",
        {"beta1": 0.0},
        "vit-none",
    ),
    "vit-sgd-none": (
        "revvit",
        (0,) * 8,
        "no delay, SGD (Nesterov momentum 0.9, lr 0.1)",
        {"sgd": True, "lr": 0.1},
        "vit-none",
    ),
    "vit-sgd": (
        "revvit",
        VIT_PIPELINE,
        "the pipeline's, SGD (Nesterov momentum 0.9, lr 0.1)",
        {"sgd": True, "lr": 0.1},
        "vit-sgd-none",
    ),
    "vit-delay-lr": (
        "revvit",
        VIT_PIPELINE,
        "the pipeline's, each stage's lr over its delay",
        {"delay_lr": 1.0},
        "vit-none",
    ),
    "vit-delay-lr-sqrt": (
        "revvit",
        VIT_PIPELINE,
        "the pipeline's, each stage's lr over the root of its delay",
        {"delay_lr": 0.5},
        "vit-none",
    ),
    # a shorter memory of Adam's second moment (beta2 0.95, the LLMs' choice for stability): does
    # a denominator that follows the gradients' size within tens of steps damp the delay's swings?
    "vit-none-beta2-0.95": ("revvit", (0,) * 8, "no delay, Adam's beta2 0.95", {"beta2": 0.95}, "vit-none"),
    "vit-beta2-0.95": (
        "revvit",
        VIT_PIPELINE,
        "the pipeline's, Adam's beta2 0.95",
        {"beta2": 0.95},
        "vit-none-beta2-0.95",
    ),
    "vit-uniform": ("revvit", (14,) * 8, "every stage the stem's delay (14)", {}, "vit-none"),
    # the non-reversible twin ViT (the same parameters): is the delay's cost RevViT's or a ViT's?
    "vit-twin-none": ("vit", (0,) * 8, "the non-reversible twin, no delay", {}, "vit-none"),
    "vit-twin-pipeline": ("vit", VIT_PIPELINE, "the twin, the pipeline's delays", {}, "vit-twin-none"),
    # shorter delays: PETRA's with RevViT's 6 blocks in one stage (J = 3), and a quarter of the
    # pipeline's (rounded up: the staleness in optimizer steps of accumulation k = 4)
    "vit-three-stages": (
        "revvit",
        (4,) + (2,) * 6 + (0,),
        "the delays of 3 stages (all 6 blocks in one)",
        {},
        "vit-none",
    ),
    "vit-quarter": ("revvit", (4, 3, 3, 2, 2, 1, 1, 0), "a quarter of the pipeline's, rounded up", {}, "vit-none"),
    "vit-cosine-none": ("revvit", (0,) * 8, "no delay, minREV's cosine", {"cosine": True}, ""),
    "vit-cosine": ("revvit", VIT_PIPELINE, "the pipeline's, minREV's cosine", {"cosine": True}, "vit-cosine-none"),
    "vit-cosine-none-e1": (
        "revvit",
        (0,) * 8,
        "no delay, minREV's cosine, 250 minibatches",
        {"cosine": True, "epochs": 1},
        "",
    ),
    "vit-cosine-e1": (
        "revvit",
        VIT_PIPELINE,
        "the pipeline's, minREV's cosine, 250 minibatches",
        {"cosine": True, "epochs": 1},
        "vit-cosine-none-e1",
    ),
}
BRANCHES = {"F": "attention", "G": "mlp"}  # a reversible block's two branches (models/transformer.py)
BATCH, CONTEXT, WINDOWS, EPOCHS, SEED = 12, 64, 3000, 5, 0
COSINE_EPOCHS = 20  # 5,000 minibatches: the profile's largest budget
IMAGE_ARCHS = ("revvit", "vit")  # CIFAR-10 models: top-1 is their result
VIT_BATCH, VIT_SUBSET, VIT_EPOCHS, VIT_WIDTH = 64, 16000, 4, 64  # the profile's RevViT at 1,000 minibatches


def epochs(arch: str, options: dict) -> int:
    if arch in IMAGE_ARCHS:
        return options.get("epochs", VIT_EPOCHS)
    return COSINE_EPOCHS if options.get("cosine") else EPOCHS


def recipe(options: dict, arch: str = "revgpt") -> Recipe:
    """The profile's recipe at 1,250 minibatches (warm-up 1/8, x0.1 at 5/8 and 7/8) or, with
    ``cosine``, nanoGPT's Shakespeare schedule at 5,000 (warm-up 1/8, cosine down to 0.1 of the peak);
    for RevViT its recipe at 1,000 minibatches or the ``epochs`` named (the same steps, Adam's beta2
    0.999 as minREV's; with ``cosine`` minREV's: warm-up 1/8, cosine down to 0); ``sgd``: the
    RevNets' optimizer at ``lr`` (Nesterov momentum 0.9, weight decay 5e-4) on the same schedule."""
    if arch in IMAGE_ARCHS and options.get("cosine"):
        n = epochs(arch, options)
        schedule = dict(warmup_epochs=n / 8, decay="cosine", decay_epochs=n, final_lr_ratio=0.0)
    elif arch in IMAGE_ARCHS:
        n = epochs(arch, options)
        schedule = dict(warmup_epochs=n / 8, milestones=(n * 5 / 8, n * 7 / 8), gamma=0.1)
    elif options.get("cosine"):
        schedule = dict(warmup_epochs=COSINE_EPOCHS / 8, decay="cosine", decay_epochs=COSINE_EPOCHS, final_lr_ratio=0.1)
    else:
        schedule = dict(warmup_epochs=0.625, milestones=(3.125, 4.375), gamma=0.1)
    if options.get("sgd"):  # the RevNets' optimizer: Nesterov momentum 0.9, weight decay 5e-4
        return Recipe(base_lr=options["lr"], optimizer="sgd", weight_decay=5e-4, scale_lr=False, **schedule)
    return Recipe(
        base_lr=options.get("lr", REFERENCE_RECIPE["lr"]),
        optimizer="adamw",
        betas=(options.get("beta1", REFERENCE_RECIPE["beta1"]), beta2(options, arch)),
        weight_decay=0.1,
        scale_lr=False,
        **schedule,
    )


def beta2(options: dict, arch: str) -> float:
    """Adam's beta2: the setting's, else its model's in the study's recipe (minREV's 0.999 for RevViT,
    nanoGPT's 0.99 for the GPT; ``REFERENCE_BETA2``, which the report names departures from)."""
    return options.get("beta2", REFERENCE_BETA2[arch])


def muon_on_the_blocks(recipe: Recipe, batch_size: int):
    """Muon (torch.optim.Muon, its AdamW-matching lr scale, so AdamW's lr and weight decay carry
    over) on the 2-D weights of the block stages, AdamW on the rest (embeddings, head, norms,
    biases), as Muon is meant to be used; both on the recipe's schedule."""

    def optimizers_for(j, stage, steps_per_epoch):
        hidden = stage.kind not in ("S", "H")  # the stem's embeddings and the head stay with AdamW
        matrices = [p for _, p in stage.named_parameters() if hidden and p.ndim == 2]
        rest = [(n, p) for n, p in stage.named_parameters() if not (hidden and p.ndim == 2)]
        pairs = [
            make_optimizer(stage, recipe, batch_size=batch_size, k=1, steps_per_epoch=steps_per_epoch, params=rest)
        ]
        if matrices:
            muon = torch.optim.Muon(
                matrices, lr=recipe.base_lr, weight_decay=recipe.weight_decay, adjust_lr_fn="match_rms_adamw"
            )
            pairs.append((muon, make_schedule(muon, recipe, k=1, steps_per_epoch=steps_per_epoch)))
        return pairs

    return optimizers_for


def delay_scaled(recipe: Recipe, batch_size: int, delays, power: float):
    """Each stage's optimizer at lr / max(1, delay)^power, the whole run (PipeMare's rescheduling
    divides by the delay early in training and anneals back to the lr; this keeps the division)."""
    from dataclasses import replace

    def optimizers_for(j, stage, steps_per_epoch):
        scaled = replace(recipe, base_lr=recipe.base_lr / max(1, delays[j]) ** power)
        return [make_optimizer(stage, scaled, batch_size=batch_size, k=1, steps_per_epoch=steps_per_epoch)]

    return optimizers_for


def in_branch(branch: str):
    """The parameters of a block's ``branch`` (F: attention, G: MLP), by name within a stage."""
    return lambda name: f".{branch}." in f".{name}"


def data_and_model(arch: str, text_dir: str, image_dir: str):
    """The setting's (train stream, test stream, model, batch size), seeded as the profile's seed-0 run."""
    if arch in IMAGE_ARCHS:
        data = build_data("cifar10", prepared_dir=image_dir, batch_size=VIT_BATCH, seed=SEED, subset=VIT_SUBSET,
                          eval_batch_size=512)  # fmt: skip
        torch.manual_seed(SEED)
        return data.train, data.test, build(arch, num_classes=data.num_classes, width=VIT_WIDTH), VIT_BATCH
    data = Path(text_dir)
    train = TextStream(np.load(data / "train_tokens.npy"), BATCH, CONTEXT, seed=SEED, train=True, windows=WINDOWS)
    test = TextStream(np.load(data / "test_tokens.npy"), 512, CONTEXT, seed=SEED, train=False)
    torch.manual_seed(SEED)
    vocab = runio.read_json(data / "manifest.json")["num_classes"]
    return train, test, build(arch, num_classes=vocab, context=CONTEXT, width=128, depth=4, heads=4), BATCH


def run(name: str, text_dir: str, image_dir: str) -> dict:
    arch, delays, question, options, baseline = SETTINGS[name]
    torch.set_num_threads(1)
    train, test, model, batch_size = data_and_model(arch, text_dir, image_dir)
    per_epoch = train.num_batches
    settings = recipe(options, arch)
    start = time.perf_counter()
    losses = train_delayed(
        model,
        lambda m: train.batch(m // per_epoch, m % per_epoch),
        per_epoch * epochs(arch, options),
        list(delays),
        settings,
        batch_size=batch_size,
        batches_per_epoch=per_epoch,
        predict=options.get("predict", REFERENCE_RECIPE["predict"]),
        optimizers_for=muon_on_the_blocks(settings, batch_size)
        if options.get("muon")
        else delay_scaled(settings, batch_size, delays, options["delay_lr"])
        if "delay_lr" in options
        else None,
        delayed=in_branch(options["branch"]) if "branch" in options else None,
    )
    seconds = time.perf_counter() - start
    return {
        "setting": name,
        "arch": arch,
        "delays": " ".join(map(str, delays)),
        "question": question,
        "baseline": baseline,
        "lr": options.get("lr", REFERENCE_RECIPE["lr"]),
        "beta1": options.get("beta1", REFERENCE_RECIPE["beta1"]),
        "beta2": beta2(options, arch),
        "predict": options.get("predict", REFERENCE_RECIPE["predict"]),
        # each stage at lr / delay**this (0: the recipe's lr)
        "delay_lr": options.get("delay_lr", REFERENCE_RECIPE["delay_lr"]),
        "optimizer": "muon+adamw" if options.get("muon") else "sgd" if options.get("sgd") else "adamw",
        "schedule": "cosine" if options.get("cosine") else "step",
        "metric": "top1" if arch in IMAGE_ARCHS else "test_loss",
        "delayed_params": BRANCHES.get(options.get("branch"), "all"),
        "minibatches": len(losses),
        "train_loss_last_epoch": float(np.mean(losses[-per_epoch:])),
        **evaluate(model, test),
        "train_s": round(seconds, 1),
    }


def main(argv=None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(SETTINGS), help="these settings (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="settings trained at once, one thread each")
    parser.add_argument("--data", default=str(ROOT / "data/prepared/shakespeare"), help="prepared Shakespeare")
    parser.add_argument("--cifar", default=str(ROOT / "data/prepared/cifar10"), help="prepared CIFAR-10 (RevViT)")
    parser.add_argument("--out", default=str(ROOT / "results/transformers/delays.csv"))
    args = parser.parse_args(argv)
    names = args.only or list(SETTINGS)
    archs = {SETTINGS[n][0] for n in names}
    if archs - set(IMAGE_ARCHS) and not (Path(args.data) / "train_tokens.npy").exists():
        parser.error(f"--data {args.data}: no prepared Shakespeare there; run: petra prepare shakespeare")
    if archs & set(IMAGE_ARCHS) and not (Path(args.cifar) / "manifest.json").exists():
        parser.error(
            f"--cifar {args.cifar}: no prepared CIFAR-10 there; run: snakemake --cores 1 -- data/prepared/cifar10"
        )
    revision = runio.git_revision(
        outputs=(str(Path(args.out).relative_to(ROOT)),) if Path(args.out).is_relative_to(ROOT) else ()
    )
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(run, names, [args.data] * len(names), [args.cifar] * len(names)))
    for row in rows:
        result = f"top-1 {row['top1']:.2f}" if row["metric"] == "top1" else f"val {row['test_loss']:.4f}"
        print(f"{row['setting']:>16}  delays {row['delays']:<18}  {result}  ({row['train_s']:.0f} s)")
    frame = pd.DataFrame(rows).assign(git_revision=revision, torch=torch.__version__)
    out = Path(args.out)
    if args.only and out.exists():  # keep the other settings' rows
        frame = pd.concat([pd.read_csv(out).query("setting not in @names"), frame], ignore_index=True)
    runio.write_text(out, frame.to_csv(index=False))
    print(f"wrote {out}")
    return frame


if __name__ == "__main__":
    main()
