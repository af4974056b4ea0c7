"""A reward served over HTTP (rsft.serve_reward) and scored through it (reward.http_client.HttpReward).

Offline and fast: every server listens on 127.0.0.1 on a free port, in a thread of this process, and
every wait between retries goes through an injected sleep, never the clock. The one test that needs
vLLM (its real pooling server) is skipped where vLLM is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import reward.sources as reward_sources
import reward.specs as reward_specs
from rsft.errors import ConfigError, InputError, MissingInput
from reward.http_client import MAX_RETRIES, HttpReward, ServerUnreachable, base_url, vllm_reward
from reward.sources import RewardSource
from reward.server import identity_digest, make_server
from tests.conftest import REPO
from tests.pipe_lines import PipeLines

PROMPTS = [f"question {i}" for i in range(11)]
COMPLETIONS = ["a", "bb", "", "cccc", "?", "dd dd", "e", "ffffff", "?", "gg", "hhh"]
ROWS = [{"bonus": i / 10, "id": f"q{i}"} for i in range(11)]


class Toy(RewardSource):
    """Deterministic: len(completion) + the row's bonus; "?" is not scorable (None)."""

    kind = "toy"

    def __init__(self, fail_first: int = 0, refuse: bool = False):
        self.calls = 0
        self.fail_first = fail_first
        self.refuse = refuse

    def score(self, prompts, completions, rows=None, batch_size=32, progress=True, shard=(0, 1)):
        self.calls += 1
        if self.calls <= self.fail_first:
            raise RuntimeError("CUDA out of memory (a passing failure)")
        if self.refuse:
            raise InputError("row 0: no 'answer' column to check against")
        rows = rows or [{}] * len(prompts)
        return [None if c == "?" else len(c) + float(r.get("bonus", 0.0)) for c, r in zip(completions, rows)]

    def identity(self):
        return {"kind": "toy", "version": 1}


class Served:
    """make_server over `source`, serving in a thread until stop()."""

    def __init__(self, source, port: int = 0, **names):
        self.server = make_server(source, "127.0.0.1", port, **{"name": "toy", **names})
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def serve():
    started: list[Served] = []

    def start(source, port: int = 0, **names) -> Served:
        started.append(Served(source, port, **names))
        return started[-1]

    yield start
    for served in started:
        if served.thread.is_alive():
            served.stop()


def no_sleep(delay):
    raise AssertionError(f"slept {delay} s: nothing should have been retried")


def free_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the round trip -----------------------------------------------------------------------------------------


def test_http_scores_equal_in_process_scores_across_batches(serve):
    source = Toy()
    served = serve(source)
    reward = HttpReward(served.url, batch_size=3, sleep=no_sleep)  # 11 rows: 4 batches, the last of 2
    expected = source.score(PROMPTS, COMPLETIONS, ROWS)
    assert expected[4] is None and expected[8] is None
    assert reward.score(PROMPTS, COMPLETIONS, ROWS, progress=False) == expected
    assert reward.score(PROMPTS, COMPLETIONS, progress=False) == source.score(PROMPTS, COMPLETIONS)
    assert source.calls == 2 + 2 * 4  # the two in-process calls and 4 batches each
    assert reward.score([], [], progress=False) == []


def test_shards_send_each_row_once_and_together_give_the_whole(serve):
    source = Toy()
    served = serve(source)
    reward = HttpReward(served.url, batch_size=3, sleep=no_sleep)
    whole = reward.score(PROMPTS, COMPLETIONS, ROWS, progress=False)
    source.calls = 0
    parts = [reward.score(PROMPTS, COMPLETIONS, ROWS, progress=False, shard=(i, 3)) for i in range(3)]
    assert source.calls == 2 + 2 + 1  # 4, 4 and 3 rows in requests of at most 3
    for i, part in enumerate(parts):
        assert part[i::3] == whole[i::3] and all(r is None for j, r in enumerate(part) if j % 3 != i)
    with pytest.raises(ValueError, match="shard"):
        reward.score(PROMPTS, COMPLETIONS, shard=(2, 2))


