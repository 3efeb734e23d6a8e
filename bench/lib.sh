# Shared by bench/webhook/run.sh and bench/kai/run.sh (sourced; needs ROOT and HANDBOOK set).
# Defines WORK (a temporary folder removed at exit with every PID in PIDS killed), BIN (the release
# hami-webhook: built unless BIN is given) and $WORK/go-peer-bin (the Go peer: built from the
# handbook unless GO_PEER_BIN is given), and writes $WORK/cert.pem / $WORK/key.pem for localhost.

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

if [ -z "${BIN:-}" ]; then
  echo "== building hami-webhook (release)"
  (cd "$ROOT" && cargo build --release -q -p hami-webhook)
  BIN="$("$ROOT/scripts/target-dir")/release/hami-webhook"
fi

if [ -n "${GO_PEER_BIN:-}" ]; then
  cp "$GO_PEER_BIN" "$WORK/go-peer-bin"
else
  echo "== building the Go peer"
  cp -r "$HANDBOOK/bench/go-peer" "$WORK/go-peer"
  chmod -R u+w "$WORK/go-peer"
  (cd "$WORK/go-peer" && GOFLAGS=-mod=mod GOPROXY=off GOCACHE="$WORK/gocache" go build -o "$WORK/go-peer-bin" .)
fi

echo "== test certificate"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
  -keyout "$WORK/key.pem" -out "$WORK/cert.pem" >/dev/null 2>&1
