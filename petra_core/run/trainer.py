"""One training run: config -> data -> model -> pipeline -> checkpoints and metrics.

Training is one stream of ``epochs × batches_per_epoch`` minibatches through the pipeline,
drained once at the end. Epoch e is complete when stage 0 (the last stage to see a minibatch)
has run the backward of the epoch's last minibatch; then the model is evaluated, the epoch's
record is appended to ``history.json`` and a checkpoint is written. A SIGINT/SIGTERM writes a
checkpoint at the end of the current tick and stops; running the same command again resumes
exactly, in-flight activations, gradients, buffers and stashes included.

The same :class:`Trainer` drives both runtimes (``session.py``): the simulator (every replica
and stage in this process) and the distributed pipeline (one process per rank, under torchrun).
In a distributed run every rank runs its phases on its own stages; rank 0 evaluates and writes
the run files, and at every tick boundary the ranks agree on whether to stop, so they all
checkpoint at the same tick. With R replicas an epoch is the stream's B // R · R minibatches,
B // R for each replica; the history counts the stream's.

The config travels one way: :func:`train` checks it against the run directory and the checkpoint
(``checkpoints.py``), makes the :class:`Trainer`, reads everything the session needs into a
:class:`~.session.SessionPlan` (:func:`session_plan`) and only then builds the session, top-down,
from the plan; nothing below calls back up with the config.
"""

from __future__ import annotations

import math
import signal
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
from tqdm import tqdm

from ..data import DataError
from ..engine.host_memory import retain_freed_memory
from ..engine.phases import check_phases
from ..engine.stage_streams import check_stage_streams
from ..methods import get_method
from ..optim import Recipe
from ..replicas import get_rule
from . import runio
from .checkpoints import Checkpoints
from .config import ConfigError, RunConfig, check_same_run
from .evaluation import evaluate, has_batch_norm, reestimate_batch_norm
from .loggers import make_logger
from .population import evaluate_population, evaluated_record
from .session import Session, SessionPlan

LOG_EVERY = 25  # ticks between reads of the head's loss log (each read waits for the device)


class Interrupted(Exception):
    """A signal stopped the run; a checkpoint was written."""


class Diverged(RuntimeError):
    """A training loss, a weight or an evaluation loss became NaN or infinite; the last good
    checkpoint was kept."""


def recipe_of(cfg: RunConfig) -> Recipe:
    return Recipe(
        base_lr=cfg.base_lr,
        momentum=cfg.momentum,
        nesterov=True,
        weight_decay=cfg.weight_decay,
        warmup_epochs=cfg.warmup_epochs,
        warmup_clock=cfg.warmup_clock,
        milestones=tuple(cfg.milestones),
        gamma=cfg.gamma,
        decay=cfg.lr_decay,
        decay_epochs=cfg.epochs if cfg.lr_decay == "cosine" else 0.0,
        final_lr_ratio=cfg.final_lr_ratio,
        scale_lr=cfg.scale_lr,
        optimizer=cfg.optimizer,
        betas=tuple(cfg.adam_betas),
        eps=cfg.adam_eps,
        decay_1d=cfg.decay_1d,
    )


def data_arguments(cfg: RunConfig) -> dict:
    """The arguments of :func:`petra_core.data.build_data` for the run's data."""
    common = dict(batch_size=cfg.batch_size, seed=cfg.seed, subset=cfg.subset, eval_batch_size=cfg.eval_batch_size)
    if cfg.dataset == "synthetic":
        return dict(
            name="synthetic",
            n_train=cfg.synthetic_train,
            n_test=cfg.synthetic_test,
            num_classes=cfg.synthetic_classes,
            **common,
        )
    if cfg.data_kind() == "text":  # windows of context characters; no subset (the config refuses one)
        common.update(context=cfg.context, windows_per_epoch=cfg.windows_per_epoch)
    return dict(name=cfg.dataset, source=cfg.data_source, prepared_dir=cfg.prepared_path(), **common)


def model_arguments(cfg: RunConfig) -> dict:
    """The arguments of :func:`petra_core.families.build` the config decides (the data decides the
    classes and the stem): arch, auxiliary heads, the width where it is set, on a text dataset
    the size and context, and the blocks per stage where they are not 1."""
    out = dict(arch=cfg.arch, width=cfg.width, aux_head=cfg.aux_head)
    if cfg.width is None:  # the arch's own width
        del out["width"]
    if cfg.data_kind() == "text":
        out.update(size=cfg.size, context=cfg.context)
    if cfg.blocks_per_stage != 1:  # only a family that cuts its blocks so takes it (RunConfig.validate)
        out.update(blocks_per_stage=cfg.blocks_per_stage)
    return out