def test_identity_is_the_url_and_the_servers_model_and_revision(serve):
    source = Toy()
    served = serve(source)
    reward = HttpReward(served.url + "/score/", sleep=no_sleep)  # the endpoint named, a trailing slash
    assert reward.identity() == {"kind": "http", "url": served.url, "model": "toy", "revision": identity_digest(source)}
    assert HttpReward(served.url, sleep=no_sleep).identity() == reward.identity()
    assert base_url("http://h:1/score") == base_url("http://h:1/") == "http://h:1"
    assert base_url("http://h:1/v1", "vllm") == base_url("http://h:1/pooling", "vllm") == "http://h:1"
    named = serve(Toy(), name="my-rm", revision="v3")
    declared = HttpReward(named.url, model="my-rm", revision="v3", sleep=no_sleep)
    assert declared.identity()["model"] == "my-rm" and declared.identity()["revision"] == "v3"


def test_open_source_builds_an_http_reward_from_a_url_with_its_options(serve):
    source = Toy()
    served = serve(source, revision="v1")
    reward = reward_specs.open_source(served.url + "/score", "cpu", batch_size=4, revision="v1", sleep=no_sleep)
    assert isinstance(reward, HttpReward) and reward_sources.SOURCES["http"] is HttpReward
    assert (reward.batch_size, reward.identity()["revision"]) == (4, "v1")
    assert reward.score(PROMPTS, COMPLETIONS, ROWS, progress=False) == source.score(PROMPTS, COMPLETIONS, ROWS)


def test_a_declared_revision_or_model_the_server_contradicts_is_refused(serve):
    served = serve(Toy(), name="my-rm", revision="v3")
    with pytest.raises(ConfigError, match=r"serves revision 'v3', but 'v2' was declared"):
        HttpReward(served.url, revision="v2", sleep=no_sleep)
    with pytest.raises(ConfigError, match=r"serves model 'my-rm', but 'other-rm' was declared"):
        HttpReward(served.url, model="other-rm", sleep=no_sleep)


def test_a_server_that_changes_its_revision_during_a_run_is_refused(serve):
    served = serve(Toy(), revision="v3")
    reward = HttpReward(served.url, batch_size=3, sleep=no_sleep)
    served.server.revision = "v4"  # restarted with other weights between the check and the scoring
    with pytest.raises(ConfigError, match=r"now serves revision 'v4'; this run scores with 'v3'"):
        reward.score(PROMPTS, COMPLETIONS, ROWS, progress=False)


def test_normalise_is_the_identity_until_calibrate_sets_mean_and_std(serve):
    served = serve(Toy())
    reward = HttpReward(served.url, batch_size=4, sleep=no_sleep)
    assert reward.normalise([1.0, None]) == [1.0, None] and reward.calibration is None
    calibration = reward.calibrate(PROMPTS, COMPLETIONS, "eleven test rows", rows=ROWS)
    raw = [r for r in Toy().score(PROMPTS, COMPLETIONS, ROWS) if r is not None]
    assert calibration["rows"] == 9 and calibration["source"] == "eleven test rows"
    assert calibration["mean"] == pytest.approx(sum(raw) / len(raw)) == reward.mean
    z = [r for r in reward.normalise(reward.score(PROMPTS, COMPLETIONS, ROWS, progress=False)) if r is not None]
    assert sum(z) == pytest.approx(0.0, abs=1e-9) and sum(v * v for v in z) / len(z) == pytest.approx(1.0)


# -- retries --------------------------------------------------------------------------------------------------


