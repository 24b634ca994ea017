#!/usr/bin/env bash
# tools/gpu-check.sh's verdicts and exit status, with fake steps in place of
# the GPU binaries (usage: gpu_check_steps.sh SOURCE_DIR): a passing, a
# failing, a skipping and a timed-out step are counted; a step killed at its
# timeout keeps the lines it printed (line-buffered); run-tests over a fake
# pack exits with the number of binaries that failed, and stops after a
# failed smoke step with a count of one.
set -uo pipefail
source_dir=$1
# shellcheck source=../../tools/gpu-check.sh
source "$source_dir/tools/gpu-check.sh"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

fail() {
  echo "FAIL: $*"
  exit 1
}

# One call's steps, in this shell: each verdict, then the count as the status.
OUT=$scratch/steps
mkdir -p "$OUT"
step passing 5 true || fail "a passing step returned nonzero"
step failing 5 false && fail "a failing step returned zero"
step skipping 5 bash -c 'exit 77'
[ $? -eq 77 ] || fail "a skipping step did not return 77"
step slow 1 sleep 30
[ $? -eq 124 ] || fail "a step past its timeout did not return 124"
# sed writes through C stdio: fully buffered into a file unless line-buffered.
step killed 1 bash -c '{ echo ok before the kill; sleep 30; } | sed "s/^/sed: /"'
grep -qx "sed: ok before the kill" "$OUT/killed.log" ||
  fail "the killed step's printed line was lost: $(cat "$OUT/killed.log")"
verdicts >"$scratch/verdicts.txt"
status=$?
[ "$status" -eq 4 ] || fail "verdicts returned $status for 4 steps not passed"
tail -n 1 "$scratch/verdicts.txt" | grep -qx "steps not passed: 4 of 5" ||
  fail "last line: $(tail -n 1 "$scratch/verdicts.txt")"
for expected in "passing +passed" "failing +failed \(exit 1\)" "skipping +skipped \(no GPU\)" \
  "slow +timed out" "killed +timed out"; do
  grep -qE "^  $expected" "$scratch/verdicts.txt" || fail "no verdict '$expected' in
$(cat "$scratch/verdicts.txt")"
done

# run-tests over a fake pack: each binary a script exiting with FAKE_RC_<name>.
make_pack() {
  local stage=$scratch/stage b name
  rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/lib" "$stage/ref"
  for b in "${binaries[@]}"; do
    name=$(basename "$b")
    printf '#!/usr/bin/env bash\necho "fake %s ran"\nvar=FAKE_RC_%s\nexit "${!var:-0}"\n' \
      "$name" "${name//-/_}" >"$stage/bin/$name"
    chmod +x "$stage/bin/$name"
  done
  echo fake-commit >"$stage/ref/commit"
  tar czf "$scratch/pack.tar.gz" -C "$stage" .
}
make_pack
pack_file=$scratch/pack.tar.gz

# run_tests' trap and globals stay in a subshell, as in one call of the script,
# which starts with no verdicts.
verdicts=()
steps_failed=0
OUT=$scratch/run1
(FAKE_RC_lockstep_gpu_tests=1 FAKE_RC_lockstep_io_gpu_tests=3 run_tests) >"$scratch/run1.txt" 2>&1
status=$?
[ "$status" -eq 2 ] || fail "run-tests with two failing binaries exited $status
$(cat "$scratch/run1.txt")"
tail -n 1 "$scratch/run1.txt" | grep -qE "^steps not passed: 2 of [0-9]+$" ||
  fail "run-tests' last line: $(tail -n 1 "$scratch/run1.txt")"
grep -qE "^  gpu_tests +failed \(exit 1\)" "$scratch/run1.txt" || fail "no gpu_tests verdict"
grep -qE "^  io_gpu_tests +failed \(exit 3\)" "$scratch/run1.txt" || fail "no io_gpu_tests verdict"

OUT=$scratch/run2
(FAKE_RC_lockstep_gpu_smoke=1 run_tests) >"$scratch/run2.txt" 2>&1
status=$?
[ "$status" -eq 1 ] || fail "run-tests after a failed smoke step exited $status"
grep -q "nothing else ran" "$scratch/run2.txt" || fail "no 'nothing else ran' after the smoke step"
[ ! -e "$OUT/gpu_tests.log" ] || fail "a test binary ran after the smoke step failed"

OUT=$scratch/run3
(run_tests) >"$scratch/run3.txt" 2>&1 || fail "run-tests with every binary passing exited $?
$(cat "$scratch/run3.txt")"
echo "gpu-check step counting: ok"
