"""`ringflow traffic`, `ringflow train`, `ringflow plan`: LLM training at cluster scale as a model."""
from __future__ import annotations

import math
from typing import Any

import typer

from ..errors import InvalidArgument
from .common import (
    FABRIC_OPT,
    OVERSUB_OPT,
    PLANES_OPT,
    RADIX_OPT,
    TIERS_OPT,
    FabricOptions,
    check_plot_path,
    console,
    fabric_options,
    print_json,
    print_table,
    report_plot,
)


def _cluster(topo: str, nodes: int | None, nic_gbps: float | None, fabric: str | FabricOptions) -> Any:
    """A preset replicated into `nodes` servers (2 switch tiers when they fit, else 3), or a topology file;
    `fabric` is the fabric kind or the full --fabric/--tiers/--radix/--oversub/--planes options."""
    from ..topology import PRESETS, load_topology
    from ..workload.validation import cluster_for
    fab = fabric if isinstance(fabric, FabricOptions) else FabricOptions(fabric)
    is_preset = topo.partition(":")[0] in PRESETS
    t = None if is_preset else load_topology(topo)
    if t is not None and not (nodes and nodes > 1 and len(t.hosts()) == 1):
        return t
    if fab.is_default() and t is None:
        return cluster_for(topo, nodes or 1, nic_gbps, fab.fabric)
    return fab.build(topo if t is None else t, nodes or 1, nic_gbps)


def _eb(x: float) -> str:
    return f"{x / 1e18:.2f}"


def _pb(x: float) -> str:
    return f"{x / 1e15:,.1f}"


