#!/usr/bin/env bash
# `make run`: the worker on examples/oracular.yaml against the local broker, fed the bundled
# sample clickstream, with its outputs printed readably as they arrive (`oracular tail --pretty`).
#
# Every run is separate: it gets its own app id and topic prefix (RUN_ID, default
# demo-<UTC time>), so its state, consumer group and topics start empty; a second run neither
# counts the first one's events as late nor mixes its outputs with them.
# Ctrl-C (or SIGTERM) stops the tail and the worker, then prints the run's summary; a worker that
# dies is noticed, said, and ends the run (exit 1). The broker keeps running (`make
# broker-down`); `make clean` deletes every run's topics and state, `oracular topics delete
# RUN_ID` one run's topics.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
ORACULAR=$VENV/bin/oracular
CONFIG=${ORACULAR_CONFIG:-examples/oracular.yaml}
SAMPLE=${SAMPLE:-examples/clickstream.jsonl}
RUN_ID=${RUN_ID:-demo-$(date -u +%Y%m%dT%H%M%S)}
LOG=${LOG:-var/worker.log}  # the last run's
READY_TIMEOUT_S=120  # first start: Faust creates the topics and the changelog and joins the group
export ORACULAR_BROKER=${ORACULAR_BROKER:-$(cat "${KAFKA_DIR:-var/kafka}/bootstrap.txt")}
# The run's own consumer group, internal topics and state (var/faust/$RUN_ID), and its own
# topics $RUN_ID.events, $RUN_ID.predictions, ... (the worker creates them).
export ORACULAR_APP_ID=$RUN_ID ORACULAR_TOPIC_PREFIX=$RUN_ID

mkdir -p var
echo "== run $RUN_ID: worker on $CONFIG, broker $ORACULAR_BROKER (log: $LOG)"
"$ORACULAR" worker --config "$CONFIG" >"$LOG" 2>&1 &
worker=$!
tailer=
echo "== worker pid $worker"
sent=$(grep -c . "$SAMPLE")  # one message a line

# The worker's last `oracular summary:` counter, e.g. `count applied` -> 2817.
count() { grep -o "oracular summary: .*" "$LOG" | tail -n 1 | grep -o "\b$1=[0-9]*" | cut -d= -f2; }

# Wait up to $2 s for child $1 ($3 names it) to exit; SIGKILL it then, and say so. A stop
# that hangs must not hang the run: Ctrl-C always ends it.
end_within() {
    local pid=$1 limit_s=$2 what=$3 i
    for ((i = 0; i < limit_s * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "== $what did not stop within $limit_s s; killed" >&2
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

finish() {
    trap - EXIT INT TERM
    if [[ -n $tailer ]] && kill -0 "$tailer" 2>/dev/null; then
        kill -TERM "$tailer" 2>/dev/null || true  # it prints what it holds and its tally
        end_within "$tailer" 15 "the tail"
    fi
    if kill -0 $worker 2>/dev/null; then
        echo "== stopping the worker"
        kill -TERM $worker 2>/dev/null || true
    fi
    # It logs its final counters on the way out, and ends itself within its stop deadline.
    end_within $worker $((${ORACULAR_SHUTDOWN_TIMEOUT_S:-30} + 15)) "the worker"
    if ! grep -q "oracular summary:" "$LOG" 2>/dev/null; then
        echo "== run $RUN_ID: the worker logged no counters; see $LOG"
        return
    fi
    local handled=$(($(count applied) + $(count redelivered) + $(count duplicate_id) + $(count dead_lettered) + $(count ignored)))
    cat <<EOF
== summary of run $RUN_ID (the worker's final counters)
   inputs:       $sent messages in $SAMPLE; the worker applied $(count applied), late $(count late), redelivered $(count redelivered), retried ids $(count duplicate_id), ignored $(count ignored)
EOF
    if ((handled < sent)); then
        echo "                 (it stopped before reading them all: $((sent - handled)) not read yet)"
    fi
    cat <<EOF
   predictions:  $(count predictions) published to $RUN_ID.predictions
   episodes:     $(count episodes) closed, published to $RUN_ID.episodes (the tail counts them by
                 reason); $(count closed_by_timer) of them closed by the timer, the rest by the user's next
                 event or a sign-out. Whether the timer or a next event notices an idle
                 episode first depends on where the ticks fall among the batches, so that
                 split differs from run to run; the total does not
   dead letters: $(count dead_lettered) in $RUN_ID.events.dlq
   see them again:  $ORACULAR tail --pretty --from-beginning --topic-prefix $RUN_ID --idle 5
   forget the run:  $ORACULAR reset $RUN_ID && $ORACULAR topics delete $RUN_ID
                    (its state, then its topics; \`make clean\` deletes every run's)
   the broker:      still running at $ORACULAR_BROKER (\`make broker-down\` stops it)
EOF
}
trap finish EXIT
trap 'exit 0' INT     # Ctrl-C is how a run ends
trap 'exit 143' TERM

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

# The lookup API's address, from the worker's log line (6067, or a free port if it is taken).
api=$(grep -o "advertised to other workers as [^ ]*" "$LOG" | tail -n 1 | awk '{print $NF}')
echo "== lookup API of $RUN_ID: ${api:-not found in $LOG} (docs/serving.md); in another terminal:"
echo "   ORACULAR_APP_ID=$RUN_ID $ORACULAR query user-00126 --url ${api:-URL} --explain"
echo "== feeding $SAMPLE to $RUN_ID.events (times shifted so its last event is now)"
"$ORACULAR" produce "$SAMPLE" --now
echo "== outputs as they arrive: time (UTC), user, the event, then p per intent (REVEAL: show"
echo "   the prompt now); episode closes with each intent's verdict; dead letters. A tally"
echo "   follows whenever the outputs go quiet. The last sessions close 30 min after their last"
echo "   event (the timer). Ctrl-C stops the tail and the worker and prints the run's summary."
# In the background, so that a signal reaches this script's traps at once (a foreground
# child delays them until it exits; one started from a script ignores SIGINT); the loop
# notices a worker that died.
"$ORACULAR" tail --pretty --from-beginning "$@" &
tailer=$!
while kill -0 "$tailer" 2>/dev/null; do
    if ! kill -0 $worker 2>/dev/null; then
        echo "== the worker exited (see $LOG); stopping the run" >&2
        tail -n 5 "$LOG" >&2
        exit 1
    fi
    sleep 1 &
    wait $! || true
done
wait "$tailer"
