"""`nmt serve`: real HTTP requests to a server on a free port, answered as `nmt.Translator` answers."""

from __future__ import annotations

import ctypes
import http.client
import json
import logging
import os
import platform
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from nmt.checkpoint import save_checkpoint
from nmt.config import config_from_dict, config_to_dict
from nmt.data.tokenizer import PAD_ID, train_tokenizer
from nmt.errors import UserError
from nmt.models import build_model
from nmt.serve import MAX_BODY_BYTES, _Handler, make_server
from nmt.translate import Translator
from tests.conftest import tiny_config_dict


@pytest.fixture(scope="module")
def checkpoint(small_corpus, tmp_path_factory) -> Path:
    """A seeded, randomly initialised tiny Transformer: nonsense translations, but real and deterministic."""
    root = tmp_path_factory.mktemp("serve")
    cfg = config_from_dict(tiny_config_dict(small_corpus, root / "run"))
    en, de = ((small_corpus / f"train.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "de"))
    tokenizer = train_tokenizer(cfg.tokenizer, en, de)
    torch.manual_seed(0)
    model = build_model(cfg.model, src_vocab_size=tokenizer.src_vocab_size, tgt_vocab_size=tokenizer.tgt_vocab_size,
                        pad_id=PAD_ID)
    path = root / "model.pt"
    save_checkpoint({"config": config_to_dict(cfg), "tokenizer": tokenizer.to_state(), "model": model.state_dict()},
                    path)
    return path


@pytest.fixture(scope="module")
def server(checkpoint):
    """The server on a free port, serving from a thread; shut down after the module."""
    srv = make_server(checkpoint, host="127.0.0.1", port=0, device="cpu")
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def translator(checkpoint) -> Translator:
    return Translator.from_checkpoint(checkpoint, device="cpu")


def request(url: str, body: bytes | None = None, *, headers: dict | None = None) -> tuple[int, dict]:
    """(status, JSON body) of a GET (no body) or POST."""
    req = urllib.request.Request(url, data=body, headers=headers or {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read().decode("utf-8"))


def post(server, payload) -> tuple[int, dict]:
    return request(f"{server.url}/translate", json.dumps(payload).encode("utf-8"))


def raw(server, data: bytes, *, shut: bool = False) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of the reply to `data` sent as is (then, with `shut`, nothing more: the sending
    side closed), read until the server closes the connection.

    The timeout is short: a server that waits for more of the request fails the test in seconds.
    """
    with socket.create_connection(server.server_address[:2], timeout=10) as sock:
        sock.sendall(data)
        if shut:
            sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    return int(status_line.split()[1]), headers, body


def test_translations_are_the_translators(server, translator, small_corpus):
    lines = (small_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:6] + ["", "Grüße, Ωmega!"]
    status, body = post(server, {"text": lines})
    assert status == 200
    assert body == {"translations": translator.translate(lines)}
    assert body["translations"][6] == ""  # an empty line stays empty
    status, body = post(server, {"text": lines[:3], "beam": 1})
    assert status == 200 and body["translations"] == translator.translate(lines[:3], beam=1)
    assert post(server, {"text": []}) == (200, {"translations": []})


def test_lines_cut_to_the_models_length_are_named_in_the_answer(server, translator):
    """A line longer than the model's positions is translated from its beginning; the client was not told, so
    a caller could not tell a translation of half its text from a whole one (only the server's log said)."""
    long_line = " ".join(["the man sees the dog"] * translator.max_src_len)  # 5 words (subwords or more) each
    lines = ["the dog runs .", long_line, "", long_line + " again"]
    status, body = post(server, {"text": lines})
    assert status == 200
    assert body == {"translations": translator.translate(lines), "truncated": [1, 3]}
    assert post(server, {"text": lines[:1]}) == (200, {"translations": translator.translate(lines[:1])})
    nbest = translator.translate_nbest(lines, beam=2, nbest=2)
    assert [[t.truncated for t in line] for line in nbest] == [[False] * 2, [True] * 2, [False] * 2, [True] * 2]


def test_a_body_that_starts_with_a_byte_order_mark_is_read(server, translator):
    """A JSON file saved with a UTF-8 byte order mark (Windows editors) and sent as is (`curl --data-binary
    @file`) was refused as "not JSON (Unexpected UTF-8 BOM (decode using utf-8-sig))", advice for the server's
    code; JSON's RFC 8259 lets a reader ignore the mark."""
    body = "\ufeff" + json.dumps({"text": ["the dog runs ."]})
    status, reply = request(f"{server.url}/translate", body.encode("utf-8"))
    assert (status, reply) == (200, {"translations": translator.translate(["the dog runs ."])})


def test_a_request_of_many_lines_is_translated_a_chunk_at_a_time(server):
    """The lines of a request were translated in one call, which holds every line's `Translation` (tokens,
    scores) until the last is done: a 10 MB body of 2.6 million empty strings took the server from 281 MB to
    1.5 GB. Translated a chunk at a time, as `nmt translate` reads a file, only the answers are held."""
    lines = [""] * 100_000
    tracemalloc.start()
    try:
        status, body = post(server, {"text": lines})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert status == 200 and body == {"translations": lines}
    assert peak < 10e6, f"{peak / 1e6:.0f} MB"  # the body (0.4 MB), its list and the answer: a few MB


def test_health(server, checkpoint):
    assert request(f"{server.url}/health") == (200, {"status": "ok", "checkpoint": str(checkpoint)})


def test_requests_on_one_kept_alive_connection_are_not_held_by_the_tcp_ack_delay(server):
    """An answer is two writes (headers, then body): with Nagle's algorithm on, the body waited for the
    client's delayed acknowledgement of the headers, 40 ms on Linux, so each request on a kept-alive
    connection took 40 ms more than on a new one (64 against 22 ms for 3 lines, 2-core CPU)."""
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    conn.request("GET", "/health")
    conn.getresponse().read()  # the connection is open and past its first exchanges
    took = []
    for _ in range(20):
        start = time.perf_counter()
        conn.request("GET", "/health")
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read())["status"] == "ok"
        took.append(time.perf_counter() - start)
    conn.close()
    # the median, not the sum: a loaded machine may hold up a few requests, never most of them by 40 ms
    assert sorted(took)[len(took) // 2] < 0.03  # a /health answer takes about 1 ms


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_requests_sent_without_waiting_for_each_answer_are_all_answered(server):
    """HTTP/1.1 pipelining: the next request came in the same read as the one before, into `rfile`'s buffer,
    and the wait for a next request, which watched the socket alone, never saw it: the client waited forever."""
    body = json.dumps({"text": ["the dog"]}).encode()
    post_ = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    get = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    close = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    status, headers, reply = raw(server, get + post_ + get + close)
    assert status == 200 and reply.count(b"HTTP/1.1 200 OK\r\n") == 3  # the first one's is in `status`
    assert b'{"translations": [' in reply


def test_an_ipv6_address_is_served(checkpoint, translator):
    """`--host ::1` was refused: "Address family for hostname not supported"."""
    srv = make_server(checkpoint, host="::1", port=0, device="cpu")
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        assert srv.url.startswith("http://[::1]:")
        assert post(srv, {"text": ["the dog runs ."]}) == (200, {"translations": translator.translate(["the dog runs ."])})
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


def test_concurrent_requests_each_get_their_own_answer(server, translator, small_corpus):
    lines = (small_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:8]
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda line: post(server, {"text": [line], "beam": 1}), lines))
    assert answers == [(200, {"translations": translator.translate([line], beam=1)}) for line in lines]


@pytest.mark.parametrize(("body", "status", "needle"), [
    (b'{"text": ["a"', 400, "body is not JSON (Expecting ',' delimiter at line 1 column 14)"),
    (b"\xff\xfe", 400, "body is not UTF-8"),
    (b'["a", "b"]', 400, 'body must be a JSON object with "text"'),
    (b'{"txt": ["a"]}', 400, 'body must be a JSON object with "text"'),
    (b'{"text": "one line"}', 400, '"text" must be a list of strings, not str'),
    (b'{"text": ["a", 3]}', 400, '"text"[1] must be a string, not int'),
    (b'{"text": ["a"], "beam": 0}', 400, '"beam" (0) must be an integer in [1, 64]'),
    (b'{"text": ["a"], "beam": true}', 400, '"beam" (True) must be an integer'),
    (b'{"text": ["a"], "beams": 2}', 400, "unknown field 'beams'"),
    (b'{"text": ["ok", "F\\u00e9lix \\ud800 eats"]}', 400,
     "\"text\"[1] holds a lone surrogate ('\\ud800' at character 6), not text"),
    # `json` refuses integers of more than `sys.get_int_max_str_digits()` digits with a ValueError of its own
    (b'{"text": ["a"], "beam": ' + b"9" * 5000 + b"}", 400, "body holds a number of 5000 digits"),
])
def test_bad_requests_get_400_and_one_line(server, body, status, needle):
    got, reply = request(f"{server.url}/translate", body)
    assert got == status and needle in reply["error"] and "\n" not in reply["error"]


def test_unknown_paths_and_oversized_bodies(server):
    assert request(f"{server.url}/nope")[0] == 404
    status, reply = request(f"{server.url}/nope", b'{"text": ["a"]}')
    assert status == 404 and "use POST /translate" in reply["error"]
    with socket.create_connection(server.server_address[:2], timeout=30) as sock:
        sock.sendall(f"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode())
        reply = b""
        while chunk := sock.recv(4096):  # the server answers, then closes: the body was never read
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 413") and b"over the limit" in reply
    # the server still answers afterwards
    assert post(server, {"text": ["a"]})[0] == 200


@pytest.mark.parametrize("chunked", [False, True], ids=["too-long", "chunked"])
def test_a_body_refused_unread_still_lets_its_client_read_the_answer(server, chunked):
    """http.client (and so urllib and requests) sends the whole body before it reads an answer. The server
    answered a body it does not read (over `MAX_BODY_BYTES`, or chunked) and closed the connection with the
    body still arriving, and the socket, closed with bytes unread, reset it: the client got a broken pipe
    (ConnectionResetError) instead of the 413 or 411."""
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=30)
    piece = b" " * 2**16
    pieces = MAX_BODY_BYTES // len(piece) + 1
    try:
        if chunked:  # 5 MiB: more than the sockets' buffers hold
            conn.request("POST", "/translate", body=iter([piece] * (pieces // 2)), encode_chunked=True)
        else:
            conn.request("POST", "/translate", body=piece * pieces)
        resp = conn.getresponse()
        status, reply = resp.status, json.loads(resp.read())
    finally:
        conn.close()
    if chunked:
        assert status == 411 and "a chunked body is not read" in reply["error"]
    else:
        assert status == 413 and reply["error"].startswith(f"request body of {len(piece) * pieces} bytes is over")
    assert post(server, {"text": ["a"]})[0] == 200


def test_deeply_nested_json_is_a_bad_request_not_a_model_failure(server, caplog):
    """`json.loads` raises RecursionError, not JSONDecodeError, on a body nested deeper than the recursion limit."""
    body = b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with caplog.at_level(logging.INFO, logger="nmt.serve"):
        status, reply = request(f"{server.url}/translate", body)
    assert status == 400 and "nests too deeply" in reply["error"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no traceback: nothing failed inside


@pytest.mark.parametrize("length", ["-1", "abc"])
def test_a_bad_content_length_is_refused_and_the_connection_closed(server, length):
    """`rfile.read(-1)` would read until the client closes: the reply must come without the client closing."""
    status, headers, body = raw(server, f"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
                                        '{"text": ["a"]}'.encode())
    assert status == 400 and headers["Connection"] == "close"
    assert json.loads(body)["error"] == f"Content-Length {length!r} is not a number of bytes"


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("PUT", "/translate", "POST"), ("PATCH", "/translate", "POST"), ("DELETE", "/health", "GET"),
    ("GET", "/translate", "POST"), ("POST", "/health", "GET"), ("OPTIONS", "/translate", "POST"),
])
def test_another_method_on_a_known_path_gets_405_and_allow(server, method, path, allow):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    try:
        conn.request(method, path, body=b'{"text": ["a"]}', headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        reply = json.loads(resp.read())
        assert resp.status == 405 and resp.getheader("Allow") == allow
        assert reply == {"error": f"{method} {path}: not allowed; use {allow} {path}"}
        conn.request("GET", "/health")  # the body was read: the connection is still usable
        resp = conn.getresponse()
        assert resp.status == 200 and json.loads(resp.read())["status"] == "ok"
    finally:
        conn.close()


@pytest.mark.parametrize(("request_bytes", "status", "needle"), [
    (b"TRACE /translate HTTP/1.1\r\nHost: x\r\n\r\n", 501, "Unsupported method ('TRACE')"),
    (b"GET /a b HTTP/1.1\r\n\r\n", 400, "Bad request syntax ('GET /a b HTTP/1.1')"),
    (b"garbage\r\n\r\n", 400, "Bad request syntax ('garbage')"),  # no version: answered as HTTP/1.1 all the same
    (b"GET /health HTTP/2.0\r\n\r\n", 505, "Invalid HTTP version (2.0)"),
    (b"GET /health HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", 431, "Too many headers"),
], ids=["unknown-method", "bad-syntax", "no-version", "http-2", "too-many-headers"])
def test_the_http_servers_own_errors_are_json_too(server, request_bytes, status, needle):
    got, headers, body = raw(server, request_bytes)
    reply = json.loads(body)
    assert got == status and headers["Content-Type"].startswith("application/json")
    assert list(reply) == ["error"] and needle in reply["error"] and "\n" not in reply["error"]


def test_head_gets_the_headers_of_get_or_its_error_without_a_body(server):
    """`curl -I` and load balancers probe /health with HEAD, which HTTP answers as GET, without the body."""
    status, headers, body = raw(server, b"HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 200 and headers["Content-Type"].startswith("application/json") and body == b""
    assert int(headers["Content-Length"]) == len(json.dumps({"status": "ok", "checkpoint": server.name}))
    status, headers, body = raw(server, b"HEAD /translate HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 405 and headers["Allow"] == "POST" and body == b""


def test_a_body_cut_short_or_chunked_is_named_so(server):
    status, headers, body = raw(server, b'POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{"text"',
                                shut=True)
    assert status == 400 and headers["Connection"] == "close"
    assert json.loads(body)["error"] == "request body cut short: 7 of the 50 bytes its Content-Length gives arrived"
    status, _, body = raw(server, b"POST /translate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                  b'7\r\n{"text"\r\n0\r\n\r\n')
    assert status == 411
    assert json.loads(body)["error"] == ("Content-Length header required; a chunked body is not read: send it with "
                                         "its length")


def test_a_client_that_stops_sending_is_not_waited_for_forever(server, monkeypatch):
    """A client that stopped sending without closing (its machine or network gone: no FIN comes) held its
    connection and thread for good, in the middle of a request or between requests; enough of them use up the
    process's files and it accepts no more. Each wait for the client now ends after `_Handler.timeout`."""
    monkeypatch.setattr(_Handler, "timeout", 0.5)  # REQUEST_TIMEOUT_SECONDS for the connections opened here
    start = time.monotonic()
    status, headers, body = raw(server, b'POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{"te')
    assert status == 408 and headers["Connection"] == "close"
    assert json.loads(body)["error"] == "request body not sent: nothing came for 0.5 s; send it whole at once"
    for sent in (b"POST /translate HTTP/1.1\r\nHost", b""):  # a request line or headers cut short, or nothing
        with socket.create_connection(server.server_address[:2], timeout=10) as sock:
            sock.sendall(sent)
            assert sock.recv(4096) == b""  # closed, without an answer: there is no request to answer
    assert time.monotonic() - start < 8
    assert post(server, {"text": ["a"]})[0] == 200


@pytest.mark.parametrize(("lengths", "error"), [
    (b"Transfer-Encoding: chunked\r\nContent-Length: 5", "Transfer-Encoding 'chunked' and Content-Length both"),
    (b"Content-Length: 5\r\nContent-Length: 22", "Content-Length ['5', '22'] both"),
], ids=["chunked-and-length", "two-lengths"])
def test_a_body_with_two_lengths_is_refused_not_read_as_two_requests(server, lengths, error):
    """Read by its (first) Content-Length, the rest of such a body was taken for the next request on the
    connection, which got an answer of its own: behind a proxy that goes by the other length (Transfer-Encoding
    first, as HTTP asks), a request could be slipped inside the body of another."""
    body = b'{"text": ["the dog"]}'
    if b"chunked" in lengths:
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    status, headers, reply = raw(server, b"POST /translate HTTP/1.1\r\nHost: x\r\n%s\r\n\r\n%s" % (lengths, body))
    assert b"HTTP/1.1" not in reply  # one answer
    assert status == 400 and headers["Connection"] == "close"
    assert json.loads(reply)["error"] == f"{error} give the body's length; send Content-Length alone, once"
    status, headers, reply = raw(server, b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                                         b"Content-Length: 5\r\nConnection: close\r\n\r\n[1,2]")
    assert status == 400 and json.loads(reply)["error"].startswith("body must be a JSON object")  # read once


def test_a_client_that_goes_away_before_its_answer_is_one_log_line(server, small_corpus, caplog, capsys):
    body = json.dumps({"text": (small_corpus / "test.en").read_text(encoding="utf-8").splitlines() * 10}).encode()
    with caplog.at_level(logging.INFO, logger="nmt"):
        sock = socket.create_connection(server.server_address[:2], timeout=10)
        sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # at once, with a reset: the answer finds no one to read it
        deadline = time.monotonic() + 60
        while "went away before its answer" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.1)
    assert "127.0.0.1 went away before its answer" in caplog.text
    assert "Traceback" not in capsys.readouterr().err
    assert request(f"{server.url}/health")[0] == 200  # and the server goes on


def test_bad_beam_and_busy_port_are_refused_before_serving(checkpoint, server):
    with pytest.raises(UserError, match=r"--beam \(0\) must be in \[1, 64\]"):
        make_server(checkpoint, port=0, beam=0, device="cpu")
    port = server.server_address[1]
    with pytest.raises(UserError, match=rf"127.0.0.1:{port}: cannot listen there"):
        make_server(checkpoint, port=port, device="cpu")


def stop_once_a_handler_runs(srv, caplog) -> float:
    """Stop `srv` (as Ctrl-C does) once a connection has its handler thread, its warnings in `caplog`; the
    seconds `server_close` took."""
    while not list(srv._handlers):
        time.sleep(0.01)
    srv.shutdown()
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="nmt.serve"):
        srv.server_close()
    return time.monotonic() - start


def test_closing_waits_for_the_requests_being_handled_but_not_forever(checkpoint, caplog):
    """A handler thread still translating when the interpreter exits can abort the process, so closing
    waits for it (`TranslationServer.server_close`), up to `drain_seconds`."""
    srv = make_server(checkpoint, host="127.0.0.1", port=0, device="cpu")
    serving = threading.Thread(target=srv.serve_forever, daemon=True)
    serving.start()
    replies = []
    srv.lock.acquire()  # the next translation waits here, as behind a long one
    client = threading.Thread(target=lambda: replies.append(post(srv, {"text": ["the dog"]})), daemon=True)
    client.start()
    while not list(srv._handlers):  # the request has reached its handler thread
        time.sleep(0.01)
    (handler,) = list(srv._handlers)
    srv.shutdown()
    threading.Timer(0.5, srv.lock.release).start()
    start = time.monotonic()
    srv.server_close()
    assert not handler.is_alive() and time.monotonic() - start >= 0.4  # it waited for the translation
    client.join(timeout=10)
    assert replies and replies[0][0] == 200

    srv = make_server(checkpoint, host="127.0.0.1", port=0, device="cpu")
    srv.drain_seconds = 0.3
    serving = threading.Thread(target=srv.serve_forever, daemon=True)
    serving.start()
    srv.lock.acquire()  # never released: the handler outlives the wait
    threading.Thread(target=lambda: post(srv, {"text": ["the dog"]}), daemon=True).start()
    assert 0.25 <= stop_once_a_handler_runs(srv, caplog) < 5 and any(t.is_alive() for t in srv._handlers)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "1 connection(s) still open after the 0.3 s wait for the requests in flight: stopping without them (a "
        "request still being read or translated gets no answer)"]
    srv.lock.release()  # let it finish, so that no thread of this test outlives it
    for thread in list(srv._handlers):
        thread.join(timeout=10)


def test_closing_does_not_wait_for_a_connection_idle_between_requests(checkpoint, caplog):
    """A client that keeps its connection open between requests (HTTP/1.1 keep-alive: a browser, a requests
    Session) held the stop for the whole `drain_seconds` (10.5 s), then was warned of as a request in flight.
    Such a connection is closed at once; the stop waits only for requests being read or translated."""
    srv = make_server(checkpoint, host="127.0.0.1", port=0, device="cpu")
    serving = threading.Thread(target=srv.serve_forever, daemon=True)
    serving.start()
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
    conn.request("GET", "/health")
    assert conn.getresponse().read()  # answered; the connection stays open, waiting for a next request
    assert stop_once_a_handler_runs(srv, caplog) < srv.drain_seconds / 2
    assert not any(t.is_alive() for t in srv._handlers)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    conn.close()


DUMPS_STACKS = {**os.environ, "PYTHONFAULTHANDLER": "1"}
"""The environment of a server process whose threads' stacks a SIGABRT prints (`faulthandler`)."""


def stopped(proc: subprocess.Popen, timeout: float = 30) -> int:
    """The exit status of a server told to stop; one still running after `timeout` seconds fails the test with
    the stacks of its threads, to show where it hung."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        proc.wait(timeout=30)
        pytest.fail(f"the server still ran {timeout:g} s after it was stopped; it said, its stacks last:\n"
                    f"{proc.stderr.read()[-8000:]}")


def test_cli_serves_until_interrupted(checkpoint):
    proc = subprocess.Popen([sys.executable, "-m", "nmt", "serve", "-c", str(checkpoint), "--port", "0",
                             "--device", "cpu", "--beam", "1"], stderr=subprocess.PIPE, text=True, env=DUMPS_STACKS)
    try:
        url = None
        for line in proc.stderr:  # "[nmt] serving <ckpt> on http://127.0.0.1:<port>: ..."
            found = re.search(r" on (http://[\d.]+:\d+)", line)
            if found:
                url = found.group(1)
                break
        assert url is not None, "the server never said where it listens"
        assert request(f"{url}/health")[0] == 200
        status, body = request(f"{url}/translate", json.dumps({"text": ["the dog"]}).encode())
        assert status == 200 and len(body["translations"]) == 1
    finally:
        proc.send_signal(signal.SIGINT)
        rc = stopped(proc)
        rest = proc.stderr.read()  # what it said after the address, to see why it failed
        proc.stderr.close()
    assert rc == 0, rest[-3000:]


def test_cli_on_sigterm_finishes_the_request_in_flight_and_exits_0(checkpoint):
    """SIGTERM, as systemd and docker stop a service, stops it as Ctrl-C does: no new connections, but the
    request already being read is still answered. Its body is sent in two parts, the second after the stop."""
    proc = subprocess.Popen([sys.executable, "-m", "nmt", "serve", "-c", str(checkpoint), "--port", "0",
                             "--device", "cpu", "--beam", "1"], stderr=subprocess.PIPE, text=True, env=DUMPS_STACKS)
    said, stopping = [], False
    try:
        for line in proc.stderr:
            said.append(line)
            if found := re.search(r" on http://([\d.]+):(\d+)", line):
                break
        assert found, "the server never said where it listens"
        conn = http.client.HTTPConnection(found.group(1), int(found.group(2)), timeout=30)
        conn.request("GET", "/health")  # the connection is accepted and has its handler thread
        assert conn.getresponse().read()
        body = json.dumps({"text": ["the dog"]}).encode()
        conn.putrequest("POST", "/translate")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body[:5])
        proc.send_signal(signal.SIGTERM)
        stopping = True
        for line in proc.stderr:  # it stops serving before it answers
            said.append(line)
            if line.strip() == "[nmt] stopped":
                break
        try:
            conn.send(body[5:])
            resp = conn.getresponse()
            status, reply, closing = resp.status, json.loads(resp.read()), resp.getheader("Connection")
        except (OSError, http.client.HTTPException) as err:  # with the server's log below, not alone
            status, reply, closing = repr(err), {}, None
        conn.close()
    finally:
        if not stopping:  # failed before the signal: nothing to wait for
            proc.kill()
        rc = stopped(proc)
        said.append(proc.stderr.read())
        proc.stderr.close()
    assert status == 200 and len(reply["translations"]) == 1, f"{status}; the server said: {''.join(said)[-3000:]}"
    assert closing == "close"  # answered during the stop: the client is told to send no next request on it
    assert rc == 0 and "[nmt] stopped\n" in said, "".join(said)[-3000:]


@pytest.mark.parametrize(("signals", "drain", "status", "said_last"), [
    ([signal.SIGTERM], 0.2, 0, "1 connection(s) still open after the 0.2 s wait for the requests in flight"),
    ([signal.SIGINT, signal.SIGINT], 30, 130, "stopped at once: the requests in flight get no answer"),
], ids=["after-the-wait", "second-ctrl-c"])
def test_cli_stopped_during_a_long_translation_exits_without_aborting(checkpoint, small_corpus, signals, drain,
                                                                        status, said_last):
    """The process exited with a handler thread still translating (after `drain_seconds`, or at a second Ctrl-C
    during that wait), and the interpreter's exit stopped that thread inside torch's C++ code: "terminate called
    without an active exception", killed by SIGABRT (a core dump where they are kept). It now ends without
    finalizing, after its warning."""
    script = (f"import sys; from nmt.serve import TranslationServer; TranslationServer.drain_seconds = {drain}; "
              "from nmt.cli import main; sys.argv[0] = 'nmt'; main()")
    proc = subprocess.Popen([sys.executable, "-c", script, "serve", "-c", str(checkpoint), "--port", "0",
                             "--device", "cpu"], stderr=subprocess.PIPE, text=True, env=DUMPS_STACKS)
    said = []
    try:
        for line in proc.stderr:
            said.append(line)
            if found := re.search(r" on http://([\d.]+):(\d+)", line):
                break
        assert found, "".join(said)
        # a nonsense model at beam 64 runs to the longest output: seconds of translation
        body = json.dumps({"text": (small_corpus / "test.en").read_text(encoding="utf-8").splitlines() * 32,
                           "beam": 64}).encode()
        sock = socket.create_connection((found.group(1), int(found.group(2))), timeout=30)
        sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(1)  # the translation runs
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.5)
        rc = stopped(proc)
        sock.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        said.append(proc.stderr.read())
        proc.stderr.close()
    said = "".join(said)
    assert rc == status and "terminate called" not in said, f"{rc}: {said[-3000:]}"
    assert said.splitlines()[-1].startswith(f"[nmt] {said_last}"), said[-3000:]


TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())
"""The number of Linux's `tgkill`, which sends a signal to one thread of a process."""


def signal_another_thread(proc: subprocess.Popen, signum: int) -> None:
    """Send `signum` to a thread of `proc` other than its main one, as the kernel may deliver a process's signal."""
    others = sorted(int(tid) for tid in os.listdir(f"/proc/{proc.pid}/task") if int(tid) != proc.pid)
    assert others, "the server runs no thread besides its main one"
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(TGKILL, proc.pid, others[-1], signum) == 0, os.strerror(ctypes.get_errno())


@pytest.mark.skipif(sys.platform != "linux" or TGKILL is None, reason="sends a signal to one thread with Linux's tgkill")
@pytest.mark.parametrize("during", ["serving", "the-wait"])
def test_cli_stops_on_a_sigterm_the_kernel_hands_to_another_thread(checkpoint, small_corpus, during):
    """Python acts on a signal in the main thread, which waited for the accepting loop (and then for the requests
    in flight) in one blocking join: a signal delivered to another thread did not end that wait, and the server
    ran on. A second SIGTERM during the wait for a long translation stops it at once, as one to the main thread."""
    script = ("import sys; from nmt.serve import TranslationServer; TranslationServer.drain_seconds = 60; "
              "from nmt.cli import main; sys.argv[0] = 'nmt'; main()")
    proc = subprocess.Popen([sys.executable, "-c", script, "serve", "-c", str(checkpoint), "--port", "0",
                             "--device", "cpu"], stderr=subprocess.PIPE, text=True, env=DUMPS_STACKS)
    said = []
    try:
        for line in proc.stderr:
            said.append(line)
            if found := re.search(r" on http://([\d.]+):(\d+)", line):
                break
        assert found, "".join(said)
        if during == "the-wait":  # a translation of a minute or more, as in the test above
            body = json.dumps({"text": (small_corpus / "test.en").read_text(encoding="utf-8").splitlines() * 64,
                               "beam": 64}).encode()
            sock = socket.create_connection((found.group(1), int(found.group(2))), timeout=30)
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(1)  # the accepting loop has started; the translation runs
        signal_another_thread(proc, signal.SIGTERM)
        if during == "the-wait":
            for line in proc.stderr:  # the server stops listening and waits for the translation
                said.append(line)
                if line.strip() == "[nmt] stopped":
                    break
            time.sleep(0.5)
            signal_another_thread(proc, signal.SIGTERM)
        rc = stopped(proc, timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        said.append(proc.stderr.read())
        proc.stderr.close()
    said = "".join(said)
    if during == "serving":
        assert rc == 0 and said.splitlines()[-1] == "[nmt] stopped", said[-3000:]
    else:  # the second SIGTERM ends the process by SIGTERM, leaving the translation
        assert rc == -signal.SIGTERM and "terminate called" not in said, f"{rc}: {said[-3000:]}"