def test_a_server_restarted_mid_run_gives_the_scores_of_an_uninterrupted_run(serve, monkeypatch, caplog):
    source = Toy()
    first = serve(source)
    restarted = []

    def sleep(delay):  # the first retry finds the server back on its port
        if not restarted:
            restarted.append(serve(source, port=first.port))

    reward = HttpReward(first.url, batch_size=3, sleep=sleep)
    post = reward._post_batch
    batches = []

    def post_then_stop(*args):
        out = post(*args)
        batches.append(args[-1][0])
        if len(batches) == 1:  # stop the server after the first batch: the second finds the port closed
            first.stop()
        return out

    monkeypatch.setattr(reward, "_post_batch", post_then_stop)
    with caplog.at_level(logging.WARNING, logger="reward.http_client"):
        scores = reward.score(PROMPTS, COMPLETIONS, ROWS, progress=False)
    assert restarted and batches == [0, 3, 6, 9]
    assert scores == Toy().score(PROMPTS, COMPLETIONS, ROWS)
    assert re.search(rf"reward server {first.url}/score: .*; retry 1 of 5 in 0\.5 s", caplog.text)


def test_an_unreachable_server_is_missing_input_after_every_retry_with_growing_waits():
    url = f"http://127.0.0.1:{free_port()}"
    waits = []
    with pytest.raises(ServerUnreachable) as caught:
        HttpReward(url, retries=4, backoff=0.5, sleep=waits.append)
    assert isinstance(caught.value, MissingInput)
    assert waits == [0.5, 1.0, 2.0, 4.0]
    message = str(caught.value)
    assert f"{url}/health" in message and "after 5 tries" in message and "rsft.serve_reward" in message


def test_the_wait_between_tries_is_capped():
    waits = []
    with pytest.raises(ServerUnreachable):
        HttpReward(f"http://127.0.0.1:{free_port()}", retries=8, backoff=2.0, sleep=waits.append)
    assert waits == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]


def test_a_failing_source_is_retried_as_a_5xx_and_then_scores(serve):
    source = Toy(fail_first=2)
    served = serve(source)
    waits = []
    reward = HttpReward(served.url, batch_size=20, sleep=waits.append)
    assert reward.score(PROMPTS, COMPLETIONS, ROWS, progress=False) == Toy().score(PROMPTS, COMPLETIONS, ROWS)
    assert waits == [0.5, 1.0]


def test_a_source_that_keeps_failing_ends_in_one_error_with_its_last_answer(serve):
    served = serve(Toy(fail_first=99))
    reward = HttpReward(served.url, retries=2, sleep=lambda delay: None)
    with pytest.raises(ServerUnreachable, match=r"after 3 tries \(HTTP 500: RuntimeError: CUDA out of memory"):
        reward.score(PROMPTS, COMPLETIONS, progress=False)


# -- bad answers: an InputError naming the URL, never a silent number ---------------------------------------


class QuietHandler(BaseHTTPRequestHandler):
    """A test server's handler: answers with a body (text, or an object sent as JSON), logs nothing."""

    def reply(self, status, body):
        body = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Scripted(QuietHandler):
    """/health answers ok; /score answers server.reply: (status, body)."""

    def do_GET(self):
        self.reply(200, json.dumps({"status": "ok", "model": "m", "revision": "r"}))

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.reply(*self.server.reply)


@pytest.fixture
def scripted():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("status, body, message", [
    (200, "<html>Bad Gateway</html>", r"answered what is not JSON: '<html>Bad Gateway</html>'"),
    (200, '{"scores": [1, 2]}', r"the 2 rows from row 0: expected a JSON object with a \"rewards\" list; it answered "
                                r"'\{\"scores\""),
    (200, '[1.0, 2.0]', r"expected a JSON object with a \"rewards\" list"),
    (200, '{"rewards": [1.0]}', r"returned 1 values for the 2 rows from row 0; expected one per row; it answered"),
    (200, '{"rewards": [1.0, "0.5"]}', r"row 1: returned '0.5' \(str\); expected a float or None"),
    (200, '{"rewards": [1.0, true]}', r"row 1: returned True \(bool\)"),
    (200, '{"rewards": [1.0, NaN]}', r"row 1: returned nan; expected a finite float"),
    (200, '{"rewards": [1.0, 1%s]}' % ("0" * 400), r"row 1: returned a number beyond a float's range.*expected a "
                                                    r"finite float"),
    (200, '{"rewards": "1.0, 2.0"}', r"returned str; expected a list of 2 floats or None"),
    (400, '{"error": "missing \'completions\'"}', r"refused the request \(HTTP 400\): missing 'completions'"),
    (422, '{"error": "row 0: no answer column"}', r"refused the request \(HTTP 422\): row 0: no answer column"),
])
def test_a_bad_answer_is_an_input_error_naming_the_url_and_is_not_retried(scripted, status, body, message):
    url = f"http://127.0.0.1:{scripted.server_address[1]}"
    reward = HttpReward(url, sleep=no_sleep)
    scripted.reply = (status, body)
    with pytest.raises(InputError, match=message) as caught:
        reward.score(["p", "q"], ["a", "b"], progress=False)
    assert url in str(caught.value)


