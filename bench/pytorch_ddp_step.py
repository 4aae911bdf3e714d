#!/usr/bin/env python3
"""The baseline of bench/step_bench.cpp: the same models, loss, batch and step in PyTorch.

Under torch's own launcher it is DistributedDataParallel over Gloo, one thread per rank:

    python3 -m torch.distributed.run --nproc_per_node 2 bench/pytorch_ddp_step.py --model mlp2m

Without a launcher (no WORLD_SIZE in the environment) it is one process, no DDP, with
--threads threads (the single-process reference). A step is zero_grad, forward,
cross-entropy, backward (DDP all-reduces the gradients in buckets while it runs), optimizer
step. The data is synthetic: a few fixed random batches per rank, cycled.

Rank 0 prints one line in step_bench's format (impl=pytorch), which
bench/run_step_bench.sh reads. Use Debian's python3-torch (/usr/bin/python3).
"""

import argparse
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    """examples/fashion_mnist's CNN (fashion_mnist.cpp), layer for layer: 225k parameters."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, bias=False)
        self.conv2 = nn.Conv2d(32, 64, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.bn2 = nn.BatchNorm2d(64)
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(64 * 5 * 5, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = self.dropout(x).flatten(1)
        return self.fc2(F.relu(self.fc1(x)))


def mlp(widths):
    layers = []
    for i in range(len(widths) - 1):
        if i > 0:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(widths[i], widths[i + 1]))
    return nn.Sequential(*layers)


def make_model(name):
    """The module and one sample's input shape."""
    if name == "cnn":
        return Net(), (1, 28, 28)
    if name == "mlp2m":
        return mlp([784, 1024, 1024, 10]), (784,)
    return mlp([1024, 4096, 4096, 1024, 10]), (1024,)


def make_optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    return torch.optim.Adam(params, lr=1e-3)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["cnn", "mlp2m", "mlp25m"], default="mlp2m")
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads; 0 = 1 under DDP, else OMP_NUM_THREADS or torch's default")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--bucket_cap_mb", type=float, default=25)
    p.add_argument("--gradient_as_bucket_view", type=int, default=1,
                   help="1 (default, PyTorch's faster setting: no gradient copies) or 0")
    a = p.parse_args()

    distributed = "WORLD_SIZE" in os.environ
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    elif distributed:
        torch.set_num_threads(1)
    elif os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    rank, world = 0, 1
    if distributed:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(a.seed)  # the same initial model on every rank (DDP broadcasts rank 0's)
    module, sample_shape = make_model(a.model)
    params = sum(t.numel() for t in module.parameters())
    model = module
    if distributed:
        model = nn.parallel.DistributedDataParallel(
            module, bucket_cap_mb=a.bucket_cap_mb,
            gradient_as_bucket_view=bool(a.gradient_as_bucket_view))
    optimizer = make_optimizer(a.optimizer, model.parameters())

    torch.manual_seed(a.seed * 1000 + rank + 1)
    batches = [(torch.randn((a.batch_size,) + sample_shape),
                torch.randint(0, 10, (a.batch_size,), dtype=torch.long)) for _ in range(4)]

    model.train()
    total, zero, fwd, bwd, opt = [], [], [], [], []
    usage_before = None
    last_loss = 0.0
    clock = time.perf_counter
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            usage_before = resource.getrusage(resource.RUSAGE_SELF)
        x, y = batches[i % len(batches)]
        t0 = clock()
        optimizer.zero_grad(set_to_none=False)  # as LibTorch 1.13's zero_grad: in place
        t1 = clock()
        loss = F.cross_entropy(model(x), y)
        t2 = clock()
        loss.backward()
        t3 = clock()
        optimizer.step()
        t4 = clock()
        if i < a.warmup:
            continue
        total.append((t4 - t0) * 1e3)
        zero.append((t1 - t0) * 1e3)
        fwd.append((t2 - t1) * 1e3)
        bwd.append((t3 - t2) * 1e3)
        opt.append((t4 - t3) * 1e3)
        last_loss = loss.item()
    usage_after = resource.getrusage(resource.RUSAGE_SELF)
    faults = usage_after.ru_minflt - usage_before.ru_minflt
    cpu_ms = ((usage_after.ru_utime + usage_after.ru_stime)
              - (usage_before.ru_utime + usage_before.ru_stime)) * 1e3

    if rank == 0:
        mean = statistics.fmean(total)
        print(f"step_bench: impl=pytorch mode={'ddp' if distributed else 'plain'} "
              f"comm={'gloo' if distributed else 'none'} world={world} model={a.model} "
              f"params={params} optimizer={a.optimizer} batch={a.batch_size} "
              f"threads={torch.get_num_threads()} steps={a.steps} warmup={a.warmup} "
              f"median_ms={statistics.median(total):.3f} mean_ms={mean:.3f} "
              f"min_ms={min(total):.3f} max_ms={max(total):.3f} "
              f"samples_per_s={world * a.batch_size * 1000.0 / mean:.1f} "
              f"zero_ms={statistics.median(zero):.3f} fwd_ms={statistics.median(fwd):.3f} "
              f"bwd_ms={statistics.median(bwd):.3f} opt_ms={statistics.median(opt):.3f} "
              f"minflt_per_step={faults / a.steps:.1f} cpu_ms_per_step={cpu_ms / a.steps:.3f} "
              f"loss={last_loss:.4f}", flush=True)
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
