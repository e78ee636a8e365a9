"""Sharded data parallelism and the overlap of its communication: ``zero1``, ``dpu``, ``wp``, ``acco``.

ACCO ("Accumulate while you Communicate", Nabli, Fournier, Erbacher, Serrano, Belilovsky, Oyallon)
overlaps a round of communication (the mean gradient and the optimizer step, sharded as in ZeRO-1:
``sharded.py``) with the next round of gradient computation. Each rule here is a schedule of
*rounds* over the stage's flat gradient: a round reduce-scatters the copies' gradients, steps
each replica's shard of the optimizer (a *tentative* step is undone afterwards: parameters and
optimizer state restored, bit for bit), and all-gathers the parameters it produced. A round's
result is a *version* of the weights, named (kind, step): ``("theta", t)`` are the real weights
θ_t of step t, ``("tilde", t)`` and ``("hat", t)`` predictions of them. Before every forward the
rule puts into the stage the version its compute side needs (:meth:`ShardedRule.wanted`):

* ``zero1``: θ_{t+1} = Opt(θ_t, ḡ_t), the exact mean (DDP's update, ZeRO-1's memory); the round
  of step t is needed right at step t + 1: nothing overlaps.
* ``dpu`` (``warmup`` = w): the one-step-delayed update θ_{t+1} = Opt(θ_t, ḡ_{t−1}), ḡ_s the mean
  gradient computed at θ_s; the round of step t runs during step t + 1. The first ``warmup``
  steps are exact (as zero1); the first delayed step applies nothing new (θ_{w+1} = θ_w), as the
  first step of w = 0 has nothing to apply. With w = 0 it is ``cdp1`` on sharded optimizers.
* ``wp`` (weight prediction): as dpu, but step s computes its gradient at θ̂_{s+1} =
  Opt(θ_s, ḡ_{s−2}), the last mean gradient applied a second time (tentatively) to predict the
  weights the gradient will be applied to; one round makes θ_{t+2} and θ̂_{t+3} from ḡ_t.
* ``acco``: step t's k micro-batches split in two halves of h = k // 2 and k − h. The first half
  computes g̃_t at θ̃_t (while the real round of step t − 1 makes θ_t), the second g_t at θ_t
  (while the tentative round makes θ̃_{t+1} = Opt(θ_t, mean g̃_t)); θ_{t+1} = Opt(θ_t, the
  count-weighted mean of g̃_t and g_t). θ̃_0 = θ_0. So g_t is computed on exactly the weights it
  updates and g̃_t on a prediction of them; no step is delayed. ``first_round``: ``petra`` splits
  step 0 as every step; ``official`` puts one micro-batch in step 0's first half, as the authors'
  code does (its first tentative round sends the gradient of the one batch it computed to set up
  its buffers), and k − 1 in the second. That is the official round 0 exactly at k = 2 only
  (``results/official/acco.json``): the official step 0 holds 1 + k/2 micro-batches, which
  petra's fixed k per step cannot express for k > 2 (``acco_k4.json``, docs/conventions.md).

Here the accumulation count is fixed (the worker's k), so every replica computes the same
micro-batches in every round and the simulator and torch.distributed agree bit for bit. On ranks
the rounds run on a communication thread, in the order they were asked for, while the rank goes
on computing; the stage waits for a version only when its compute needs it. ACCO as published
accumulates until communication is done (a variable count): that *timing mode* is
``petra_core.replicas.timing``, used by ``benchmarks/bench_acco.py``.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

from torch import Tensor

from ..methods.schedule import Schedule, Sequential
from .options import RuleOptions
from .rule import ReplicaRule
from .sharded import FlatLayout, ShardedOptimizer

Key = tuple[str, int]  # a version of the weights: (kind, step)


@dataclass
class Cell:
    """What the rule keeps for one copy (one replica's copy of one stage)."""

    layout: FlatLayout
    shard: ShardedOptimizer
    versions: dict = field(default_factory=dict)  # Key -> Tensor (flat, R·S) or Future of one
    loaded: Key = ("theta", 0)  # the version the stage's parameters hold
    tentative: int = -1  # acco: the last step whose tentative round was asked for
    peak: int = 0  # the most bytes of weight versions held at once (measured before each forward)


@dataclass
class Ask:
    """One replica's part of a round: its flat gradient, the learning rates of its schedule at that
    step, and what the round makes of them (the steps in order, each "real" or "tentative", and the
    version each result is)."""

    grad: Tensor
    lrs: list[float]
    outputs: list[tuple[str, Key]]


class ShardedRule(ReplicaRule):
    """``zero1``: every copy steps with the exact mean gradient, through a sharded optimizer.

    The base of the overlapping rules: a copy's own optimizer never steps (``complete`` returns
    False; it keeps the learning-rate schedule), the rounds step the shards."""

    name = "zero1"
    same_weights = True  # every replica loads the same all-gathered versions

    def __init__(self, **settings):
        super().__init__(**settings)
        self.cells: dict[tuple[int, int], Cell] = {}  # (stage, replica) -> Cell
        self.asks: dict[tuple[int, str, int], dict[int, Ask]] = {}  # (stage, round kind, step) -> replica -> Ask
        self.record = False  # keep the mean gradient each real round applied (tests)
        self.applied: dict[tuple[int, int, int], Tensor] = {}  # (stage, replica, step) -> applied mean gradient
        self._thread: ThreadPoolExecutor | None = None
        self._saved: dict = {}  # a loaded checkpoint's cells, taken by each cell when it is built

    # ---- the rule's own schedule (what subclasses change) -----------------------------------------
    def wanted(self, copy) -> Key:
        """The version of the weights the copy computes its next micro-batch at."""
        return ("theta", copy.steps)

    def initial(self, cell: Cell) -> None:
        """The versions that exist before any round (θ_0 is in ``versions`` already)."""

    def step_round(self, copy, cell: Cell) -> tuple[Tensor, list[tuple[str, Key]]]:
        """The round asked for when the copy has accumulated its step: (gradient, outputs)."""
        return cell.layout.grads(), [("real", ("theta", copy.steps + 1))]

    # ---- the hooks of the replica-rule contract ------------------------------------------------------
    def contribute(self, copy, group) -> None:
        cell = self.cell(copy, group)
        grad, outputs = self.step_round(copy, cell)
        self.ask(copy, group, "step", grad, outputs)

    def complete(self, copy, group) -> bool:
        return False  # the rounds step the shards; the copy's optimizer only advances its schedule

    def before_forward(self, copy, group) -> None:
        cell = self.cell(copy, group)
        wanted = self.wanted(copy)
        self.load(cell, wanted)
        for key in [
            key
            for key in cell.versions  # what no one can want any more: past steps, and an
            if key[1] < copy.steps or (key[1] == copy.steps and key not in (wanted, ("theta", copy.steps)))
        ]:
            cell.versions.pop(key)  # acco's θ̃_t once its first half is done
        flat = cell.layout.replicas * cell.layout.S * cell.layout.params[0].element_size()
        cell.peak = max(cell.peak, flat * len(cell.versions))

    def settle(self, copy, group) -> None:
        """Before anyone reads the weights: the stage holds the real weights of its step."""
        if (copy.index, copy.replica) in self.cells:
            self.load(self.cells[copy.index, copy.replica], ("theta", copy.steps))

    # ---- rounds -------------------------------------------------------------------------------------
    def cell(self, copy, group) -> Cell:
        key = (copy.index, copy.replica)
        if key not in self.cells:
            layout = FlatLayout(copy.optimizer, group.size)
            cell = Cell(layout, ShardedOptimizer(copy.optimizer, layout, copy.replica))
            cell.versions[("theta", 0)] = layout.values()
            self.initial(cell)
            self._restore(key, cell)  # a resumed run: the checkpoint's shard and versions
            self.cells[key] = cell
        return self.cells[key]

    def ask(self, copy, group, kind: str, grad: Tensor, outputs: list[tuple[str, Key]]) -> None:
        """Give this copy's part of a round; once every copy this process holds has, it starts."""
        key = (copy.index, kind, copy.steps)
        lrs = [g["lr"] for g in copy.optimizer.param_groups]  # the schedule's, now: the thread reads no live state
        asks = self.asks.setdefault(key, {})
        asks[copy.replica] = Ask(grad, lrs, outputs)
        if len(asks) < group.local:
            return
        self.asks.pop(key)
        replicas = sorted(asks)
        cells = [self.cells[copy.index, r] for r in replicas]
        parts = [asks[r] for r in replicas]

        def run() -> list[Tensor]:
            return self.run_round(group, copy.index, copy.steps, replicas, cells, parts)

        if group.overlaps:  # a rank: the round runs while this rank computes
            if self._thread is None:
                self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="petra-rounds")
            done = self._thread.submit(run)
            results = [_Later(done, i) for i in range(len(parts[0].outputs))]
        else:
            results = run()
        for cell, part in zip(cells, parts):
            for (_, version), result in zip(part.outputs, results):
                cell.versions[version] = result

    def run_round(
        self, group, stage: int, step: int, replicas: list[int], cells: list[Cell], parts: list[Ask]
    ) -> list[Tensor]:
        """Reduce-scatter, the shards' steps, all-gather: the flat weights of each output."""
        shards = group.reduce_scatter_mean([p.grad for p in parts])()
        made: list[list[Tensor]] = [[] for _ in parts[0].outputs]
        for r, cell, part, grad in zip(replicas, cells, parts, shards):
            for i, (how, _) in enumerate(part.outputs):
                if how == "tentative":
                    before = cell.shard.snapshot()
                    made[i].append(cell.shard.step(grad, part.lrs))
                    cell.shard.restore(before)
                else:
                    made[i].append(cell.shard.step(grad, part.lrs))
                    if self.record:
                        self.applied[stage, r, step] = grad.clone()  # this replica's slice of the mean
        return [group.all_gather(shards_of_output)().reshape(-1) for shards_of_output in made]

    def load(self, cell: Cell, key: Key) -> None:
        if cell.loaded == key:
            return
        if key not in cell.versions:
            raise RuntimeError(f"replica rule {self.name!r}: weights {key} are needed before a round made them")
        value = cell.versions[key]
        if isinstance(value, _Later):
            value = cell.versions[key] = value.result()
        cell.layout.load(value)
        cell.loaded = key

    def drain(self) -> None:
        """Wait for every round under way (their versions become tensors)."""
        for cell in self.cells.values():
            for key, value in list(cell.versions.items()):
                if isinstance(value, _Later):
                    cell.versions[key] = value.result()

    # ---- what it holds ------------------------------------------------------------------------------
    def memory_bytes(self) -> dict[str, int]:
        """Bytes one replica holds besides its stages' parameters and gradients (the replica that
        holds most): its shards' optimizer state, the shards' own float copies of their scalars, and
        the most the weight versions took at once."""
        per: dict[int, dict[str, int]] = {}
        for (_, r), cell in self.cells.items():
            row = per.setdefault(r, {"optimizer_state": 0, "shard": 0, "versions": 0})
            row["optimizer_state"] += cell.shard.state_bytes()
            row["shard"] += sum(t.numel() * t.element_size() for t in cell.shard.tensors)
            row["versions"] += cell.peak
        return max(per.values(), key=lambda row: sum(row.values())) if per else {}

    def state_dict(self) -> dict:
        if self.asks:
            raise RuntimeError("a checkpoint in the middle of a round (some replicas have not given their part)")
        self.drain()
        return {
            key: {
                "shard": cell.shard.state_dict(),
                "loaded": cell.loaded,
                "peak": cell.peak,
                "versions": {k: v.detach().cpu() for k, v in cell.versions.items()},
                "tentative": cell.tentative,
            }
            for key, cell in self.cells.items()
        }

    def load_state_dict(self, state: dict) -> None:
        self._saved = dict(state)  # the cells are built at first use (they need the copies' optimizers)

    def _restore(self, key: tuple[int, int], cell: Cell) -> None:
        saved = self._saved.pop(key, None)
        if saved is None:
            return
        device = cell.layout.params[0].device
        cell.shard.load_state_dict(saved["shard"])  # copied onto the shard's device, its state cast by torch
        cell.versions = {tuple(k): v.to(device) for k, v in saved["versions"].items()}
        cell.loaded, cell.peak = tuple(saved["loaded"]), saved.get("peak", 0)
        cell.tentative = saved.get("tentative", -1)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None


