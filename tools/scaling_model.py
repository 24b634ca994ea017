#!/usr/bin/env python3
"""Weak-scaling model for lockstep's data-parallel training (docs/scaling-model.md).

From a measured backward pass (bench_scaling's per-bucket ready times) or the built-in
ResNet-50, and an alpha-beta model of NCCL's allreduce on NVLink + InfiniBand nodes, it
predicts weak-scaling efficiency from 8 to 4096 GPUs, then names and estimates what the
ideal model leaves out (bandwidth knee, compute interference, stragglers, loader stalls).
--rank-invariant adds the rank-invariant mode's step (all-to-all + all-gather, the tree).
--check compares the model with bench_scaling's own multi-rank measurements.

usage: scaling_model.py [--profile FILE] [--json OUT] [--plot OUT.png] [--rank-invariant] ...
       scaling_model.py --check FILE
"""
import argparse
import json
import math
import sys
from dataclasses import dataclass, replace

import numpy as np

from jsonl import InputError, read_jsonl  # tools/jsonl.py

MiB = 1 << 20
# lockstep's bucket plan (comm/buckets.h): 1 MiB first bucket so that communication starts
# early, 25 MiB after it, segments 256-byte aligned; PyTorch DDP's defaults are the same caps.
FIRST_BUCKET_CAP_BYTES = 1 * MiB
BUCKET_CAP_BYTES = 25 * MiB
SEGMENT_ALIGN_BYTES = 256
# NCCL's tuner (src/graph/tuning.cc) gives the tree 0.9 of the ring's bus bandwidth.
TREE_BUSBW_FACTOR = 0.9
# Published weak-scaling points, drawn on the plot (docs/scaling-model.md, "References").
REFERENCE_POINTS = [
    (512, 0.90, "Horovod, ResNet-101, 512 P100, 25 Gb/s RoCE\n(Sergeev & Del Balso 2018)"),
    (16, 0.93, "PyTorch DDP, ResNet-50, 16 GPUs\n(Li et al., VLDB 2020)"),
    (8, 16621 / (8 * 2470), "NVIDIA DeepLearningExamples, ResNet-50 AMP,\n8 A100 (DGX A100)"),
]


# ---------------------------------------------------------------------------------------
# Network: alpha-beta allreduce cost, NCCL's structure


@dataclass(frozen=True)
class Network:
    gpus_per_node: int
    intra_alpha_us: float    # latency per ring step inside a node
    intra_busbw_gbs: float   # achievable bus bandwidth per GPU inside a node (nccl-tests busbw)
    inter_alpha_us: float    # latency per step that crosses nodes (NIC + switch hops)
    inter_busbw_gbs: float   # achievable bandwidth of each GPU's own NIC
    intra_half_bytes: float  # bandwidth knee: a flow of n bytes runs at B n / (n + n_half)
    inter_half_bytes: float
    phased: bool = False     # hierarchical phases one after another instead of pipelined

    def _layout(self, ranks):
        """(GPUs per node used, nodes, intra and inter bandwidth in bytes per ms, intra and
        inter latency in ms) of `ranks` GPUs, which must fill whole nodes."""
        g = min(ranks, self.gpus_per_node)
        if ranks % g:
            raise InputError(f"{ranks} GPUs do not fill nodes of {self.gpus_per_node} GPUs "
                             "(use multiples of --gpus-per-node)")
        return (g, ranks // g, self.intra_busbw_gbs * 1e6, self.inter_busbw_gbs * 1e6,
                self.intra_alpha_us * 1e-3, self.inter_alpha_us * 1e-3)

    def allreduce_ms(self, nbytes, ranks, knee):
        """(milliseconds, algorithm) of an nbytes allreduce among `ranks` GPUs: the faster
        of ring and tree, as NCCL's tuner picks per message."""
        if ranks <= 1:
            return 0.0, "none"
        g, nodes, bi, be, ai, ae = self._layout(ranks)
        ring_factor = 2.0 * (ranks - 1) / ranks  # bytes each GPU sends per message byte
        if nodes == 1:
            # NCCL's tree inside a node is a chain: the same 2(p-1) steps as the ring at 0.9
            # of its bandwidth, so the ring always wins there.
            t = 2 * (ranks - 1) * ai + ring_factor * nbytes / bi
            if knee:
                t += ring_factor * self.intra_half_bytes / bi
            return t, "ring"
        # Several nodes. Ring: 2(p-1) steps of which 2(N-1) cross nodes (NCCL's tuning.cc);
        # every GPU's NIC carries one ring's crossing, so the node's inter-node bandwidth is
        # g x each NIC's, and the ring runs at the slower of that and NVLink.
        # Tree: NVLink chain of g inside the node, double binary tree of depth log2 N across.
        ring_lat = 2 * (ranks - nodes) * ai + 2 * (nodes - 1) * ae
        tree_lat = 2 * ((g - 1) * ai + math.ceil(math.log2(nodes)) * ae)
        if self.phased:
            # Reduce-scatter in the node, allreduce of n/g bytes across nodes over each GPU's
            # NIC, allgather in the node, one after another: bandwidth terms add.
            intra = 2.0 * (g - 1) / g * nbytes / bi
            ring_bw = intra + 2.0 * (nodes - 1) / nodes * (nbytes / g) / be
            tree_bw = intra + 2.0 * (nbytes / g) / (TREE_BUSBW_FACTOR * be)
        else:
            bus = min(bi, g * be)
            ring_bw = ring_factor * nbytes / bus
            tree_bw = 2.0 * nbytes / (TREE_BUSBW_FACTOR * bus)
        ring, tree = ring_lat + ring_bw, tree_lat + tree_bw
        if knee:
            # The bottleneck flows are the NICs'; each runs at B m / (m + n_half).
            ring += 2.0 * (nodes - 1) / nodes * self.inter_half_bytes / be
            tree += 2.0 * self.inter_half_bytes / (TREE_BUSBW_FACTOR * be)
        return (ring, "ring") if ring <= tree else (tree, "tree")


    def ordered_allreduce_ms(self, nbytes, ranks):
        """Milliseconds of the rank-invariant mode's reduction of nbytes among `ranks` GPUs
        (comm/ordered_reduce.h, Note [ordered allreduce]): an all-to-all, in which each GPU
        sends 1/p of the buffer to each other GPU, those on other nodes through its own NIC
        while those in its node go over NVLink (at the same time, p-1 messages), then a ring
        all-gather of the p summed shards (p-1 steps, (p-1)/p of the buffer at the ring's bus
        bandwidth). The bytes are a ring allreduce's, 2(p-1)/p of the buffer, but the
        all-to-all's inter-node share cannot use the other GPUs' NICs, and none of it
        overlaps backward (Note [ordered synchronisation])."""
        if ranks <= 1:
            return 0.0
        g, nodes, bi, be, ai, ae = self._layout(ranks)
        shard = nbytes / ranks
        alltoall = max((g - 1) * shard / bi, (ranks - g) * shard / be)
        alltoall += (ranks - 1) * (ae if nodes > 1 else ai)
        bus = bi if nodes == 1 else min(bi, g * be)
        allgather = (ranks - 1) * shard / bus
        allgather += (ranks - nodes) * ai + (nodes - 1) * ae
        return alltoall + allgather


