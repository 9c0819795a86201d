"""BFCL through an OpenAI-compatible endpoint: llama-cpp-python's own server with the bundled
SmolLM2-135M, in ``native`` and ``hermes`` modes, each run killed once and resumed, then the two
reports compared.

    python benchmarks/bfcl_endpoint.py            # ~10 min on 2 cores

The tiny model's scores say little; what this shows is the path: ``--model config`` against a
real server, ``--workers``, a run killed with SIGKILL part-way and continued with ``--resume``,
and ``eval --compare``. It writes ``benchmarks/results/bfcl_endpoint_{native,hermes}.json`` (the
two reports), ``benchmarks/results/bfcl_endpoint.json`` (what happened to each run) and
``docs/img/bfcl_endpoint_compare.png`` (the comparison chart).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

# Helpers the benchmarks share (this folder is on sys.path when run as a script).
from _common import free_port

from hermes_agent.evals.resume import journal_path
from hermes_agent.models.llamacpp import bundled_model_path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CHART = ROOT / "docs" / "img" / "bfcl_endpoint_compare.png"
LAUNCHER = ROOT / "tests" / "llama_server.py"  # the server with llama.cpp's repacking off
CLI = [sys.executable, "-c", "from hermes_agent.cli import main; main()"]
CHAT_FORMATS = {"native": "chatml-function-calling", "hermes": "chatml"}


@contextmanager
def llama_server(chat_format: str) -> Iterator[str]:
    """``python -m llama_cpp.server`` on a free loopback port; yields its base URL."""
    port = free_port()
    command = [
        sys.executable, str(LAUNCHER), "--model", str(bundled_model_path()),
        "--host", "127.0.0.1", "--port", str(port), "--chat_format", chat_format,
        "--n_ctx", "4096", "--n_threads", "2", "--verbose", "False",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError("llama_cpp.server exited at start")
            try:
                if httpx.get(f"{base_url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama_cpp.server did not start within 120 s")
            time.sleep(0.5)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines()) if path.is_file() else 0


def run_mode(
    mode: str, folder: Path, categories: str, limit: int, kill_after: int
) -> dict[str, object]:
    config = folder / f"{mode}.yaml"
    report = RESULTS / f"bfcl_endpoint_{mode}.json"
    report.unlink(missing_ok=True)
    with llama_server(CHAT_FORMATS[mode]) as base_url:
        config.write_text(
            "model:\n  provider: openai\n  model_name: smollm2-135m\n"
            f"  base_url: {base_url}\n  api_key: local\n  mode: {mode}\n"
            "  temperature: 0.0\n  max_tokens: 128\n  timeout: 300\n",
            encoding="utf-8",
        )
        args = ["eval", "bfcl", "--category", categories, "--limit", str(limit)]
        args += ["--config", str(config), "--workers", "2", "-r", str(report), "-q"]
        started = time.perf_counter()
        first = subprocess.Popen([*CLI, *args], cwd=folder, stderr=subprocess.DEVNULL)
        journal = journal_path(report)
        while _lines(journal) < 1 + kill_after and first.poll() is None:
            time.sleep(0.2)
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed_at = _lines(journal) - 1
        second = subprocess.run(
            [*CLI, *args, "--resume"], cwd=folder, capture_output=True, text=True, check=False
        )
        seconds = time.perf_counter() - started
    data = json.loads(report.read_text(encoding="utf-8"))
    resumed_line = next(
        (line for line in second.stderr.splitlines() if line.startswith("resuming")), ""
    ).replace(f"{ROOT}/", "")  # the path from the checkout, not this machine's
    return {
        "mode": mode,
        "cases": data["summary"]["total"],
        "accuracy": data["summary"]["accuracy"],
        "killed_after_cases": killed_at,
        "resume_said": resumed_line,
        "resume_exit_code": second.returncode,
        "complete": data["settings"]["complete"],
        "journal_left": journal.exists(),
        "seconds": round(seconds, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--categories", default="simple_python,multiple,irrelevance,live_simple")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--kill-after", type=int, default=6, help="cases before the SIGKILL")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        for mode in ("native", "hermes"):
            runs.append(run_mode(mode, Path(folder), args.categories, args.limit, args.kill_after))
            print(json.dumps(runs[-1]), flush=True)
    reports = [str(RESULTS / f"bfcl_endpoint_{mode}.json") for mode in ("native", "hermes")]
    compare = subprocess.run(
        [*CLI, "eval", "--compare", *reports, "--chart", str(CHART)],
        capture_output=True,
        text=True,
        check=False,
    )
    print(compare.stdout)
    summary = {"runs": runs, "compare_table": compare.stdout}
    (RESULTS / "bfcl_endpoint.json").write_text(
        json.dumps(summary, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return compare.returncode


if __name__ == "__main__":
    sys.exit(main())
