#!/usr/bin/env python3
"""Reads the flight-recorder dumps (flight-rank-<r>.json, written by every rank that could on a
watchdog failure, an abort or SIGUSR2) in DIR and says what happened: which ranks did not answer
the watchdogs' liveness checks, which collective the job was stuck in, which ranks never reached
it and where each of them was, and which ranks issued a different collective (kind, size or
dtype) at the same sequence number (a desync).

    python3 tools/flight.py DIR
"""
import argparse
import glob
import os
import re
import sys

from jsonl import InputError, read_json  # tools/jsonl.py

RECORD_FIELDS = {"sequence": int, "communicator": str, "kind": str, "count": int, "bytes": int,
                 "dtype": str, "step": int, "bucket": int, "enqueue_ns": int, "start_ns": int,
                 "end_ns": int, "state": str}
STATES = {"enqueued", "started", "completed", "failed"}



def load(path):
    dump = read_json(path, "flight dump")
    if not isinstance(dump, dict):
        raise InputError(f"{path}: not a flight dump (a JSON object is expected)")
    for key in ("rank", "size", "step", "now_ns", "epoch_unix_ns"):
        if not isinstance(dump.get(key), int):
            raise InputError(f"{path}: field '{key}' is missing or not an integer")
    if not 0 <= dump["rank"] < dump["size"]:
        raise InputError(f"{path}: rank {dump['rank']} is not a rank of a job of {dump['size']}")
    if not isinstance(dump.get("collectives"), list):
        raise InputError(f"{path}: field 'collectives' is missing or not a list")
    liveness = dump.get("liveness")  # absent from dumps older than Note [liveness check]
    if liveness is not None and not (
            isinstance(liveness, dict)
            and all(isinstance(liveness.get(k), int) for k in ("asked_ns", "ended_ns"))
            and isinstance(liveness.get("grace_s"), (int, float))
            and all(isinstance(liveness.get(k), list) and all(isinstance(r, int) for r in liveness[k])
                    for k in ("answered", "answered_ns", "silent"))
            and len(liveness["answered"]) == len(liveness["answered_ns"])):
        raise InputError(f"{path}: field 'liveness' is neither null nor a liveness check "
                         "(asked_ns, ended_ns, grace_s, answered, answered_ns, silent)")
    for i, record in enumerate(dump["collectives"]):
        if not isinstance(record, dict):
            raise InputError(f"{path}: collective {i} is not a JSON object")
        for key, kind in RECORD_FIELDS.items():
            if not isinstance(record.get(key), kind):
                raise InputError(f"{path}: collective {i}: field '{key}' is missing or not {kind.__name__}")
        if record["state"] not in STATES:
            raise InputError(f"{path}: collective {i}: unknown state '{record['state']}'")
    return dump


def key(record):
    return f"{record['communicator']}#{record['sequence']}"


def what(record):
    """'allreduce 1024 f32 (4096 bytes) at step 3, bucket 0'"""
    text = f"{record['kind']} {record['count']} {record['dtype']} ({record['bytes']} bytes)"
    text += f" at step {record['step']}" if record["step"] >= 0 else " before the first step"
    if record["bucket"] >= 0:  # 0-based in the dump; counted from 1 as in the watchdog's messages
        text += f", gradient bucket {record['bucket'] + 1}"
    return text


def ranks_text(ranks):
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def wall_ns(dump, ns):
    return dump["epoch_unix_ns"] + ns


# Note [dump cut]: ranks write their dumps at different moments. The first rank to give up on a
# collective dumps at its timeout; a stalled rank often dumps only when the job's end wakes it
# (mpirun continues stopped ranks before ending them), and by then it may have finished the
# collective it was stopped in and issued the next. Read as they are, its records would make the
# rank that gave up look like the one behind. So every dump is read as of the cut, the earliest
# dump of a rank that was waiting in a collective: a collective issued after the cut is taken as
# not issued, one completed after it as still running, and each is reported as late. The ranks'
# clocks are compared, which assumes they agree to well under the watchdog's timeout.
def cut_ns(dumps):
    waiting = [wall_ns(d, d["now_ns"]) for d in dumps.values()
               if any(r["state"] != "completed" for r in d["collectives"])]
    return min(waiting) if waiting else None


def as_of_cut(dumps, cut):
    """({rank: records as of the cut}, {(communicator, sequence): {rank: (seconds after the cut,
    "issued" or "completed")}})."""
    records, late = {}, {}
    for rank, dump in dumps.items():
        kept = []
        for record in dump["collectives"]:
            k = (record["communicator"], record["sequence"])
            if cut is not None and wall_ns(dump, record["enqueue_ns"]) > cut:
                late.setdefault(k, {})[rank] = ((wall_ns(dump, record["enqueue_ns"]) - cut) / 1e9,
                                                "issued")
                continue
            if (cut is not None and record["state"] == "completed"
                    and wall_ns(dump, record["end_ns"]) > cut):
                late.setdefault(k, {})[rank] = ((wall_ns(dump, record["end_ns"]) - cut) / 1e9,
                                                "completed")
                record = dict(record, state="started", end_ns=-1)
            kept.append(record)
        records[rank] = kept
    return records, late


