# Serve `qwen3-8b --dummy` (python -m oasis_exec serve) in `dense` and in `lookahead`, each
# driven by experiments/common/loadgen.py under the same load (open-loop Mooncake conversation arrivals, prompts capped at
# MAXP tokens, <= MAXO output tokens, <= CONC in flight, a fixed LOAD_S window), in one device call:
#   OASIS_COMMIT=<hash> WHL=.whl TRACE=mooncake_head.jsonl bash experiments/device.sh serving_load/serve
# A CPU dry run of the same script:
#   MODEL=tiny DEVICE=cpu MAXP=192 LOAD_S=15 KV_GB=0.05 LA_KV_GB=0.05 HOST_GB=0.05 OUT=/tmp/serve_dry bash experiments/device.sh serving_load/serve
# Every step runs under `timeout`, progress lines carry timestamps (stdout and $OUT/progress.log), a failed mode
# does not stop the next. Records: $OUT/serve_<mode>.json; logs: $OUT/server_<mode>.log, $OUT/aux.log (warm-ups,
# loadgen); six files in all (a device call returns at most 8).
MODEL=${MODEL:-qwen3-8b}; DEVICE=${DEVICE:-cuda}
MAXP=${MAXP:-16320}        # prompt cap: 16K context less the output
MAXO=${MAXO:-64}           # output cap
LIMIT=${LIMIT:-24}         # requests offered (the first LIMIT rows of the trace)
SCALE=${SCALE:-3.0}        # arrival time scale (3.0 = a third of the trace's rate: ~1.1 requests/s)
CONC=${CONC:-4}            # requests in flight, at most (client side; the host pool admits as many)
LOAD_S=${LOAD_S:-34}       # load window per mode (loadgen --deadline-s)
HOST_GB=${HOST_GB:-10}     # lookahead's pinned host pool: 4 x 2.42 GB at 16K
KV_GB=${KV_GB:-52}         # dense's GPU KV budget
LA_KV_GB=${LA_KV_GB:-16}   # lookahead's GPU KV budget (0.46 GB a lane at 16K: far more lanes than the pool admits)
UP_S=${UP_S:-40}           # server start (then up to 30 s of warm-up), both servers at once
WARM_TOK=${WARM_TOK:-2100} # warm-up prompt (two prefill chunks)
DEADLINE_S=${DEADLINE_S:-118}
TRACE=${TRACE:-}

say "commit $OASIS_COMMIT model $MODEL device $DEVICE prompts<=$MAXP out<=$MAXO limit $LIMIT scale $SCALE conc $CONC window ${LOAD_S}s"
SETSID=$(command -v setsid || true)
TRACE_ARG=(); [ -n "$TRACE" ] && TRACE_ARG=(--trace "$TRACE")

# Wait for OASIS_SERVER_LISTENING in the log, then for /health 200; prints the URL, exits 1 on timeout/death.
wait_up() {  # log pid timeout_s
  timeout "$3" $PY - "$1" "$2" <<'EOF'
import os, sys, time, urllib.request
log, pid = sys.argv[1], int(sys.argv[2])
url = None
while True:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("server exited")
    if url is None:
        for line in open(log, errors="replace"):
            if line.startswith("OASIS_SERVER_LISTENING "):
                url = line.split()[1]
    if url:
        try:
            if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                print(url)
                sys.exit(0)
        except OSError:
            pass
    time.sleep(0.1)
EOF
}

warm() {  # url prompt_tokens: one request through prefill and decode (Triton JIT, first graph capture)
  timeout 30 $PY - "$1" "$2" <<'EOF'
import json, random, sys, time, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
body = {"prompt": [random.Random(n).randrange(200) for _ in range(n)], "max_tokens": 8, "temperature": 0.0}
body["model"] = json.load(urllib.request.urlopen(url + "/v1/models", timeout=10))["data"][0]["id"]
t = time.perf_counter()
req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
out = json.load(urllib.request.urlopen(req, timeout=28))
print(f"warm-up {n} tokens: {out['usage']}, {time.perf_counter() - t:.2f}s")
EOF
}

start_server() {  # mode, extra server args... (setsid: the server leads its own process group, pid in $OUT/pid_<mode>)
  local mode=$1; shift
  say "$mode: starting server: $*"
  $SETSID $PY -m oasis_exec serve --model "$MODEL" --dummy --device "$DEVICE" --mode "$mode" --port 0 \
    --log-level warning "$@" > "$OUT/server_$mode.log" 2>&1 &
  echo $! > "$OUT/pid_$mode"
}

stop_server() {  # mode
  local pid; pid=$(cat "$OUT/pid_$1" 2>/dev/null); [ -z "$pid" ] && return
  kill -TERM -- -"$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- -"$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  say "$1: server stopped"
}

up_and_warm() {  # mode budget_s: wait for health, warm up, then write the URL to $OUT/url_<mode>
  local url; url=$(wait_up "$OUT/server_$1.log" "$(cat "$OUT/pid_$1")" "$2")
  if [ -z "$url" ]; then
    say "$1: server not healthy within ${2}s; log tail:"; tail -n 15 "$OUT/server_$1.log"; return
  fi
  say "$1: healthy at $url"
  local w; w=$(warm "$url" "$WARM_TOK" 2>&1)
  say "$1: warm-up rc=$?: $(echo "$w" | tail -n 3)"
  echo "$url" > "$OUT/url_$1"
}

load() {  # mode window_s
  local url; url=$(cat "$OUT/url_$1" 2>/dev/null)
  [ -z "$url" ] && { say "$1: no server, no load"; return; }
  say "$1: load for ${2}s"
  timeout -k 3 $(( $2 + 15 )) $PY experiments/common/loadgen.py --base-url "$url" "${TRACE_ARG[@]}" --limit "$LIMIT" \
    --time-scale "$SCALE" --concurrency "$CONC" --max-prompt "$MAXP" --max-output "$MAXO" --deadline-s "$2" \
    --per-request --out "$OUT/serve_$1.json" > "$OUT/loadgen_$1.tmp" 2>&1
  say "$1: loadgen rc=$?: $(tail -n 3 "$OUT/loadgen_$1.tmp")"
  { echo "== loadgen $1"; cat "$OUT/loadgen_$1.tmp"; } >> "$OUT/aux.log"; rm -f "$OUT/loadgen_$1.tmp"
}

# Both servers start together (start-up is the slow part: CUDA, weights, lookahead's pinned pool) and warm up;
# the loads then run one after the other, each with the GPU to itself: dense is stopped before lookahead's load.
start_server dense --kv-budget-gb "$KV_GB"
start_server lookahead --kv-budget-gb "$LA_KV_GB" --host-kv-gb "$HOST_GB" --transfer uva
up_and_warm dense "$UP_S" & W1=$!
up_and_warm lookahead "$UP_S" & W2=$!
wait $W1 $W2
# Equal windows for both modes, as long as the time left allows (each load + stop takes about W + 4 s).
W=$(min "$LOAD_S" $(( ($(left) - 10) / 2 )))
[ "$W" -lt 5 ] && W=5
load dense "$W"
stop_server dense
load lookahead "$W"
stop_server lookahead
rm -f "$OUT"/pid_* "$OUT"/url_*
say "done"