def traffic_command(
    model: str = typer.Option("llama3-70b", "--model", help="preset name or YAML/JSON model file"),
    tokens: float = typer.Option(156e9, "--tokens", min=0, help="tokens per epoch (C4: 156e9)"),
    samples: float | None = typer.Option(None, "--samples", min=0, help="samples per epoch (default: C4's 364.6e6 "
                                            "when --tokens is C4's, else tokens / seq-len)"),
    batch: int = typer.Option(2048, "--batch", min=1, help="global batch in samples (N = samples / batch)"),
    gpus: int = typer.Option(8, "--gpus", min=1, help="G of the closed-form 1-D rows"),
    tp: int = typer.Option(1, "--tp", min=1), pp: int = typer.Option(1, "--pp", min=1),
    dp: int = typer.Option(1, "--dp", min=1),
    cp: int = typer.Option(1, "--cp", min=1, help="context parallelism of the exact 3-D job"),
    ep: int = typer.Option(1, "--ep", min=1, help="expert parallelism of the exact 3-D job (MoE models)"),
    cp_comm: str = typer.Option("p2p", "--cp-comm", help="p2p, a2a or allgather"),
    formula: str = typer.Option("seed", "--formula", help="seed (the closed-form formulas), exact (ringflow's "
                                "algorithms on --topo), or both"),
    topo: str = typer.Option("dgx-h100", "--topo", help="server preset for --formula exact"),
    fabric: str = typer.Option("rail", "--fabric"),
    switch_tbps: float = typer.Option(51.2, "--switch-tbps", min=0, help="switch capacity for the sizing (Tb/s)"),
    epochs: int = typer.Option(100, "--epochs", min=1), days: float = typer.Option(100.0, "--days", min=0),
    checkpoint_every: int = typer.Option(1000, "--checkpoint-every", min=1, help="steps between checkpoints"),
    json_out: bool = typer.Option(False, "--json", help="print rows and totals as JSON"),
) -> None:
    """Per-epoch traffic of DP / FSDP / TP / PP and 3-D training: the closed-form formulas and the real algorithms'."""
    from ..workload import load_model
    from ..workload import seed_traffic as st
    from ..workload.layout import Layout
    from ..workload.traffic import DIFFERENCES, exact_1d, exact_3d, storage_traffic
    from ..workload.validation import cluster_for

    if formula not in ("seed", "exact", "both"):
        raise InvalidArgument(f"--formula {formula!r}", "use seed, exact or both")
    m = load_model(model)
    seq = m.seq_len
    if samples is None:
        samples = st.C4_SAMPLES if tokens == st.C4_TOKENS else tokens / seq
    if batch < 1 or samples <= 0 or tokens <= 0 or gpus < 1:
        raise InvalidArgument("--batch, --samples, --tokens and --gpus must be > 0")
    N = samples / batch
    P = m.nominal()
    out: dict[str, Any] = {"model": m.name, "formula": formula, "P_seed": P, "P_dimensions": m.params(),
                           "T": tokens, "L": m.layers, "H": m.hidden, "G": gpus, "N": N, "batch": batch}
    three_d = tp * pp * dp > 1
    if formula in ("seed", "both"):
        rows = st.seed_rows(P, tokens, m.layers, m.hidden, gpus, N)
        out["rows"] = [r.to_dict() for r in rows]
        out["totals"] = {r.mode: r.backward_bytes + r.forward_bytes for r in rows}
        if three_d:
            d3 = st.seed_3d(P, tokens, m.layers, m.hidden, N, tp, pp, dp)
            out["three_d"] = d3
            out["totals"]["3d"] = d3["total_bytes"]
            out["switch"] = st.switch_sizing(d3["total_bytes"], switch_tbps, epochs, days)
    if formula in ("exact", "both"):
        steps = N

        per_server = max(1, len(cluster_for(topo, 1, None, fabric).endpoints()))

        def topo_for(g: int, one_per_server: bool) -> Any:
            return cluster_for(topo, g if one_per_server else max(1, math.ceil(g / per_server)), None, fabric)
        ex = [r.to_dict() for r in exact_1d(m, tokens, steps, gpus, topo_for)]
        out["exact_rows"] = ex
        if formula == "exact":
            out["rows"] = ex
            out["totals"] = {r["mode"]: r["total_bytes"] for r in ex}
        if three_d or cp > 1:
            lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, cp_comm=cp_comm, global_batch=dp, micro_batch=1,
                         seq_len=m.seq_len, sequence_parallel=tp > 1)
            if cp > 1 or ep > 1:
                lay.check_model(m)
            t3 = cluster_for(topo, max(1, math.ceil(lay.gpus / per_server)), None, fabric)
            e3 = [r.to_dict() for r in exact_3d(m, tokens, steps, lay, t3)]
            tot3 = sum(r["total_bytes"] for r in e3)
            net3 = sum(r["network_bytes"] for r in e3)
            # only bytes that leave a server cross a network switch (NVLink traffic never does)
            out["exact_3d"] = {"rows": e3, "total_bytes": tot3, "total_EB": tot3 / 1e18, "network_bytes": net3,
                               "switch": st.switch_sizing(net3, switch_tbps, epochs, days)}
            out.setdefault("totals", {})["exact_3d"] = tot3
        out["storage"] = storage_traffic(m, tokens, steps, checkpoint_every, st.C4_BYTES
                                         if tokens == st.C4_TOKENS else None)
        out["differences"] = [{"mode": k, "why": v} for k, v in DIFFERENCES]
    if json_out:
        print_json(out)
        return
    _print_traffic(out)


