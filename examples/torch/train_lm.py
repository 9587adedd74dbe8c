"""Train a small transformer language model with torch DDP or FSDP2 on backend gloo or ringflow (CPU, float64).

    torchrun --nproc-per-node 2 examples/torch/train_lm.py --backend ringflow --mode ddp
    RANK=0 WORLD_SIZE=2 python examples/torch/train_lm.py --init-method file:///tmp/init ...   # (one per rank)

An ordinary torch script: the only ringflow line is the import that registers the backend. DDP runs with
small gradient buckets and `no_sync` gradient accumulation; FSDP2 shards every block and the root with
`fully_shard` on a CPU device mesh, accumulating with `set_requires_gradient_sync(False)`. Each step
sees the same global batch whatever the world size, so the parameters after k steps equal a
single-process run's (up to summation order). `--json-out` (rank 0) writes the losses, the median step time and the full
parameters.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn


class TinyLM(nn.Module):
    """Token and position embeddings, causal transformer blocks, a tied-free LM head."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits for every position."""
        h = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            h = blk(h, src_mask=self.mask, is_causal=True)
        return self.head(self.norm(h))


def batches(steps: int, accum: int, global_batch: int, seq: int, vocab: int) -> torch.Tensor:
    """[steps, accum, global_batch, seq + 1] tokens of a learnable sequence task (the same on every rank)."""
    g = torch.Generator().manual_seed(1234)
    start = torch.randint(0, vocab, (steps, accum, global_batch, 1), generator=g)
    stride = torch.randint(1, 4, (steps, accum, global_batch, 1), generator=g)
    return (start + stride * torch.arange(seq + 1)) % vocab


def main() -> None:
    """Parse arguments, train, report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["gloo", "ringflow"], default="ringflow")
    ap.add_argument("--mode", choices=["ddp", "fsdp"], default="ddp")
    ap.add_argument("--init-method", default="env://")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per step (no_sync accumulation)")
    ap.add_argument("--global-batch", type=int, default=8, help="sequences per micro-batch, all ranks together")
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--bucket-cap-mb", type=float, default=0.02)
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    if args.backend == "ringflow":
        import ringflow.torch_backend  # noqa: F401 - registers backend "ringflow"
    torch.set_num_threads(1)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    dist.init_process_group(args.backend, init_method=args.init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    torch.set_default_dtype(torch.float64)
    vocab = 32
    torch.manual_seed(0)
    model = TinyLM(vocab, 32, 4, 2, args.seq)
    if args.mode == "ddp":
        net: nn.Module = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh)
        net = fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    data = batches(args.steps, args.accum, args.global_batch, args.seq, vocab)
    per = args.global_batch // world
    losses, step_s = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        total = torch.zeros(())
        for i in range(args.accum):
            tokens = data[step, i, rank * per:(rank + 1) * per]
            last = i == args.accum - 1
            if args.mode == "ddp" and not last:
                with net.no_sync():
                    loss = _loss(net, tokens, vocab) / args.accum
                    loss.backward()
            else:
                if args.mode == "fsdp":
                    net.set_requires_gradient_sync(last)
                loss = _loss(net, tokens, vocab) / args.accum
                loss.backward()
            total += loss.detach()
        opt.step()
        step_s.append(time.perf_counter() - t0)
        dist.all_reduce(total, dist.ReduceOp.SUM)
        losses.append(total.item() / world)
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d} loss {losses[-1]:.6f}", flush=True)
    params = _full_params(net)
    spread = 0.0
    for p in params.values():
        hi, lo = p.clone(), p.clone()
        dist.all_reduce(hi, dist.ReduceOp.MAX)
        dist.all_reduce(lo, dist.ReduceOp.MIN)
        spread = max(spread, (hi - lo).abs().max().item())
    if rank == 0 and args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"backend": args.backend, "mode": args.mode, "world_size": world, "steps": args.steps,
                       "losses": losses, "ranks_agree": spread,
                       "step_ms": statistics.median(step_s[2:] or step_s) * 1e3,
                       "params": {k: v.flatten().tolist() for k, v in params.items()}}, fh)
    dist.destroy_process_group()


def _loss(net: nn.Module, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    logits = net(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))


def _full_params(net: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, unsharded (DTensor.full_tensor() for FSDP2), by its module-relative name."""
    out = {}
    for name, p in net.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name.removeprefix("module.")] = full.detach().clone()
    return out


if __name__ == "__main__":
    main()