# Note [liveness check] (comm/watchdog.cpp): a watchdog that gave up asked the other ranks what they
# were doing, and its dump says who answered and when. A rank stopped inside a collective that
# every rank issued looks like the others in the dumps (its own, if it left one, was written when
# the job's end woke it); the check is what names it. The job's end comes after the first report,
# which follows the first check to end: an answer that arrived later may come from a rank that the
# job's end woke, so a rank is heard only by an answer that arrived before the first check ended,
# or by its own check: a rank that asks is alive, though it may not answer while it reports and
# ends the job. A check asked after the cut is not counted at all: a woken rank's own check, made
# once the others were gone, would find them all silent.
def silent_ranks(dumps, cut):
    """({rank: [ranks whose check it did not answer in time]} for the ranks no check heard,
    {the ranks a check heard in time})."""
    checks = {rank: d["liveness"] for rank, d in dumps.items() if d.get("liveness") is not None
              and (cut is None or wall_ns(d, d["liveness"]["asked_ns"]) <= cut)}
    if not checks:
        return {}, set()
    first_end = min(wall_ns(dumps[rank], c["ended_ns"]) for rank, c in checks.items())
    heard, unheard = set(checks), {}
    for asker, check in sorted(checks.items()):
        for rank, ns in zip(check["answered"], check["answered_ns"]):
            if wall_ns(dumps[asker], ns) <= first_end:
                heard.add(rank)
            else:
                unheard.setdefault(rank, []).append(asker)
        for rank in check["silent"]:
            unheard.setdefault(rank, []).append(asker)
    return {rank: askers for rank, askers in unheard.items() if rank not in heard}, heard


def silent_lines(dumps, cut, silent):
    lines = []
    for rank, askers in sorted(silent.items()):
        first = dumps[askers[0]]
        check = first["liveness"]
        text = (f"NO ANSWER: rank {rank} did not answer the watchdog's liveness check of "
                f"{ranks_text(askers)} in time (rank {askers[0]} asked "
                f"{(first['now_ns'] - check['asked_ns']) / 1e9:.1f} s before it wrote its dump and "
                f"waited {check['grace_s']:g} s): it is stopped, dead or cut off")
        if rank in dumps and cut is not None and wall_ns(dumps[rank], dumps[rank]["now_ns"]) > cut:
            text += (f"; its own dump was written "
                     f"{(wall_ns(dumps[rank], dumps[rank]['now_ns']) - cut) / 1e9:.1f} s after "
                     "the first (the job's end woke it)")
        lines.append(text)
    return lines