def session_plan(cfg: RunConfig) -> SessionPlan:
    """Everything the run's session is made of, read from its config once (the session never sees it)."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but no CUDA device is visible; allowed here: cpu")
    recipe = recipe_of(cfg)
    try:
        check_phases(cfg.phases, get_method(cfg.method), replicas=cfg.replicas, device=torch.device(cfg.device))
        check_stage_streams(
            cfg.stage_streams,
            devices=[cfg.device],
            replicas=cfg.replicas,
            one_process=cfg.runtime == "simulator",
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None
    rule = get_rule(cfg.replica_rule, stages=cfg.rule_stages, options=cfg.rule_options, seed=cfg.seed)
    data = data_arguments(cfg)
    return SessionPlan(
        runtime=cfg.runtime,
        device=torch.device(cfg.device),
        threads=cfg.threads,
        precision=cfg.precision,
        phases=cfg.phases,
        stage_streams=cfg.stage_streams,
        deterministic=cfg.deterministic,
        dist_timeout=cfg.dist_timeout,
        replicas=cfg.replicas,
        data=data,
        model=model_arguments(cfg),
        seed=cfg.seed,
        channels_last=cfg.channels_last,
        epochs=cfg.epochs,
        prefetch=cfg.prefetch if cfg.prefetch is not None else (4 if cfg.device == "cuda" else 0),
        method=get_method(cfg.method).bounded(cfg.rebuild_span).predicting(cfg.weight_prediction),
        k=cfg.k,
        batch_size=cfg.batch_size,
        recipe=recipe,
        rule=rule,
        placement=cfg.placement,
    )


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


def train(
    cfg: RunConfig,
    run_dir: str | Path,
    *,
    checkpoint_dir: str | Path | None = None,
    on_tick=None,
    log=print,
    until_epoch: int | None = None,
    fault_at: str | None = None,
) -> dict:
    """Run (or resume, or report) the run ``cfg`` in ``run_dir``; returns the final metrics.

    ``until_epoch``: stop after that many epochs (checkpoint written, no metrics.json) and return
    ``{"history": [...]}`` (``petra verify`` retrains the first epochs of a record so).

    The checkpoint lives in ``checkpoint_dir`` (default: ``run_dir``), records in ``run_dir``.
    With ``runtime: distributed`` every rank calls this (under torchrun); all return the metrics.
    ``on_tick(tick)`` is called after every tick, before the ranks agree on stopping (and with
    tick -1 once this process has joined the run, before its pipeline is built). ``fault_at``: the
    ``--fault-at`` list that made ``on_tick`` (run/faults.py), recorded in ``env.json``.
    """
    run_dir = Path(run_dir)
    config_file = run_dir / runio.CONFIG
    check_same_run(run_dir, runio.read_yaml(config_file) if config_file.exists() else None, cfg)
    if (run_dir / runio.METRICS).exists():
        log(f"{run_dir}: already finished")
        return runio.read_json(run_dir / runio.METRICS)
    checkpoints = Checkpoints(Path(checkpoint_dir) if checkpoint_dir is not None else run_dir, cfg)
    manifest = checkpoints.read_manifest()  # before any process waits for another: all read it alike
    # every tick frees and reallocates the same activation-sized host buffers (host_memory.py)
    host_malloc = "retain" if retain_freed_memory() else "system"
    trainer = Trainer(cfg, run_dir, on_tick, log, until_epoch=until_epoch, host_malloc=host_malloc, fault_at=fault_at)
    plan = session_plan(cfg)
    rt = Session(plan, checkpoints, manifest, on_start=None if on_tick is None else lambda: on_tick(-1))
    ok = False
    try:
        metrics = trainer.run(rt)
        ok = True
        return metrics
    except (Interrupted, Diverged, ConfigError, DataError):  # raised by every rank together
        ok = True
        raise
    except BaseException as err:
        rt.failed(err)  # distributed: make the other ranks stop instead of waiting for this one
        raise
    finally:
        rt.close(ok)


class Trainer:
    """One run's training loop in named phases: :meth:`resume`, :meth:`write_run_files`, then per
    tick :meth:`advance` → :meth:`read_head_log` → :meth:`agree` → :meth:`end_epoch` (at an
    epoch's last tick) → :meth:`stop_if_signalled`, and :meth:`finish`. Every rank of a
    distributed run runs the same phases at the same ticks (the collectives keep them in step). It is
    made from the config before the session exists; :meth:`run` trains the session's pipeline."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        on_tick=None,
        log=print,
        *,
        until_epoch: int | None = None,
        host_malloc: str = "system",
        fault_at: str | None = None,
    ):
        self.cfg, self.run_dir, self.on_tick, self.log = cfg, run_dir, on_tick, log
        self.until_epoch = until_epoch
        self.host_malloc = host_malloc  # what retain_freed_memory() set: "retain" or "system" (env.json)
        self.fault_at = fault_at  # faults injected on purpose (--fault-at), said in env.json
        self.rt: Session | None = None
        self.history: list[dict] = []
        self.saved = {"tick": None, "epochs": 0}  # the checkpoint on disk
        self.checked = 0  # head-log records already checked for a finite loss
        self.tick_time, self.images_done = 0.0, 0
        self.fidelity = None
        self.logger = make_logger(cfg.logger, run_dir)  # history.csv or TensorBoard, if asked for

    # ---- the phases -------------------------------------------------------------------------------
    def resume(self) -> None:
        """Continue from the checkpoint, if there is one (weights, in-flight state, history)."""
        rt, pipe = self.rt, self.pipe
        observers, resumed = None, rt.has_checkpoint()
        if resumed:
            self.history, observers = rt.load_checkpoint()
            if rt.is_main:
                if self.history:  # a run dir restored from a checkpoint alone gets its history back
                    runio.write_json(self.run_dir / runio.HISTORY, self.history)
                self.log(
                    f"{self.run_dir}: resuming at tick {pipe.tick} of {pipe.schedule.num_ticks} "
                    f"(epoch {len(self.history)})"
                )
        self.saved = {"tick": pipe.tick if rt.checkpoint_path.exists() else None, "epochs": len(self.history)}
        self.fidelity = FidelityLog(
            self.run_dir / runio.FIDELITY,
            pipe,
            self.cfg.fidelity_every,
            resumed=resumed,
            state=(observers or {}).get("fidelity"),
        )
        self.checked = len(pipe.head_log)

    def write_run_files(self) -> None:
        def write():
            runio.write_yaml(self.run_dir / runio.CONFIG, self.cfg.to_dict())
            env = {**runio.environment(self.cfg.device), **self.rt.environment(), "host_malloc": self.host_malloc}
            if self.fault_at:
                env["fault_at"] = self.fault_at
            runio.write_json(self.run_dir / runio.ENV, env)

        self.rt.on_main(write)

    def _attach(self, session: Session) -> None:
        """Train ``session``'s pipeline."""
        self.rt, self.pipe = session, session.pipe
        self.B, self.G = session.batches_per_epoch, session.stream_batches_per_epoch  # per replica; the stream's
        self.epoch_end = {self.pipe.schedule.backward_tick((e + 1) * self.B - 1, 0): e for e in range(self.cfg.epochs)}

    def run(self, session: Session) -> dict:
        """Every phase, from resuming to the final metrics."""
        self._attach(session)
        self.resume()
        self.write_run_files()
        cfg, pipe = self.cfg, self.pipe
        progress = Progress(pipe.schedule, self.B, cfg, disable=not (cfg.progress and self.rt.is_main))
        progress.to_tick(pipe.tick)
        bar = progress.bar
        with stop_on_signals() as stop, bar:
            while not pipe.done:
                self.advance()
                progress.to_tick(pipe.tick)
                epoch = self.epoch_end.get(pipe.tick - 1)
                diverged = None
                if pipe.tick % LOG_EVERY == 0 or epoch is not None or pipe.done or stop["signal"]:
                    diverged = self.read_head_log(bar)
                if self.on_tick is not None:
                    self.on_tick(pipe.tick)
                signalled = self.agree(stop["signal"], diverged)
                if epoch is not None:
                    self.end_epoch(epoch)
                    if self.until_epoch is not None and len(self.history) >= self.until_epoch and not pipe.done:
                        return {"history": self.history}
                self.stop_if_signalled(signalled)
        return self.finish()

    def advance(self) -> None:
        start = time.perf_counter()
        self.pipe.advance()
        self.tick_time += time.perf_counter() - start

    def read_head_log(self, bar) -> str | None:
        """Read the heads' losses (a device -> host copy); what is wrong with the first non-finite one."""
        diverged = None
        records = self.pipe.head_log  # where a head lives
        for r in records[self.checked :]:
            self.images_done += r.n
            if not math.isfinite(r.loss) and diverged is None:
                diverged = (
                    f"training loss is {r.loss} at minibatch {r.mb} (epoch {r.mb // self.G + 1}, "
                    f"batch {r.mb % self.G + 1})"
                )
        self.checked = len(records)
        if records:
            bar.set_postfix(loss=f"{records[-1].loss:.3f}", img_s=f"{self.images_done / max(self.tick_time, 1e-9):.0f}")
        return diverged

    def agree(self, signal: str | None, diverged: str | None) -> str | None:
        """Every rank's verdict on this tick: a non-finite loss anywhere stops the run; the signals."""
        signalled, diverged = self.rt.agree(signal, diverged)
        if diverged is not None:
            self.diverged(diverged)
        return signalled

    def end_epoch(self, epoch: int) -> None:
        """Check the weights, evaluate when due, append the epoch's record, write a checkpoint."""
        rt, pipe, cfg, G = self.rt, self.pipe, self.cfg, self.G
        if not rt.all_finite():
            self.diverged(f"weights are NaN or infinite after epoch {epoch + 1} (minibatch {(epoch + 1) * G - 1})")
        due = (epoch + 1) % cfg.eval_every == 0 or epoch == cfg.epochs - 1
        logs = pipe.gather_object([r for r in pipe.head_log if epoch * G <= r.mb < (epoch + 1) * G])
        model = rt.model_for_eval() if due else None

        def record():
            log_records = [r for part in logs for r in part]
            lr = pipe.workers[0].optimizer.param_groups[0]["lr"]  # stage 0's (rank 0)
            # the epoch's own images over the time of the ticks since the last epoch's end (a pipeline's
            # head is J - 1 minibatches ahead of stage 0's backward: counting what the head had seen
            # gave a short run's last epoch no images)
            images = sum(r.n for r in log_records)
            entry = epoch_record(epoch, log_records, lr, model, rt.data, self.tick_time, images, rt.model.family)
            self.history.append(entry)
            runio.write_json(self.run_dir / runio.HISTORY, self.history)
            self.logger.write(self.history)
            with tqdm.external_write_mode():  # above the progress bar, if there is one
                self.log(epoch_line(entry, cfg.epochs, self.history))
            if due and not math.isfinite(entry["test_loss"]):
                return f"test loss is {entry['test_loss']} after epoch {epoch + 1}"
            return None

        diverged = rt.share(rt.on_main(record))
        if diverged is not None:
            self.diverged(diverged)
        self.tick_time, self.images_done = 0.0, 0
        self.checkpoint()

    def stop_if_signalled(self, signalled: str | None) -> None:
        """A signal stops the run at this tick with a checkpoint (raises :class:`Interrupted`)."""
        if not signalled or self.pipe.done:
            return
        if not self.rt.all_finite():  # a NaN loss may lie between two reads of the head's log
            self.diverged(f"weights are NaN or infinite at tick {self.pipe.tick}")
        self.checkpoint()
        raise Interrupted(
            f"{signalled} at tick {self.pipe.tick}; checkpoint written to {self.rt.checkpoint_path}; "
            f"run the same command again to resume"
        )

    def finish(self) -> dict:
        """The run's metrics (rank 0 writes metrics.json; every rank returns them)."""
        rt, pipe, cfg = self.rt, self.pipe, self.cfg
        steps = pipe.workers[0].steps  # stage 0's (rank 0)
        peaks = pipe.gather_object(
            [sum(w.peak_kept.values()) for w in pipe.workers] if 0 in pipe.world.placement.replicas else []
        )
        # a model without batch norm (a transformer) has no statistics to re-estimate
        model = rt.model_for_eval() if cfg.bn_reestimate_batches and has_batch_norm(rt.model) else None
        floats = rt.floats_sent_per_replica()
        # replicas whose weights a rule keeps identical (the sharded rules' all-gather) form no population
        population = rt.population_for_eval() if cfg.replicas > 1 and not pipe.rule.same_weights else None
        members = population  # the models whose weight average evaluated_model may evaluate
        if population is None and cfg.evaluated_model != "replica0":  # equal weights: replica 0 is the average
            members = [model if model is not None else rt.model_for_eval()]

        def write():
            metrics = final_metrics(self.history, steps, [p for part in peaks for p in part], rt.model.family)
            metrics.update(
                params=rt.model.num_params(),
                aux_params=rt.model.num_params(aux=True),
                stages=len(rt.model),
                stage_kinds=rt.model.kinds,
            )
            if model is not None:
                start = time.perf_counter()
                test = evaluate(reestimate_batch_norm(model, rt.data.train, cfg.bn_reestimate_batches), rt.data.test)
                metrics.update(
                    top1_bn_reestimated=test["top1"],
                    top5_bn_reestimated=test["top5"],
                    test_loss_bn_reestimated=test["test_loss"],
                    bn_reestimate_batches=min(cfg.bn_reestimate_batches, rt.data.train.num_batches),
                    bn_reestimate_time_s=time.perf_counter() - start,
                )
            metrics["floats_sent_per_step"] = floats / steps if steps else None  # per replica, counted by the world
            metrics.update(evaluated_record(cfg.evaluated_model, members, rt.data.test, metrics))
            if population is not None:
                start = time.perf_counter()
                bn_batches = cfg.bn_reestimate_batches if has_batch_norm(rt.model) else 0
                metrics["population"] = evaluate_population(population, rt.data.test, rt.data.train, bn_batches)
                metrics["population_eval_time_s"] = time.perf_counter() - start
            runio.write_json(self.run_dir / runio.METRICS, metrics)
            return metrics

        return rt.share(rt.on_main(write))

    # ---- shared by the phases ---------------------------------------------------------------------
    def checkpoint(self) -> None:
        if self.saved["tick"] != self.pipe.tick:
            self.rt.save_checkpoint(self.history, {"fidelity": self.fidelity.state_dict()})
            self.rt.on_main(self.fidelity.write)  # rewritten whole from the tracker's records
            self.saved.update(tick=self.pipe.tick, epochs=len(self.history))

    def diverged(self, what: str) -> None:
        """Stop the run: ``what`` became NaN or infinite; the last good checkpoint is kept."""
        last = "none" if self.saved["tick"] is None else f"{self.rt.checkpoint_path} (epoch {self.saved['epochs']})"
        raise Diverged(f"{what}; stopped; last good checkpoint: {last}")