def tree_adds_ms(nbytes, ranks, chunks_per_rank, memory_gbs):
    """Milliseconds of the rank-invariant mode's local sums (comm::ChunkTree, Note [chunk
    tree]): per step K - 1 adds (read two buffers, write one) and K - 1 copies (read one,
    write one) of the gradient buffer, and at each shard's owner p - 1 adds of a 1/p shard,
    all memory-bound at memory_gbs."""
    k = chunks_per_rank
    moved = (3 + 2) * (k - 1) * nbytes + 3 * (ranks - 1) * nbytes / ranks
    return moved / (memory_gbs * 1e6)


def predict_invariant(profile, network, ranks, chunks_per_rank, memory_gbs):
    """The rank-invariant step at `ranks` GPUs, K chunks per rank, beside the default step
    with the same K micro-batches (ideal terms only: no knee, no interference): the mode's
    step is K forwards and backwards, then the reduction and the tree's adds, then the
    optimizer; the default overlaps its allreduce with the last micro-batch's backward."""
    nbytes = sum(b for b, _ in profile.buckets)
    chunk_ms = profile.forward_ms + profile.backward_ms
    comm = network.ordered_allreduce_ms(nbytes, ranks)
    tree = tree_adds_ms(nbytes, ranks, chunks_per_rank, memory_gbs)
    step = chunks_per_rank * chunk_ms + comm + tree + profile.optimizer_ms
    costs = [network.allreduce_ms(b, ranks, False)[0] for b, _ in profile.buckets]
    default = (chunks_per_rank - 1) * chunk_ms + simulate_step(profile, costs)[0]
    compute = chunks_per_rank * chunk_ms + profile.optimizer_ms
    return {"invariant_comm_ms": comm, "invariant_tree_ms": tree, "invariant_step_ms": step,
            "default_step_ms": default, "invariant_efficiency": compute / step,
            "invariant_over_default": step / default}


def flat_network(link, ranks):
    """The single-node network of a bench_scaling link record: its fitted per-message
    latency alpha (at link['ranks']) becomes a per-step latency alpha / 2(p-1); no knee,
    because the fit already holds this machine's small-message behaviour."""
    steps = 2 * max(1, link["ranks"] - 1)
    return Network(gpus_per_node=max(ranks, 1), intra_alpha_us=link["alpha_us"] / steps,
                   intra_busbw_gbs=link["bus_bandwidth_gbps"], inter_alpha_us=0.0,
                   inter_busbw_gbs=link["bus_bandwidth_gbps"], intra_half_bytes=0.0,
                   inter_half_bytes=0.0)


# ---------------------------------------------------------------------------------------
# Profiles: what one GPU does in a step, and when each bucket's gradients are written


@dataclass
class Profile:
    model: str
    source: str            # where it came from, for the table's header
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    buckets: list          # [(bytes, ready_ms)] in launch order
    params: int = 0

    @property
    def compute_ms(self):
        return self.forward_ms + self.backward_ms + self.optimizer_ms

    def scaled(self, factor, source):
        """Every time multiplied by `factor` (a slower or faster device)."""
        return replace(self, source=source, forward_ms=self.forward_ms * factor,
                       backward_ms=self.backward_ms * factor,
                       optimizer_ms=self.optimizer_ms * factor,
                       buckets=[(b, r * factor) for b, r in self.buckets])

    def with_wire_bytes(self, factor):
        return replace(self, buckets=[(b * factor, r) for b, r in self.buckets])


