"""A reward served over HTTP: HttpReward, the RewardSource behind an `http(s)://` reward spec.

Two servers are understood (`api`):

- `api="rsft"` (default): rsft's own protocol, which `python -m rsft.serve_reward` serves for any
  reward source (docs/reward-server.md), and which any server can implement:

      GET  <url>/health -> {"status": "ok", "model": "...", "revision": "..."}
      POST <url>/score  {"prompts": [...], "completions": [...], "rows": [{...}, ...]}  (rows optional)
                        -> {"rewards": [float or null, ...], "model": "...", "revision": "..."}

  `url` may name the base or the /score endpoint; both mean the same server.
- `api="vllm"`: vLLM's own pooling server (`vllm serve <reward model> --runner pooling`): the
  completions, rendered as `template` ("{prompt}{completion}"; a row's columns may be named too), are
  posted to `<base>/pooling` as {"model": ..., "input": [texts]} and each answer's `data` is read as
  vllm_reward() says. The model served is read from `<base>/v1/models`.

Rows go in batches of `batch_size`; each answer must hold exactly one float or null per row
(reward_sources.checked_scores), or the run stops with an InputError that names the URL and the rows
and quotes what came back (its first 200 characters): never a silent zero. The rewards are the
server's raw scale: normalise() is the identity (mean 0, std 1) until calibrate() (RewardSource's)
sets mean and std from a stated set of rows and records it in `calibration`.

`timeout` is a deadline for a whole request, not a limit on each socket read: looking up the host's
name (_resolve_within), connecting (to each of its addresses), sending and every read of the answer wait
at most what is left of it, and none starts after it, so a server that trickles its answer a byte at a
time, or a DNS server that does not answer, fails like a server that does not answer.

What is retried: a refused or dropped connection, a timeout, HTTP 5xx, 408 and 429, up to `retries`
(at most MAX_RETRIES) more times, `backoff * 2**attempt` seconds apart (at most MAX_BACKOFF), each
retry logged; then ServerUnreachable (a MissingInput) says what to check. Scoring is idempotent, so a
batch is simply sent again. What is not retried: any other 4xx (InputError with the server's own error
text) and an answer that arrived but is malformed (InputError): sending it again would get the same
answer. A redirect of /health is followed as urllib follows it, and a failure after one says where it
led; a batch's POST that is redirected is an InputError naming where (urllib would resend it as a GET
without its body).

The identity (an artifact's fingerprint) is the URL, the model and the revision: the ones declared
(`model=`, `revision=`), else the ones the server reports. A declared value that the server
contradicts is a ConfigError when the source is built, and again if a /score answer reports another
model or revision later (the server was restarted with other weights). What cannot be detected: a
server that changes its weights without changing the revision it reports (or a vLLM server, which
reports no revision at all: declare one). Declare the revision and keep the server honest.
"""

from __future__ import annotations

import functools
import http.client
import io
import json
import logging
import queue
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable

from reward.refusals import ConfigError, InputError, MissingInput
from reward.sources import RewardSource, checked_scores, register

log = logging.getLogger(__name__)

MAX_BACKOFF = 30.0  # seconds: the longest wait between two tries
MAX_RETRIES = 20  # 7.5 minutes of waits at the default backoff (0.5 s): a server's restart fits, a dead server ends
RETRIED_STATUS = {408, 429}  # besides every 5xx: the server may answer the same request later
QUOTE = 200  # characters of a bad answer quoted in an error


class ServerUnreachable(MissingInput):
    """A reward server that could not be reached, or kept failing, after every retry."""