class FidelityLog:
    """Optional: every N optimizer steps, each stage's delayed gradient vs the true one (fidelity.csv).

    Observation only (training is bit-identical with or without it). It survives a resume at any
    tick with the same records as an uninterrupted run: the tracker's state travels in the
    checkpoint (``state``) and the file is rewritten whole from it; the batches of a group fetched
    before the checkpoint are fetched again. A checkpoint written without that state (older petra)
    resumes from the file, the rebuilt-input errors of the groups in flight then unknown (NaN).
    """

    def __init__(self, path: Path, sim, every: int, *, resumed: bool = False, state: dict | None = None):
        self.path, self.tracker, self.previous = path, None, None
        if every and not sim.schedule.fixed_weights_in_flight:
            import pandas as pd

            from ..engine.fidelity import track_fidelity

            self.tracker = track_fidelity(sim, every=every)
            if state is not None:
                self.tracker.load_state_dict(state)
            elif resumed and path.exists():
                try:  # a file without a row yet has no header either
                    self.previous = pd.read_csv(path)
                except pd.errors.EmptyDataError:
                    self.previous = None

    def state_dict(self) -> dict | None:
        return None if self.tracker is None else self.tracker.state_dict()

    def write(self) -> None:
        if self.tracker is None:
            return
        import pandas as pd

        frame = self.tracker.frame()
        if self.previous is not None:
            frame = pd.concat([self.previous, frame], ignore_index=True)
        runio.write_text(self.path, frame.to_csv(index=False))


