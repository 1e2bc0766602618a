"""When each streamed update of one Generate leaves the server, seen two ways: raw server-sent events read
with httpx, and gradio_client's iteration. Starts `python app.py`; prints both timelines and the server's
own log line for each job (explorer.app.runner.Timeline).

    python -m experiments.stream_check [--tokens 256] [--model bundled]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--model", default="bundled")
    args = parser.parse_args()
    import httpx
    from gradio_client import Client

    port = free_port()
    env = dict(os.environ, PORT=str(port), GRADIO_ANALYTICS_ENABLED="False")
    server = subprocess.Popen(
        [sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    t0, log, up = time.monotonic(), [], threading.Event()

    def read():
        for line in server.stdout:
            log.append((time.monotonic() - t0, line.rstrip()))
            if "Running on local URL" in line:
                up.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        up.wait(600)
        url = f"http://127.0.0.1:{port}/"
        client = Client(url, verbose=False)
        params = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["parameters"]
        data = {p["parameter_name"]: p["parameter_default"] for p in params}
        data |= dict(model=args.model, new_tokens=args.tokens)
        for attempt in range(2):
            t1 = time.monotonic()
            event = httpx.post(url + "gradio_api/call/generate", json={"data": list(data.values())}).json()["event_id"]
            arrivals = []
            with httpx.stream("GET", url + f"gradio_api/call/generate/{event}", timeout=120) as stream:
                for line in stream.iter_lines():
                    if line.startswith("event:"):
                        arrivals.append((round(time.monotonic() - t1, 3), line[7:]))
            print(f"raw SSE, run {attempt + 1}: {arrivals}", flush=True)
            t1 = time.monotonic()
            stamps = [round(time.monotonic() - t1, 3) for _ in client.submit(**data, api_name="/generate")]
            print(f"gradio_client, run {attempt + 1}: {stamps}", flush=True)
        time.sleep(0.5)
        for t, line in log:
            if line.startswith("job "):
                print(f"server log at {t:.1f} s: {line}")
    finally:
        server.terminate()
        server.wait(30)
    print(json.dumps({"python": sys.version.split()[0]}))


if __name__ == "__main__":
    main()
