"""What the distributed tests compare a run of the ranks with: the simulator on the same setup."""

import torch

from petra_core import Simulator
from petra_core.replicas import get_rule

from .ranks import demo_setup, method_of, parser


def simulator_state(argv, method):
    """Replica 0's state_dict after the simulator trains the ranks' setup (``argv`` of ranks.py)."""
    args = parser().parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, get_batch, recipe = demo_setup(args)
        Simulator(
            model,
            method_of(method),
            num_batches=args.steps,
            get_batch=get_batch,
            batch_size=args.batch,
            k=args.k,
            recipe=recipe,
            replicas=args.replicas,
            rule=get_rule(args.rule, stages=args.rule_stages, options=args.rule_options, seed=0),
        ).run()
    finally:
        torch.set_num_threads(threads)
    return model.state_dict()


def assert_bit_for_bit(saved, reference, method):
    assert list(saved) == list(reference), method
    differ = [k for k, v in reference.items() if not torch.equal(saved[k], v)]
    assert not differ, f"{method}: {len(differ)} tensors differ from the simulator, e.g. {differ[:3]}"
    if any(v.dtype == torch.int64 for v in reference.values()):  # buffers (num_batches_tracked) compared too
        assert any(v.dtype == torch.int64 for v in saved.values())


def check_outcome(procs):
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{p.err[-3000:]}"