def _print_traffic(out: dict[str, Any]) -> None:
    console.print(f"[bold]{out['model']}[/]: P={out['P_seed']:.4g} (dimensions give {out['P_dimensions']:.4g}), "
                  f"T={out['T']:.4g} tokens, L={out['L']}, H={out['H']}, G={out['G']}, N={out['N']:,.1f} "
                  f"mini-batches per epoch, BF16")
    if out["formula"] in ("seed", "both"):
        rows = [[r["mode"], r["pattern"], _pb(r["backward_bytes"]), f"{r['seed_printed'][0]:g}",
                 f"{r['backward_syncs']:g}", _pb(r["forward_bytes"]), f"{r['seed_printed'][1]:g}",
                 f"{r['forward_transfers']:.4g}"] for r in out["rows"]]
        print_table("closed-form traffic per epoch "
                    "(PB = 1e15 B; 'as printed' = in the reference table's unit, rounded up)",
                    ["mode", "pattern", "backward PB", "as printed", "syncs", "forward PB", "as printed",
                     "transfers"], rows)
        if "three_d" in out:
            d, s = out["three_d"], out["switch"]
            console.print(f"3-D {d['tp']} TP x {d['pp']} PP x {d['dp']} DP = {d['gpus']} GPUs: backward "
                          f"{_eb(d['backward_bytes'])} EB + forward {_eb(d['forward_bytes'])} EB = "
                          f"[bold]{d['total_EB']:.1f} EB[/] per epoch")
            console.print(f"one {s['switch_tbps']:g} Tb/s switch: {s['seed_days_per_epoch']:.1f} days per epoch "
                          f"with Tb/s read as TB/s -> {s['seed_switches']} switches for {s['epochs']} "
                          f"epochs in {s['days']:g} days; in bits: {s['days_per_epoch']:.0f} days -> "
                          f"{s['switches']} switches")
    if out["formula"] in ("exact", "both"):
        rows = []
        for r in out["exact_rows"]:
            tiers = ", ".join(f"{k} {_pb(v)}" for k, v in sorted(r["tiers"].items()))
            rows.append([r["mode"], "+".join(r["algorithms"]), _pb(r["backward_bytes"]), _pb(r["forward_bytes"]),
                         tiers])
        print_table("ringflow's algorithms, same job (bytes the GPUs inject, PB; link-bytes per tier)",
                    ["mode", "algorithm", "backward PB", "forward PB", "link-bytes per tier (PB)"], rows)
        if "exact_3d" in out:
            e = out["exact_3d"]
            rows = [[r["mode"], "+".join(r["algorithms"]), _eb(r["backward_bytes"]), _eb(r["forward_bytes"]),
                     ", ".join(f"{k} {_eb(v)}" for k, v in sorted(r["tiers"].items()))] for r in e["rows"]]
            print_table(f"3-D exact: {e['total_EB']:.2f} EB per epoch", ["dim", "algorithm", "backward EB",
                        "forward EB", "link-bytes per tier (EB)"], rows)
            s = e["switch"]
            console.print(f"{_eb(e['network_bytes'])} EB of it leaves the servers; one {s['switch_tbps']:g} Tb/s "
                          f"switch carries that in {s['days_per_epoch']:.1f} days per epoch -> {s['switches']} "
                          f"switches for {s['epochs']} epochs in {s['days']:g} days")
        if out["formula"] == "both":
            ex = {r["mode"]: r for r in out["exact_rows"]}
            rows = []
            for r in out["rows"]:
                e = ex.get(r["mode"])
                if e is None:
                    continue
                tot_s, tot_e = r["backward_bytes"] + r["forward_bytes"], e["total_bytes"]
                rows.append([r["mode"], _pb(r["backward_bytes"]), _pb(e["backward_bytes"]), _pb(r["forward_bytes"]),
                             _pb(e["forward_bytes"]), f"{tot_s / tot_e:.1f}x" if tot_e else "-"])
            print_table("side by side (PB per epoch)", ["mode", "closed-form backward", "exact backward",
                        "closed-form forward", "exact forward", "closed-form / exact"], rows)
        st = out["storage"]
        if "dataset_bytes" in st:
            console.print(f"dataset (C4 as the reference table quotes it): {st['dataset_bytes'] / 1e12:.1f} TB")
        console.print(f"GPU-storage per epoch: data loading {st['load_bytes'] / 1e12:.1f} TB (token ids), "
                      f"{st['checkpoints_per_epoch']:.0f} checkpoints x {st['checkpoint_bytes'] / 1e12:.2f} TB = "
                      f"{st['checkpoint_bytes_per_epoch'] / 1e15:.2f} PB")
        for d in out["differences"]:
            console.print(f"  [bold]{d['mode']}[/]: {d['why']}")


