#!/usr/bin/env bash
# `make run`: the worker on examples/oracular.yaml against the local broker, fed the bundled
# sample clickstream, with its outputs printed as they arrive. Ctrl-C stops the tail and the
# worker (the broker keeps running: `make broker-down`).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
CONFIG=${ORACULAR_CONFIG:-examples/oracular.yaml}
SAMPLE=${SAMPLE:-examples/clickstream.jsonl}
LOG=var/worker.log
READY_TIMEOUT_S=120  # first start: Faust creates the changelog topic and joins the group
export ORACULAR_BROKER=${ORACULAR_BROKER:-$(cat "${KAFKA_DIR:-var/kafka}/bootstrap.txt")}

mkdir -p var
echo "== worker: $VENV/bin/oracular worker --config $CONFIG (log: $LOG)"
"$VENV/bin/oracular" worker --config "$CONFIG" >"$LOG" 2>&1 &
worker=$!
trap 'echo "== stopping the worker"; kill -TERM $worker 2>/dev/null; wait $worker 2>/dev/null || true' EXIT

for ((waited = 0; waited < READY_TIMEOUT_S * 2; waited++)); do
    grep -q "Worker ready" "$LOG" 2>/dev/null && break
    if ! kill -0 $worker 2>/dev/null; then
        echo "the worker exited during start-up; the end of $LOG:" >&2
        tail -n 30 "$LOG" >&2
        exit 1
    fi
    sleep 0.5
done
if ! grep -q "Worker ready" "$LOG"; then
    echo "the worker was not ready within ${READY_TIMEOUT_S} s; the end of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
fi

echo "== feeding $SAMPLE (times shifted so its last event is now)"
"$VENV/bin/oracular" produce "$SAMPLE" --now
echo "== outputs (oracular tail; Ctrl-C to stop; the worker's summary is in $LOG)"
"$VENV/bin/oracular" tail --from-beginning "$@"