@register("http")
class HttpReward(RewardSource):
    """A reward source scored by a server over HTTP (see the module docstring).

    HttpReward(url, model=None, revision=None, batch_size=64, timeout=30.0, retries=5, backoff=0.5,
    api="rsft", template="{prompt}{completion}", extra=None, sleep=time.sleep)

    model, revision: what the user declares the server serves: the identity records them, and a server
        that reports others is refused (ConfigError). Undeclared, the server's own report is recorded.
    batch_size: rows per request (score()'s own batch_size argument is ignored: the server's batch is
        the one that matters to a remote server and to its memory).
    timeout: seconds one request may take, from looking up the host to the answer's last byte (per try).
    retries, backoff, sleep: the retry policy (module docstring); sleep is injected so tests need no clock.
    clock: what the timeout is measured on (time.monotonic), injected likewise.
    api: "rsft" (rsft.serve_reward's protocol) or "vllm" (vLLM's /pooling).
    template: api="vllm" only: the text the reward model reads, from {prompt}, {completion} and the row's
        columns.
    extra: api="vllm" only: further fields of every /pooling request, e.g. {"use_activation": false} for
        the raw logit of a sequence classifier (vLLM applies a sigmoid/softmax to classify outputs by
        default) or {"task": "classify"}.

    The server is asked once, when the source is built (/health, or /v1/models for vLLM), with the same
    retry policy: an unreachable server fails before any work.
    """

    kind = "http"

    def __init__(self, url: str, model: str | None = None, revision: str | None = None, batch_size: int = 64,
                 timeout: float = 30.0, retries: int = 5, backoff: float = 0.5, api: str = "rsft",
                 template: str = "{prompt}{completion}", extra: dict | None = None,
                 sleep: Callable[[float], Any] = time.sleep, clock: Callable[[], float] = time.monotonic):
        if api not in ("rsft", "vllm"):
            raise ConfigError(f"reward server api={api!r}: expected 'rsft' (python -m rsft.serve_reward) or 'vllm' "
                              f"(vLLM's /pooling)")
        try:
            check_url(url, "reward server url")
            check_retries(retries, f"reward server {url}: retries")
        except ValueError as error:
            raise ConfigError(str(error)) from None
        if int(batch_size) < 1:
            raise ConfigError(f"reward server batch_size={batch_size}: expected at least 1")
        if float(backoff) < 0 or not float(timeout) > 0:
            raise ConfigError(f"reward server {url}: backoff={backoff}, timeout={timeout}: expected backoff >= 0 and "
                              f"timeout > 0")
        self.api = api
        self.url = base_url(url, api)
        self.declared_model = model
        self.declared_revision = None if revision is None else str(revision)
        self.batch_size = int(batch_size)
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.template = template
        self.extra = dict(extra or {})
        self.sleep = sleep
        self.clock = clock
        self.mean, self.std = 0.0, 1.0  # until calibrate() (RewardSource.calibrate) sets them from stated rows
        self.calibration = None
        self.model, self.revision = self._check_server()

    # -- the interface --------------------------------------------------------------------------------

    def score(self, prompts: list[str], completions: list[str], rows: list[dict] | None = None,
              batch_size: int = 32, progress: bool = True, shard: tuple[int, int] = (0, 1)) -> list[float | None]:
        """One float or None per (prompt, completion), in order, sent `self.batch_size` rows a request.
        shard=(i, n): only rows i, i + n, ... are sent (None elsewhere), so that n processes together
        send each row once."""
        prompts, completions = list(prompts), list(completions)
        if len(prompts) != len(completions):
            raise ValueError(f"score: {len(prompts)} prompts but {len(completions)} completions")
        if rows is not None:
            rows = [dict(row) for row in rows]
            if len(rows) != len(prompts):
                raise ValueError(f"score: {len(rows)} rows but {len(prompts)} prompts")
        index, count = shard
        if not 0 <= index < count:
            raise ValueError(f"score: shard={shard}: expected (i, n) with 0 <= i < n")
        mine = list(range(len(prompts)))[index::count]
        rewards: list[float | None] = [None] * len(prompts)
        from tqdm.auto import tqdm

        starts = range(0, len(mine), self.batch_size)
        for start in tqdm(starts, desc=f"scoring at {self.url}", unit="batch", disable=not progress):
            batch = mine[start:start + self.batch_size]
            batch_rows = None if rows is None else [rows[i] for i in batch]
            answer = self._post_batch([prompts[i] for i in batch], [completions[i] for i in batch], batch_rows, batch)
            for i, reward in zip(batch, answer):
                rewards[i] = reward
        return rewards

    def identity(self) -> dict[str, Any]:
        found: dict[str, Any] = {"kind": "http", "url": self.url, "model": self.model, "revision": self.revision}
        if self.api != "rsft":
            found.update(api=self.api, template=self.template, extra=self.extra)
        return found

    # -- the server's own report ------------------------------------------------------------------------

    def _check_server(self) -> tuple[str | None, str | None]:
        """(model, revision) this source records: the declared ones, checked against the server's report."""
        if self.api == "vllm":
            return self._check_vllm()
        url = self.url + "/health"
        body = self._request(url, None)
        answer = parse_json(body, url)
        if not isinstance(answer, dict) or answer.get("status") != "ok":
            raise InputError(f"reward server {url}: expected {{\"status\": \"ok\", \"model\": ..., "
                             f"\"revision\": ...}}; it answered {quote(body)}")
        served_model = answer.get("model")
        served_revision = None if answer.get("revision") is None else str(answer["revision"])
        self._refuse_contradiction(served_model, served_revision, url)
        log.info("reward server %s serves %s (revision %s)", self.url, served_model, served_revision)
        return (self.declared_model if self.declared_model is not None else served_model,
                self.declared_revision if self.declared_revision is not None else served_revision)

    def _refuse_contradiction(self, served_model, served_revision, url: str) -> None:
        if self.declared_model is not None and served_model is not None and served_model != self.declared_model:
            raise ConfigError(f"reward server {url} serves model {served_model!r}, but {self.declared_model!r} was "
                              f"declared: point the url at the server of that model, or declare {served_model!r}")
        if (self.declared_revision is not None and served_revision is not None
                and str(served_revision) != self.declared_revision):
            raise ConfigError(f"reward server {url} serves revision {served_revision!r}, but "
                              f"{self.declared_revision!r} was declared: the server's weights are not the ones "
                              f"declared; restart it with those weights, or declare {served_revision!r} (artifacts "
                              f"scored before were scored by another reward)")

    def _check_vllm(self) -> tuple[str | None, str | None]:
        url = self.url + "/v1/models"
        body = self._request(url, None)
        answer = parse_json(body, url)
        try:
            served = [str(entry["id"]) for entry in answer["data"]]
        except (TypeError, KeyError):
            raise InputError(f"vLLM server {url}: expected {{\"data\": [{{\"id\": ...}}, ...]}}; it answered "
                             f"{quote(body)}") from None
        if self.declared_model is None:
            if len(served) != 1:
                raise ConfigError(f"vLLM server {url} serves {served}: declare which model scores (model=...)")
            model = served[0]
        elif self.declared_model not in served:
            raise ConfigError(f"vLLM server {url} serves {served}, not the declared model {self.declared_model!r}")
        else:
            model = self.declared_model
        if self.declared_revision is None:
            log.warning("vLLM server %s reports no revision: declare one (revision=...) so that the fingerprint of "
                        "what it scores changes when its weights do", self.url)
        log.info("vLLM server %s serves %s", self.url, model)
        return model, self.declared_revision

    # -- one batch ----------------------------------------------------------------------------------------

    def _post_batch(self, prompts: list[str], completions: list[str], rows: list[dict] | None,
                    ids: list[int]) -> list[float | None]:
        """The rewards of one request's rows; `ids`: their numbers in score()'s input, for the errors."""
        where = f"reward server {self.url}"
        if self.api == "vllm":
            return self._post_vllm(prompts, completions, rows, ids, where)
        request: dict[str, Any] = {"prompts": prompts, "completions": completions}
        if rows is not None:
            request["rows"] = rows
        url = self.url + "/score"
        body = self._request(url, encode(request, where))
        answer = parse_json(body, url)
        if not isinstance(answer, dict) or "rewards" not in answer:
            raise InputError(f"{where}: for the {len(ids)} rows from row {ids[0]}: expected a JSON object with a "
                             f"\"rewards\" list; it answered {quote(body)}")
        try:
            rewards = checked_scores(answer["rewards"], len(prompts), where, row_ids=ids)
        except InputError as error:
            raise InputError(f"{error}; it answered {quote(body)}") from None
        # a server restarted with other weights between two batches, if it says so
        self._refuse_contradiction_later(answer.get("model"), answer.get("revision"), url)
        return rewards

    def _refuse_contradiction_later(self, served_model, served_revision, url: str) -> None:
        if served_model is not None and self.model is not None and served_model != self.model:
            raise ConfigError(f"reward server {url} now serves model {served_model!r}; this run scores with "
                              f"{self.model!r}: the server changed during the run; restart it with {self.model!r} "
                              f"and rerun")
        if served_revision is not None and self.revision is not None and str(served_revision) != self.revision:
            raise ConfigError(f"reward server {url} now serves revision {served_revision!r}; this run scores with "
                              f"{self.revision!r}: the server changed during the run; restart it with revision "
                              f"{self.revision!r} and rerun")

    def _post_vllm(self, prompts, completions, rows, ids: list[int], where: str) -> list[float | None]:
        texts = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions)):
            fields = {**(rows[i] if rows is not None else {}), "prompt": prompt, "completion": completion}
            try:
                texts.append(self.template.format_map(fields))
            except (KeyError, IndexError, ValueError) as error:
                raise ConfigError(f"reward server template {self.template!r}: row {ids[i]}: {error!r}; it may name "
                                  f"{{prompt}}, {{completion}} and the row's columns {sorted(fields)}") from None
        url = self.url + "/pooling"
        body = self._request(url, encode({**self.extra, "model": self.model, "input": texts}, where))
        answer = parse_json(body, url)
        try:
            items = sorted(answer["data"], key=lambda item: item["index"])
            values = [vllm_reward(item["data"]) for item in items]
        except (TypeError, KeyError, ValueError, IndexError):
            raise InputError(f"{where}: for the {len(ids)} rows from row {ids[0]}: expected vLLM's pooling answer "
                             f"{{\"data\": [{{\"index\": i, \"data\": [...]}}, ...]}} with a number (or a list "
                             f"of them) per input; it answered {quote(body)}") from None
        try:
            return checked_scores(values, len(prompts), where, row_ids=ids)
        except InputError as error:
            raise InputError(f"{error}; it answered {quote(body)}") from None

    # -- HTTP with retries ----------------------------------------------------------------------------------

    def _request(self, url: str, data: bytes | None) -> bytes:
        """The body of a 2xx answer to GET url (data None) or POST url (JSON data), retried as the module
        docstring says."""
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                delay = min(self.backoff * 2 ** (attempt - 1), MAX_BACKOFF)
                log.warning("reward server %s: %s; retry %d of %d in %.1f s", url, last, attempt, self.retries, delay)
                self.sleep(delay)
            request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST",
                                             headers={"Content-Type": "application/json",
                                                      "Accept": "application/json"})
            redirects = _NamedRedirects()
            deadline = _Deadline(self.timeout, self.clock)
            opener = urllib.request.build_opener(_HTTPHandler(deadline), _HTTPSHandler(deadline), redirects)
            try:
                with opener.open(request, timeout=self.timeout) as response:
                    return response.read()
            except urllib.error.HTTPError as error:
                text = error_text(error)
                if error.code >= 500 or error.code in RETRIED_STATUS:
                    last = f"HTTP {error.code}: {text}{redirects.where()}"
                    continue
                raise InputError(f"reward server {url} refused the request (HTTP {error.code}{redirects.where()}): "
                                 f"{text}") from None
            except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as error:
                # refused, reset or dropped connections, a timeout (socket.timeout is TimeoutError), a cut answer
                reason = getattr(error, "reason", error)
                last = (f"no complete answer within timeout={self.timeout:g} s" if isinstance(reason, TimeoutError)
                        else f"{type(reason).__name__}: {reason}") + redirects.where()
        raise ServerUnreachable(
            f"reward server {url} is unreachable or kept failing after {self.retries + 1} tries ({last}): check that "
            f"the server is running (python -m rsft.serve_reward <spec> --port ...), that the url's host and port are "
            f"the ones it listens on (it serves only 127.0.0.1 unless started with --host 0.0.0.0), and its log; a "
            f"slow server needs a longer timeout (now {self.timeout:g} s) or a smaller batch_size (now "
            f"{self.batch_size})")