def test_a_long_bad_answer_is_quoted_to_200_characters(scripted):
    reward = HttpReward(f"http://127.0.0.1:{scripted.server_address[1]}", sleep=no_sleep)
    scripted.reply = (200, "x" * 1000)
    with pytest.raises(InputError) as caught:
        reward.score(["p"], ["a"], progress=False)
    assert "x" * 200 + "'..." in str(caught.value) and "x" * 201 not in str(caught.value)


def test_a_health_answer_that_is_not_rsfts_is_an_input_error(scripted):
    class Elsewhere(Scripted):
        def do_GET(self):
            self.reply(200, '{"healthy": true}')

    scripted.RequestHandlerClass = Elsewhere
    with pytest.raises(InputError, match=r"/health: expected \{\"status\": \"ok\".*it answered '\{\"healthy\""):
        HttpReward(f"http://127.0.0.1:{scripted.server_address[1]}", sleep=no_sleep)


class Trickle(QuietHandler):
    """/health answers at once; /score promises a long answer and sends it a byte at a time, never finishing
    while the test lets it (server.stop), each byte moving the test's clock (server.now) on by 0.3 s: a byte
    every 0.3 s, each well within a 1 s timeout."""

    def do_GET(self):
        self.reply(200, {"status": "ok", "model": "m", "revision": "r"})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        for _ in range(3000):  # 30 s at most, should the client never hang up
            if self.server.stop.wait(0.01):
                return
            try:
                self.wfile.write(b" ")
            except OSError:  # the client hung up
                return
            self.server.now += 0.3


def test_a_server_that_trickles_its_answer_fails_at_the_timeout_like_an_unreachable_one():
    """timeout is a deadline for the whole request: bytes that keep coming, each in time, do not extend it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.now, server.stop = 0.0, threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        reward = HttpReward(url, timeout=1, retries=0, sleep=no_sleep, clock=lambda: server.now)
        with pytest.raises(ServerUnreachable, match=rf"{url}/score is unreachable .* after 1 tries \(no complete "
                                                    rf"answer within timeout=1 s\).* longer timeout \(now 1 s\)"):
            reward.score(["p"], ["a"], progress=False)
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()


def test_a_failure_after_a_redirect_says_where_it_was_sent(scripted):
    elsewhere = f"http://127.0.0.1:{free_port()}/health"

    class Redirects(Scripted):
        def do_GET(self):
            self.send_response(302)
            self.send_header("Location", elsewhere)
            self.send_header("Content-Length", "0")
            self.end_headers()

    scripted.RequestHandlerClass = Redirects
    url = f"http://127.0.0.1:{scripted.server_address[1]}"
    with pytest.raises(ServerUnreachable, match=rf"{url}/health is unreachable .*ConnectionRefusedError.*, after a "
                                                rf"redirect \(HTTP 302 to {elsewhere}\)"):
        HttpReward(url, retries=0, sleep=no_sleep)


@pytest.mark.parametrize("code", [302, 307])
def test_a_batch_redirected_elsewhere_is_not_sent_on_and_the_error_names_where(scripted, code):
    """urllib would resend a 302'd POST as a GET without its body (the batch lost) and not follow a 307 at all."""
    url = f"http://127.0.0.1:{scripted.server_address[1]}"
    reward = HttpReward(url, sleep=no_sleep)
    elsewhere = f"http://127.0.0.1:{free_port()}/score"

    class RedirectsBatches(Scripted):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(code)
            self.send_header("Location", elsewhere)
            self.send_header("Content-Length", "0")
            self.end_headers()

    scripted.RequestHandlerClass = RedirectsBatches
    with pytest.raises(InputError, match=rf"{url}/score answered HTTP {code}, a redirect to {elsewhere}: a batch is "
                                         rf"not sent on"):
        reward.score(["p"], ["a"], progress=False)


