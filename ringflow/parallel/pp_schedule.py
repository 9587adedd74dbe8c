"""Pipeline schedules as explicit per-stage action lists, and their ideal timeline.

A schedule for p stages and m micro-batches gives every stage an ordered list
of actions `F j` (forward of micro-batch j) and `B j` (its backward). Stage s
receives F j's input from s-1 and B j's output gradient from s+1; the runtime
(`pipeline.py`) executes exactly these lists. `simulate` plays the lists with
fixed per-action times and dependencies; with equal stage times its bubble is
(p-1)/(m+p-1) for both GPipe and 1F1B, while 1F1B keeps at most p-s
micro-batches' activations alive on stage s instead of m.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument, UnknownAlgorithm

SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Action:
    """One step of a stage: kind 'F' or 'B' on micro-batch `mb`."""

    kind: str
    mb: int

    def __str__(self) -> str:
        return f"{self.kind}{self.mb}"


def _check(p: int, m: int, stage: int) -> None:
    if p < 1 or m < 1 or not 0 <= stage < p:
        raise InvalidArgument(f"bad pipeline shape: stages={p}, micro_batches={m}, stage={stage}",
                              "need stages >= 1, micro_batches >= 1 and 0 <= stage < stages")


def gpipe(p: int, m: int, stage: int) -> list[Action]:
    """GPipe: all forwards, then all backwards (activations of all m micro-batches stay alive)."""
    _check(p, m, stage)
    return [Action("F", j) for j in range(m)] + [Action("B", j) for j in range(m)]


def one_f_one_b(p: int, m: int, stage: int) -> list[Action]:
    """1F1B (PipeDream-flush): p-s-1 warm-up forwards, then alternate F and B, then drain the backwards."""
    _check(p, m, stage)
    warm = min(p - stage - 1, m)
    acts = [Action("F", j) for j in range(warm)]
    for i in range(m - warm):
        acts += [Action("F", warm + i), Action("B", i)]
    acts += [Action("B", j) for j in range(m - warm, m)]
    return acts


def schedule(name: str, p: int, m: int) -> list[list[Action]]:
    """Action lists of every stage for schedule `name` ('gpipe' or '1f1b')."""
    builders = {"gpipe": gpipe, "1f1b": one_f_one_b}
    if name not in builders:
        raise UnknownAlgorithm(f"unknown pipeline schedule {name!r}", f"use one of {', '.join(SCHEDULES)}")
    return [builders[name](p, m, s) for s in range(p)]


def theoretical_bubble(p: int, m: int) -> float:
    """The textbook bubble fraction (p-1)/(m+p-1)."""
    return (p - 1) / (m + p - 1)


@dataclass(frozen=True)
class Timeline:
    """Result of playing a schedule: per-stage (action, start, end), makespan and bubble."""

    events: list[list[tuple[Action, float, float]]]
    makespan: float
    bubble: float
    peak_inflight: list[int]


def simulate(lists: list[list[Action]], t_f: float = 1.0, t_b: float = 2.0) -> Timeline:
    """Play the action lists with per-action times t_f / t_b and zero-cost transfers."""
    p = len(lists)
    done: dict[tuple[str, int, int], float] = {}
    pos = [0] * p
    clock = [0.0] * p
    events: list[list[tuple[Action, float, float]]] = [[] for _ in range(p)]
    remaining = sum(len(a) for a in lists)
    while remaining:
        progressed = False
        for s in range(p):
            while pos[s] < len(lists[s]):
                a = lists[s][pos[s]]
                if a.kind == "F":
                    deps = [("F", s - 1, a.mb)] if s > 0 else []
                else:
                    deps = [("F", s, a.mb)] + ([("B", s + 1, a.mb)] if s < p - 1 else [])
                if any(d not in done for d in deps):
                    break
                start = max([clock[s]] + [done[d] for d in deps])
                end = start + (t_f if a.kind == "F" else t_b)
                done[(a.kind, s, a.mb)] = end
                clock[s] = end
                events[s].append((a, start, end))
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise InvalidArgument("the schedule deadlocks (a stage waits for an action that never runs)",
                                  "every stage needs F j before B j, in an order its neighbours can follow")
    makespan = max(clock)
    busy = sum(e - b for ev in events for _, b, e in ev)
    return Timeline(events, makespan, 1.0 - busy / (p * makespan), [peak_inflight(a) for a in lists])


def peak_inflight(actions: list[Action]) -> int:
    """Most micro-batches whose forward ran but backward did not, over the list (activation memory)."""
    live = peak = 0
    for a in actions:
        live += 1 if a.kind == "F" else -1
        peak = max(peak, live)
    return peak


def render(lists: list[list[Action]]) -> str:
    """One line per stage, e.g. 'stage 0: F0 F1 F2 B0 F3 B1 B2 B3'."""
    return "\n".join(f"stage {s}: " + " ".join(map(str, acts)) for s, acts in enumerate(lists))
