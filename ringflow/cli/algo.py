"""`ringflow algo ...`: list, show, verify and choose collective algorithms."""
from __future__ import annotations

import typer
from rich.markup import escape

from .common import console, print_json, print_table

algo_app = typer.Typer(help="Collective algorithms as schedules: list, show, verify, choose.", no_args_is_help=True)


def _rings(text: str | None, n: int) -> list[tuple[int, ...]] | None:
    if not text:
        return None
    from ..topology import parse_rings
    return parse_rings(text, n)


@algo_app.command("list")
def list_cmd(json_out: bool = typer.Option(False, "--json", help="JSON output")) -> None:
    """Every algorithm, the collectives it implements and its closed-form cost line."""
    from ..algorithms.registry import ALGORITHMS
    rows = []
    for a in ALGORITHMS.values():
        for c, line in a.cost_lines.items():
            rows.append({"algorithm": a.name, "family": a.family, "collective": c.value, "cost": line,
                         "summary": a.summary})
    if json_out:
        print_json(rows)
        return
    print_table("algorithms (S = whole vector bytes, p = 2^floor(log2 n), r = n-p, K = ceil(log2 n))",
                ["algorithm", "collective", "cost (steps; bytes per rank)"],
                [(r["algorithm"], r["collective"], escape(r["cost"])) for r in rows], justify_right=False)


@algo_app.command("show")
def show_cmd(collective: str = typer.Argument(..., help="e.g. all_reduce"),
             algorithm: str = typer.Argument(..., help="e.g. ring"),
             nranks: int = typer.Option(4, "-n", "--nranks", min=1, help="number of ranks"),
             root: int | None = typer.Option(None, "--root", min=0, help="root rank (rooted collectives)"),
             nsegs: int = typer.Option(1, "--nsegs", min=1, help="segments per block"),
             nchannels: int = typer.Option(1, "--nchannels", min=1, help="channels (rings)"),
             rings: str | None = typer.Option(None, "--rings", help="ring orders, NCCL_RINGS syntax"),
             json_out: bool = typer.Option(False, "--json", help="the schedule as JSON (versioned schema)")) -> None:
    """The per-rank, per-step table of one schedule."""
    from ..algorithms.registry import get_schedule
    from ..algorithms.schedule import Collective
    c = Collective.parse(collective)
    if c.has_root and root is None:
        root = 0
    s = get_schedule(c, algorithm, nranks, root=root, nsegs=nsegs, nchannels=nchannels, rings=_rings(rings, nranks))
    if json_out:
        print_json(s.to_json())
    else:
        typer.echo(s.table())  # plain text, never re-wrapped


@algo_app.command("verify")
def verify_cmd(collective: str = typer.Argument(..., help="e.g. all_reduce, or 'all'"),
               algorithm: str = typer.Argument("all", help="e.g. halving_doubling, or 'all'"),
               nranks: int = typer.Option(4, "-n", "--nranks", min=1, help="number of ranks"),
               root: int | None = typer.Option(None, "--root", min=0, help="root rank (rooted collectives)"),
               nsegs: int = typer.Option(1, "--nsegs", min=1, help="segments per block"),
               nchannels: int = typer.Option(1, "--nchannels", min=1, help="channels (rings)"),
               json_out: bool = typer.Option(False, "--json", help="JSON output")) -> None:
    """Prove schedules correct symbolically (in place too) and check their counts against the closed form."""
    from ..algorithms.registry import algorithms_for, info
    from ..algorithms.schedule import Collective
    from ..algorithms.verifier import check_algorithm as verify_one
    colls = list(Collective) if collective == "all" else [Collective.parse(collective)]
    results = []
    for c in colls:
        names = algorithms_for(c) if algorithm == "all" else [info(algorithm).name]
        for name in names:
            if c not in info(name).cost_lines:
                info(name)
                from ..errors import UnknownAlgorithm
                raise UnknownAlgorithm(f"algorithm {name!r} does not implement {c.value}",
                                       f"algorithms for {c.value}: {', '.join(algorithms_for(c))}")
            results.append(verify_one(c, name, nranks, root=root, nsegs=nsegs, nchannels=nchannels))
    if json_out:
        print_json(results)
        return
    print_table(f"verified on {nranks} ranks: symbolic provenance, counts 0/1/n-1/7n+3, in place where allowed; "
                "step and byte counts equal the closed form",
                ["collective", "algorithm", "steps", "transfers", "in place", "bytes per rank"],
                [(r["collective"], r["algorithm"], r.get("transfer_steps", r["steps"]), r["transfers"],
                  "yes" if r["in_place_checked"] else "-",
                  "-" if r["bytes_fraction"] == "-" else f"{r['bytes_fraction']} S") for r in results],
                justify_right=False)
    for r in results:
        console.print(f"{r['collective']} / {r['algorithm']}: {escape(r['cost_line'])}", highlight=False)