class _Deadline:
    """The end of one request: every connect, send and read is given what is left of `seconds` as its socket
    timeout, and none starts once nothing is left (TimeoutError), so the request as a whole ends by then."""

    def __init__(self, seconds: float, clock: Callable[[], float]):
        self.seconds, self.clock = seconds, clock
        self.end = clock() + seconds

    def left(self) -> float:
        left = self.end - self.clock()
        if left <= 0:
            raise TimeoutError(f"no complete answer within {self.seconds:g} s")
        return left


class _DeadlineReader(io.RawIOBase):
    """The socket's bytes, each read waiting at most what is left of the deadline. It holds the socket through
    a socket file (makefile), as http.client's own reader does, so the socket stays open until it is closed."""

    def __init__(self, sock: socket.socket, deadline: _Deadline):
        self.sock, self.deadline = sock, deadline
        self.file = sock.makefile("rb", buffering=0)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int | None:
        self.sock.settimeout(self.deadline.left())
        return self.file.readinto(buffer)

    def close(self) -> None:
        self.file.close()
        super().close()


class _DeadlineResponse(http.client.HTTPResponse):
    """http.client's response, reading its status line, headers and body through a _DeadlineReader."""

    def __init__(self, sock, *args, deadline: _Deadline, **kwargs):
        super().__init__(sock, *args, **kwargs)
        self.fp.close()  # http.client's own socket file: reads that wait a whole timeout each
        self.fp = io.BufferedReader(_DeadlineReader(sock, deadline))


