"""tools/flight.py on dumps written here: a size desync, a rank that never reached a collective,
a rank without a dump, a rank stopped inside an allreduce that its partner completed, one stopped
inside an allreduce every rank issued (named by the watchdog's liveness check), and bad input
named by file. The end-to-end runs on real dumps are the
mpi_flight_* tests (tests/mpi/CMakeLists.txt). Run by ctest (tools_python)."""
import json
import os
import tempfile
import unittest

import flight
from fixtures import run_main


def record(seq, kind="allreduce", count=256, state="completed", step=0, bucket=-1, t=0):
    return {"sequence": seq, "communicator": "gradients", "kind": kind, "count": count,
            "bytes": count * 4, "dtype": "f32", "step": step, "bucket": bucket,
            "enqueue_ns": t, "start_ns": t, "end_ns": t + 10 if state == "completed" else -1,
            "state": state}


def dump(rank, size, collectives, step=1):
    return {"rank": rank, "size": size, "reason": "test", "step": step, "capacity": 8,
            "recorded": len(collectives), "epoch_unix_ns": 0, "now_ns": 5_000_000_000,
            "collectives": collectives}


class FlightTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, rank, content):
        with open(os.path.join(self.dir.name, f"flight-rank-{rank}.json"), "w") as f:
            f.write(content if isinstance(content, str) else json.dumps(content))

    def run_tool(self):
        return run_main(flight.main, [self.dir.name])

    def test_size_desync_and_a_rank_that_never_reached(self):
        self.write(0, dump(0, 4, [record(0), record(1, count=256, state="started", step=1, bucket=0)]))
        self.write(1, dump(1, 4, [record(0), record(1, count=512, state="started", step=1, bucket=0)]))
        self.write(2, dump(2, 4, [record(0)]))
        status, out, _ = self.run_tool()
        self.assertEqual(status, 0)
        lines = out.splitlines()
        self.assertEqual(lines[0], "3 of 4 ranks left a dump; rank 3 left none "
                                   "(stopped, dead or cut off before it could write)")
        self.assertIn("DESYNC at gradients#1: the ranks issued different collectives there:", lines)
        self.assertIn("  rank 0 issued allreduce 256 f32 (1024 bytes) at step 1, gradient bucket 1",
                      lines)
        self.assertIn("  rank 1 issued allreduce 512 f32 (2048 bytes) at step 1, gradient bucket 1",
                      lines)
        self.assertTrue(any(l.startswith("  rank 2 never reached gradients#1; it is in step 1 "
                                         "(the last step it completed is 0)") for l in lines), out)
        self.assertTrue(any(l.startswith("  rank 3 never reached gradients#1; it left no dump; "
                                         "it had joined gradients#0") for l in lines), out)

    def test_a_rank_stopped_inside_an_allreduce_is_named_at_the_next_one(self):
        # As a real 2-rank lockstep-train run left them (rank 1 SIGSTOPped): rank 0 completed
        # #1, whose share had arrived, and waits in #2; rank 1 is still in #1.
        self.write(0, dump(0, 2, [record(0), record(1, step=3, bucket=1),
                                  record(2, state="started", step=3, bucket=0)], step=3))
        self.write(1, dump(1, 2, [record(0), record(1, state="started", step=3, bucket=1)],
                           step=3))
        status, out, _ = self.run_tool()
        self.assertEqual(status, 0)
        lines = out.splitlines()
        self.assertTrue(lines[1].startswith("STUCK at gradients#2: allreduce 256 f32 (1024 bytes) "
                                            "at step 3, gradient bucket 1, issued by rank 0 "
                                            "(started;"), out)
        self.assertTrue(lines[2].startswith("  rank 1 never reached gradients#2; it is in step 3"),
                        out)
        self.assertIn("it waits in gradients#1", lines[2])

    def test_a_rank_woken_by_the_job_end_is_read_as_of_the_first_dump(self):
        # As CI's run left them: rank 1 was stopped inside #1 while rank 0 waited there; rank 0
        # gave up and dumped at 5 s; the job's end woke rank 1, which completed #1 and issued #2
        # before its own dump at 6 s. Read as of rank 0's dump both ranks are in #1.
        self.write(0, dump(0, 2, [record(0), record(1, state="started", step=3, bucket=1, t=1_000)],
                           step=3))
        woken = [record(0), record(1, step=3, bucket=1, t=1_000),
                 record(2, state="started", step=3, bucket=0, t=5_500_000_000)]
        woken[1]["end_ns"] = 5_400_000_000
        late = dump(1, 2, woken, step=3)
        late["now_ns"] = 6_000_000_000
        self.write(1, late)
        status, out, _ = self.run_tool()
        self.assertEqual(status, 0)
        lines = out.splitlines()
        self.assertTrue(lines[1].startswith("STUCK at gradients#1: allreduce 256 f32 (1024 bytes) "
                                            "at step 3, gradient bucket 2, issued by ranks 0, 1 "
                                            "(started; waiting up to 5.0 s)"), out)
        self.assertEqual(lines[2], "  rank 1 completed gradients#1 only 0.4 s after a rank had "
                                   "given up on it (the job's end woke it; it was stalled inside it)")
        self.assertEqual(len(lines), 3, out)

    def test_a_rank_stopped_inside_an_allreduce_every_rank_issued_is_named_by_the_check(self):
        # Note [liveness check]: both dumps show #1 started; rank 0's watchdog asked at 3 s,
        # heard nothing from rank 1 in its 2 s grace, and dumped at 5 s. The job's end woke
        # rank 1, which dumped at 6 s after a check of its own (at 5.5 s, after the cut) that
        # found rank 0 gone: that one does not count.
        started = [record(0), record(1, state="started", step=3, bucket=0, t=1_000)]
        first = dump(0, 2, started, step=3)
        first["liveness"] = {"asked_ns": 3_000_000_000, "ended_ns": 5_000_000_000,
                             "grace_s": 2.0, "answered": [], "answered_ns": [], "silent": [1]}
        self.write(0, first)
        woken = dump(1, 2, started, step=3)
        woken["now_ns"] = 6_000_000_000
        woken["liveness"] = {"asked_ns": 5_500_000_000, "ended_ns": 5_900_000_000,
                             "grace_s": 2.0, "answered": [], "answered_ns": [], "silent": [0]}
        self.write(1, woken)
        status, out, _ = self.run_tool()
        self.assertEqual(status, 0)
        lines = out.splitlines()
        self.assertEqual(lines[1], "NO ANSWER: rank 1 did not answer the watchdog's liveness check "
                                   "of rank 0 in time (rank 0 asked 2.0 s before it wrote its dump and "
                                   "waited 2 s): it is stopped, dead or cut off; its own dump was "
                                   "written 1.0 s after the first (the job's end woke it)")
        self.assertTrue(lines[2].startswith("STUCK at gradients#1: allreduce 256 f32 (1024 bytes) "
                                            "at step 3, gradient bucket 1, issued by ranks 0, 1 "
                                            "(started;"), out)
        self.assertEqual(lines[3], "  rank 1 issued gradients#1 but did not answer the watchdog "
                                   "(NO ANSWER above): it is stopped or stalled inside it")
        self.assertEqual(len(lines), 4, out)

    def test_an_answer_after_the_first_check_ended_does_not_count(self):
        # Three ranks, all in #1; rank 1 is stopped. Rank 0 asks at 3 s, hears rank 2 at 3.1 s,
        # ends its check and dumps at 5 s. Rank 2 asks at 3.2 s; the job's end wakes rank 1,
        # whose answer reaches rank 2 at 5.3 s: rank 1 is still named, by both checks.
        checks = {0: ([2], [3_100_000_000], [1], 5_000_000_000),
                  2: ([0, 1], [3_300_000_000, 5_300_000_000], [], 5_400_000_000)}
        for rank in range(3):
            d = dump(rank, 3, [record(0), record(1, state="started", t=1_000)])
            d["now_ns"] = checks.get(rank, (0, 0, 0, 5_600_000_000))[3]
            if rank in checks:
                answered, answered_ns, silent, _ = checks[rank]
                d["liveness"] = {"asked_ns": 3_000_000_000 + 100_000_000 * rank,
                                 "ended_ns": d["now_ns"], "grace_s": 2, "answered": answered,
                                 "answered_ns": answered_ns, "silent": silent}
            self.write(rank, d)
        status, out, _ = self.run_tool()
        self.assertEqual(status, 0)
        lines = out.splitlines()
        self.assertTrue(lines[1].startswith("NO ANSWER: rank 1 did not answer the watchdog's "
                                            "liveness check of ranks 0, 2 in time"), out)
        self.assertEqual(sum(l.startswith("NO ANSWER") for l in lines), 1, out)
        self.assertIn("  rank 1 issued gradients#1 but did not answer the watchdog (NO ANSWER "
                      "above): it is stopped or stalled inside it", lines)

    def test_a_rank_heard_in_time_whose_collective_ended_late_is_not_called_stalled(self):
        # Rank 1 is stopped before #1; rank 0 heard rank 2 in time, and the job's end (an
        # abort) returned rank 2 from #1 after rank 0's dump: rank 2 was not stalled.
        d0 = dump(0, 3, [record(0), record(1, state="started", t=1_000)])
        d0["liveness"] = {"asked_ns": 3_000_000_000, "ended_ns": 5_000_000_000, "grace_s": 2,
                          "answered": [2], "answered_ns": [3_100_000_000], "silent": [1]}
        self.write(0, d0)
        ended = [record(0), record(1, t=1_000)]
        ended[1]["end_ns"] = 5_200_000_000
        d2 = dump(2, 3, ended)
        d2["now_ns"] = 5_300_000_000
        self.write(2, d2)
        status, out, _ = self.run_tool()
        self.assertEqual(status, 0)
        self.assertNotIn("rank 2 completed", out)
        self.assertIn("  rank 1 never reached gradients#1; it left no dump", out)

    def test_an_answer_after_an_early_cut_still_counts(self):
        # Rank 2 answered rank 0 at 3.05 s and was ended before its own report: its dump, made
        # as it answered, is the cut. Rank 0 heard it at 3.1 s, before its check ended at 5 s.
        d0 = dump(0, 3, [record(0), record(1, state="started", t=1_000)])
        d0["liveness"] = {"asked_ns": 3_000_000_000, "ended_ns": 5_000_000_000, "grace_s": 2,
                          "answered": [2], "answered_ns": [3_100_000_000], "silent": [1]}
        self.write(0, d0)
        d2 = dump(2, 3, [record(0), record(1, state="started", t=1_000)])
        d2["now_ns"] = 3_050_000_000
        self.write(2, d2)
        status, out, _ = self.run_tool()
        self.assertEqual(status, 0)
        self.assertIn("NO ANSWER: rank 1 did not answer", out)
        self.assertNotIn("NO ANSWER: rank 2", out)

    def test_a_rank_that_asked_is_not_named(self):
        # A desync: all three time out at once. Rank 2's check ends first; it then reports and
        # ends the job without answering the others' questions. It was alive: it asked.
        for rank in range(3):
            d = dump(rank, 3, [record(0), record(1, state="started", t=1_000)])
            others = [r for r in range(3) if r != rank]
            answered = [r for r in others if r != 2]
            d["liveness"] = {"asked_ns": 3_000_000_000,
                             "ended_ns": 3_010_000_000 if rank == 2 else 5_000_000_000,
                             "grace_s": 2, "answered": answered,
                             "answered_ns": [3_005_000_000] * len(answered),
                             "silent": [r for r in others if r == 2]}
            d["now_ns"] = d["liveness"]["ended_ns"] + 1_000_000
            self.write(rank, d)
        status, out, _ = self.run_tool()
        self.assertEqual(status, 0)
        self.assertNotIn("NO ANSWER", out)

    def test_a_rank_that_answered_in_time_is_not_named(self):
        # Rank 0's check missed rank 2 (slow to answer); rank 1's heard it before the cut.
        for rank, answered, silent in ((0, [1], [2]), (1, [0, 2], []), (2, [0, 1], [])):
            d = dump(rank, 3, [record(0), record(1, state="started", t=1_000)])
            d["liveness"] = {"asked_ns": 3_000_000_000, "ended_ns": 5_000_000_000,
                             "grace_s": 2, "answered": answered,
                             "answered_ns": [3_100_000_000] * len(answered), "silent": silent}
            self.write(rank, d)
        status, out, _ = self.run_tool()
        self.assertEqual(status, 0)
        self.assertNotIn("NO ANSWER", out)

    def test_all_completed(self):
        for r in range(2):
            self.write(r, dump(r, 2, [record(0), record(1)]))
        status, out, _ = self.run_tool()
        self.assertEqual(status, 0)
        self.assertIn("every collective in the dumps completed", out)

    def test_bad_input_names_the_file(self):
        self.write(0, "{not json")
        status, _, err = self.run_tool()
        self.assertEqual(status, 2)
        self.assertIn("flight-rank-0.json: not a readable flight dump", err)
        self.write(0, "[1]")
        status, _, err = self.run_tool()
        self.assertEqual(status, 2)
        self.assertIn("flight-rank-0.json: not a flight dump", err)
        self.write(0, dump(0, 2, [3]))
        status, _, err = self.run_tool()
        self.assertEqual(status, 2)
        self.assertIn("flight-rank-0.json: collective 0 is not a JSON object", err)
        self.write(0, dump(1, 2, []))
        status, _, err = self.run_tool()
        self.assertEqual(status, 2)
        self.assertIn("flight-rank-0.json: holds rank 1's dump", err)
        broken = record(0)
        del broken["state"]
        self.write(0, dump(0, 2, [broken]))
        status, _, err = self.run_tool()
        self.assertEqual(status, 2)
        self.assertIn("collective 0: field 'state' is missing", err)
        bad_check = dump(0, 2, [])
        bad_check["liveness"] = {"asked_ns": 1, "ended_ns": 2, "grace_s": 2, "answered": [1],
                                 "answered_ns": [], "silent": []}
        self.write(0, bad_check)
        status, _, err = self.run_tool()
        self.assertEqual(status, 2)
        self.assertIn("flight-rank-0.json: field 'liveness' is neither null nor a liveness check",
                      err)
        self.write(0, dump(0, 2, []))
        self.write(1, dump(1, 3, []))
        status, _, err = self.run_tool()
        self.assertEqual(status, 2)
        self.assertIn("come from jobs of [2, 3] ranks", err)

    def test_no_dumps(self):
        status, _, err = self.run_tool()
        self.assertEqual(status, 2)
        self.assertIn("no flight-rank-<r>.json in", err)


if __name__ == "__main__":
    unittest.main()
