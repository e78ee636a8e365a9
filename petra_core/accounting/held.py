"""What is really held: distinct tensor storages kept by storage policies, and allocator-level bytes.

Two independent measurements, both observation only:

* :func:`held_by_stage` walks what each stage's storage policy keeps between forward and backward
  (buffered inputs, weight stashes, and for kept graphs the output, the input leaves and every
  tensor saved by the autograd graph) and sums the bytes of *distinct storages*, leaving out the
  stage's live parameters (they are model memory, not buffers).
* :class:`AllocationMeter` counts bytes allocated and not freed by the CPU allocator while a block
  runs (``torch.profiler`` memory events), so nothing that holds memory can hide from it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator

from torch import Tensor
from torch.profiler import ProfilerActivity, profile

# attribute of a storage policy -> kind of buffer (processed in this order: a stashed weight saved
# by the graph counts as stash, once)
KINDS = {"stashes": "weight_stash", "inputs": "input", "records": "graph"}


def storage_key(t: Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def saved_by_graph(root: Tensor) -> Iterator[Tensor]:
    """Every tensor saved by the autograd graph that ends in ``root`` (walks ``_saved_*`` fields)."""
    seen, stack = set(), [root.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        for name in dir(fn):
            if not name.startswith("_saved_"):
                continue
            value = getattr(fn, name)
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(v, Tensor):
                    yield v
        stack.extend(nxt for nxt, _ in fn.next_functions)


def tensors_in(obj, _depth: int = 0) -> Iterator[Tensor]:
    """Tensors reachable from ``obj`` (containers, dataclasses, local graphs), graph-saved ones included."""
    if _depth > 8:
        return
    if isinstance(obj, Tensor):
        yield obj
        if obj.grad_fn is not None:
            yield from saved_by_graph(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors_in(v, _depth + 1)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for v in obj:
            yield from tensors_in(v, _depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for v in vars(obj).values():
            yield from tensors_in(v, _depth + 1)


def held_by_policy(policy, exclude: Iterable[Tensor] = ()) -> dict[str, int]:
    """Bytes of distinct storages a storage policy holds now, by kind (input, graph, weight_stash)."""
    seen = {storage_key(t) for t in exclude}
    held: dict[str, int] = {}
    attrs = sorted(vars(policy), key=lambda a: list(KINDS).index(a) if a in KINDS else len(KINDS))
    for attr in attrs:
        kind = KINDS.get(attr, attr)
        for t in tensors_in(getattr(policy, attr)):
            key = storage_key(t)
            if key[1] == 0 or key in seen:
                continue
            seen.add(key)
            held[kind] = held.get(kind, 0) + key[1]
    return held


def held_by_stage(workers) -> list[dict]:
    """Tidy rows (stage, kind, policy, buffer, held_bytes, reported_bytes) for every worker now.

    ``reported_bytes`` is what the policy's own ``kept_bytes()`` says, to check it against reality.
    """
    rows = []
    for w in workers:
        held = held_by_policy(w.storage, exclude=list(w.stage.parameters()) + list(w.stage.buffers()))
        reported = w.storage.kept_bytes()
        for buf in sorted(set(held) | set(reported)):
            rows.append(
                dict(
                    stage=w.index,
                    kind=w.stage.kind,
                    policy=w.storage.name,
                    buffer=buf,
                    held_bytes=held.get(buf, 0),
                    reported_bytes=reported.get(buf, 0),
                )
            )
    return rows


class AllocationMeter:
    """``with AllocationMeter() as m: ...`` then ``m.net_bytes``: CPU bytes allocated, not freed, inside."""

    net_bytes: int | None = None

    def __enter__(self) -> AllocationMeter:
        gc.collect()  # garbage of earlier work, freed inside, would count as a negative allocation
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._prof.__exit__(*exc)
        try:  # the raw allocator events: fast
            raw = self._prof.profiler.kineto_results.events()
            self.net_bytes = int(sum(e.nbytes() for e in raw if e.name() == "[memory]"))
        except AttributeError:  # pragma: no cover - older/newer profiler internals
            self.net_bytes = int(sum(e.self_cpu_memory_usage for e in self._prof.events()))


def held_total(workers) -> int:
    """Bytes of distinct storages held by all storage policies together (one process: a stage's
    kept output and the next stage's kept input are one storage, counted once)."""
    exclude = [t for w in workers for t in (*w.stage.parameters(), *w.stage.buffers())]
    seen = {storage_key(t) for t in exclude}
    total = 0
    for w in workers:
        for t in tensors_in(w.storage):
            key = storage_key(t)
            if key not in seen:
                seen.add(key)
                total += key[1]
    return total