def plan_buckets(segments):
    """lockstep's plan_buckets: greedy in ready order, a bucket takes the next segment
    unless its slice (alignment padding included) would pass the cap; a segment larger than
    the cap is a bucket alone. segments: [(bytes, ready_ms)] -> [(bytes, ready_ms)]."""
    buckets, size, ready = [], 0, 0.0
    for nbytes, ready_ms in segments:
        cap = FIRST_BUCKET_CAP_BYTES if not buckets else BUCKET_CAP_BYTES
        offset = -(-size // SEGMENT_ALIGN_BYTES) * SEGMENT_ALIGN_BYTES  # next aligned start
        if size and offset + nbytes > cap:
            buckets.append((size, ready))
            size, offset, ready = 0, 0, 0.0
        size = offset + nbytes
        ready = max(ready, ready_ms)
    if size:
        buckets.append((size, ready))
    return buckets


def resnet50_layers():
    """torchvision's ResNet-50 (v1.5: stride in the 3x3 conv) at 224x224, in forward order:
    (name, [parameter numels], forward multiply-adds, has_input_gradient)."""
    layers = []

    def conv(name, cin, cout, k, stride, hw_in, input_grad=True):
        hw_out = hw_in // stride
        layers.append((name, [cout * cin * k * k], hw_out * hw_out * cout * cin * k * k,
                       input_grad))
        return hw_out

    def bn(name, c):
        # Normalisation is memory-bound, not FLOPs: its share of backward time goes to the
        # convolutions when time is spread by FLOPs (see docs/scaling-model.md).
        layers.append((name, [c, c], 0, True))

    hw = conv("conv1", 3, 64, 7, 2, 224, input_grad=False)  # the image needs no gradient
    bn("bn1", 64)
    hw //= 2  # max-pool
    inplanes = 64
    for stage, (planes, blocks, stride) in enumerate(
            [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)], start=1):
        for b in range(blocks):
            s = stride if b == 0 else 1
            p = f"layer{stage}.{b}"
            conv(f"{p}.conv1", inplanes, planes, 1, 1, hw)
            bn(f"{p}.bn1", planes)
            hw_out = conv(f"{p}.conv2", planes, planes, 3, s, hw)
            bn(f"{p}.bn2", planes)
            conv(f"{p}.conv3", planes, planes * 4, 1, 1, hw_out)
            bn(f"{p}.bn3", planes * 4)
            if b == 0:
                conv(f"{p}.downsample.0", inplanes, planes * 4, 1, s, hw)
                bn(f"{p}.downsample.1", planes * 4)
            inplanes, hw = planes * 4, hw_out
    layers.append(("fc", [1000 * 2048, 1000], 1000 * 2048, True))
    return layers


def resnet50_profile(step_ms, optimizer_ms):
    """The built-in ResNet-50: forward 1/3 and backward 2/3 of (step - optimizer); backward
    time spread over layers by backward FLOPs (2x forward, 1x for the stem, which computes no
    input gradient); a layer's parameters are ready when its backward ends."""
    layers = resnet50_layers()
    compute = step_ms - optimizer_ms
    forward_ms, backward_ms = compute / 3, compute * 2 / 3
    costs = [macs * (2 if input_grad else 1) for _, _, macs, input_grad in layers]
    ms_per_mac = backward_ms / sum(costs)
    segments, t = [], 0.0
    # Backward runs the layers in reverse; parameters within a layer in reverse too (bias,
    # then weight, as DDP registers them reversed).
    for (_, numels, _, _), cost in zip(reversed(layers), reversed(costs)):
        t += cost * ms_per_mac
        segments += [(4 * n, t) for n in reversed(numels)]
    params = sum(sum(numels) for _, numels, _, _ in layers)
    return Profile("resnet50", f"built-in, step {step_ms:g} ms", forward_ms, backward_ms,
                   optimizer_ms, plan_buckets(segments), params)


# ---------------------------------------------------------------------------------------
# Input files


def need(record, where, key, kind=float, positive=False):
    if key not in record or record[key] is None:
        raise InputError(f"{where}: '{record.get('bench')}' record lacks '{key}'")
    value = record[key]
    if kind is float and not (isinstance(value, (int, float)) and not isinstance(value, bool)):
        raise InputError(f"{where}: '{key}' is {value!r}, expected a number")
    if kind is int and not (isinstance(value, int) and not isinstance(value, bool)):
        raise InputError(f"{where}: '{key}' is {value!r}, expected an integer")
    if kind is str and not isinstance(value, str):
        raise InputError(f"{where}: '{key}' is {value!r}, expected a string")
    if kind in (int, float) and (value < 0 or (positive and value == 0)):
        sign = "positive" if positive else "non-negative"
        raise InputError(f"{where}: '{key}' is {value}, expected a {sign} number")
    return value