class _OnDeadline:
    """Mixin for http.client's HTTPConnection and HTTPSConnection: send within the deadline (connecting, and
    the TLS handshake after it, are _connect_within's; the answer is read through _DeadlineResponse)."""

    deadline: _Deadline

    def send(self, data):
        if self.sock is not None:  # None: send() connects first, within the deadline
            self.sock.settimeout(self.deadline.left())
        super().send(data)


def _connect_within(deadline: _Deadline, address: tuple, timeout=None, source_address=None) -> socket.socket:
    """socket.create_connection, each of the host's addresses tried with what is left of the deadline (not the
    whole timeout each, which a host with several unreachable addresses would multiply), and the socket handed
    on with what is then left, for the TLS handshake that follows."""
    host, port = address
    last: OSError | None = None
    for family, kind, proto, _, where in _resolve_within(deadline, host, port):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.left())
            if source_address:
                sock.bind(source_address)
            sock.connect(where)
            sock.settimeout(deadline.left())
            return sock
        except OSError as error:
            sock.close()
            last = error
            if isinstance(error, TimeoutError) and deadline.end <= deadline.clock():
                raise
    raise last if last is not None else OSError(f"no address found for {host}")


def _resolve_within(deadline: _Deadline, host: str, port: int) -> list:
    """socket.getaddrinfo within what is left of the deadline. The system resolver takes no timeout (a stalled
    DNS server holds it for as long as resolv.conf allows, times its retries), so a name is looked up in a daemon
    thread that the request stops waiting for at the deadline; the thread ends when the resolver gives up. A
    literal address needs no lookup and is answered at once."""
    try:
        return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
    except socket.gaierror:
        pass
    answer: queue.SimpleQueue = queue.SimpleQueue()

    def look_up():
        try:
            answer.put((True, socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)))
        except BaseException as error:  # handed to the waiting request, which raises it
            answer.put((False, error))

    threading.Thread(target=look_up, name=f"rsft-resolve-{host}", daemon=True).start()
    try:
        found, value = answer.get(timeout=deadline.left())
    except queue.Empty:
        raise TimeoutError(f"looking up {host} took the whole {deadline.seconds:g} s deadline") from None
    if found:
        return value
    raise value


