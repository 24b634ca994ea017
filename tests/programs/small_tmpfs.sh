# Sourced by the full-disk tests: small_tmpfs SIZE makes $work (a scratch
# folder) and mounts a tmpfs of SIZE at $disk inside it, both removed on any
# exit; without the right to mount (root) it reports the test skipped (77).
small_tmpfs() {
  work=$(mktemp -d)
  disk=$work/disk
  mkdir -p "$disk"
  trap 'mountpoint -q "$disk" && umount "$disk"; rm -rf "$work"' EXIT
  if ! mount -t tmpfs -o "size=$1,mode=0700" lockstep-test "$disk" 2>"$work/mount.log"; then
    echo "skipped: cannot mount a tmpfs ($(cat "$work/mount.log"); needs root)"
    exit 77
  fi
}
