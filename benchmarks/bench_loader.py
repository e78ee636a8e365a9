"""How fast the data layer makes training minibatches, alone: images/s on this machine's CPUs.

    python benchmarks/bench_loader.py                      # CIFAR-10 from data/prepared/cifar10 (petra prepare)
    python benchmarks/bench_loader.py --dataset synthetic  # no data needed

A training batch of 32x32 data is a gather from the uint8 array, a batched random crop and flip,
a layout change and normalisation (petra_core.data.stream). Measured three ways: in the calling
thread; through the Prefetcher (a background thread makes batches ahead, the consumer only waits
for what is not ready); and with pinned memory where CUDA exists (what a GPU run does). Compare
with what one GPU consumes (bench_gpu.py's images/s): the loader must stay ahead of it.
"""

from __future__ import annotations

import argparse
import time

import torch

from petra_core.data import Prefetcher, build_data


def rate(get_batch, n: int, batch: int) -> float:
    get_batch(0)  # warm-up: the epoch's permutation, allocator
    start = time.perf_counter()
    for mb in range(1, n + 1):
        get_batch(mb)
    return n * batch / (time.perf_counter() - start)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="cifar10", choices=["cifar10", "synthetic"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the consumer")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.dataset == "synthetic":
        data = build_data("synthetic", batch_size=args.batch, seed=0, n_train=4096, n_test=64)
    else:
        data = build_data("cifar10", prepared_dir="data/prepared/cifar10", batch_size=args.batch, seed=0)
    B = data.train.num_batches

    def get_batch(mb):
        return data.train.batch(mb // B, mb % B)

    results = {"in the calling thread": rate(get_batch, args.batches, args.batch)}
    prefetch = Prefetcher(get_batch, ahead=8)
    results["prefetched (1 background thread)"] = rate(prefetch, args.batches, args.batch)
    prefetch.close()
    if torch.cuda.is_available():
        pinned = Prefetcher(get_batch, ahead=8, pin=True)
        results["prefetched, pinned"] = rate(pinned, args.batches, args.batch)
        pinned.close()
    print(f"{args.dataset}, batch {args.batch}, {args.batches} batches, {torch.get_num_threads()} consumer thread(s)")
    for how, r in results.items():
        print(f"  {how:<36s} {r:10.0f} images/s")
    return results


if __name__ == "__main__":
    main()
