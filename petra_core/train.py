"""One training run: config -> data -> model -> pipeline -> checkpoints and metrics.

Training is one stream of ``epochs × batches_per_epoch`` minibatches through the pipeline,
drained once at the end. Epoch e is complete when stage 0 (the last stage to see a minibatch)
has run the backward of the epoch's last minibatch; then the model is evaluated, the epoch's
record is appended to ``history.json`` and a checkpoint is written. A SIGINT/SIGTERM writes a
checkpoint at the end of the current tick and stops; running the same command again resumes
exactly, in-flight activations, gradients, buffers and stashes included.
"""
from __future__ import annotations

import math
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from . import runio
from .config import ConfigError, RunConfig
from .data import build_data
from .engine import Simulator
from .models import build_model
from .optim import Recipe

TIMING_KEYS = ("images_per_s", "wall_time_s", "eval_time_s")


class Interrupted(Exception):
    """A signal stopped the run; a checkpoint was written."""


class Diverged(RuntimeError):
    """The training loss became NaN or infinite; the last good checkpoint was kept."""


def setup_runtime(cfg: RunConfig) -> torch.device:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(cfg.deterministic, warn_only=True)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but no CUDA device is visible; allowed here: cpu")
    return torch.device(cfg.device)


def spread_over_devices(model, device: torch.device) -> None:
    """Contiguous blocks of stages on each visible GPU (all on one device otherwise)."""
    if device.type != "cuda" or torch.cuda.device_count() < 2:
        model.to(device)
        return
    n = torch.cuda.device_count()
    for j, stage in enumerate(model):
        stage.to(torch.device("cuda", j * n // len(model)))


def load_data(cfg: RunConfig):
    common = dict(batch_size=cfg.batch_size, seed=cfg.seed, subset=cfg.subset, eval_batch_size=cfg.eval_batch_size)
    if cfg.dataset == "synthetic":
        return build_data("synthetic", n_train=cfg.synthetic_train, n_test=cfg.synthetic_test,
                          num_classes=cfg.synthetic_classes, **common)
    return build_data(cfg.dataset, source=cfg.data_source, prepared_dir=cfg.prepared_path(), **common)


@torch.no_grad()
def evaluate(model, stream) -> dict:
    """Test loss, top-1 and top-5 (%) with running batch-norm statistics."""
    model.eval()
    first = next(model.parameters()).device
    last = next(model[-1].parameters()).device
    loss = top1 = top5 = n = 0.0
    for images, labels in stream.iter_epoch(0):
        logits = model(images.to(first))
        labels = labels.to(last)
        loss += float(F.cross_entropy(logits, labels, reduction="sum"))
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices
        top1 += float((top[:, 0] == labels).sum())
        top5 += float((top == labels[:, None]).any(dim=1).sum())
        n += len(labels)
    model.train()
    return {"test_loss": loss / n, "top1": 100 * top1 / n, "top5": 100 * top5 / n}


@contextmanager
def stop_on_signals():
    """Turn SIGINT/SIGTERM into a flag checked between ticks (the tick in progress completes)."""
    flag = {"signal": None}

    def handler(signum, _frame):
        flag["signal"] = signal.Signals(signum).name

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def check_same_config(run_dir: Path, cfg: RunConfig) -> None:
    saved_path = run_dir / runio.CONFIG
    if not saved_path.exists():
        return
    saved = RunConfig.from_dict(runio.yaml.safe_load(saved_path.read_text())).to_dict()
    requested = cfg.to_dict()
    ignored = {"progress", "threads"}  # how a run is watched, not what it computes
    for key in requested:
        if key not in ignored and saved.get(key) != requested[key]:
            raise ConfigError(f"{run_dir} holds a run with {key}={saved.get(key)!r}, not {requested[key]!r}; "
                              f"use another run directory")


def train(cfg: RunConfig, run_dir: str | Path, *, on_tick=None, log=print) -> dict:
    """Run (or resume, or report) the run ``cfg`` in ``run_dir``; returns the final metrics."""
    run_dir = Path(run_dir)
    check_same_config(run_dir, cfg)
    if (run_dir / runio.METRICS).exists():
        log(f"{run_dir}: already finished")
        return runio.json.loads((run_dir / runio.METRICS).read_text())
    device = setup_runtime(cfg)
    data = load_data(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.arch, num_classes=data.num_classes, stem=data.stem, width=cfg.width)
    spread_over_devices(model, device)
    B = data.train.num_batches
    recipe = Recipe(base_lr=cfg.base_lr, momentum=cfg.momentum, nesterov=True, weight_decay=cfg.weight_decay,
                    warmup_epochs=cfg.warmup_epochs, milestones=tuple(cfg.milestones), gamma=cfg.gamma,
                    scale_lr=cfg.scale_lr)
    first_device = next(model.parameters()).device

    def get_batch(mb: int):
        images, labels = data.train.batch(mb // B, mb % B)
        return images.to(first_device), labels

    sim = Simulator(model, cfg.method, num_batches=cfg.epochs * B, get_batch=get_batch, batch_size=cfg.batch_size,
                    k=cfg.k, recipe=recipe, batches_per_epoch=B)
    epoch_end = {sim.schedule.backward_tick((e + 1) * B - 1, 0): e for e in range(cfg.epochs)}
    history: list[dict] = []
    ckpt_path = run_dir / runio.CHECKPOINT
    if ckpt_path.exists():
        state = runio.load_checkpoint(ckpt_path)
        model.load_state_dict(state["model"])
        sim.load_state_dict(state["pipeline"])
        history = state["history"]
        log(f"{run_dir}: resuming at tick {sim.tick} of {sim.schedule.num_ticks} (epoch {len(history)})")
    runio.write_yaml(run_dir / runio.CONFIG, cfg.to_dict())
    runio.write_json(run_dir / runio.ENV, runio.environment(cfg.device))

    def checkpoint():
        runio.save_checkpoint(ckpt_path, {"model": model.state_dict(), "pipeline": sim.state_dict(),
                                          "history": history, "config": cfg.to_dict()})

    fidelity = FidelityLog(run_dir / FIDELITY, sim, cfg.fidelity_every)
    head = sim.workers[-1]
    checked = len(head.head_log)
    tick_time, images_done = 0.0, 0
    bar = tqdm(total=sim.schedule.num_ticks, initial=sim.tick, disable=not cfg.progress, unit="tick",
               desc=f"{cfg.method} {cfg.arch}")
    with stop_on_signals() as stop, bar:
        while not sim.done:
            start = time.perf_counter()
            sim.step()
            tick_time += time.perf_counter() - start
            for mb, loss, _, n in head.head_log[checked:]:
                images_done += n
                if not math.isfinite(loss):
                    last = f"{ckpt_path} (epoch {len(history)})" if ckpt_path.exists() else "none"
                    raise Diverged(f"training loss is {loss} at minibatch {mb} (epoch {mb // B + 1}, "
                                   f"batch {mb % B + 1}); stopped; last good checkpoint: {last}")
            checked = len(head.head_log)
            bar.update(1)
            if head.head_log:
                bar.set_postfix(loss=f"{head.head_log[-1][1]:.3f}", img_s=f"{images_done / max(tick_time, 1e-9):.0f}")
            epoch = epoch_end.get(sim.tick - 1)
            if epoch is not None:
                history.append(epoch_record(epoch, B, sim, model, data, tick_time, images_done))
                tick_time, images_done = 0.0, 0
                runio.write_json(run_dir / runio.HISTORY, history)
                fidelity.write()
                checkpoint()
            if on_tick is not None:
                on_tick(sim.tick)
            if stop["signal"] and not sim.done:
                checkpoint()
                raise Interrupted(f"{stop['signal']} at tick {sim.tick}; checkpoint written to {ckpt_path}; "
                                  f"run the same command again to resume")
    metrics = final_metrics(history, sim, cfg)
    runio.write_json(run_dir / runio.METRICS, metrics)
    return metrics


FIDELITY = "fidelity.csv"


class FidelityLog:
    """Optional: every N optimizer steps, each stage's delayed gradient vs the true one (fidelity.csv).

    Observation only (training is bit-identical with or without it). After a resume, tracking
    restarts with the next accumulation group whose minibatches it sees fetched.
    """

    def __init__(self, path: Path, sim, every: int):
        self.path, self.tracker, self.previous = path, None, None
        if every and sim.schedule.kind == "pipelined":
            import pandas as pd

            from .accounting import track_fidelity

            self.tracker = track_fidelity(sim, every=every)
            self.previous = pd.read_csv(path) if path.exists() else None

    def write(self) -> None:
        if self.tracker is None:
            return
        import pandas as pd

        frame = self.tracker.frame()
        if self.previous is not None:
            frame = pd.concat([self.previous, frame], ignore_index=True)
        runio.write_text(self.path, frame.to_csv(index=False))


def epoch_record(epoch: int, B: int, sim, model, data, tick_time: float, images: int) -> dict:
    logs = [r for r in sim.head_log if epoch * B <= r[0] < (epoch + 1) * B]
    n = sum(r[3] for r in logs)
    start = time.perf_counter()
    test = evaluate(model, data.test)
    return {
        "epoch": epoch + 1,
        "train_loss": sum(r[1] * r[3] for r in logs) / n,
        "train_acc": 100 * sum(r[2] for r in logs) / n,
        **test,
        "lr": sim.workers[0].optimizer.param_groups[0]["lr"],
        "images_per_s": images / max(tick_time, 1e-9),
        "wall_time_s": tick_time,
        "eval_time_s": time.perf_counter() - start,
    }


def final_metrics(history: list[dict], sim, cfg: RunConfig) -> dict:
    last = history[-1]
    tail = history[-10:]
    return {
        "top1": last["top1"], "top5": last["top5"], "test_loss": last["test_loss"],
        "train_loss": last["train_loss"], "train_acc": last["train_acc"],
        "best_top1": max(h["top1"] for h in history),
        "top1_last10_mean": sum(h["top1"] for h in tail) / len(tail),
        "epochs": len(history), "optimizer_steps": sim.workers[0].steps,
        "peak_kept_bytes": [sum(w.peak_kept.values()) for w in sim.workers],
        "images_per_s": sum(h["images_per_s"] * h["wall_time_s"] for h in history) / sum(h["wall_time_s"] for h in history),
        "wall_time_s": sum(h["wall_time_s"] + h["eval_time_s"] for h in history),
    }