def epoch_record(epoch: int, logs, lr: float, model, data, tick_time: float, images: int, family) -> dict:
    """``logs``: the head's records (HeadRecord) of this epoch, which the model's ``family`` turns
    into training fields (``train_loss``, ``train_acc``); ``model`` None: no evaluation this epoch
    (``eval_every``), the family's test fields recorded as None."""
    n = sum(r.n for r in logs)
    sums = [sum(r.sums[i] for r in logs) for i in range(len(family.train_sums))]
    start = time.perf_counter()
    test = evaluate(model, data.test) if model is not None else dict.fromkeys(family.eval_names)
    return {
        "epoch": epoch + 1,
        **family.train_record(sum(r.loss * r.n for r in logs), sums, n),
        **test,
        "lr": lr,
        "images_per_s": images / max(tick_time, 1e-9),
        "wall_time_s": tick_time,
        "eval_time_s": time.perf_counter() - start,
    }


class Progress:
    """The tqdm bar in minibatches and epochs, not pipeline ticks: a minibatch counts once its
    backward has reached stage 0 (its gradient is complete), so the bar ends with the run and the
    fill and drain ticks move it by nothing."""

    def __init__(self, schedule, batches_per_epoch: int, cfg: RunConfig, disable: bool):
        self.schedule, self.B, self.epochs = schedule, batches_per_epoch, cfg.epochs
        self.total, self.done = cfg.epochs * batches_per_epoch, 0
        self.name = f"{cfg.method} {cfg.arch}"
        self.bar = tqdm(total=self.total, disable=disable, unit="minibatch", desc=self.name)

    def to_tick(self, tick: int) -> None:
        """Count the minibatches whose stage-0 backward ran before ``tick``."""
        done = self.done
        while done < self.total and self.schedule.backward_tick(done, 0) < tick:
            done += 1
        if done != self.done or tick == 0:
            self.bar.update(done - self.done)
            self.done = done
            self.description = f"{self.name} epoch {min(done // self.B + 1, self.epochs)}/{self.epochs}"
            self.bar.set_description(self.description, refresh=False)


