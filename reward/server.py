"""Serve any reward source over HTTP: `python -m rsft.serve_reward <spec>`.

    python -m rsft.serve_reward trained:runs/demo/reward               # 127.0.0.1:8000, CPU
    python -m rsft.serve_reward pretrained:<folder or hub id> --device cuda --port 8100
    python -m rsft.serve_reward function:my_rewards:exact_match --host 0.0.0.0   # the network (no auth!)

The spec is any that reward.specs.open_source takes (`trained:`, `pretrained:`, `function:`, a
folder). A run then scores with the URL as its reward (reward.http_client.HttpReward), from this machine
or another: the GPU that holds the reward model need not be the one that samples.

Protocol (JSON in and out; docs/reward-server.md):

    GET  /health  -> 200 {"status": "ok", "model": <name>, "revision": <revision>, "kind": <source kind>}
    POST /score   {"prompts": [str, ...], "completions": [str, ...],
                   "rows": [{column: value, ...}, ...]}      # optional: each prompt row's other columns
                  -> 200 {"rewards": [float or null, ...], "model": <name>, "revision": <revision>}

- One reward per row, in order; null = not scorable (a verifier that cannot parse the answer). The
  rewards are raw (the source's own scale): the client normalises.
- model is --name (default: the spec); revision is --revision (default: "sha256:" and 16 hex digits of
  the source's identity(), which holds the digests of its files), so a server restarted with other
  weights reports another revision and a client that declared the old one refuses it.
- 400 {"error": ...}: a request that is not of this form (not JSON, a missing or non-list field, lists of
  different lengths, a row that is not an object). 404: another path. 413: a body over MAX_BODY.
- 422 {"error": ...}: the source refused the rows (an rsft error: a row without the column a verifier
  needs); sending them again would get the same answer.
- 500 {"error": ...}: the source failed otherwise (logged here with its traceback), or answered
  something that is not one float or None per row. Clients retry 5xx.

Requests are scored one at a time (a lock): a model on one device gains nothing from two at once, and
a source need not be thread-safe. Ctrl-C (or SIGTERM) stops the server cleanly (exit 0), also when it
was started with SIGINT ignored (a background job: stopped_by_signals).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import signal
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

from reward.refusals import ConfigError, RsftError
from reward.sources import RewardSource, checked_scores

log = logging.getLogger(__name__)

MAX_BODY = 256 * 2 ** 20  # bytes: a request larger than this is refused (413)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class BadRequest(Exception):
    """A request that is not of the protocol's form: answered 400 with this text."""