def test_each_address_of_a_host_shares_the_one_deadline(monkeypatch):
    """A host with three addresses that never answer: the connects together take the deadline, not three times it."""
    from reward import http_client

    now = [0.0]
    tried = []

    class Silent:
        def __init__(self, *args):
            self.timeout = None

        def settimeout(self, value):
            self.timeout = value

        def connect(self, where):
            tried.append(self.timeout)
            now[0] += self.timeout  # the connect waits its whole timeout, then gives up
            raise TimeoutError("timed out")

        def close(self):
            pass

    monkeypatch.setattr(http_client.socket, "getaddrinfo", lambda *a, **k: [(2, 1, 6, "", (f"10.0.0.{i}", 80))
                                                                          for i in range(3)])
    monkeypatch.setattr(http_client.socket, "socket", Silent)
    deadline = http_client._Deadline(1.0, lambda: now[0])
    with pytest.raises(TimeoutError):
        http_client._connect_within(deadline, ("example", 80))
    assert tried == [1.0] and now[0] == 1.0


def test_a_name_lookup_that_never_answers_ends_at_the_deadline(monkeypatch):
    """The system resolver takes no timeout: a stalled DNS server would hold the request past any deadline.
    The lookup here blocks until the test releases it, so only the deadline can end the wait."""
    from reward import http_client

    release = threading.Event()
    asked = []

    def stalled(host, port, family=0, kind=0, proto=0, flags=0):
        if flags & socket.AI_NUMERICHOST:
            raise socket.gaierror(socket.EAI_NONAME, "not a literal address")
        asked.append(host)
        release.wait(60)  # released below; bounded even so
        return []

    monkeypatch.setattr(http_client.socket, "getaddrinfo", stalled)
    try:
        with pytest.raises(TimeoutError, match="looking up dns.example took the whole 0.2 s deadline"):
            http_client._connect_within(http_client._Deadline(0.2, time.monotonic), ("dns.example", 80))
        assert asked == ["dns.example"]
    finally:
        release.set()


def test_a_literal_address_and_a_failed_lookup_are_answered_as_before(monkeypatch):
    from reward import http_client

    deadline = http_client._Deadline(5.0, time.monotonic)
    assert http_client._resolve_within(deadline, "127.0.0.1", 80)[0][4] == ("127.0.0.1", 80)

    def unknown(host, port, family=0, kind=0, proto=0, flags=0):
        raise socket.gaierror(socket.EAI_NONAME, f"{host} is not known")

    monkeypatch.setattr(http_client.socket, "getaddrinfo", unknown)
    with pytest.raises(socket.gaierror, match="nowhere.example is not known"):
        http_client._resolve_within(deadline, "nowhere.example", 80)


def test_settings_that_cannot_work_are_config_errors():
    with pytest.raises(ConfigError, match="http:// or https://"):
        HttpReward("ftp://example/score")
    with pytest.raises(ConfigError, match="api='grpc'"):
        HttpReward("http://127.0.0.1:1", api="grpc")
    with pytest.raises(ConfigError, match="batch_size=0"):
        HttpReward("http://127.0.0.1:1", batch_size=0)


@pytest.mark.parametrize("url, why", [("http://[::1", "Invalid IPv6 URL"), ("http://127.0.0.1:port", "'port'"),
                                      ("http://:8000/score", "names no host")])