class _HTTPConnection(_OnDeadline, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_OnDeadline, http.client.HTTPSConnection):
    pass


class _OpensOnDeadline:
    """Mixin for urllib's HTTPHandler and HTTPSHandler: the connections they open keep `deadline`."""

    def __init__(self, deadline: _Deadline):
        super().__init__()
        self.deadline = deadline

    def do_open(self, http_class, req, **kwargs):
        timed = {http.client.HTTPConnection: _HTTPConnection, http.client.HTTPSConnection: _HTTPSConnection}[http_class]

        def connection(host, **options):
            made = timed(host, **options)
            made.deadline = self.deadline
            made._create_connection = functools.partial(_connect_within, self.deadline)  # http.client's hook
            made.response_class = functools.partial(_DeadlineResponse, deadline=self.deadline)
            return made

        return super().do_open(connection, req, **kwargs)


class _HTTPHandler(_OpensOnDeadline, urllib.request.HTTPHandler):
    pass


class _HTTPSHandler(_OpensOnDeadline, urllib.request.HTTPSHandler):
    pass


class _NamedRedirects(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, followed as it follows them and remembered, so that a failure after one says where
    it went rather than blaming the url the user gave."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if req.get_method() != "GET":  # urllib would resend a batch's POST as a GET without its body, or not at all
            raise InputError(f"reward server {req.full_url} answered HTTP {code}, a redirect to {newurl}: a batch is "
                             f"not sent on to another address; set the url to the address the server names")
        followed = super().redirect_request(req, fp, code, msg, headers, newurl)
        if followed is not None:
            self.seen.append(f"HTTP {code} to {newurl}")
        return followed

    def where(self) -> str:
        return f", after a redirect ({', '.join(self.seen)})" if self.seen else ""


def check_url(url, key: str = "url") -> None:
    """An http:// or https:// address urllib can open: a host, and a port that is a number if one is given.
    A malformed one (`http://[::1`) is a wrong setting, not a server to retry. ValueError(`<key>=<url>:
    expected ...`), the config rules' form, so that a setting's check names its key (rsft.config.rules)."""
    expected = "an http:// or https:// address, http(s)://host[:port][/path]"
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"{key}={url!r}: expected {expected}")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (read for its ValueError: a port that is not a number in 0-65535)
    except ValueError as error:
        raise ValueError(f"{key}={url!r}: expected {expected} ({error})") from None
    if not parts.hostname:
        raise ValueError(f"{key}={url!r}: expected {expected} (it names no host)")