# Note [stuck collective]: a communicator's stuck collective is the first unfinished one that
# some rank never reached (it left no dump, issued it too late, or its own records stop before
# it); only when every rank reached every unfinished one is it simply the first unfinished. A
# rank stopped in the middle of an allreduce shows why: its partner may complete that allreduce
# (its share arrived) and wait in the next, which the stopped rank never issued; the first
# unfinished one, issued by all, would name no culprit.
def analyse(dumps):
    """The report's lines, given {rank: dump}."""
    lines = []
    size = max(d["size"] for d in dumps.values())
    missing = [r for r in range(size) if r not in dumps]
    head = f"{len(dumps)} of {size} ranks left a dump"
    if missing:
        head += f"; {ranks_text(missing)} left none (stopped, dead or cut off before it could write)"
    lines.append(head)

    cut = cut_ns(dumps)  # Note [dump cut]
    silent, heard = silent_ranks(dumps, cut)
    lines += silent_lines(dumps, cut, silent)
    in_time, late = as_of_cut(dumps, cut)
    by_key = {}  # (communicator, sequence) -> {rank: record as of the cut}
    for rank, kept in in_time.items():
        for record in kept:
            by_key.setdefault((record["communicator"], record["sequence"]), {})[rank] = record

    # A desync: ranks issued different collectives at the same sequence number.
    for (comm, seq), records in sorted(by_key.items()):
        variants = {}
        for rank, record in records.items():
            variants.setdefault((record["kind"], record["count"], record["dtype"]), []).append(rank)
        if len(variants) > 1:
            lines.append(f"DESYNC at {comm}#{seq}: the ranks issued different collectives there:")
            for ranks in sorted(variants.values()):
                lines.append(f"  {ranks_text(ranks)} issued {what(records[ranks[0]])}")

    # The stuck collective of each communicator (Note [stuck collective]).
    for comm in sorted({c for c, _ in by_key}):
        unfinished = sorted(s for (c, s), records in by_key.items() if c == comm and any(
            r["state"] != "completed" for r in records.values()))
        if not unfinished:
            continue
        last_seen = {rank: max((r["sequence"] for r in kept if r["communicator"] == comm),
                               default=-1)
                     for rank, kept in in_time.items()}

        def someone_missing(seq):
            records = by_key[(comm, seq)]
            return any(rank not in dumps or (rank not in records and last_seen[rank] < seq)
                       for rank in range(size))

        seq = next((s for s in unfinished if someone_missing(s)), unfinished[0])
        records = by_key[(comm, seq)]
        late_here = late.get((comm, seq), {})
        issued = sorted(records)
        first = records[issued[0]]
        desynced = len({(r["kind"], r["count"], r["dtype"]) for r in records.values()}) > 1
        at = {r: (cut - dumps[r]["epoch_unix_ns"]) if cut is not None else dumps[r]["now_ns"]
              for r in records}
        waits = [(at[r] - rec["enqueue_ns"]) / 1e9 for r, rec in records.items()]
        lines.append(f"STUCK at {comm}#{seq}: "
                     f"{'the desynced collective above' if desynced else what(first)}, "
                     f"issued by {ranks_text(issued)} "
                     f"({', '.join(sorted({r['state'] for r in records.values()}))}; "
                     f"waiting up to {max(waits):.1f} s)")
        before = [(s, recs) for (c, s), recs in by_key.items() if c == comm and s < seq
                  and all(r["state"] == "completed" for r in recs.values())]
        for rank in range(size):
            if rank in records:
                # A rank that answered a check in time was not stalled: the job's end (an
                # abort) is what ended its collective.
                if late_here.get(rank, (0, ""))[1] == "completed" and rank not in heard:
                    lines.append(f"  rank {rank} completed {comm}#{seq} only "
                                 f"{late_here[rank][0]:.1f} s after a rank had given up on it "
                                 "(the job's end woke it; it was stalled inside it)")
                elif rank in silent:
                    lines.append(f"  rank {rank} issued {comm}#{seq} but did not answer the "
                                 "watchdog (NO ANSWER above): it is stopped or stalled inside it")
                continue
            if late_here.get(rank, (0, ""))[1] == "issued":
                lines.append(f"  rank {rank} never reached {comm}#{seq} in time: it issued it "
                             f"{late_here[rank][0]:.1f} s after a rank had given up on it "
                             "(the job's end woke it; it was stalled before)")
                continue
            if rank not in dumps:
                text = f"  rank {rank} never reached {comm}#{seq}; it left no dump"
                if before:
                    s, recs = max(before, key=lambda b: b[0])
                    text += (f"; it had joined {comm}#{s} ({what(next(iter(recs.values())))}), "
                             f"which the other ranks completed")
                lines.append(text)
                continue
            dump = dumps[rank]
            own = [r for r in in_time[rank] if r["communicator"] == comm]
            text = f"  rank {rank} never reached {comm}#{seq}; it is in step {dump['step']}"
            completed = [r for r in in_time[rank] if r["state"] == "completed"]
            if dump["step"] >= 1:
                text += f" (the last step it completed is {dump['step'] - 1})"
            if own:
                text += f"; its last collective on '{comm}' was #{own[-1]['sequence']}, {what(own[-1])}, {own[-1]['state']}"
            in_flight = [r for r in in_time[rank] if r["state"] != "completed"]
            if in_flight:
                text += "; it waits in " + ", ".join(f"{key(r)} ({what(r)})" for r in in_flight)
            elif completed:
                idle = (dump["now_ns"] - completed[-1]["end_ns"]) / 1e9
                text += f"; it is in no collective (the last one ended {idle:.1f} s before the dump)"
            lines.append(text)
    if len(lines) == 1:
        lines.append("every collective in the dumps completed on every rank that issued it, "
                     "and no two ranks issued different ones at the same sequence number")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", help="the directory holding flight-rank-<r>.json")
    args = parser.parse_args(argv)
    paths = glob.glob(os.path.join(args.dir, "flight-rank-*.json"))
    if not paths:
        print(f"flight.py: no flight-rank-<r>.json in {args.dir} (LOCKSTEP_FLIGHT_DIR, else the "
              "checkpoint directory, else the working directory of the ranks)", file=sys.stderr)
        return 2
    try:
        dumps = {}
        for path in sorted(paths):
            dump = load(path)
            match = re.search(r"flight-rank-(\d+)\.json$", path)
            if not match or int(match.group(1)) != dump["rank"]:
                raise InputError(f"{path}: holds rank {dump['rank']}'s dump")
            dumps[dump["rank"]] = dump
        sizes = sorted({d["size"] for d in dumps.values()})
        if len(sizes) > 1:
            raise InputError(f"the dumps in {args.dir} come from jobs of {sizes} ranks: clear the "
                             "directory of older runs' dumps")
    except InputError as e:
        print(f"flight.py: {e}", file=sys.stderr)
        return 2
    print("\n".join(analyse(dumps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
