"""What a hostile visitor tries: oversized or odd values are refused at once, naming the field, echoing
little of the value and logging no trace; uploads are refused; many visitors at once are each answered
or refused by the queue, in order, and memory comes back when they are done. Oversized bodies on any route,
JSON nested without end, too few values, and streams of events that are not there are each refused with a
clean 4xx that says why, never a 500 or a stream broken off."""

import ctypes
import gc
import logging
import os
import threading
import time

import pytest

from tests.serve import running_app

pytestmark = pytest.mark.slow  # a server (and a browser) per test

gradio_client = pytest.importorskip("gradio_client")
httpx = pytest.importorskip("httpx")


def rss_mb(pid: str | int = "self") -> float:
    if pid == "self":  # the server shares this process with the test's clients: what they freed goes back first
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.fixture(scope="module")
def app():
    with running_app(queue_size=64, with_runner=True) as (url, runner):
        yield gradio_client.Client(url, verbose=False), url, runner


@pytest.mark.parametrize(
    "endpoint,params,message",
    [
        ("/sweep", dict(kernel="attention", shape="B=1,H=1,T=1000000,D=512"), "a sweep here takes at most"),
        (
            "/sweep",
            dict(kernel="layer_norm", shape="M=99999999999999999999,C=64", x="block_m", y="num_warps"),
            "a sweep here takes at most",
        ),
        ("/sweep", dict(kernel="layer_norm", shape="", x="block_m", y="num_warps"), "missing M, C"),
        ("/sweep", dict(kernel="layer_norm", shape="M=8,C=64", x="block_m", y="block_m"), "x and y are both block_m"),
        ("/generate", dict(prompt="p" * 5_000_000, new_tokens=1), "at most 20000 are allowed"),
        ("/compare", dict(lengths=", ".join(["8"] * 7), new_tokens=1), "at most 6 numbers"),
        ("/compare", dict(lengths="8 " * 100_000), "prompt lengths \\(tokens\\) is 200000 characters long"),
        ("/compare", dict(lengths="1_0"), "digits 0-9"),
        ("/compare", dict(lengths="1000", new_tokens=64), "need 1064 positions; the model has 1024"),
    ],
)
def test_oversized_or_odd_values_are_refused_fast_with_memory_in_bounds(app, endpoint, params, message):
    client, _, _ = app
    before, t0 = rss_mb(), time.monotonic()
    with pytest.raises(gradio_client.exceptions.AppError, match=message):
        client.predict(**params, api_name=endpoint)
    assert time.monotonic() - t0 < 10
    assert rss_mb() - before < 300  # the 5 MB prompt is parsed, once; no job was started


@pytest.mark.parametrize(
    "endpoint,params,field",
    [
        ("/generate", dict(model="x" * 1_000_000), "model"),
        ("/generate", dict(dtype="y" * 1_000_000), "dtype"),
        ("/generate", dict(backend="cuda"), "backend"),
        ("/generate", dict(fusion=["decode"]), "fusion \\(Triton backend\\)"),
        ("/sweep", dict(kernel="gemm"), "kernel"),
        ("/lesson", dict(lesson="z" * 100_000), "lesson"),
        ("/export", dict(which="everything", fmt="csv"), "table"),
        ("/ladder", dict(model="gpt2-xl"), "model"),
    ],
)
def test_a_choice_is_refused_by_name_echoing_little_and_logging_no_trace(app, caplog, endpoint, params, field):
    client, _, _ = app
    with caplog.at_level(logging.DEBUG), pytest.raises(gradio_client.exceptions.AppError) as e:
        client.predict(**params, api_name=endpoint)
    message = str(e.value)
    assert message.startswith(field.replace("\\", "")) and "must be one of" in message, message
    assert len(message) < 400
    assert "Traceback" not in caplog.text


def test_a_file_reference_in_any_field_is_refused_clearly(app):
    client, url, _ = app
    file = {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}, "orig_name": "passwd"}
    params = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["parameters"]
    defaults = [p["parameter_default"] for p in params]
    for endpoint, data, index in (
        ("generate", [file, *defaults[1:]], 0),  # the model
        ("generate", [defaults[0], file, *defaults[2:]], 1),  # the prompt
        ("lesson", [file], 0),
        ("export", ["compare", {"nested": [file]}], 1),
    ):
        response = httpx.post(url + f"gradio_api/call/{endpoint}", json={"data": data})
        assert response.status_code == 400, response.text
        assert response.json()["detail"] == f"Input {index} is a file reference: this app takes no files."
    # The browser's own way in, the queue, is guarded the same way.
    response = httpx.post(url + "gradio_api/queue/join", json={"data": [file], "fn_index": 0, "session_hash": "x"})
    assert response.status_code == 400 and "takes no files" in response.text


def test_uploads_are_refused(app):
    _, url, _ = app
    response = httpx.post(url + "gradio_api/upload", files={"files": ("big.bin", b"x" * 1_000_000)})
    assert response.status_code == 403 and "takes no files" in response.text
    response = httpx.post(url + "gradio_api/upload/", files={"files": ("small.txt", b"x")})
    assert response.status_code == 403