def check_retries(retries, key: str = "retries") -> None:
    """An integer in [0, MAX_RETRIES]: the waits between tries add up (up to MAX_BACKOFF seconds each), so an
    unbounded count keeps a command waiting for days on a server that is not there. ValueError as check_url."""
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
        raise ValueError(f"{key}={retries!r}: expected an integer in [0, {MAX_RETRIES}] (0 = one try; the waits "
                         f"between tries grow to {MAX_BACKOFF:g} s each)")


def vllm_reward(data) -> float:
    """The reward in one item of vLLM's pooling answer (PoolingResponseData.data, whose type is
    list[list[float]] | list[float] | str; vllm/entrypoints/pooling/pooling/protocol.py).

    A sequence reward model or classifier (task classify) answers one value per label, [r]: the last is
    taken (a one-label head's only value; a two-label classifier's "good" class). A token reward model
    (task token_classify, or `reward` in vLLM < 0.11, ALL pooling) answers one row per token, [[r], ...]:
    the last token's row is the sequence's reward, its last value taken likewise. A bare number is itself.
    A string (base64 encoding_format) is refused: rsft asks for floats."""
    if isinstance(data, list) and data and isinstance(data[-1], list):
        data = data[-1]
    if isinstance(data, list):
        if not data:
            raise ValueError("empty pooling output")
        data = data[-1]
    if isinstance(data, bool) or not isinstance(data, (int, float)):
        raise ValueError(f"not a number: {data!r}")
    return float(data)


def base_url(url: str, api: str = "rsft") -> str:
    """The server's base address: without a trailing slash and without the endpoint the user may have
    named (/score or /health; for vLLM /pooling, /health or the OpenAI base /v1)."""
    url = url.rstrip("/")
    for suffix in ("/score", "/health") if api == "rsft" else ("/pooling", "/health", "/v1"):
        if url.endswith(suffix):
            return url[: -len(suffix)]
    return url


def encode(request: dict, where: str) -> bytes:
    try:
        return json.dumps(request, allow_nan=False).encode()
    except (TypeError, ValueError) as error:
        raise InputError(f"{where}: the rows cannot be sent as JSON ({error}); keep the prompt rows' columns to "
                         f"strings, numbers, lists and dicts") from None


def parse_json(body: bytes, url: str):
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise InputError(f"reward server {url} answered what is not JSON: {quote(body)}") from None


def quote(body: bytes | str) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    return repr(text[:QUOTE]) + ("..." if len(text) > QUOTE else "")


def error_text(error: urllib.error.HTTPError) -> str:
    """The server's own error text: {"error": ...} of rsft's protocol, else the body's start."""
    try:
        body = error.read()
    except Exception:  # a connection that broke while the error page was read
        return str(error.reason)
    try:
        answer = json.loads(body)
        if isinstance(answer, dict) and isinstance(answer.get("error"), str):
            return answer["error"]
        if isinstance(answer, dict) and isinstance(answer.get("message"), str):  # vLLM's ErrorResponse (older)
            return answer["message"]
        if isinstance(answer, dict) and isinstance(answer.get("error"), dict):  # vLLM's ErrorResponse (newer)
            return str(answer["error"].get("message", answer["error"]))
    except ValueError:
        pass
    return quote(body) if body else str(error.reason)
