"""Requests that would tie up the server are refused at once, with memory kept in bounds, and many
visitors at once each get their own answer."""

import threading
import time

import pytest

from tests.serve import running_app

gradio_client = pytest.importorskip("gradio_client")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.fixture(scope="module")
def client():
    with running_app(queue_size=64) as url:
        yield gradio_client.Client(url, verbose=False)


@pytest.mark.parametrize(
    "endpoint,params,message",
    [
        ("/sweep", dict(kernel="attention", shape="B=1,H=1,T=1000000,D=512"), "a sweep here takes at most"),
        (
            "/sweep",
            dict(kernel="layer_norm", shape="M=99999999999999999999,C=64", x="block_m", y="num_warps"),
            "a sweep here takes at most",
        ),
        ("/generate", dict(prompt="p" * 5_000_000, new_tokens=1), "at most 20000 are allowed"),
        ("/compare", dict(lengths=", ".join(["8"] * 7), new_tokens=1), "at most 6 prompt lengths"),
        ("/compare", dict(lengths="8 " * 100_000), "prompt lengths is 200000 characters long"),
    ],
)
def test_oversized_work_is_refused_fast_with_memory_in_bounds(client, endpoint, params, message):
    before, t0 = _rss_mb(), time.monotonic()
    with pytest.raises(gradio_client.exceptions.AppError, match=message):
        client.predict(**params, api_name=endpoint)
    assert time.monotonic() - t0 < 10
    assert _rss_mb() - before < 300  # the 5 MB prompt is parsed, once; no job was started


def test_sixteen_visitors_at_once_each_get_their_own_run(client):
    answers, errors = {}, []

    def visit(i):
        try:
            own = gradio_client.Client(client.src, verbose=False)
            text = own.predict(prompt=f"v{i} = {i}", new_tokens=2, backend="torch", api_name="/generate")[0]
            answers[i] = text
        except Exception as e:  # noqa: BLE001 (collected and reported below)
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=visit, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert sorted(answers) == list(range(16))
    for i, text in answers.items():  # no visitor sees another's prompt or tokens
        assert text.startswith(f"v{i} = {i}") and len(text) > len(f"v{i} = {i}")
