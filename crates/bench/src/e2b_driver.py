"""koder-bench's E2B SDK driver: the real `e2b` Python SDK against the daemon under test
(E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point at it). One JSON request per stdin line,
one JSON answer per stdout line, so the Rust harness can interleave its own samples between
batches. Times are wall-clock milliseconds measured around the SDK calls.

Requests:
  {"op": "open"}               create the sandbox the `run` batches use
  {"op": "run", "n": K}        K x sandbox.commands.run("true")            -> {"ms": [...]}
  {"op": "tti", "n": K}        K x (Sandbox.create(); commands.run("node -v")), one after the other,
                               each sandbox killed untimed afterwards       -> {"ms": [...]}
  {"op": "burst", "n": K}      the same K at once (K threads released by a barrier) -> {"ms": [...]}
  {"op": "close"}              kill the sandbox and exit
Any failure answers {"error": "..."}.
"""

import json
import sys
import threading
import time
import traceback

from e2b import Sandbox

TIMEOUT_S = 600


def run_true(sb, n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = sb.commands.run("true")
        out.append((time.perf_counter() - t) * 1e3)
        if r.exit_code != 0:
            raise RuntimeError(f"`true` exited {r.exit_code}: {r.stderr!r}")
    return out


def tti_one(made):
    t = time.perf_counter()
    sb = Sandbox.create(timeout=TIMEOUT_S)
    made.append(sb)
    r = sb.commands.run("node -v")
    took = (time.perf_counter() - t) * 1e3
    if r.exit_code != 0 or not r.stdout.startswith("v"):
        raise RuntimeError(f"`node -v` answered {r.exit_code}: {r.stdout!r} {r.stderr!r}")
    return took


def kill_all(made):
    for sb in made:
        try:
            sb.kill()
        except Exception:  # noqa: BLE001 - best effort; the daemon destroys the rest on stop
            pass
    made.clear()


def burst(n):
    barrier = threading.Barrier(n)
    made, out, errors = [], [None] * n, []

    def one(i):
        try:
            barrier.wait()
            out[i] = tti_one(made)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    kill_all(made)
    if errors:
        raise RuntimeError(f"{len(errors)} of {n} failed; first: {errors[0]}")
    return out


def main():
    sb = None
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        try:
            if op == "open":
                sb = Sandbox.create(timeout=TIMEOUT_S)
                ans = {"ok": True, "sandbox_id": sb.sandbox_id}
            elif op == "run":
                ans = {"ms": run_true(sb, req["n"])}
            elif op == "tti":
                ms = []
                for _ in range(req["n"]):
                    made = []
                    try:
                        ms.append(tti_one(made))
                    finally:
                        kill_all(made)
                ans = {"ms": ms}
            elif op == "burst":
                ans = {"ms": burst(req["n"])}
            elif op == "close":
                if sb is not None:
                    sb.kill()
                print(json.dumps({"ok": True}), flush=True)
                return
            else:
                ans = {"error": f"unknown op {op!r}"}
        except Exception as e:  # noqa: BLE001
            ans = {"error": f"{e!r}: {traceback.format_exc(limit=3)}"}
        print(json.dumps(ans), flush=True)


if __name__ == "__main__":
    main()