def test_a_malformed_url_is_a_config_error_not_a_server_to_retry(url, why):
    with pytest.raises(ConfigError) as caught:
        HttpReward(url, sleep=no_sleep)
    message = str(caught.value)
    assert f"url={url!r}: expected an http:// or https:// address" in message and why in message


def test_retries_are_bounded_so_that_a_missing_server_cannot_keep_a_command_waiting_for_days():
    """A million retries, 30 s apart, would wait a year before saying the server is not there."""
    with pytest.raises(ConfigError, match=rf"retries=1000000: expected an integer in \[0, {MAX_RETRIES}\]"):
        HttpReward(f"http://127.0.0.1:{free_port()}", retries=1_000_000, sleep=no_sleep)
    waits = []
    with pytest.raises(ServerUnreachable, match=f"after {MAX_RETRIES + 1} tries"):
        HttpReward(f"http://127.0.0.1:{free_port()}", retries=MAX_RETRIES, sleep=waits.append)
    assert len(waits) == MAX_RETRIES


def test_the_configs_bound_on_retries_is_the_clients_and_names_the_setting(make_cfg):
    from rsft.config import reward_settings
    from rsft.preflight import check_config

    assert reward_settings.MAX_RETRIES == MAX_RETRIES
    over = make_cfg("stage=score", "reward_source=http", "reward_source.spec=http://127.0.0.1:9",
                    f"reward_source.retries={MAX_RETRIES + 1}")
    with pytest.raises(ConfigError, match=rf"reward_source.retries={MAX_RETRIES + 1}: expected an integer in \[0, "
                                          rf"{MAX_RETRIES}\]"):
        check_config(over)


# -- the server's side of the protocol -------------------------------------------------------------------------


def post(url, payload) -> tuple[int, dict]:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method="POST"), timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize("payload, status, error", [
    (b"not json", 400, "not JSON"),
    ({"prompts": ["p"]}, 400, "missing 'completions'"),
    ({"prompts": ["p", "q"], "completions": ["a"]}, 400, "2 prompts but 1 completions"),
    ({"prompts": ["p"], "completions": [3]}, 400, "completions[0] is int"),
    ({"prompts": ["p"], "completions": ["a"], "rows": [{}, {}]}, 400, "one object per prompt"),
    ({"prompts": ["p"], "completions": ["a"], "rows": ["x"]}, 400, "rows[0] is str"),
    ({"prompts": ["p"], "completions": ["a"], "completion": ["a"]}, 400, "unknown field(s) ['completion']"),
])
def test_the_server_answers_a_bad_request_400_with_what_is_wrong(serve, payload, status, error):
    served = serve(Toy())
    code, answer = post(served.url + "/score", payload)
    assert code == status and error in answer["error"]


def test_the_server_answers_health_score_422_and_404(serve):
    source = Toy()
    served = serve(source)
    with urllib.request.urlopen(served.url + "/health", timeout=10) as response:
        assert json.loads(response.read()) == {"status": "ok", "model": "toy", "revision": identity_digest(source),
                                               "kind": "toy"}
    code, answer = post(served.url + "/score", {"prompts": ["p", "q"], "completions": ["abc", "?"],
                                                "rows": [{"bonus": 0.5}, {}]})
    assert (code, answer) == (200, {"rewards": [3.5, None], "model": "toy", "revision": identity_digest(source)})
    assert post(served.url + "/other", {})[0] == 404
    refusing = serve(Toy(refuse=True))
    code, answer = post(refusing.url + "/score", {"prompts": ["p"], "completions": ["a"]})
    assert code == 422 and "no 'answer' column" in answer["error"]


def test_a_source_answering_a_non_number_is_a_500_from_the_server(serve):
    class Broken(Toy):
        def score(self, prompts, completions, rows=None, batch_size=32, progress=True, shard=(0, 1)):
            return ["high"] * len(prompts)

    served = serve(Broken())
    code, answer = post(served.url + "/score", {"prompts": ["p"], "completions": ["a"]})
    assert code == 500 and "returned 'high' (str)" in answer["error"]


