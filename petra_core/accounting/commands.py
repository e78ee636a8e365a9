"""``petra costs`` (Tables 1 and 3, a fidelity sample) and ``petra cyclic`` (cyclic execution): measurements
into CSVs (picked up by ``petra_core.cli``)."""

from __future__ import annotations

import json


def cmd_costs(args) -> int:
    from . import costs

    settings = json.loads(args.settings) if args.settings else None
    for path in costs.write(costs.measure(settings), args.out):
        print(path)
    return 0


def cmd_cyclic(args) -> int:
    from . import cyclic

    settings = json.loads(args.settings) if args.settings else None
    for path in cyclic.write(cyclic.measure(settings), args.out):
        print(path)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "costs",
        help="measure Table 1 and Table 3 (and a fidelity sample) into CSVs",
        description="Run every method a few minibatches under the accounting recorder (Table 1), "
        "account Table 3 by shape propagation, track a fidelity sample; write CSVs.",
    )
    p.add_argument("--out", required=True, help="output directory, e.g. results/costs")
    p.add_argument(
        "--settings",
        help='JSON overriding petra_core.accounting.costs.DEFAULTS, e.g. \'{"table1": {"image_size": 64}}\'',
    )
    p.set_defaults(func=cmd_costs)
    p = sub.add_parser(
        "cyclic",
        help="measure cyclic execution: memory and gradient traffic per time slot, devices",
        description="Run R replicas in lockstep (DP) and offset (Cyclic Data Parallelism) in the "
        "simulator; write the activation and gradient bytes of every tick, their peaks "
        "and means over one step, and the devices each needs.",
    )
    p.add_argument("--out", required=True, help="output directory, e.g. results/cyclic")
    p.add_argument("--settings", help="JSON overriding petra_core.accounting.cyclic.DEFAULTS, e.g. '{\"replicas\": 8}'")
    p.set_defaults(func=cmd_cyclic)