def identity_digest(source: RewardSource) -> str:
    """The default revision: a digest of what the source says scores (its files' digests and settings)."""
    text = json.dumps(source.identity(), sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_request(body: bytes) -> tuple[list[str], list[str], list[dict] | None]:
    """(prompts, completions, rows) of a /score request, or BadRequest saying what is wrong."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadRequest(f"the body is not JSON ({error})") from None
    if not isinstance(request, dict):
        raise BadRequest(f"expected a JSON object with prompts and completions; got {type(request).__name__}")
    fields = {}
    for key in ("prompts", "completions"):
        if key not in request:
            raise BadRequest(f"missing {key!r}: expected {{\"prompts\": [...], \"completions\": [...], \"rows\": "
                             f"[...] (optional)}}")
        values = request[key]
        if not isinstance(values, list):
            raise BadRequest(f"{key!r} is {type(values).__name__}; expected a list of strings")
        for i, value in enumerate(values):
            if not isinstance(value, str):
                raise BadRequest(f"{key}[{i}] is {type(value).__name__}; expected a string")
        fields[key] = values
    prompts, completions = fields["prompts"], fields["completions"]
    if len(prompts) != len(completions):
        raise BadRequest(f"{len(prompts)} prompts but {len(completions)} completions; expected one completion per "
                         f"prompt")
    rows = request.get("rows")
    if rows is not None:
        if not isinstance(rows, list) or len(rows) != len(prompts):
            raise BadRequest(f"'rows' must be a list of one object per prompt ({len(prompts)}); got "
                             f"{len(rows) if isinstance(rows, list) else type(rows).__name__}")
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise BadRequest(f"rows[{i}] is {type(row).__name__}; expected an object of the row's columns")
    unknown = set(request) - {"prompts", "completions", "rows"}
    if unknown:
        raise BadRequest(f"unknown field(s) {sorted(unknown)}; expected prompts, completions and rows")
    return prompts, completions, rows


class RewardHandler(BaseHTTPRequestHandler):
    server: RewardServer
    server_version = "rsft-reward/1"

    def do_GET(self):  # the names http.server calls
        if self.path.split("?")[0].rstrip("/") not in ("/health", ""):
            return self.answer(404, {"error": f"no such path {self.path!r}: GET /health or POST /score"})
        self.answer(200, {"status": "ok", **self.server.names(), "kind": getattr(self.server.source, "kind", None)})

    def do_POST(self):
        if self.path.split("?")[0].rstrip("/") != "/score":
            return self.answer(404, {"error": f"no such path {self.path!r}: POST /score or GET /health"})
        try:
            length = int(self.headers.get("Content-Length") or -1)
        except ValueError:
            length = -1
        if length < 0:
            return self.answer(411, {"error": "the request needs a Content-Length"})
        if length > MAX_BODY:
            return self.answer(413, {"error": f"the body has {length} bytes; at most {MAX_BODY}: send fewer rows"})
        body = self.rfile.read(length)
        try:
            prompts, completions, rows = parse_request(body)
        except BadRequest as error:
            return self.answer(400, {"error": str(error)})
        status, answer = self.server.score(prompts, completions, rows)
        self.answer(status, answer)

    def answer(self, status: int, payload: dict) -> None:
        body = json.dumps(payload, allow_nan=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class RewardServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that scores with `source`; see the module docstring."""

    daemon_threads = True

    def __init__(self, address, source: RewardSource, name: str, revision: str | None = None,
                 batch_size: int = 32):
        self.source = source
        self.name = name
        self.revision = revision if revision is not None else identity_digest(source)
        self.batch_size = int(batch_size)
        self.lock = threading.Lock()
        super().__init__(address, RewardHandler)

    def names(self) -> dict[str, Any]:
        return {"model": self.name, "revision": self.revision}

    def score(self, prompts: list[str], completions: list[str], rows: list[dict] | None) -> tuple[int, dict]:
        """(HTTP status, answer) for one /score request."""
        started = time.perf_counter()
        try:
            with self.lock:
                raw = self.source.score(prompts, completions, rows=rows, batch_size=self.batch_size, progress=False)
        except RsftError as error:
            log.warning("refused %d rows: %s", len(prompts), error)
            return 422, {"error": str(error), **self.names()}
        except Exception as error:  # a bug or a failing device: logged in full here, 500 (retried) there
            log.exception("scoring %d rows failed", len(prompts))
            return 500, {"error": f"{type(error).__name__}: {error}", **self.names()}
        try:
            rewards = checked_scores(raw, len(prompts), f"reward source {self.name}")
        except RsftError as error:
            log.error("%s", error)
            return 500, {"error": str(error), **self.names()}
        log.info("scored %d rows in %.2f s (%d not scorable)", len(prompts), time.perf_counter() - started,
                 sum(r is None for r in rewards))
        return 200, {"rewards": rewards, **self.names()}


def make_server(source: RewardSource, host: str = "127.0.0.1", port: int = 8000, name: str = "reward",
                revision: str | None = None, batch_size: int = 32) -> RewardServer:
    """A server (bound, not yet serving) that scores with `source`: run serve_forever() in a thread (port 0
    picks a free port: server.server_address), shutdown() and server_close() to stop it."""
    return RewardServer((host, port), source, name, revision, batch_size)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m rsft.serve_reward",
        description="Serve a reward source over HTTP (GET /health, POST /score; docs/reward-server.md). A run "
                    "scores with it by naming the URL as its reward.")
    parser.add_argument("spec", help="the reward: trained:<folder>, pretrained:<folder or hub id>, "
                                     "function:<module:function>, or a folder")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 serves the "
                             "network, with no authentication)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    parser.add_argument("--device", default="cpu", help="device of a model source: cpu, cuda, cuda:1, auto")
    parser.add_argument("--head", type=int, default=None,
                        help="which output of a pretrained reward model scores (passed to open_source)")
    parser.add_argument("--batch-size", type=int, default=32, help="rows per forward pass of a model source")
    parser.add_argument("--name", default=None, help="the model name /health reports (default: the spec)")
    parser.add_argument("--revision", default=None,
                        help="the revision /health reports (default: a digest of the source's identity)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from reward.specs import open_source

    options = {} if args.head is None else {"head": args.head}
    source = open_source(args.spec, args.device, **options)  # a wrong spec: an RsftError, one line (main_guard)
    try:
        server = make_server(source, args.host, args.port, args.name or args.spec, args.revision, args.batch_size)
    except OSError as error:  # the port is taken, the address is not this machine's
        raise ConfigError(f"--host {args.host} --port {args.port}: cannot listen there ({error}); choose another "
                          f"port (--port 0 picks a free one) or an address of this machine") from None
    host, port = server.server_address[:2]
    log.info("loaded %s reward %s on %s: %s", getattr(source, "kind", "?"), args.spec, args.device,
             json.dumps(source.identity(), default=str))
    log.info("serving %s (revision %s) at http://%s:%d (POST /score, GET /health); Ctrl-C stops", server.name,
             server.revision, host, port)
    if args.host not in LOOPBACK:
        log.warning("listening on %s: anyone who can reach port %d can score with this reward (no authentication)",
                    args.host, port)

    with stopped_by_signals(server):
        try:
            server.serve_forever()
        finally:
            server.server_close()
    log.info("stopped")
    return 0


@contextmanager
def stopped_by_signals(server: RewardServer) -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM stop `server` cleanly: its serve_forever() returns, the socket is closed.

    The handlers are installed whatever disposition the process inherited: a shell starts a background job
    (`cmd &`, nohup, some CI runners) with SIGINT ignored, and Python then installs no KeyboardInterrupt
    handler, so without these a SIGINT would never stop the server. The first signal asks serve_forever to
    return (shutdown() from a thread: it waits for the serving loop, which runs in this one); a second one
    raises KeyboardInterrupt at once. The previous handlers are restored after."""
    received: list[int] = []

    def stop(signum, frame):
        received.append(signum)
        if len(received) > 1:
            raise KeyboardInterrupt
        log.info("%s: stopping", signal.Signals(signum).name)
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in previous:
        signal.signal(signum, stop)
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before if before is not None else signal.SIG_DFL)
