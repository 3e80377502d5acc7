# Sourced by the scripts in this folder: `start_busy` keeps one core busy with another
# process until `stop_busy` (also run on exit), for the figures with a competing busy
# process.
busy_pid=""
start_busy() {
  (while :; do :; done) &
  busy_pid=$!
}
stop_busy() {
  if [[ -n "$busy_pid" ]]; then
    kill "$busy_pid" 2>/dev/null || true
    wait "$busy_pid" 2>/dev/null || true
    busy_pid=""
  fi
}
trap stop_busy EXIT