@algo_app.command("cost")
def cost_cmd(collective: str = typer.Argument(..., help="e.g. all_reduce"),
             algorithm: str = typer.Argument(..., help="e.g. ring"),
             size: str = typer.Option("64MiB", "--size", help="message size S (e.g. 1KiB, 256MiB)"),
             nranks: int = typer.Option(4, "-n", "--nranks", min=1, help="number of ranks"),
             root: int | None = typer.Option(None, "--root", min=0, help="root rank (rooted collectives)"),
             nsegs: int = typer.Option(1, "--nsegs", min=1, help="segments per block"),
             nchannels: int = typer.Option(1, "--nchannels", min=1, help="channels (rings)"),
             topo: str | None = typer.Option(None, "--topo", help="topology: preset, file or '4xdgx-h100'"),
             dtype_size: int = typer.Option(4, "--dtype-size", min=1, help="bytes per element"),
             json_out: bool = typer.Option(False, "--json", help="JSON output")) -> None:
    """Steps, bytes per rank and per rank pair, and the alpha-beta time of one schedule."""
    from ..algorithms.cost import schedule_cost, traffic
    from ..algorithms.layout import CallShape
    from ..algorithms.registry import get_schedule, info
    from ..algorithms.schedule import Collective
    from ..algorithms.tuner import count_for
    from ..units import format_size, parse_size
    c = Collective.parse(collective)
    if c.has_root and root is None:
        root = 0
    t = _load_topo(topo, nranks)
    s = get_schedule(c, algorithm, nranks, root=root, nsegs=nsegs, nchannels=nchannels)
    count = count_for(c, parse_size(size), nranks, dtype_size)
    splits = tuple((count,) * nranks for _ in range(nranks)) if c == Collective.ALL_TO_ALLV else None
    shape = CallShape(c, nranks, count, dtype_size, splits)
    tr, cost = traffic(s, shape), schedule_cost(s, shape, t)
    d = {**cost.to_dict(), "cost_line": info(algorithm).cost_lines[c], "bytes_sent": list(tr.bytes_sent),
         "bytes_recv": list(tr.bytes_recv), "pair_bytes": [[a, b, v] for (a, b), v in sorted(tr.pair_bytes.items())],
         "topology": t.name if t is not None else None}
    if json_out:
        print_json(d)
        return
    console.print(f"{c.value} / {s.algorithm} of {format_size(cost.nbytes)} on {nranks} ranks"
                  f"{' on ' + t.name if t is not None else ''}: {cost.steps} steps, "
                  f"{format_size(cost.bytes_per_rank)} per rank, {cost.time_s * 1e6:.2f} us "
                  f"({escape(d['cost_line'])})", highlight=False)
    print_table("bytes per rank pair (row sends to column)", ["from \\ to"] + [str(j) for j in range(nranks)],
                [[str(i)] + [format_size(tr.pair_bytes.get((i, j), 0)) if (i, j) in tr.pair_bytes else "."
                             for j in range(nranks)] for i in range(nranks)])


