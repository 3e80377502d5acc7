#!/usr/bin/env python3
"""PyTorch's figures for the three measurements of `xpu bench cuda`, on cuda:0.

- h2d / d2h: a pinned host tensor (`torch.empty(n, dtype=torch.uint8,
  pin_memory=True)`) copied to / from a device tensor of the same size with
  `dst.copy_(src, non_blocking=True)` followed by `torch.cuda.synchronize()`, in GB/s.
- launch: the cheapest single kernel launch PyTorch offers followed by
  `torch.cuda.synchronize()`, in microseconds. That is `torch.cuda._sleep(0)`: one
  launch of a one-thread spin kernel told to spin for 0 cycles, straight from C++
  without the operator dispatcher. Where a build lacks it, a 1-element `fill_(0)`
  (one launch through the dispatcher) is used instead; "launch_op" says which.
  "launch_fill" always times the 1-element `fill_(0)` too, the cheapest launch an
  ordinary tensor operation makes.

Rounds and iterations follow `xpu bench cuda`: `--rounds` rounds (default 20) of
`clamp(256 MiB / size, 1, 64)` copies or 200 launches each, after a warm-up; mean and
p50 are over the rounds' time per operation (GB/s from that time). Prints one JSON
object. Without torch, or without a CUDA device, prints {"skipped": reason} and exits
0. Python 3 standard library and torch only.

    python3 benches/torch/cuda_copy_launch.py [--rounds N] [--size BYTES] [--json]
"""

import argparse
import json
import statistics
import sys
import time

LAUNCH_ITERS = 200


def parse_bytes(text):
    """`64M` -> 67108864 (K, M, G, T binary suffixes, as `xpu` reads them)."""
    t = text.strip().upper().rstrip("B").rstrip("I")
    shift = {"K": 10, "M": 20, "G": 30, "T": 40}.get(t[-1:], 0)
    digits = t[:-1] if shift else t
    if not digits.isdigit() or int(digits) == 0:
        raise argparse.ArgumentTypeError(f"`{text}` is not a positive byte count (e.g. 64M)")
    return int(digits) << shift


def copy_iters(size):
    return max(1, min(64, (256 << 20) // max(1, size)))


def rounds_of(rounds, iters, warmup, op):
    for _ in range(warmup):
        op()
    seconds = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(iters):
            op()
        seconds.append((time.perf_counter() - t) / iters)
    return seconds


def stats(seconds, to_unit):
    return {"mean": to_unit(statistics.fmean(seconds)), "p50": to_unit(statistics.median(seconds))}


def skip(reason):
    print(json.dumps({"skipped": reason}))
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="measurement rounds (default 20)")
    ap.add_argument("--size", type=parse_bytes, default=64 << 20, help="bytes per copy (default 64M)")
    ap.add_argument("--json", action="store_true", help="accepted for symmetry with xpu; the output is always JSON")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install
        return skip(f"torch cannot be imported: {e}")
    try:
        if not torch.cuda.is_available():
            return skip(f"torch {torch.__version__} sees no CUDA device (torch.version.cuda={torch.version.cuda})")
        torch.cuda.set_device(0)
        size, rounds, iters = args.size, args.rounds, copy_iters(args.size)
        gbs = lambda t: size / t / 1e9
        micros = lambda t: t * 1e6
        host_src = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        host_dst = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        host_src.fill_(7)
        host_dst.fill_(0)
        dev = torch.empty(size, dtype=torch.uint8, device="cuda:0")
        sync = torch.cuda.synchronize

        def h2d():
            dev.copy_(host_src, non_blocking=True)
            sync()

        def d2h():
            host_dst.copy_(dev, non_blocking=True)
            sync()

        one = torch.empty(1, dtype=torch.float32, device="cuda:0")

        def fill():
            one.fill_(0)
            sync()

        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is not None:
            def launch():
                sleep(0)
                sync()
            launch_op = "torch.cuda._sleep(0): one launch of a one-thread spin kernel, 0 cycles, no dispatcher"
        else:
            launch = fill
            launch_op = "torch.empty(1, device='cuda').fill_(0): one launch through the dispatcher"
        mib = size / (1 << 20)
        figures = {
            "h2d": {"name": f"copy host→device {mib:.0f} MiB, pinned", "unit": "GB/s",
                    **stats(rounds_of(rounds, iters, 2, h2d), gbs)},
            "d2h": {"name": f"copy device→host {mib:.0f} MiB, pinned", "unit": "GB/s",
                    **stats(rounds_of(rounds, iters, 2, d2h), gbs)},
            "launch": {"name": "launch + synchronize", "unit": "µs",
                       **stats(rounds_of(rounds, LAUNCH_ITERS, 50, launch), micros)},
            "launch_fill": {"name": "1-element fill_ + synchronize", "unit": "µs",
                            **stats(rounds_of(rounds, LAUNCH_ITERS, 50, fill), micros)},
        }
        report = {
            "device": "cuda:0",
            "name": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "size": size,
            "rounds": rounds,
            "copy_iters": iters,
            "launch_iters": LAUNCH_ITERS,
            "launch_op": launch_op,
            "figures": figures,
        }
    except Exception as e:  # a CUDA error: report it, as a failure
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 1
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