class _Later:
    """Output ``index`` of a round running on the communication thread."""

    def __init__(self, future: Future, index: int):
        self.future, self.index = future, index

    def result(self) -> Tensor:
        return self.future.result()[self.index]


@dataclass(frozen=True)
class DPUOptions(RuleOptions):
    warmup: int = 0  # exact steps before the delay

    def check(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"warmup={self.warmup!r} is not allowed; allowed: an integer >= 0 (exact steps first)")


class DPU(ShardedRule):
    """``dpu``: θ_{t+1} = Opt(θ_t, ḡ_{t−1}) after ``warmup`` exact steps; the round of step t runs
    during step t + 1."""

    name = "dpu"
    Options = DPUOptions

    def step_round(self, copy, cell):
        t, warmup = copy.steps, self.options.warmup
        if t < warmup:
            return cell.layout.grads(), [("real", ("theta", t + 1))]
        if t == warmup:  # the first delayed step has nothing new to apply
            cell.versions[("theta", t + 1)] = cell.versions[("theta", t)]
        return cell.layout.grads(), [("real", ("theta", t + 2))]


class WeightPrediction(ShardedRule):
    """``wp``: dpu whose step s computes at θ̂_{s+1} = Opt(θ_s, ḡ_{s−2}) (a second, tentative step
    with the last mean gradient)."""

    name = "wp"

    def initial(self, cell):
        theta0 = cell.versions[("theta", 0)]
        for key in (("theta", 1), ("hat", 1), ("hat", 2)):  # nothing to apply or predict with yet
            cell.versions[key] = theta0

    def wanted(self, copy):
        return ("hat", copy.steps + 1)

    def step_round(self, copy, cell):
        t = copy.steps
        return cell.layout.grads(), [("real", ("theta", t + 2)), ("tentative", ("hat", t + 3))]


