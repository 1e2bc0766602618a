"""Gradio's events as a request names them, checked against Gradio's own tables before Gradio reads the
request (serve.Guard asks), for the two cases Gradio answers with no words or no answer at all:

- GET /gradio_api/call/<endpoint>/<event id> and GET /gradio_api/queue/data?session_hash=... answer 200 and
  start a stream at once; only inside it does Gradio look the id up, and for an id it does not hold it raises,
  which breaks the stream off (the client sees an incomplete chunked body). The lookup here is Gradio's own
  (routes.simple_predict_get and queue_data_helper in gradio 6.31, pinned): an event still queued or running,
  or one finished whose last messages wait to be read.
- an event given fewer values than its handler takes fails in Gradio's preprocessing with a ValueError it
  does not show (the client reads {"error": null}); here it is refused naming the endpoint's parameters.
"""

from __future__ import annotations

import inspect
import re
from urllib.parse import parse_qs

CALL_STREAM = re.compile(r"/call/(?:v2/)?[^/]+/([^/]+)$")  # Gradio matches /call/v2/<name> as <name>=v2
EVENT_ID = re.compile(r"[0-9a-f]{32}")  # what Gradio issues: uuid4().hex


def missing(scope, path: str) -> str | None:
    """Why a GET of an event stream is refused (no such event or session waiting here), or None: another
    route, or one that Gradio answers cleanly by itself (a session_hash left out: 422)."""
    queue = _queue(scope)
    if queue is None:
        return None
    if m := CALL_STREAM.search(path):
        event_id = m.group(1)
        if EVENT_ID.fullmatch(event_id) and _session_of(queue, event_id) in queue.pending_messages_per_session:
            return None
        shown = f"{event_id} " if EVENT_ID.fullmatch(event_id) else ""
        return (
            f"There is no event {shown}waiting here. An event id is the one a POST to /gradio_api/call/<endpoint> "
            "answered (32 hexadecimal digits); its results can be read once, until the event has ended."
        )
    if path.endswith("/queue/data"):
        sessions = parse_qs(scope["query_string"].decode("latin-1"), keep_blank_values=True).get("session_hash")
        if sessions and sessions[0] not in queue.pending_messages_per_session:
            return "There is no session with that session_hash waiting here: join the queue first."
    return None


def short(scope, path: str, body) -> str | None:
    """Why an event's data (POST /call/<endpoint>, /run/<endpoint> or /queue/join) is refused as too few
    values, or None."""
    blocks = _blocks(scope)
    if blocks is None or not isinstance(body, dict) or not isinstance(body.get("data"), list):
        return None
    if path.endswith("/queue/join"):  # the page's own way in: every input, the page's state among them
        fn = blocks.fns.get(body.get("fn_index")) if isinstance(body.get("fn_index"), int) else None
        needed = len(fn.inputs) if fn is not None else 0
    else:  # an API call: the inputs an API client gives (Gradio fills the page's state itself)
        name = path.rsplit("/", 1)[-1]
        fn = next((f for f in blocks.fns.values() if f.api_name == name), None)
        needed = sum(not block.skip_api for block in fn.inputs) if fn is not None else 0
    given = len(body["data"])
    if given >= needed:
        return None
    names = list(inspect.signature(fn.fn).parameters)[:needed] if callable(fn.fn) else []
    if len(names) < needed:  # a handler without named parameters: its inputs by position
        names = [f"input {i}" for i in range(needed)]
    endpoint = f"/{fn.api_name}" if fn.api_name else "This event"
    values = "value" if needed == 1 else "values"
    return (
        f"{endpoint} takes {needed} {values}, in this order: {', '.join(names)}; got {given} "
        f"(missing {', '.join(names[given:])})."
    )


def _blocks(scope):
    get = getattr(scope.get("app"), "get_blocks", None)
    return get() if get is not None else None


def _queue(scope):
    return getattr(_blocks(scope), "_queue", None)


def _session_of(queue, event_id: str) -> str:
    """The session an event id streams from, found as Gradio finds it."""
    event = queue.event_ids_to_events.get(event_id)
    if event is not None:
        return event.session_hash
    return next((s for s, ids in queue.pending_event_ids_session.items() if event_id in ids), event_id)
