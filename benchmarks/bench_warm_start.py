"""First-request latency of ``hermes-agent serve`` with the embedded model, cold and warm.

Each round starts ``hermes-agent serve`` with no config (the embedded SmolLM2 model and the demo
tools, a key for the user ``local`` in ``.hermes/api-key``) in a fresh temporary folder, on a
free loopback port, and measures:

- *cold* (``--no-warmup``): from the moment the port answers ``/healthz`` to the end of the
  first ``POST /v1/runs`` — the model is loaded, its grammar compiled and the system prompt
  evaluated inside that request;
- *warm* (the default, ``Agent.warmup`` at start-up): how long after ``/healthz`` the service
  says ``/readyz`` 200, then the first ``POST /v1/runs`` after that — what a client that
  waits for readiness (a load balancer, a Kubernetes readiness probe) sees.

The run is "What is 17 * 23?" with ``tool_choice: required`` (one call of the calculator, then
the answer). Rounds alternate cold and warm so that a busy machine affects both alike; the
median of each is reported, with the second request's latency for reference.

    python benchmarks/bench_warm_start.py                 # 3 rounds
    python benchmarks/bench_warm_start.py --rounds 5 --json benchmarks/results/warm_start.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import code_version, free_port

RUN = {"message": "What is 17 * 23?", "tool_choice": "required"}
FIELDS = ("process_to_http_s", "http_to_ready_s", "first_request_s", "second_request_s")


def wait_for(client: httpx.Client, path: str, deadline: float) -> float:
    """Poll ``path`` until it answers 200; the time it did (``time.monotonic``)."""
    while time.monotonic() < deadline:
        try:
            if client.get(path).status_code == 200:
                return time.monotonic()
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{path} did not answer 200 in time")


def one_round(warm: bool, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hermes-warm-") as folder:
        port = free_port()
        command = [sys.executable, "-m", "hermes_agent", "serve", "--port", str(port)]
        command.append("--warmup" if warm else "--no-warmup")
        env = {**os.environ, "HOME": folder}
        env.pop("HERMES_DEBUG", None)
        log = open(Path(folder) / "serve.log", "wb")  # noqa: SIM115 - closed in finally
        started = time.monotonic()
        server = subprocess.Popen(
            command, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=log
        )
        try:
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, timeout=timeout) as client:
                deadline = started + timeout
                up = wait_for(client, "/healthz", deadline)
                ready = wait_for(client, "/readyz", deadline) if warm else up
                key = (Path(folder) / ".hermes" / "api-key").read_text().strip()
                headers = {"Authorization": f"Bearer {key}"}
                times = []
                for _ in range(2):
                    begun = time.monotonic()
                    answer = client.post("/v1/runs", json=RUN, headers=headers)
                    times.append(time.monotonic() - begun)
                    if answer.status_code != 200:
                        raise RuntimeError(f"run failed: {answer.status_code} {answer.text[:300]}")
            return {
                "mode": "warm" if warm else "cold",
                "process_to_http_s": up - started,
                "http_to_ready_s": ready - up,
                "first_request_s": times[0],
                "second_request_s": times[1],
            }
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
            log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path, help="write the rows and medians here")
    args = parser.parse_args()
    rows = []
    for _ in range(args.rounds):
        for warm in (False, True):
            row = one_round(warm, args.timeout)
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary: dict[str, Any] = {}
    for mode in ("cold", "warm"):
        mine = [row for row in rows if row["mode"] == mode]
        summary[mode] = {
            key: round(statistics.median(row[key] for row in mine), 3)
            for key in (
                "process_to_http_s",
                "http_to_ready_s",
                "first_request_s",
                "second_request_s",
            )
        }
    print(json.dumps(summary, indent=1))
    if args.json is not None:
        document = {
            "code": code_version(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
            "rows": rows,
            "median": summary,
        }
        args.json.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
