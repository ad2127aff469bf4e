#!/usr/bin/python3
"""Checks a plan written by `ptcctl plan --out FILE`, independently of ptc's C++.

For every target host (or, in per-rank plans, every target rank) and every
tensor, the pieces delivered must cover exactly the regions the target
needs, each element once; every piece must be held by its live source
host; and the summary's cross-host bytes must equal both the pieces' bytes
and the lower bound (what each host needs minus what it holds).

usage: check_plan.py PLAN.json     exit 0 and one line if the plan is right,
                                   exit 1 and the first problem if not.
"""
import itertools
import json
import sys
from bisect import bisect_left
from collections import defaultdict


def cells_of(region, cuts):
    """Index ranges, per dimension, of the grid cells inside `region`."""
    return [range(bisect_left(c, b), bisect_left(c, e)) for (b, e), c in zip(region, cuts)]


def check(plan):
    hosts = plan["hosts"]
    alive = {h["id"] for h in hosts if h["alive"]}
    per_rank = plan["per_rank"]
    tensors = plan["tensors"]
    src_host = {r["rank"]: r["host"] for r in plan["source"]["ranks"]}
    dst_host = {r["rank"]: r["host"] for r in plan["target"]["ranks"]}

    need = defaultdict(list)      # tensor -> [(unit, region)]
    hold = defaultdict(list)      # tensor -> [(host, region)]
    pieces = defaultdict(list)    # tensor -> [(unit, source_host, region)]
    for s in plan["target"]["shards"]:
        unit = s["rank"] if per_rank else dst_host[s["rank"]]
        need[s["tensor"]].append((unit, s["region"]))
    for s in plan["source"]["shards"]:
        if src_host[s["rank"]] in alive:
            hold[s["tensor"]].append((src_host[s["rank"]], s["region"]))
    cross = 0
    for x in plan["transfers"]:
        if x["source_host"] not in alive:
            return f"transfer from dead host {x['source_host']}: {x}"
        unit = x["target_rank"] if per_rank else x["target_host"]
        pieces[x["tensor"]].append((unit, x["source_host"], x["region"]))
        if x["source_host"] != x["target_host"]:
            vol = 1
            for b, e in x["region"]:
                vol *= max(e - b, 0)
            cross += vol * tensors[x["tensor"]]["element_size"]

    bound = 0
    for t, info in enumerate(tensors):
        shape = info["shape"]
        regions = [r for _, r in need[t]] + [r for _, r in hold[t]] + [r for *_, r in pieces[t]]
        for _, _, r in pieces[t]:
            if len(r) != len(shape) or any(b < 0 or b > e or e > n for (b, e), n in zip(r, shape)):
                return f"tensor {info['key']}: piece {r} is outside shape {shape}"
        cuts = [sorted({x for r in regions for x in r[d]}) for d in range(len(shape))]
        need_at = defaultdict(set)
        hold_at = defaultdict(set)
        got_at = defaultdict(list)
        for unit, r in need[t]:
            for cell in itertools.product(*cells_of(r, cuts)):
                need_at[cell].add(unit)
        for host, r in hold[t]:
            for cell in itertools.product(*cells_of(r, cuts)):
                hold_at[cell].add(host)
        for unit, src, r in pieces[t]:
            for cell in itertools.product(*cells_of(r, cuts)):
                got_at[cell].append((unit, src))
        for cell in set(need_at) | set(got_at):
            box = [(cuts[d][i], cuts[d][i + 1]) for d, i in enumerate(cell)]
            vol = 1
            for b, e in box:
                vol *= e - b
            units = [u for u, _ in got_at[cell]]
            for unit, src in got_at[cell]:
                if src not in hold_at[cell]:
                    return f"tensor {info['key']} {box}: source host {src} does not hold it"
            for unit in need_at[cell] | set(units):
                n = units.count(unit)
                if unit in need_at[cell] and n != 1:
                    return f"tensor {info['key']} {box}: covered {n} times for unit {unit}"
                if unit not in need_at[cell]:
                    return f"tensor {info['key']} {box}: delivered to unit {unit}, which does not need it"
            if not per_rank:
                for unit in need_at[cell]:
                    if unit not in hold_at[cell]:
                        bound += vol * info["element_size"]
    summary = plan["summary"]
    if summary["cross_host_bytes"] != cross:
        return f"summary says {summary['cross_host_bytes']} bytes cross hosts, pieces add up to {cross}"
    if not per_rank and cross != bound:
        return f"{cross} bytes cross hosts but the lower bound is {bound}"
    return None


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    problem = check(plan)
    if problem:
        print(f"plan INVALID: {problem}")
        return 1
    print(f"plan OK: {len(plan['transfers'])} transfers, "
          f"{plan['summary']['cross_host_bytes']} bytes across hosts (lower bound met)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