def test_a_real_tiny_reward_model_scores_the_same_over_http(serve, tmp_path):
    from omegaconf import OmegaConf

    from reward.backbone import build_tiny_reward_model
    from reward.trained import save_reward_model
    from rsft.models import build_byte_tokenizer
    from tests.conftest import TINY_REWARD

    tokenizer = build_byte_tokenizer()
    model = build_tiny_reward_model(OmegaConf.create({**TINY_REWARD, "seed": 0}), tokenizer).eval()
    save_reward_model(model, tokenizer, tmp_path, {"mean": 0.0, "std": 1.0, "max_length": 64})
    source = reward_specs.open_source(f"trained:{tmp_path}", "cpu")
    served = serve(source)
    reward = HttpReward(served.url, batch_size=4, sleep=no_sleep)
    expected = source.score(PROMPTS, COMPLETIONS, ROWS, progress=False)
    got = reward.score(PROMPTS, COMPLETIONS, ROWS, progress=False)
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert reward.identity()["revision"] == identity_digest(source)


# -- vLLM's pooling API ------------------------------------------------------------------------------------------


def test_vllm_reward_reads_each_shape_of_pooling_output():
    assert vllm_reward([0.25]) == 0.25  # a sequence reward model: one label
    assert vllm_reward([0.1, 0.9]) == 0.9  # a two-label classifier: the last
    assert vllm_reward([[0.1], [0.2], [1.5]]) == 1.5  # a token reward model: the last token's
    assert vllm_reward(2) == 2.0
    for bad in ([], "AAAA", [["x"]], None):
        with pytest.raises(ValueError):
            vllm_reward(bad)


class FakeVllm(QuietHandler):
    """vLLM's /v1/models and /pooling as its protocol declares them (vllm/entrypoints/pooling/pooling/protocol.py):
    per input one item {"index", "object": "pooling", "data": [[r] per token]}, answered out of order."""

    def do_GET(self):
        self.reply(200, {"object": "list", "data": [{"id": "acme/rm-1b", "object": "model"}]})

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(request)
        if request["model"] != "acme/rm-1b":
            return self.reply(404, {"error": {"message": f"The model `{request['model']}` does not exist."}})
        items = [{"index": i, "object": "pooling", "data": [[0.0]] * 3 + [[float(len(text))]]}
                 for i, text in enumerate(request["input"])]
        self.reply(200, {"id": "pool-1", "object": "list", "created": 0, "model": request["model"],
                         "data": items[::-1], "usage": {"prompt_tokens": 1, "total_tokens": 1}})