NOT_IN_EPOCH_LINE = ("epoch", "lr", "images_per_s", "wall_time_s", "eval_time_s")


def epoch_line(entry: dict, epochs: int, history: list[dict]) -> str:
    """One line per epoch, so that a log without a progress bar (Snakemake, SLURM) shows the run
    going: the epoch's training and test fields (the family's), its speed, and the time left at
    the mean epoch time so far."""
    fields = ", ".join(
        f"{key} {value:.4g}"
        for key, value in entry.items()
        if key not in NOT_IN_EPOCH_LINE and isinstance(value, (int, float))
    )
    per_epoch = sum(h["wall_time_s"] + h["eval_time_s"] for h in history) / len(history)
    eta = timedelta(seconds=round(per_epoch * (epochs - entry["epoch"])))
    unit = "windows/s" if "train_bpc" in entry else "images/s"  # a language model's samples are character windows
    return f"epoch {entry['epoch']}/{epochs}: {fields}, {entry['images_per_s']:.0f} {unit}, ETA {eta}"


def final_metrics(history: list[dict], optimizer_steps: int, peak_kept_bytes: list[int], family=None) -> dict:
    """The run's summary. The last epoch is always evaluated; ``best_top1`` and
    ``top1_last10_mean`` (Fig. 4's "last 10 epochs") use the evaluated epochs among them. A
    ``family`` whose evaluation has no top-1 (a language model) gets :func:`family_metrics`."""
    if family is not None and "top1" not in family.eval_names:
        return family_metrics(history, optimizer_steps, peak_kept_bytes)
    last = history[-1]
    evaluated = [h["top1"] for h in history if h["top1"] is not None]
    tail = [h["top1"] for h in history[-10:] if h["top1"] is not None]
    return {
        "top1": last["top1"],
        "top5": last["top5"],
        "test_loss": last["test_loss"],
        "train_loss": last["train_loss"],
        "train_acc": last["train_acc"],
        "best_top1": max(evaluated),
        "top1_last10_mean": sum(tail) / len(tail),
        "epochs": len(history),
        "optimizer_steps": optimizer_steps,
        "peak_kept_bytes": peak_kept_bytes,
        "images_per_s": sum(h["images_per_s"] * h["wall_time_s"] for h in history)
        / sum(h["wall_time_s"] for h in history),
        "wall_time_s": sum(h["wall_time_s"] + h["eval_time_s"] for h in history),
    }


def family_metrics(history: list[dict], optimizer_steps: int, peak_kept_bytes: list[int]) -> dict:
    """The summary of a run whose family has no top-1 (a language model): the last epoch's training
    and test fields (the family's: loss, bits per character, perplexity, accuracy), the lowest test
    loss over the evaluated epochs, and the same counts as an image run's."""
    last = history[-1]
    fields = {key: value for key, value in last.items() if key not in NOT_IN_EPOCH_LINE}
    evaluated = [h["test_loss"] for h in history if h["test_loss"] is not None]
    return {
        **{key: value for key, value in fields.items() if key.startswith("test_")},
        **{key: value for key, value in fields.items() if key.startswith("train_")},
        "best_test_loss": min(evaluated),
        "epochs": len(history),
        "optimizer_steps": optimizer_steps,
        "peak_kept_bytes": peak_kept_bytes,
        "images_per_s": sum(h["images_per_s"] * h["wall_time_s"] for h in history)
        / sum(h["wall_time_s"] for h in history),
        "wall_time_s": sum(h["wall_time_s"] + h["eval_time_s"] for h in history),
    }