def job_gpus(t: Any, gpus: int | None) -> int:
    """The GPUs of a job on the first `gpus` of cluster `t` (all of them when None); a typed error beyond them."""
    have = len(t.endpoints())
    if gpus is not None and gpus > have:
        raise InvalidArgument(f"--gpus {gpus}, but the cluster ({getattr(t, 'name', '?')}) has {have} GPUs",
                              f"use --gpus {have} or fewer, or more servers (--nodes)")
    return have if gpus is None else gpus


def _layout_from(tp: int, pp: int, dp: int | None, cp: int, ep: int, gpus: int, **kw: Any) -> Any:
    """The layout of `gpus` GPUs (the cluster's, or the job's --gpus): tp x pp x cp x dp must use every one."""
    from ..workload.layout import Layout
    model_par = tp * pp * cp
    if dp is None:
        if gpus % model_par:
            raise InvalidArgument(f"{gpus} GPUs are not divisible by tp x pp x cp = {model_par}",
                                  "change --nodes, or --tp / --pp / --cp so their product divides the GPUs")
        dp = gpus // model_par
    if model_par * dp != gpus:
        fix = (f"use --dp {gpus // model_par}" if gpus % model_par == 0 else "change --tp / --pp / --cp") + \
            (" or a cluster of that many GPUs (--nodes)" if gpus % (model_par * dp) == 0 or model_par * dp > gpus
             else "")
        raise InvalidArgument(f"tp x pp x cp x dp = {tp} x {pp} x {cp} x {dp} = {model_par * dp} GPUs, but the "
                              f"job has {gpus} (the cluster's, or --gpus)", fix)
    return Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, **kw)


def _stage_list(text: str | None) -> tuple[int, ...]:
    """'7,8,8,7' -> (7, 8, 8, 7); None -> () (an even split)."""
    if not text:
        return ()
    try:
        return tuple(int(x) for x in text.replace(" ", "").split(","))
    except ValueError:
        raise InvalidArgument(f"--stage-layers {text!r} is not a comma-separated list of whole numbers",
                              "write e.g. --stage-layers 7,8,8,7") from None