def _load_topo(topo: str | None, nranks: int):  # noqa: ANN202 - Topology | None, lazily imported
    """Load --topo; a one-host preset with fewer endpoints than ranks is replicated to fit."""
    if not topo:
        return None
    from ..topology import build_cluster, load_topology
    t = load_topology(topo)
    neps, hosts = len(t.endpoints()), len(t.hosts())
    if 0 < neps < nranks and hosts == 1:
        t = build_cluster(t, -(-nranks // neps))  # one host replicated (rail fabric) to fit the ranks
    return t


@algo_app.command("choose")
def choose_cmd(collective: str = typer.Argument(..., help="e.g. all_reduce"),
               size: str = typer.Option("64MiB", "--size", help="message size S (e.g. 1KiB, 256MiB)"),
               nranks: int = typer.Option(8, "-n", "--nranks", min=1, help="number of ranks"),
               topo: str | None = typer.Option(None, "--topo", help="topology: preset, file or '4xdgx-h100'"),
               dtype_size: int = typer.Option(4, "--dtype-size", min=1, help="bytes per element"),
               calibrated: str | None = typer.Option(None, "--calibrated", help="a `ringflow calibrate` host-model "
                                                        "file: what RINGFLOW_TUNER_MODEL=FILE makes the runtime run"),
               transport: str = typer.Option("shm", "--transport", help="--calibrated: the ranks' transport, "
                                             "shm or tcp"),
               in_place: bool | None = typer.Option(None, "--in-place/--out-of-place", help="--calibrated: "
                                                       "the call's buffers (default: in place for all_reduce, "
                                                       "broadcast and reduce, as ringflow bench calls them)"),
               json_out: bool = typer.Option(False, "--json", help="JSON output")) -> None:
    """The tuner's choice and the predicted cost of every candidate."""
    from ..algorithms.tuner import choose
    from ..units import format_size, parse_size
    if calibrated:
        _calibrated_choice(collective, parse_size(size), nranks, dtype_size, calibrated, transport, in_place,
                           json_out)
        return
    t = _load_topo(topo, nranks)
    ch = choose(collective, parse_size(size), nranks, t, dtype_size)
    if json_out:
        print_json(ch.to_dict())
        return
    where = f"on {ch.topology}" if ch.topology else "on one host (default alpha/beta, no topology)"
    console.print(f"{ch.collective} of {format_size(ch.nbytes)} on {nranks} ranks {where}: "
                  f"[bold]{ch.algorithm}[/] (segments {ch.nsegs}, channels {ch.nchannels}), "
                  f"predicted {ch.time_s * 1e6:.2f} us", highlight=False)
    print_table(None, ["algorithm", "segs", "chans", "steps", "bytes/rank", "scratch", "time (us)"],
                [(c.algorithm, c.nsegs, c.nchannels, c.steps, format_size(c.bytes_per_rank),
                  format_size(c.scratch_bytes), f"{c.time_s * 1e6:.2f}") for c in ch.candidates])


def _calibrated_choice(collective: str, nbytes: int, nranks: int, dtype_size: int, path: str, transport: str,
                       in_place: bool | None, json_out: bool) -> None:
    """The runtime's flat choice, every candidate priced on the host model, and what the runtime runs with
    RINGFLOW_TUNER_MODEL=`path` (`algorithms.selection.model_decision`, under the argument check's pattern the
    model picks for that many ranks, `selection.pattern_for`)."""
    from .. import config
    from ..algorithms import check_rounds
    from ..algorithms.schedule import Collective, Schedule
    from ..algorithms.selection import model_decision, pattern_for, pattern_prices_us
    from ..errors import InvalidArgument
    from ..hostmodel import load_cost_model
    from ..runtime.bench import IN_PLACE
    from ..units import format_size
    c = Collective.parse(collective)
    model = load_cost_model(path, transport)
    if not model.supports(nranks):
        raise InvalidArgument(f"{path} was not calibrated for {nranks} ranks", "calibrate with --ranks including it")
    inplace = in_place if in_place is not None else c.value in IN_PLACE
    pattern = pattern_for(nranks, model)
    prices = pattern_prices_us(nranks, model) if nranks >= check_rounds.MIN_RANKS else {}
    with check_rounds.using(pattern):
        d = model_decision(c, nbytes, nranks, 0 if c.has_root else None, dtype_size, inplace,
                           int(config.get("SINGLE_RING_THRESHOLD")), model)
    flat, chosen, t_flat = d.flat, d.chosen, d.flat_us

    def name(s: Schedule) -> tuple[str, int, int]:
        return (s.algorithm, int(s.params.get("nsegs", 1)), s.nchannels)
    rows = [{"algorithm": cand.algorithm, "nsegs": cand.nsegs, "nchannels": cand.nchannels,
             "flat_model_us": cand.time_s * 1e6, "calibrated_us": t,
             "flat_choice": name(s) == name(flat), "calibrated_choice": name(s) == name(chosen)}
            for cand, s, t in d.candidates]
    if json_out:
        print_json({"collective": c.value, "nbytes": nbytes, "nranks": nranks, "transport": transport,
                    "in_place": inplace,
                    "flat": dict(zip(("algorithm", "nsegs", "nchannels"), name(flat), strict=True)),
                    "flat_calibrated_us": t_flat,
                    "chosen": dict(zip(("algorithm", "nsegs", "nchannels"), name(chosen), strict=True)),
                    "margin": model.margin, "check_pattern": pattern, "check_pattern_prices_us": prices,
                    "candidates": rows})
        return
    console.print(f"{c.value} of {format_size(nbytes)} on {nranks} ranks over {transport}, host model {path}: "
                  f"flat tuner runs [bold]{flat.algorithm}[/] ({t_flat:.1f} us predicted here); with the model the "
                  f"runtime runs [bold]{chosen.algorithm}[/] (segments {name(chosen)[1]}, channels {chosen.nchannels}; "
                  f"it switches only for a predicted speed-up over {model.margin:.2f}x, the model's error)",
                  highlight=False)
    if prices:
        console.print(f"argument check: [bold]{pattern}[/] (the smallest call of each collective, summed: "
                      f"pairs {prices['pairs']:.1f} us, log-depth rounds {prices['log']:.1f} us)", highlight=False)
    print_table(None, ["algorithm", "segs", "chans", "flat model (us)", "host model (us)", ""],
                [(r["algorithm"], r["nsegs"], r["nchannels"], f"{r['flat_model_us']:.1f}", f"{r['calibrated_us']:.1f}",
                  " ".join(m for m, on in (("flat", r["flat_choice"]), ("model", r["calibrated_choice"])) if on))
                 for r in rows])


def register(app: typer.Typer) -> None:
    """Add the `algo` command group to the app."""
    app.add_typer(algo_app, name="algo")