@dataclass(frozen=True)
class ACCOOptions(RuleOptions):
    first_round: Literal["petra", "official"] = "petra"  # step 0's first half: k // 2 or 1 micro-batch


class ACCO(ShardedRule):
    """``acco``: half of each step's micro-batches at θ̃_t, half at θ_t; a tentative round makes
    θ̃_{t+1} while the second half computes, the real round θ_{t+1} while the next first half does."""

    name = "acco"
    schedules = (Sequential,)
    Options = ACCOOptions

    def check(self, *, schedule: type[Schedule], k: int) -> None:
        super().check(schedule=schedule, k=k)
        if k < 2:
            raise ValueError(
                f"replica rule 'acco' needs k >= 2 micro-batches per step (half at the predicted "
                f"weights, half at the real ones), got k={k}"
            )

    def initial(self, cell):
        cell.versions[("tilde", 0)] = cell.versions[("theta", 0)]

    def half(self, copy) -> int:
        """The micro-batches of step ``copy.steps`` computed at the predicted weights θ̃."""
        if copy.steps == 0 and self.options.first_round == "official":
            return 1
        return copy.k // 2

    def wanted(self, copy):
        return ("tilde", copy.steps) if copy.pending < self.half(copy) else ("theta", copy.steps)

    def before_forward(self, copy, group) -> None:
        cell = self.cell(copy, group)
        if copy.pending == self.half(copy) and cell.tentative < copy.steps:  # the first half is done
            cell.tentative = copy.steps
            # the gradients go on accumulating over the second half (as in the authors' code): the
            # real round sends the sum of both halves; the tentative one the first half's mean
            mean_of_half = cell.layout.grads() * (copy.k / self.half(copy))
            self.ask(copy, group, "tentative", mean_of_half, [("tentative", ("tilde", copy.steps + 1))])
        super().before_forward(copy, group)

    def step_round(self, copy, cell):
        # both halves' gradients, the mean over the step's k micro-batches (a partial last step: the
        # runner has scaled them by k / pending already)
        return cell.layout.grads(), [("real", ("theta", copy.steps + 1))]