def parse_profile(record, where):
    buckets = record.get("buckets")
    if not isinstance(buckets, list) or not buckets:
        raise InputError(f"{where}: scaling_profile record needs a non-empty 'buckets' list")
    parsed = []
    for i, b in enumerate(buckets):
        if not isinstance(b, dict):
            raise InputError(f"{where}: buckets[{i}] is not an object")
        parsed.append((need(b, f"{where} buckets[{i}]", "bytes", int, positive=True),
                       need(b, f"{where} buckets[{i}]", "ready_ms")))
    profile = Profile(model=need(record, where, "model", str),
                      source=f"{where}, {record.get('device', '?')}",
                      forward_ms=need(record, where, "forward_ms"),
                      backward_ms=need(record, where, "backward_ms", positive=True),
                      optimizer_ms=need(record, where, "optimizer_ms"),
                      buckets=parsed, params=record.get("params", 0))
    return profile, need(record, where, "gemm_gflops", positive=True), record.get("device", "")


def parse_link(record, where):
    for key, kind in (("alpha_us", float), ("bus_bandwidth_gbps", float), ("ranks", int)):
        need(record, where, key, kind, positive=key != "alpha_us")
    return record


def parse_measurement(record, where):
    for key in ("ranks",):
        need(record, where, key, int, positive=True)
    for key in ("solo_ms", "compute_ms", "synced_ms", "efficiency"):
        need(record, where, key, positive=True)
    need(record, where, "model", str)
    for key in ("comm_ms", "jitter", "straggler_ms", "comm_in_step_ms", "serial_compute_ms"):
        if record.get(key) is not None:  # optional: older files lack the measured terms
            need(record, where, key)
    return record


def load_bench_file(path):
    profiles, links, measurements = [], [], []
    for where, record in read_jsonl(path, allow_empty=True):
        kind = record.get("bench")
        if kind == "scaling_profile":
            profiles.append(parse_profile(record, where))
        elif kind == "scaling_link":
            links.append(parse_link(record, where))
        elif kind == "scaling":
            measurements.append((where, parse_measurement(record, where)))
        elif kind is None:
            raise InputError(f"{where}: record has no 'bench' field")
    if not profiles:
        raise InputError(f"{path}: no 'scaling_profile' record "
                         "(write one with bench_scaling --json)")
    return profiles, links, measurements


# ---------------------------------------------------------------------------------------
# The step timeline and the non-ideal terms


def backward_wall_ms(work_ms, intervals, slowdown):
    """Wall time at which `work_ms` of undisturbed backward has been done, when compute runs
    at 1/(1+slowdown) of its speed during the (sorted, disjoint) communication intervals."""
    t, done = 0.0, 0.0
    for start, end in intervals:
        if done + (start - t) >= work_ms:
            return t + (work_ms - done)
        done += start - t
        rate = 1.0 / (1.0 + slowdown)
        if done + (end - start) * rate >= work_ms:
            return start + (work_ms - done) / rate
        done += (end - start) * rate
        t = end
    return t + (work_ms - done)


def simulate_step(profile, costs_ms, slowdown=0.0):
    """One rank's step: forward, then backward; bucket i starts when it is ready and the
    one channel is free (start_i = max(ready_i, end_{i-1})); the optimizer waits for both
    backward and the last bucket. Returns (step_ms, backward_end_ms, comm_end_ms, overlap_ms),
    backward-relative times from the start of backward."""
    intervals, end = [], 0.0
    for (_, ready_work), cost in zip(profile.buckets, costs_ms):
        # The bucket's start cannot move earlier because of later buckets, so one pass
        # suffices: earlier intervals are final when bucket i's ready time is computed.
        ready = backward_wall_ms(min(ready_work, profile.backward_ms), intervals, slowdown)
        ready += max(0.0, ready_work - profile.backward_ms)
        start = max(ready, end)
        end = start + cost
        if cost > 0:
            intervals.append((start, end))
    backward_end = backward_wall_ms(profile.backward_ms, intervals, slowdown)
    overlap = sum(max(0.0, min(e, backward_end) - s) for s, e in intervals)
    step = profile.forward_ms + max(backward_end, end) + profile.optimizer_ms
    return step, backward_end, end, overlap


_max_normal_cache = {}


def expected_max_normal(p):
    """E[max of p independent standard normals], by numerical integration of
    x * d/dx Phi(x)^p (exact to about 1e-6; sqrt(2 ln p) overestimates it)."""
    if p <= 1:
        return 0.0
    if p not in _max_normal_cache:
        x = np.linspace(-8.0, 8.0, 16001)
        cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
        pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        integrand = x * p * pdf * cdf ** (p - 1)
        _max_normal_cache[p] = float(np.sum(integrand) * (x[1] - x[0]))
    return _max_normal_cache[p]


@dataclass(frozen=True)
class NonIdeal:
    knee: bool = True
    interference: float = 0.10   # backward slowdown while communication overlaps it
    jitter: float = 0.01         # relative std of each rank's compute per step
    stall_prob: float = 1e-4     # probability a rank's loader stalls in a step
    stall_ms: float = 20.0       # length of one stall


