"""One simulated workflow job, run as its own process: read the input files, work, write the output files, and
report the new data states and mutations to the collector's REST API.

Standard library only and run by path (not as part of the package), like the paper's instrumented C codes:
what it reports is plain JSON over HTTP. Usage: ``python worker.py JOB_JSON`` where the job has ``address``,
``run``, ``app``, ``kind``, ``sleep`` (seconds), ``inputs`` [{id, path}], ``outputs`` [{id, path, size,
location}] and optionally ``delete`` (remove the inputs instead of writing outputs), ``hold`` (after the work,
wait for a line on standard input before writing the outputs) and ``then`` (jobs this process runs next, each
reported in turn).
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request


def post(address: str, run: str, body: dict) -> None:
    req = urllib.request.Request(f"{address}/v1/runs/{run}/states", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"worker {body['mutations'][0]['application'] if body['mutations'] else ''}: collector "
                         f"refused the report: HTTP {exc.code}: {exc.read().decode(errors='replace')}") from None


def main(job: dict) -> None:
    start = time.time_ns()
    for inp in job["inputs"]:
        with open(inp["path"], "rb") as f:
            while f.read(1 << 20):
                pass
    time.sleep(job["sleep"])
    if job.get("hold"):
        sys.stdin.readline()
    states, mutations = [], []
    if job.get("delete"):
        for inp in job["inputs"]:
            os.remove(inp["path"])
            states.append({"state_id": f"{inp['id']}-deleted", "label": os.path.basename(inp["path"]),
                           "size_bytes": 0, "ts_ns": time.time_ns(), "origin": job["app"],
                           "location": inp.get("location")})
            mutations.append({"src_state_id": inp["id"], "dst_state_id": states[-1]["state_id"], "kind": "DELETE",
                              "application": job["app"], "attrs": json.dumps({"start_ns": start})})
    for out in job["outputs"]:
        with open(out["path"], "wb") as f:
            f.write(b"\0" * out["size"])
        states.append({"state_id": out["id"], "label": os.path.basename(out["path"]), "size_bytes": out["size"],
                       "ts_ns": time.time_ns(), "origin": job["app"], "location": out["location"],
                       "attrs": json.dumps({"path": out["path"]})})
        for inp in job["inputs"]:
            mutations.append({"src_state_id": inp["id"], "dst_state_id": out["id"], "kind": job["kind"],
                              "application": job["app"], "attrs": json.dumps({"start_ns": start})})
    post(job["address"], job["run"], {"states": states, "mutations": mutations})
    for nxt in job.get("then", ()):  # a follow-up job of the same process (a rank's next step)
        main({**nxt, "address": job["address"], "run": job["run"]})


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