def test_twenty_four_visitors_at_once_are_each_answered_in_order(app):
    client, url, runner = app
    mix = [
        ("/generate", lambda i: dict(prompt=f"v{i} = {i}", new_tokens=2, backend="torch")),
        ("/sweep", lambda i: dict(kernel="layer_norm", shape="M=4,C=32", x="block_m", y="num_warps")),
        ("/export", lambda i: dict(which="last run: steps", fmt="csv")),
    ]
    answers, errors, finished = {}, [], []
    client.predict(prompt="warm = 1", new_tokens=2, backend="torch", api_name="/generate")  # the model loaded
    server, worker = rss_mb(), rss_mb(runner.pid)

    def visit(i):
        endpoint, params = mix[i % len(mix)]
        try:
            own = gradio_client.Client(url, verbose=False)
            answers[i] = own.predict(**params(i), api_name=endpoint)
        except gradio_client.exceptions.AppError as e:  # a clear refusal is an answer too (nothing to export)
            answers[i] = str(e)
        except Exception as e:  # noqa: BLE001 (collected and reported below)
            errors.append((i, repr(e)))
        finished.append(i)

    threads = [threading.Thread(target=visit, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert sorted(answers) == list(range(24))
    for i, answer in answers.items():
        if i % 3 == 0:  # no visitor sees another's prompt or tokens
            assert answer[0].startswith(f"v{i} = {i}") and len(answer[0]) > len(f"v{i} = {i}")
        elif i % 3 == 1:
            assert "all 20 configs" in answer[2]
        else:
            assert "Nothing to export yet" in answer or str(answer).endswith(".csv")
    assert rss_mb() - server < 100 and rss_mb(runner.pid) - worker < 100, (server, worker)


ROUTES = ["gradio_api/component_server", "gradio_api/reset", "gradio_api/call/generate", "gradio_api/queue/join", "x"]


def peak_rss_mb(work) -> tuple[float, float]:
    """(this process's memory before `work`, its peak while `work` runs), sampled every 5 ms."""
    idle, peak, stop = rss_mb(), [0.0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mb(os.getpid()))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        work()
    finally:
        stop.set()
        sampler.join()
    return idle, peak[0]


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "chunked"])
@pytest.mark.parametrize("route", ROUTES)
def test_four_oversized_bodies_at_once_are_refused_on_every_route_with_memory_flat(app, route, declared):
    """A body that says it holds 96 MB is refused before a byte is read; one sent in chunks without saying so is
    read only up to the limit. The clients' bodies are one 1 MB chunk sent again and again: the memory measured
    here (the server's process is this one) is what the server holds."""
    _, url, _ = app
    chunk, answers = b"x" * (1 << 20), []
    headers = {"Content-Length": str(96 << 20)} if declared else {}

    def send():
        body = (chunk for _ in range(96))
        answers.append(httpx.post(url + route, content=body, headers=headers, timeout=120))

    def four_at_once():
        senders = [threading.Thread(target=send) for _ in range(4)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()

    idle, peak = peak_rss_mb(four_at_once)
    assert [a.status_code for a in answers] == [413] * 4, [a.text for a in answers]
    assert answers[0].json()["detail"] == "A request may hold at most 8 MB."
    assert peak - idle < 100, (idle, peak)


@pytest.mark.parametrize("route", ROUTES[:4])
@pytest.mark.parametrize("levels", [40, 100_000])
def test_deeply_nested_json_is_refused_on_every_route(app, route, levels):
    _, url, _ = app
    nested = "[" * levels + "]" * levels
    body = f'{{"data": [{nested}], "fn_index": 0, "session_hash": "s", "component_id": 1, "fn_name": "f"}}'
    response = httpx.post(url + route, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["detail"].startswith("The request's JSON nests deeper than 32 levels")


@pytest.mark.parametrize(
    "endpoint,data,message",
    [
        ("export", [], "/export takes 2 values, in this order: which, fmt; got 0 (missing which, fmt)."),
        ("export", ["compare"], "/export takes 2 values, in this order: which, fmt; got 1 (missing fmt)."),
        ("lesson", [], "/lesson takes 1 value, in this order: lesson; got 0 (missing lesson)."),
        ("ladder", ["gpt2"], "/ladder takes 3 values, in this order: model, dtype, batch; got 1 (missing dtype, "),
        ("generate", ["bundled"], "/generate takes 37 values, in this order: model, prompt, prompt_tokens, new_tokens"),
    ],
)
def test_an_api_call_with_too_few_values_names_the_endpoints_parameters(app, endpoint, data, message):
    _, url, _ = app
    response = httpx.post(url + f"gradio_api/call/{endpoint}", json={"data": data})
    assert response.status_code == 400 and response.json()["detail"].startswith(message), response.text


@pytest.mark.parametrize("event_id", ["abc", "x" * 5000, "%00", "0" * 32, "ünï", "a b", "v2", "'; drop"])
def test_a_stream_of_an_event_that_is_not_waiting_is_a_clean_404(app, event_id):
    _, url, _ = app
    response = httpx.get(url + f"gradio_api/call/export/{event_id}")  # read whole: a broken stream raises here
    assert response.status_code == 404, response.text
    assert response.json()["detail"].startswith("There is no event ")
    assert "<" not in response.text.replace("<endpoint>", "")  # nothing of the id but a well-formed one echoed


@pytest.mark.parametrize("session", ["", "abc", "x" * 5000])
def test_a_stream_of_a_session_that_is_not_waiting_is_a_clean_404(app, session):
    _, url, _ = app
    response = httpx.get(url + "gradio_api/queue/data", params={"session_hash": session})
    assert response.status_code == 404 and "no session with that session_hash" in response.text


def test_a_real_events_stream_is_still_served(app):
    _, url, _ = app
    event = httpx.post(url + "gradio_api/call/export", json={"data": ["compare", "csv"]}).json()["event_id"]
    response = httpx.get(url + f"gradio_api/call/export/{event}", timeout=60)
    assert response.status_code == 200 and "Nothing to export yet" in response.text
