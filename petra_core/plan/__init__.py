"""``petra plan``: a calibrated cluster model of petra's pipelines.

Given a model, a method, a device profile (per-stage phase times and bytes) and a cluster card
(devices, memory, links), the planner replays the method's action table as an event simulation
(``simulate``) and answers: time per minibatch and per epoch, speedup, bubble, peak memory per
device, communication. ``search`` finds the minimum devices, the best split and the largest RevNet
that fits; ``validate`` checks predictions against real (emulated) multi-process runs.

Modules, one job each: ``cluster`` (cards), ``profile`` (device profiles: loaded, saved, checked),
``profiling`` (profiles measured on this CPU or read from results/gpu), ``device_profile`` and
``clock`` (a profile timed on a GPU), ``memory`` (bytes per stage from the accounting, on the meta
device), ``simulate`` (the event simulation), ``search`` (the searches), ``answers`` (the
reviewers' questions), ``formulas`` (closed-form memory per stage: PipeDream's
optimizer, the paper's Table 1), ``validate`` (the harness), ``commands`` (``petra plan``). The measurement
of an emulated multi-process point lives in ``measure`` (the emulated devices' work). This package imports torch only
where a function needs it, so the CLI starts fast.
"""