def predict(profile, network, ranks, terms):
    """Efficiency at `ranks` GPUs: the ideal alpha-beta timeline, then each non-ideal term
    added in turn; the loss of each is the efficiency it takes away at that point."""
    def costs(knee):
        out = [network.allreduce_ms(b, ranks, knee) for b, _ in profile.buckets]
        return [c for c, _ in out], sorted({a for _, a in out})

    ideal_costs, algorithms = costs(False)
    ideal_step = simulate_step(profile, ideal_costs)[0]
    knee_costs, _ = costs(terms.knee)
    knee_step = simulate_step(profile, knee_costs)[0]
    step, backward_end, comm_end, overlap = simulate_step(profile, knee_costs, terms.interference)
    interference_step = step
    # The slowest of p ranks: every bucket's allreduce waits for it, so its delay is the
    # step's; ranks realign at each step's last allreduce.
    step += terms.jitter * profile.compute_ms * expected_max_normal(ranks)
    straggler_step = step
    # The step stalls when any rank's loader does. A rank alone stalls too (p = 1), so only
    # the excess over it counts against scaling.
    step += terms.stall_ms * ((1.0 - (1.0 - terms.stall_prob) ** ranks) - terms.stall_prob)
    eff = {
        "ideal": profile.compute_ms / ideal_step,
        "knee": profile.compute_ms / knee_step,
        "interference": profile.compute_ms / interference_step,
        "stragglers": profile.compute_ms / straggler_step,
        "loader": profile.compute_ms / step,
    }
    nodes = max(1, ranks // network.gpus_per_node)
    return {
        "model": profile.model, "gpus": ranks, "nodes": nodes,
        "algorithms": "+".join(algorithms), "buckets": len(profile.buckets),
        "compute_ms": profile.compute_ms, "step_ms": step,
        "comm_ms": sum(knee_costs), "overlap_ms": overlap,
        "exposed_comm_ms": max(0.0, comm_end - backward_end),
        "ideal_efficiency": eff["ideal"],
        "loss_knee": eff["ideal"] - eff["knee"],
        "loss_interference": eff["knee"] - eff["interference"],
        "loss_stragglers": eff["interference"] - eff["stragglers"],
        "loss_loader": eff["stragglers"] - eff["loader"],
        "efficiency": eff["loader"],
    }


# ---------------------------------------------------------------------------------------
# Output


def print_table(profile, rows):
    total_mb = sum(b for b, _ in profile.buckets) / 1e6
    print(f"\n{profile.model}: {profile.source}; {profile.params:,} parameters, "
          f"{len(profile.buckets)} buckets, {total_mb:.1f} MB on the wire; forward "
          f"{profile.forward_ms:.3g} ms, backward {profile.backward_ms:.3g} ms, optimizer "
          f"{profile.optimizer_ms:.3g} ms")
    print(f"{'GPUs':>5} {'nodes':>5} {'algo':>9} {'comm ms':>8} {'exposed':>8} {'ideal':>7} "
          f"{'-knee':>6} {'-interf':>7} {'-strag':>6} {'-loader':>7} {'predicted':>9}")
    for r in rows:
        print(f"{r['gpus']:>5} {r['nodes']:>5} {r['algorithms']:>9} {r['comm_ms']:>8.3g} "
              f"{r['exposed_comm_ms']:>8.3g} {100 * r['ideal_efficiency']:>6.1f}% "
              f"{100 * r['loss_knee']:>6.2f} {100 * r['loss_interference']:>7.2f} "
              f"{100 * r['loss_stragglers']:>6.2f} {100 * r['loss_loader']:>7.2f} "
              f"{100 * r['efficiency']:>8.1f}%")


def print_invariant(chunks_per_rank, rows):
    print(f"  --rank-invariant, {chunks_per_rank} chunk(s) per rank (ideal terms): "
          "all-to-all + all-gather after backward, and the tree's adds")
    print(f"  {'GPUs':>5} {'comm ms':>8} {'tree ms':>8} {'step ms':>8} {'default':>8} "
          f"{'ratio':>6} {'efficiency':>10}")
    for r in rows:
        print(f"  {r['gpus']:>5} {r['invariant_comm_ms']:>8.3g} {r['invariant_tree_ms']:>8.3g} "
              f"{r['invariant_step_ms']:>8.3g} {r['default_step_ms']:>8.3g} "
              f"{r['invariant_over_default']:>6.3f} {100 * r['invariant_efficiency']:>9.1f}%")


def plot(path, series):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    for i, (model, rows) in enumerate(series.items()):
        color = f"C{i}"
        gpus = [r["gpus"] for r in rows]
        ax.plot(gpus, [100 * r["ideal_efficiency"] for r in rows], "--", color=color,
                label=f"{model}: ideal alpha-beta")
        ax.plot(gpus, [100 * r["efficiency"] for r in rows], "o-", color=color, markersize=3,
                label=f"{model}: with non-ideal terms")
    for gpus, eff, label in REFERENCE_POINTS:
        ax.plot([gpus], [100 * eff], "k*", markersize=11)
        ax.annotate(label, (gpus, 100 * eff), textcoords="offset points", xytext=(6, -22),
                    fontsize=7)
    ax.set_xscale("log", base=2)
    ticks = sorted({r["gpus"] for rows in series.values() for r in rows} | {8})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("GPUs")
    ax.set_ylabel("weak-scaling efficiency (%)")
    ax.set_title("Predicted weak scaling, data-parallel training on H100 + NDR InfiniBand")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_ylim(top=101)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_json(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


# ---------------------------------------------------------------------------------------
# Modes


def target_profiles(args):
    """The profiles to predict, scaled to the target GPU."""
    profiles = []
    if args.profile:
        for profile, gemm_gflops, device in load_bench_file(args.profile)[0]:
            rescale = args.rescale == "always" or (args.rescale == "auto" and device != "cuda")
            if rescale:
                speedup = args.target_tflops * 1e3 / gemm_gflops
                source = (f"{profile.source} / {speedup:,.0f} ({gemm_gflops:g} GFLOP/s -> "
                          f"{args.target_tflops:g} TFLOP/s)")
                profile = profile.scaled(1.0 / speedup, source)
            profiles.append(profile)
    if not args.no_resnet50:
        profiles.append(resnet50_profile(args.resnet50_step_ms, args.resnet50_optimizer_ms))
    if args.model:
        profiles = [p for p in profiles if p.model in args.model]
        if not profiles:
            raise InputError(f"none of --model {', '.join(args.model)} is in the profiles")
    wire = 0.5 if args.wire_dtype == "bf16" else 1.0
    return [p.with_wire_bytes(wire) for p in profiles]


def run_model(args):
    network = Network(args.gpus_per_node, args.intra_alpha_us, args.intra_busbw_gbs,
                      args.inter_alpha_us, args.inter_busbw_gbs, args.intra_half_mib * MiB,
                      args.inter_half_mib * MiB, phased=args.phased)
    terms = NonIdeal(knee=args.inter_half_mib > 0 or args.intra_half_mib > 0,
                     interference=args.interference, jitter=args.jitter,
                     stall_prob=args.stall_prob, stall_ms=args.stall_ms)
    profiles = target_profiles(args)  # bad input fails before anything is printed
    for p in args.gpus:
        network.allreduce_ms(1, p, False)
    print(f"network: {args.gpus_per_node} GPUs per node; NVLink busbw {args.intra_busbw_gbs:g} "
          f"GB/s, alpha {args.intra_alpha_us:g} us/step; NIC {args.inter_busbw_gbs:g} GB/s per "
          f"GPU, alpha {args.inter_alpha_us:g} us/step; {'phased' if args.phased else 'pipelined'}"
          f"; wire {args.wire_dtype}")
    print(f"non-ideal: knee n_half {args.intra_half_mib:g}/{args.inter_half_mib:g} MiB "
          f"(intra/inter), interference {args.interference:g}, jitter sigma {args.jitter:g}, "
          f"loader stall {args.stall_ms:g} ms with p={args.stall_prob:g} per rank-step")
    print("columns: ideal efficiency, then the efficiency points each term takes away, in turn")
    series, records = {}, []
    for profile in profiles:
        rows = [predict(profile, network, p, terms) for p in args.gpus]
        print_table(profile, rows)
        if args.rank_invariant:
            for r in rows:
                r.update(predict_invariant(profile, network, r["gpus"], args.chunks_per_rank,
                                           args.memory_gbs))
            print_invariant(args.chunks_per_rank, rows)
        series[profile.model] = rows
        records += rows
    if args.json:
        write_json(args.json, records)
    if args.plot:
        plot(args.plot, series)
        print(f"\nplot: {args.plot}")


# The check's columns, in the order their terms are added (docs/scaling-model.md).
CHECK_TERMS = ("ideal", "contention", "stragglers", "sharded_optimizer", "comm_in_step",
               "after_comm", "loader")


def check_record(profile, network, m, terms):
    """Step times (ms) of bench_scaling's weak-scaling record `m` as the check builds it up,
    one term at a time (CHECK_TERMS), each measured in the same run where the record has it.
    The profile is scaled to the record's solo step, so that every efficiency is solo / step."""
    ranks = m["ranks"]
    base = profile.scaled(m["solo_ms"] / profile.compute_ms, profile.source)
    serial = m.get("host_overlap") is False
    if serial:
        # The synchroniser reduced every bucket after backward (Note [host overlap]).
        base = replace(base, buckets=[(b, base.backward_ms) for b, _ in base.buckets])
    none = NonIdeal(knee=False, interference=0.0, jitter=0.0, stall_prob=0.0, stall_ms=0.0)
    steps = {"ideal": predict(base, network, ranks, none)["step_ms"]}
    # Ranks sharing one machine slow each other's compute even without communication:
    # compute_ms / solo_ms, measured, stretches every compute time.
    shared = base.scaled(m["compute_ms"] / m["solo_ms"], base.source)
    contended = predict(shared, network, ranks, replace(none, interference=terms.interference))
    steps["contention"] = contended["step_ms"]
    # The slowest rank: measured as such (Note [serial step] in bench_scaling), else from
    # the step-to-step jitter (the record's, or --jitter) and a normal distribution.
    if m.get("straggler_ms") is not None:
        straggler = m["straggler_ms"]
    else:
        straggler = (m.get("jitter", terms.jitter) * shared.compute_ms
                     * expected_max_normal(ranks))
    steps["stragglers"] = steps["contention"] + straggler
    # ZeRO-1: each rank updates 1/p of the parameters, where solo and compute update all.
    sharded = shared.optimizer_ms * (1.0 - 1.0 / ranks) if m.get("zero") == 1 else 0.0
    steps["sharded_optimizer"] = steps["stragglers"] - sharded
    # Without overlap the communication is all exposed; in the step it runs right after
    # backward, on caches backward filled, not as the alpha-beta fit (hot buffers) says.
    in_step = m.get("comm_in_step_ms") if serial else None
    exposed = contended["exposed_comm_ms"]
    steps["comm_in_step"] = steps["sharded_optimizer"] + (in_step - exposed if in_step is not None
                                                   else 0.0)
    # The next forward and the optimizer refill the caches the communication evicted.
    after = m.get("serial_compute_ms") if serial else None
    steps["after_comm"] = steps["comm_in_step"] + (after - m["compute_ms"] if after is not None
                                                   else 0.0)
    steps["loader"] = steps["after_comm"] + terms.stall_ms * (
        (1.0 - (1.0 - terms.stall_prob) ** ranks) - terms.stall_prob)
    return steps, sum(network.allreduce_ms(b, ranks, False)[0] for b, _ in profile.buckets)


def run_check(args):
    """Predict bench_scaling's measured weak-scaling runs from its own profile, link and
    measured terms, and say what is left unexplained."""
    profiles, links, measurements = load_bench_file(args.check)
    if not links:
        raise InputError(f"{args.check}: no 'scaling_link' record to take alpha and bandwidth from")
    by_model = {p.model: p for p, _, _ in profiles}
    terms = NonIdeal(knee=False, interference=args.interference, jitter=args.jitter,
                     stall_prob=args.stall_prob, stall_ms=args.stall_ms)
    records = []
    print(f"check against {args.check}: flat network from the link record(s), profiles scaled "
          "to each record's solo step; efficiencies in %, each column adds one term")
    print("columns: ideal alpha-beta; + contention (compute_ms / solo_ms); + stragglers "
          "(measured, or from jitter); + ZeRO-1's sharded optimizer (1/p of the profile's); "
          "+ comm in step (measured, less the alpha-beta comm); "
          "+ compute after comm (measured); + loader stalls (flags) = predicted; "
          "unexplained = predicted - measured; no-overlap bound = solo / (compute + comm)")
    print(f"{'model':>8} {'ranks':>5} {'measured':>8} {'ideal':>6} {'+cont':>6} {'+strag':>6} "
          f"{'+shard':>6} {'+comm':>6} {'+after':>6} {'+loader':>7} {'unexpl':>6} {'no-overlap':>10} "
          f"{'comm ms pred/alone/step':>24}")
    for where, m in measurements:
        if m.get("mode", "weak") != "weak":
            print(f"{'':>8} skipping {where}: mode '{m.get('mode')}' (only weak runs are checked)")
            continue
        if m["model"] not in by_model:
            raise InputError(f"{where}: no scaling_profile for model '{m['model']}' "
                             f"in {args.check}")
        same = [link for link in links if link["ranks"] == m["ranks"]]
        network = flat_network((same or links)[0], m["ranks"])
        steps, comm_pred = check_record(by_model[m["model"]], network, m, terms)
        eff = {k: m["solo_ms"] / steps[k] for k in CHECK_TERMS}
        measured = m["efficiency"]
        comm_meas = m.get("comm_ms")
        # Measured only: the efficiency if communication had not overlapped compute at all.
        serial = m["solo_ms"] / (m["compute_ms"] + comm_meas) if comm_meas is not None else None
        unexplained = eff["loader"] - measured

        def ms(v):
            return f"{v:.3g}" if v is not None else "-"
        print(f"{m['model']:>8} {m['ranks']:>5} {100 * measured:>8.1f} "
              + " ".join(f"{100 * eff[k]:>{w}.1f}" for k, w in zip(CHECK_TERMS, (6, 6, 6, 6, 6, 6, 7)))
              + f" {100 * unexplained:>+6.1f} "
              f"{100 * serial if serial is not None else float('nan'):>10.1f} "
              f"{comm_pred:>8.3g} / {ms(comm_meas)} / {ms(m.get('comm_in_step_ms'))}")
        record = {"check": args.check, "record": where, "model": m["model"],
                  "ranks": m["ranks"], "measured_efficiency": measured,
                  "predicted_ideal": eff["ideal"],
                  "predicted_with_contention": eff["contention"],
                  "predicted_with_stragglers": eff["stragglers"],
                  "predicted_with_sharded_optimizer": eff["sharded_optimizer"],
                  "predicted_with_comm_in_step": eff["comm_in_step"],
                  "predicted_with_after_comm": eff["after_comm"],
                  "predicted_with_terms": eff["loader"],
                  "contention": m["compute_ms"] / m["solo_ms"],
                  "difference_ideal": eff["ideal"] - measured,
                  "difference_with_contention": eff["contention"] - measured,
                  "difference_with_terms": unexplained,
                  "unexplained_ms": m["synced_ms"] - steps["loader"],
                  "no_overlap_bound": serial,
                  "comm_ms_predicted": comm_pred, "comm_ms_measured": comm_meas,
                  "comm_in_step_ms": m.get("comm_in_step_ms")}
        # Loss of each term in points, as the model's table gives them.
        for before, after in zip(CHECK_TERMS, CHECK_TERMS[1:]):
            record[f"loss_{after}"] = eff[before] - eff[after]
        records.append(record)
    if not records:
        raise InputError(f"{args.check}: no weak-scaling 'scaling' record to check")
    if args.json:
        write_json(args.json, records)


def gpu_list(text):
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers")
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("GPU counts must be positive")
    return values


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Weak-scaling model for data-parallel training (docs/scaling-model.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    io = ap.add_argument_group("input and output")
    io.add_argument("--profile", metavar="FILE",
                    help="bench_scaling --json file; each scaling_profile record is a model")
    io.add_argument("--check", metavar="FILE",
                    help="compare the model with the weak-scaling records of a bench_scaling file")
    io.add_argument("--model", action="append", help="only this model (repeatable)")
    io.add_argument("--no-resnet50", action="store_true", help="leave out the built-in ResNet-50")
    io.add_argument("--gpus", type=gpu_list, default=[2 ** k for k in range(3, 13)],
                    help="GPU counts, comma-separated")
    io.add_argument("--json", metavar="FILE", help="write one JSON object per prediction")
    io.add_argument("--plot", metavar="PNG", help="plot efficiency against GPUs")
    net = ap.add_argument_group("network (defaults: 8 x H100 SXM on NVLink 4, one 400 Gb/s NDR "
                                "ConnectX-7 per GPU)")
    net.add_argument("--gpus-per-node", type=int, default=8)
    net.add_argument("--intra-busbw-gbs", type=float, default=360.0,
                     help="achievable NVLink allreduce bus bandwidth per GPU (450 GB/s nominal)")
    net.add_argument("--intra-alpha-us", type=float, default=3.0, help="latency per NVLink step")
    net.add_argument("--inter-busbw-gbs", type=float, default=45.0,
                     help="achievable bandwidth of each GPU's NIC (50 GB/s nominal)")
    net.add_argument("--inter-alpha-us", type=float, default=10.0,
                     help="latency per inter-node step, switch hops included")
    net.add_argument("--phased", action="store_true",
                     help="hierarchical phases in sequence instead of pipelined as NCCL does")
    net.add_argument("--wire-dtype", choices=["f32", "bf16"], default="f32",
                     help="gradient dtype on the wire (GradientSynchronizer's wire_dtype)")
    mode = ap.add_argument_group("the rank-invariant mode (docs/reproducibility.md)")
    mode.add_argument("--rank-invariant", action="store_true",
                      help="also predict the mode's step: its all-to-all + all-gather and tree")
    mode.add_argument("--chunks-per-rank", type=int, default=1,
                      help="K: micro-batches (chunks) per rank per step, in both steps")
    mode.add_argument("--memory-gbs", type=float, default=2600.0,
                      help="achievable device memory bandwidth for the tree's adds (H100 HBM3, "
                      "3350 GB/s nominal)")
    comp = ap.add_argument_group("compute")
    comp.add_argument("--target-tflops", type=float, default=400.0,
                      help="achieved training TFLOP/s of the target GPU (H100 bf16)")
    comp.add_argument("--rescale", choices=["auto", "always", "never"], default="auto",
                      help="scale profile times by target-tflops / gemm_gflops (auto: profiles "
                      "not measured on a CUDA device)")
    comp.add_argument("--resnet50-step-ms", type=float, default=85.0,
                      help="ResNet-50 step on one H100, batch 256, mixed precision (assumption)")
    comp.add_argument("--resnet50-optimizer-ms", type=float, default=0.5)
    terms = ap.add_argument_group("non-ideal terms (0 switches one off)")
    terms.add_argument("--intra-half-mib", type=float, default=1.0,
                       help="bandwidth knee n_half of an NVLink flow, MiB")
    terms.add_argument("--inter-half-mib", type=float, default=2.0,
                       help="bandwidth knee n_half of a NIC flow, MiB")
    terms.add_argument("--interference", type=float, default=0.10,
                       help="backward slowdown while communication kernels overlap it")
    terms.add_argument("--jitter", type=float, default=0.01,
                       help="relative std of each rank's compute time per step")
    terms.add_argument("--stall-prob", type=float, default=1e-4,
                       help="probability that a rank's loader stalls in a step")
    terms.add_argument("--stall-ms", type=float, default=20.0, help="length of a loader stall")
    args = ap.parse_args(argv)
    for name in ("intra_busbw_gbs", "inter_busbw_gbs", "target_tflops", "resnet50_step_ms",
                 "gpus_per_node"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    for name in ("intra_alpha_us", "inter_alpha_us", "intra_half_mib", "inter_half_mib",
                 "interference", "jitter", "stall_ms", "resnet50_optimizer_ms"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must not be negative")
    if args.chunks_per_rank < 1 or args.memory_gbs <= 0:
        ap.error("--chunks-per-rank and --memory-gbs must be positive")
    if args.rank_invariant and args.wire_dtype != "f32":
        ap.error("--rank-invariant sums f32 gradients (Note [ordered synchronisation]); "
                 "leave --wire-dtype at f32")
    if not 0 <= args.stall_prob <= 1:
        ap.error("--stall-prob is a probability, between 0 and 1")
    if args.resnet50_optimizer_ms >= args.resnet50_step_ms:
        ap.error("--resnet50-optimizer-ms must be below --resnet50-step-ms")
    return args


def main(argv):
    args = parse_args(argv)
    try:
        run_check(args) if args.check else run_model(args)
    except InputError as e:
        sys.exit(f"scaling_model.py: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