def test_the_vllm_api_posts_rendered_texts_to_pooling_and_reads_the_last_tokens_reward():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    server.requests = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        reward = HttpReward(url, api="vllm", batch_size=4, template="{id}|{prompt}|{completion}",
                            extra={"use_activation": False}, revision="2024-06", sleep=no_sleep)
        assert reward.identity() == {"kind": "http", "url": url[:-3], "model": "acme/rm-1b", "revision": "2024-06",
                                     "api": "vllm", "template": "{id}|{prompt}|{completion}",
                                     "extra": {"use_activation": False}}
        scores = reward.score(PROMPTS, COMPLETIONS, ROWS, progress=False)
        texts = [f"{r['id']}|{p}|{c}" for p, c, r in zip(PROMPTS, COMPLETIONS, ROWS)]
        assert scores == [float(len(t)) for t in texts]
        assert server.requests[0] == {"use_activation": False, "model": "acme/rm-1b", "input": texts[:4]}
        with pytest.raises(ConfigError, match=r"serves \['acme/rm-1b'\], not the declared model 'other'"):
            HttpReward(url, api="vllm", model="other", sleep=no_sleep)
        with pytest.raises(ConfigError, match=r"template '\{answer\}'.*KeyError\('answer'\)"):
            HttpReward(url, api="vllm", template="{answer}", sleep=no_sleep).score(["p"], ["c"], progress=False)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (docs/vllm.md#tests)")
def test_a_real_vllm_pooling_server_scores_as_the_model_does(tmp_path):
    """`vllm serve` a tiny random Llama sequence classifier; its /pooling rewards (raw logits) equal
    transformers' forward pass of the same folder."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from rsft.models import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=512, num_labels=1, pad_token_id=tokenizer.pad_token_id)).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    port = free_port()
    log_file = (tmp_path / "vllm.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path),
                                "--served-model-name", "tiny-rm", "--host", "127.0.0.1", "--port", str(port),
                                "--runner", "pooling", "--max-model-len", "512", "--enforce-eager"],
                               stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 600
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).close()
                break
            except OSError:
                if process.poll() is not None or time.time() > deadline:
                    pytest.fail("vllm serve did not start:\n" + (tmp_path / "vllm.log").read_text()[-3000:])
                time.sleep(2)
        reward = HttpReward(f"http://127.0.0.1:{port}", api="vllm", revision="random-0", batch_size=4,
                            extra={"use_activation": False})
        texts = [p + c for p, c in zip(PROMPTS, COMPLETIONS)]
        with torch.no_grad():
            expected = [model(**tokenizer(t, return_tensors="pt")).logits[0, 0].item() for t in texts]
        assert reward.score(PROMPTS, COMPLETIONS, progress=False) == pytest.approx(expected, rel=1e-2, abs=1e-3)
    finally:
        process.terminate()
        process.wait(60)
        log_file.close()


# -- the command ----------------------------------------------------------------------------------------------------


def test_serve_reward_help_exits_0():
    done = subprocess.run([sys.executable, "-m", "rsft.serve_reward", "--help"], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--host" in done.stdout and "127.0.0.1" in done.stdout


SERVE_TOY = """
import sys
import reward.sources as sources
import reward.specs as specs

class Toy(sources.RewardSource):
    kind = "toy"
    def score(self, prompts, completions, rows=None, batch_size=32, progress=True, shard=(0, 1)):
        return [float(len(c)) for c in completions]
    def identity(self):
        return {"kind": "toy"}

specs.open_source = lambda spec, device, **options: Toy()
from reward.server import main
sys.exit(main(sys.argv[1:]))
"""


def ignore_sigint() -> None:
    """What a shell does to a background job (`cmd &`, nohup, some CI runners): SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("stop,inherited", [(signal.SIGINT, "default"), (signal.SIGINT, "ignored"),
                                            (signal.SIGTERM, "default")], ids=["ctrl-c", "ctrl-c-background", "term"])
def test_the_command_serves_on_loopback_logs_where_and_stops_cleanly_on_ctrl_c(stop, inherited):
    """Ctrl-C or SIGTERM stops the server (exit 0), also one started with SIGINT ignored: Python installs no
    KeyboardInterrupt handler there, and before the server installed its own it served on forever (and this
    test, reading its stderr without a deadline, never ended)."""
    process = subprocess.Popen([sys.executable, "-c", SERVE_TOY, "toy:spec", "--port", "0", "--name", "toy-rm"],
                               cwd=REPO, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO),
                                                                                  os.environ.get("PYTHONPATH"))))},
                               preexec_fn=ignore_sigint if inherited == "ignored" else None)
    try:
        lines = PipeLines(process.stderr)
        log_text = lines.until("serving", timeout=120)
        assert "loaded toy reward toy:spec on cpu" in log_text, log_text
        url = re.search(r"at (http://127\.0\.0\.1:\d+)", log_text).group(1)
        reward = HttpReward(url, model="toy-rm", sleep=no_sleep)
        assert reward.score(["p", "q"], ["abc", ""], progress=False) == [3.0, 0.0]
        process.send_signal(stop)
        rest = lines.rest(timeout=60)
        assert process.wait(30) == 0 and f"{signal.Signals(stop).name}: stopping" in rest and "stopped" in rest, rest
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