def train_command(
    model: str = typer.Option("llama3-70b", "--model", help="preset name or YAML/JSON model file"),
    topo: str = typer.Option("dgx-h100", "--topo", help="server preset (replicated --nodes times) or file"),
    nodes: int = typer.Option(128, "--nodes", min=1),
    gpus: int | None = typer.Option(None, "--gpus", min=1, help="GPUs the job uses: the cluster's first N, "
                                    "servers filled in order (default: all of them)"),
    nic_gbps: float | None = typer.Option(None, "--nic-gbps", min=0, help="NIC speed (default: the preset's)"),
    fabric: str = FABRIC_OPT, tiers: int | None = TIERS_OPT, radix: int = RADIX_OPT, oversub: str = OVERSUB_OPT,
    planes: int = PLANES_OPT,
    tp: int = typer.Option(8, "--tp", min=1), pp: int = typer.Option(8, "--pp", min=1),
    dp: int | None = typer.Option(None, "--dp", min=1, help="default: GPUs / (tp x pp x cp)"),
    cp: int = typer.Option(1, "--cp", min=1), ep: int = typer.Option(1, "--ep", min=1),
    etp: int = typer.Option(0, "--etp", min=0, help="tensor parallelism inside each expert (0 = --tp)"),
    cp_comm: str = typer.Option("p2p", "--cp-comm", help="context parallelism: p2p (ring attention), a2a "
                                "(Ulysses) or allgather (K/V all-gather, Llama 3)"),
    stage_layers: str | None = typer.Option(None, "--stage-layers", help="layers per pipeline stage, e.g. "
                                            "5,6,6,6,6,6,6,6,6,6,6,5 (default: an even split)"),
    first_stage_layers: int = typer.Option(0, "--first-stage-layers", min=0, help="layers on the first stage; "
                                           "the stages between split the rest evenly (0 = even)"),
    last_stage_layers: int = typer.Option(0, "--last-stage-layers", min=0, help="layers on the last stage"),
    capacity_factor: float = typer.Option(0.0, "--capacity-factor", min=0, help="MoE expert capacity over the "
                                          "balanced load; tokens beyond it dropped, buffers padded (0 = dropless)"),
    overlap_ep: bool = typer.Option(False, "--overlap-ep/--no-overlap-ep", help="hide MoE all-to-alls under "
                                    "compute (DualPipe-style)"),
    fp8_params: bool = typer.Option(False, "--fp8-params", help="with --precision fp8: weights kept only in "
                                    "FP8 (Megatron --fp8-param-gather)"),
    mfu_peak: str = typer.Option("bf16", "--mfu-peak", help="report MFU against the bf16 or the fp8 dense peak"),
    software: str = typer.Option("megatron-core-2025", "--software", help="software profile: "
                                 "megatron-core-2025, megatron-lm-2021, deepspeed-2022, torchtitan-eager, "
                                 "torchtitan-compile, llm-foundry-2023"),
    seq_len: int | None = typer.Option(None, "--seq-len", min=1, help="default: the model's"),
    global_batch: int = typer.Option(1024, "--global-batch", min=1, help="sequences per step"),
    micro_batch: int = typer.Option(1, "--micro-batch", min=1),
    recompute: str = typer.Option("selective", "--recompute", help="none, selective or full"),
    sequence_parallel: bool = typer.Option(True, "--sequence-parallel/--no-sequence-parallel"),
    interleave: int = typer.Option(1, "--interleave", min=1, help="virtual pipeline stages per GPU"),
    zero: int = typer.Option(1, "--zero", min=0, max=3, help="ZeRO stage 0-3 (3 = FSDP)"),
    precision: str = typer.Option("bf16", "--precision", help="bf16 or fp8"),
    bucket_mb: float = typer.Option(160.0, "--bucket-mb", min=0, help="DP gradient bucket (MB)"),
    overlap_grad: bool = typer.Option(True, "--overlap-grad/--no-overlap-grad"),
    overlap_tp: bool = typer.Option(False, "--overlap-tp/--no-overlap-tp", help="TP collectives in chunks beside "
                                    "their GEMMs (needs --sequence-parallel)"),
    tp_overlap: str = typer.Option("userbuffers", "--tp-overlap", help="how --overlap-tp runs: userbuffers "
                                   "(Megatron --tp-comm-overlap) or async_tp (PyTorch async TP, torchtitan)"),
    fsdp_units: str = typer.Option("bucketed", "--fsdp-units", help="with --zero 3: bucketed (gathers and "
                                   "reduce-scatters per bucket) or per_block (PyTorch FSDP2: one unit per block "
                                   "and the root, prefetched one block ahead)"),
    flash: bool = typer.Option(True, "--flash/--no-flash", help="FlashAttention (no stored attention scores)"),
    tokens: float = typer.Option(15e12, "--tokens", min=0, help="token budget for the time-to-train figure"),
    comm: str = typer.Option("auto", "--comm", help="auto (simulator), sim, or alpha-beta"),
    contention: bool = typer.Option(False, "--contention", help="scale each dimension by the flow engine's "
                                    "slowdown with all its groups communicating at once (slower)"),
    scaling: bool = typer.Option(False, "--scaling", help="also the scale factor T_n/(nT) as DP grows"),
    plot: str | None = typer.Option(None, "--plot", help="draw the breakdown (and scaling) into this "
                                       "image (.png, .svg, .pdf)"),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Step time, MFU, memory and network wait of one training layout on a cluster."""
    from ..workload import load_model
    from ..workload.commmodel import default_comm_model
    from ..workload.steptime import scale_factors, step_time

    if plot:
        check_plot_path(plot)
    m = load_model(model)
    fab = fabric_options(fabric, tiers, radix, oversub, planes)
    t = _cluster(topo, nodes, nic_gbps, fab)
    lay = _layout_from(tp, pp, dp, cp, ep, job_gpus(t, gpus), micro_batch=micro_batch, global_batch=global_batch,
                       seq_len=seq_len or m.seq_len, zero=zero, recompute=recompute,
                       sequence_parallel=sequence_parallel and tp > 1, interleave=interleave,
                       bucket_bytes=int(bucket_mb * 1e6), overlap_grad_reduce=overlap_grad, overlap_tp=overlap_tp,
                       tp_overlap=tp_overlap, fsdp_units=fsdp_units, precision=precision, flash_attention=flash,
                       etp=etp, cp_comm=cp_comm,
                       stage_layers=_stage_list(stage_layers), first_stage_layers=first_stage_layers,
                       last_stage_layers=last_stage_layers, capacity_factor=capacity_factor, overlap_ep=overlap_ep,
                       fp8_params=fp8_params)
    cm = default_comm_model(comm)
    r = step_time(m, lay, t, comm=cm, contention=contention, mfu_peak=mfu_peak, software=software)
    out = r.to_dict(tokens)
    curve = None
    if scaling or plot:
        dps = sorted({d for d in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, lay.dp) if d <= lay.dp})
        per_server = max(len(g) for g in t.host_groups())

        def topo_for(g: int) -> Any:
            return _cluster(topo, max(1, math.ceil(g / per_server)), nic_gbps, fab)
        curve = scale_factors(m, lay, topo_for, dps, comm=cm, mfu_peak=mfu_peak, software=software)
        out["scaling"] = curve
    if plot:
        from ..workload.plot import plot_train
        plot_train(r, curve, plot)
        out["plot"] = plot
    if json_out:
        print_json(out)
        if plot:
            report_plot(plot, json_out=True)
        return
    L = lay
    counts = L.stage_layer_counts(m)
    part = f" of {len(t.endpoints())}" if L.gpus < len(t.endpoints()) else ""
    console.print(f"[bold]{m.name}[/] on {L.gpus}{part} x {r.gpu} ({t.name}): TP {L.tp} x PP {L.pp} x DP {L.dp}"
                  f"{f' x CP {L.cp}' if L.cp > 1 else ''}{f' (EP {L.ep})' if L.ep > 1 else ''}, "
                  f"{L.microbatches} micro-batches of {L.micro_batch} x {L.seq_len}, ZeRO-{L.zero}, "
                  f"recompute {L.recompute}, v={L.interleave}, {L.precision}"
                  f"{f', stages {list(counts)}' if len(set(counts)) > 1 else ''}"
                  f" [dim]({r.comm_model}, {r.software})[/]")
    rows = [[k, f"{v:.3f}", f"{100 * v / r.step_time_s:.1f}%"] for k, v in r.breakdown.items() if v > 0]
    print_table(f"step {r.step_time_s:.3f} s", ["component", "seconds", "share"], rows)
    mem = r.memory
    console.print(f"MFU {100 * r.mfu:.1f}%  HFU {100 * r.hfu:.1f}% (of the {r.mfu_peak.upper()} dense peak, "
                  f"{r.peak_tflops:.0f} TFLOP/s)  {r.tflops_per_gpu:.0f} TFLOP/s per GPU  "
                  f"{r.tokens_per_s:,.0f} tokens/s  network wait {100 * r.network_wait_fraction:.1f}%  "
                  f"bubble {100 * r.bubble_fraction:.1f}%")
    console.print(f"memory per GPU {mem.total_bytes / 1e9:.1f} GB of {mem.capacity_bytes / 1e9:.0f} GB "
                  f"(weights {mem.weights_bytes / 1e9:.1f}, grads {mem.grads_bytes / 1e9:.1f}, optimizer "
                  f"{mem.optimizer_bytes / 1e9:.1f}, activations {mem.activations_bytes / 1e9:.1f}) "
                  f"{'[green]fits[/]' if mem.fits else '[red]OUT OF MEMORY[/]'}")
    console.print(f"{tokens:.3g} tokens in {r.time_to_train_s(tokens) / 86400:.1f} days")
    if r.contention:
        console.print("contention (all groups at once / one group alone, flow engine): " +
                      ", ".join(f"{k} x{v:.2f}" for k, v in r.contention.items()))
    if curve:
        print_table("scale factor T_n/(nT), weak scaling in DP",
                    ["GPUs", "DP", "tokens/s", "scale factor"],
                    [[c["gpus"], c["dp"], f"{c['tokens_per_s']:,.0f}", f"{c['scale_factor']:.3f}"] for c in curve])
    if plot:
        report_plot(plot)


def plan_command(
    model: str = typer.Option("llama3-70b", "--model", help="preset name or YAML/JSON model file"),
    gpus: int = typer.Option(1024, "--gpus", min=1),
    topo: str = typer.Option("dgx-h100", "--topo", help="server preset or topology file"),
    nodes: int | None = typer.Option(None, "--nodes", min=1, help="default: GPUs / 8"),
    nic_gbps: float | None = typer.Option(None, "--nic-gbps", min=0),
    fabric: str = typer.Option("rail", "--fabric"),
    batch: int = typer.Option(1024, "--batch", "--global-batch", min=1, help="global batch in sequences"),
    seq_len: int | None = typer.Option(None, "--seq-len", min=1),
    precision: str = typer.Option("bf16", "--precision"),
    top: int = typer.Option(10, "--top", min=1),
    check: bool = typer.Option(True, "--check/--no-check", help="time the top layouts with the simulator too"),
    check_budget_s: float = typer.Option(12.0, "--check-budget", min=0, help="seconds for the simulator's check"),
    every: bool = typer.Option(False, "--all", help="time every layout that fits (default: only those whose "
                               "lower bound can reach the --top best; the --top are the same either way)"),
    plot: str | None = typer.Option(None, "--plot", help="scatter of step time vs memory of the layouts timed "
                                       "into this image (.png, .svg, .pdf); with --all every one that fits"),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Search EP x TP x PP x DP x CP layouts (uneven stages, expert TP, MoE dispatcher, CP exchange), micro-batch,
    ZeRO, recomputation and interleaving; rank what fits by step time."""
    from rich.progress import Progress

    from ..workload import load_model
    from ..workload.planner import plan

    if plot:
        check_plot_path(plot)
    m = load_model(model)
    per_server = max(1, len(_cluster(topo, 1, nic_gbps, fabric).endpoints()))
    t = _cluster(topo, nodes or max(1, math.ceil(gpus / per_server)), nic_gbps, fabric)
    with Progress(console=console, transient=True, disable=json_out) as bar:
        task = bar.add_task(f"planning {m.name} on {gpus} GPUs", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
        p = plan(m, t, gpus, batch, seq_len, precision=precision, refine="auto" if check else None,
                 refine_top=top, refine_budget_s=check_budget_s, keep=None if every else top, progress=progress)
    best = p.top(top)
    rows_json = []
    for i, r in enumerate(best):
        d = r.to_dict()
        chk = p.checked.get(i)
        if chk is not None:
            d["sim_check"] = {"step_time_s": chk.step_time_s, "mfu": chk.mfu, "breakdown": chk.breakdown,
                              "comm_model": chk.comm_model}
        rows_json.append(d)
    if plot:
        from ..workload.plot import plot_plan
        plot_plan(p, plot)
        report_plot(plot, json_out)
    if json_out:
        print_json({"model": m.name, "gpus": gpus, "topology": t.name, "searched": p.searched,
                    "fits": p.evaluated, "out_of_memory": p.oom, "skipped_by_bound": p.pruned, "top": rows_json,
                    "check_budget_spent": p.budget_spent})
        return
    skipped = f", {p.pruned} skipped (their lower bound cannot reach the top {top})" if p.pruned else ""
    console.print(f"{p.searched} layouts: {p.oom} out of memory, {p.evaluated} ranked by step time{skipped} "
                  f"({best[0].comm_model if best else '-'}; 'sim' = the simulator's analytic engine)")
    rows = []
    for i, r in enumerate(best):
        L = r.layout
        b = r.breakdown
        chk = p.checked.get(i)
        rows.append([i + 1, _layout_label(L), L.micro_batch, L.zero, L.recompute, L.interleave,
                     f"{r.step_time_s:.2f}", f"{chk.step_time_s:.2f}" if chk else "-", f"{100 * r.mfu:.1f}",
                     f"{r.memory.total_bytes / 1e9:.0f}", f"{b['compute'] + b['recompute']:.2f}",
                     f"{b['tp_exposed']:.2f}", f"{b['cp_exposed']:.2f}", f"{b['ep_exposed']:.2f}",
                     f"{b['pp_p2p']:.2f}", f"{b['bubble']:.2f}", f"{b['dp_exposed']:.2f}"])
    print_table(f"top {len(best)} layouts for {m.name} on {gpus} GPUs",
                ["#", "TPxPPxDP", "mb", "ZeRO", "recompute", "v", "step s", "sim s", "MFU %", "GB",
                 "compute", "TP", "CP", "EP", "PP p2p", "bubble", "DP"], rows)
    if p.budget_spent:
        console.print(f"the simulator checked {len(p.checked)} of the top {len(best)} within --check-budget "
                      f"{check_budget_s:g} s; raise it to check the rest")


def _layout_label(L: Any) -> str:
    """TPxPPxDP, then CP and its exchange, EP (expert TP where it is not TP, the flex dispatcher), end stages."""
    out = f"{L.tp}x{L.pp}x{L.dp}"
    if L.cp > 1:
        out += f" cp{L.cp} {L.cp_comm}"
    if L.ep > 1:
        out += f" ep{L.ep}" + (f" etp{L.expert_tp}" if L.expert_tp != L.tp else "") + \
            (f" {L.ep_dispatcher}" if L.ep_dispatcher != "alltoall" else "")
    elif L.etp and L.expert_tp != L.tp:
        out += f" etp{L.expert_tp}"
    if L.first_stage_layers or L.last_stage_layers:
        out += f" ends {L.first_stage_layers}/{L.last_stage_layers}"
    return out


def ps_command(
    model: str = typer.Option("llama3-8b", "--model", help="gradient size = parameters x --grad-bytes"),
    grad_bytes: int = typer.Option(4, "--grad-bytes", min=1),
    topo: str = typer.Option("dgx-h100", "--topo"), nodes: int = typer.Option(8, "--nodes", min=1),
    nic_gbps: float | None = typer.Option(None, "--nic-gbps", min=0),
    compute_s: float = typer.Option(1.0, "--compute-s", min=0, help="a worker's compute time per step"),
    straggler: str = typer.Option("none", "--straggler", help="none, lognormal:SIGMA, bernoulli:P:SLOWDOWN, "
                                  "exp:MEAN_FRACTION"),
    staleness: int = typer.Option(3, "--staleness", min=0, help="SSP bound s"),
    cpu_servers: int = typer.Option(1, "--cpu-servers", min=1, help="CPU parameter-server hosts (one NIC each)"),
    iters: int = typer.Option(200, "--iters", min=1), seed: int = typer.Option(0, "--seed", min=0),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Parameter servers (CPU, GPU 0, sharded) under BSP / SSP / ASP with stragglers, vs ring all-reduce."""
    from ..workload import load_model
    from ..workload.param_server import compare

    m = load_model(model)
    t = _cluster(topo, nodes, nic_gbps, "rail")
    workers = [t.gpus(h)[0] for h in t.hosts()]
    nbytes = float(m.params()) * grad_bytes
    res = compare(nbytes, compute_s, workers, t, straggler=straggler, staleness=staleness, cpu_servers=cpu_servers,
                  iters=iters, seed=seed)
    if json_out:
        print_json({"model": m.name, "workers": len(workers), "grad_bytes": nbytes, "straggler": straggler,
                    "rows": [r.to_dict() for r in res]})
        return
    print_table(f"{len(workers)} workers (one GPU per server), {nbytes / 1e9:.1f} GB gradient, compute "
                f"{compute_s:g} s, stragglers {straggler}",
                ["layout", "consistency", "s per global step", "push+pull s", "server s", "bottleneck"],
                [[r.layout, r.consistency, f"{r.step_time_s:.3f}", f"{r.comm_s:.3f}", f"{r.server_time_s:.3f}",
                  r.bottleneck] for r in res])


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    app.command("traffic")(traffic_command)
    app.command("train")(train_command)
    app.command("plan")(plan_command)
    app.command("ps")(ps_command)
