"""A small HTTP endpoint over `nmt.Translator`: `nmt serve -c best.pt --port 8080`.

    POST /translate  {"text": ["Ein Mann fährt Fahrrad.", ...], "beam": 5}
                  -> {"translations": ["A man is riding a bike.", ...]}
    GET  /health  -> {"status": "ok", "checkpoint": "best.pt"}

`beam` is optional (default: `--beam`, else the checkpoint's `decode.beam`).
A line longer than the model takes is translated from its beginning, as `nmt
translate` does; the answer then names such lines by their place in `text`,
from 0: {"translations": [...], "truncated": [3]} (no `truncated` key when no
line was cut).
The model is loaded once. Connections are served by threads
(`ThreadingHTTPServer`), and translations run one request at a time behind a
lock: the model and its caches are not shared between concurrent searches,
and a batch of lines already uses every core the model is given.

Bad requests get status 400 (404 for an unknown path, 405 and an `Allow` header
for another method on a known one, 413 for a body over `MAX_BODY_BYTES`) and a
JSON body {"error": "<one line>"}, as do the errors `http.server` itself sends
(a request line it cannot parse, a method it does not know: 501); a failure
inside the model gets 500, with the traceback in the server's log only. A body
refused unread is read and dropped after the answer, so that a client still
sending it gets to read the answer.

It serves until Ctrl-C or SIGTERM (how systemd and docker stop a service), then
stops listening, closes the connections that wait for a next request (a client's
idle keep-alive), and finishes the requests in flight, up to
`TranslationServer.drain_seconds`; a second signal stops it at once.

Standard library only (`http.server`): no web framework to install. For
production traffic, run it behind a reverse proxy that adds TLS and limits.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from nmt.errors import UserError
from nmt.heap import share_arenas
from nmt.interrupts import Terminated, flush_std_streams, sigterm_interrupts
from nmt.translate import Translator

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 10 * 2**20
"""Largest request body read; about 100,000 sentences, far more than one request should hold."""
IDLE_POLL_SECONDS = 0.25
"""How often a connection waiting for its next request (a client's keep-alive) looks whether the server stops."""
SHUTDOWN_POLL_SECONDS = 0.1
"""How often the accepting loop looks for `shutdown` (`serve`): the most a stop waits for it."""
REQUEST_TIMEOUT_SECONDS = 60.0
"""Longest a connection waits for its client (a byte of the request, the next request; the whole answer written)
before it closes: a client gone without closing (its machine or network down) held a thread and a file for good."""
LINGER_SECONDS = 10.0
"""Longest a connection closed with its request body unread goes on reading (and dropping) that body."""
LINGER_IDLE_SECONDS = 2.0
"""How long that reading waits for more before it gives up on a client that sends nothing and does not close."""
MAX_BEAM = 64
"""Largest `beam` a request may ask for: a bigger one would hold the lock (and memory) for long."""
MAX_NUMBER_DIGITS = 100
"""Longest integer a request body may hold: far more than "beam" needs, and under the interpreter's own limit
(`sys.get_int_max_str_digits()`, 4300), past which `json` raised a ValueError that was answered as a model failure."""
_METHODS = {"/translate": "POST", "/health": "GET"}
"""The one method each path answers; another one gets 405."""


class TranslationServer(ThreadingHTTPServer):
    """An HTTP server holding one `Translator` and the lock that serialises its use.

    Args:
        address: (host, port); port 0 picks a free one (see `server_address` after).
        translator: the loaded model.
        beam: default beam for requests that give none; None: the checkpoint's.
        name: what `/health` reports as the checkpoint.
    """

    daemon_threads = True  # an open connection never keeps the process alive at shutdown
    drain_seconds = 10.0
    """How long `server_close` waits for requests still being handled."""

    def __init__(self, address: tuple[str, int], translator, *, beam: int | None = None, name: str = "") -> None:
        self._handlers: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # before binding, which may close
        self.stopping = False  # set by `server_close`: connections close once their requests are answered
        self.abandoned = 0  # set by `server_close`: handler threads still running after its wait
        if ":" in address[0]:  # an IPv6 address (`--host ::1`, `--host ::` for every interface)
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self.translator = translator
        self.beam = beam
        self.name = name
        self.lock = threading.Lock()

    def process_request_thread(self, request, client_address) -> None:
        self._handlers.add(threading.current_thread())
        super().process_request_thread(request, client_address)

    def handle_error(self, request, client_address) -> None:
        """A client that went away before its answer (a timeout, Ctrl-C) is one log line, not a traceback."""
        if isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipeError, ConnectionResetError
            log.info("%s went away before its answer", client_address[0])
        else:
            super().handle_error(request, client_address)

    def shutdown(self) -> None:
        """End `serve_forever` (called from another thread); from now on, as after `server_close`, a connection
        closes once its request is answered, and says so."""
        self.stopping = True
        super().shutdown()

    def server_close(self) -> None:
        """Stop listening, then wait (up to `drain_seconds`) for the threads still handling a request.

        A handler thread that is still running when the interpreter exits is stopped inside whatever
        it runs, and where that is torch's C++ code the process aborts ("terminate called without an
        active exception"): 7 aborted exits in 130 under a loaded 2-core CPU before this wait, none in 110
        after it.
        """
        self.stopping = True  # a connection waiting for its next request ends within `IDLE_POLL_SECONDS`
        super().server_close()
        deadline = time.monotonic() + self.drain_seconds
        for thread in list(self._handlers):
            while thread.is_alive() and (remaining := deadline - time.monotonic()) > 0:
                thread.join(min(remaining, SHUTDOWN_POLL_SECONDS))  # in steps, as `serve` waits for its loop
        self.abandoned = left = sum(thread.is_alive() for thread in self._handlers)
        if left:
            log.warning("%d connection(s) still open after the %g s wait for the requests in flight: stopping "
                        "without them (a request still being read or translated gets no answer)", left,
                        self.drain_seconds)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def translate(self, lines: list[str], beam: int | None) -> dict[str, list]:
        """The answer to `lines`: their translations, and the places of those cut to the model's length
        (`truncated`, when any). One request at a time, a chunk of lines at a time as `nmt translate` reads a
        file: only the answers are held, not every line's `Translation` until the last is done."""
        texts, cut = [], []
        with self.lock:
            for i, (best, *_) in enumerate(self.translator.translate_stream_nbest(lines, beam=beam or self.beam)):
                texts.append(best.text)
                if best.truncated:
                    cut.append(i)
        return {"translations": texts, "truncated": cut} if cut else {"translations": texts}


def make_server(
    checkpoint: str | Path | Sequence[str | Path], *, host: str = "127.0.0.1", port: int = 8080,
    beam: int | None = None, device: str = "auto",
) -> TranslationServer:
    """Load the checkpoint(s) (several: an ensemble) and bind the server, not yet serving.

    Raises:
        UserError: the checkpoint cannot be loaded, `beam` is out of range, or the
            address cannot be bound (in use, not allowed).
    """
    if beam is not None and not 1 <= beam <= MAX_BEAM:
        raise UserError(f"--beam ({beam}) must be in [1, {MAX_BEAM}]")
    translator = Translator.from_checkpoint(checkpoint, device=device)
    names = [checkpoint] if isinstance(checkpoint, (str, Path)) else list(checkpoint)
    try:
        return TranslationServer((host, port), translator, beam=beam, name=" ".join(map(str, names)))
    except OSError as err:
        raise UserError(f"{host}:{port}: cannot listen there ({err.strerror}); choose another --host or --port") from None


def serve(checkpoint: str | Path | Sequence[str | Path], **options) -> None:
    """Load, bind and serve until interrupted (Ctrl-C or SIGTERM's KeyboardInterrupt); `options` as for `make_server`."""
    share_arenas()  # before the connections' threads: each one's arena kept a search's memory after it
    server = make_server(checkpoint, **options)
    log.info("serving %s on %s: POST /translate {\"text\": [...]}, GET /health", server.name, server.url)
    # The loop accepts in a thread of its own, and the stop (raised in the main thread, where Python runs signal
    # handlers) ends it between two connections: raised inside the loop, it could come while the loop was still
    # starting a connection's handler thread, and socketserver then shut that connection down under its handler,
    # whose answer went nowhere (1 run in 12 of the SIGTERM test under load).
    failed: list[BaseException] = []
    loop = threading.Thread(target=_serve_until_shutdown, args=(server, failed), name="nmt-serve", daemon=True)
    with sigterm_interrupts():  # through the drain too: a second SIGTERM stops at once, as a second Ctrl-C
        try:
            loop.start()
            # in steps, not one blocking join: a signal the kernel hands to another thread of the process (one of
            # torch's) does not interrupt this thread's wait, and is acted on only once the wait returns
            while loop.is_alive():
                loop.join(SHUTDOWN_POLL_SECONDS)
        except KeyboardInterrupt:
            log.info("stopped")
        finally:
            server.shutdown()  # returns once the loop has ended
            try:
                server.server_close()
            except Terminated:
                raise  # a second SIGTERM: `sigterm_interrupts` ends the process by SIGTERM, which leaves no thread
            except KeyboardInterrupt:  # a second Ctrl-C, during the wait for the requests in flight
                log.warning("stopped at once: the requests in flight get no answer")
                _exit_leaving_threads(130)
    if failed:
        raise failed[0]
    if server.abandoned:
        _exit_leaving_threads(0)


def _exit_leaving_threads(status: int) -> None:
    """End the process now, leaving the handler threads still running (a translation longer than the wait).

    The interpreter's exit stops such a thread where it runs, and inside torch's C++ code that aborts the
    process ("terminate called without an active exception", SIGABRT and a core dump), so the process ends
    without it (`os._exit`), its output flushed: `status` 0 as after a stop, 130 as after Ctrl-C.
    """
    logging.shutdown()
    flush_std_streams()
    os._exit(status)


def _serve_until_shutdown(server: TranslationServer, failed: list[BaseException]) -> None:
    """`serve_forever`, keeping what ended it other than `shutdown` for the main thread to raise."""
    try:
        server.serve_forever(poll_interval=SHUTDOWN_POLL_SECONDS)
    except BaseException as err:  # handed to the main thread, which raises it
        failed.append(err)


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _readable(sock: socket.socket, wait: float = 0.0) -> bool:
    """Whether bytes (a request) wait on `sock`, or it has closed, within `wait` seconds, without reading them."""
    try:
        return bool(select.select([sock], [], [], wait)[0])
    except (OSError, ValueError):  # closed already: reading it ends the connection, where waiting would spin
        return True


class _Handler(BaseHTTPRequestHandler):
    server: TranslationServer
    protocol_version = "HTTP/1.1"  # keep-alive: a client may send many requests on one connection
    # TCP_NODELAY: an answer is two writes, headers then body, and with Nagle's algorithm the body waited for the
    # client's delayed acknowledgement of the headers (40 ms on Linux) on every request of a kept-alive connection
    disable_nagle_algorithm = True
    timeout = REQUEST_TIMEOUT_SECONDS  # every read and write of the socket; a timeout ends the connection
    body_unread = False
    """Whether the connection closes with the request's body, or part of it, not read (`_discard_unread`)."""

    def handle_one_request(self) -> None:
        """The next request on this connection, waited for in steps of `IDLE_POLL_SECONDS`: when the server
        stops, a connection with no request coming closes by itself, where a blocking read held the stop
        for `drain_seconds`; a request whose first bytes have come is answered. Those bytes may already be
        read into `rfile`'s buffer, with the end of the previous request (a client that sends its requests
        without waiting for each answer: HTTP/1.1 pipelining), where the socket has nothing to show."""
        if not self._buffered():
            idle_until = time.monotonic() + self.timeout
            while not _readable(self.connection, wait=IDLE_POLL_SECONDS):
                if self.server.stopping or time.monotonic() > idle_until:
                    self.close_connection = True
                    return
        super().handle_one_request()
        if self.body_unread:
            self._discard_unread()

    def _buffered(self) -> bool:
        """Whether bytes of the connection wait in `rfile`'s buffer; reads the socket only without waiting."""
        try:
            self.connection.setblocking(False)  # a read finding nothing returns at once, leaving `peek` nothing
            try:
                return bool(self.rfile.peek(1))
            finally:
                self.connection.settimeout(self.timeout)
        except OSError:
            return True  # reading it ends the connection

    def do_GET(self) -> None:
        if self._routed():
            self._reply(HTTPStatus.OK, {"status": "ok", "checkpoint": self.server.name})

    do_HEAD = do_GET  # its headers without the body (`_reply`), as HTTP asks of a GET resource: `curl -I`, probes

    def do_POST(self) -> None:
        if not self._routed():
            return
        try:
            lines, beam = _parse(self._body())
            answer = self.server.translate(lines, beam)
        except _BadRequest as err:
            self._reply(err.status, {"error": str(err)})
        except UserError as err:  # the translator refused the options
            self._reply(HTTPStatus.BAD_REQUEST, {"error": str(err)})
        except Exception as err:  # the model failed: the client gets one line, the log the traceback
            log.exception("translation failed")
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"translation failed: {type(err).__name__}"})
        else:
            self._reply(HTTPStatus.OK, answer)

    def _routed(self) -> bool:
        """Whether this path answers this method; if not, the reply (404 or 405) is sent."""
        path = self.path.split("?")[0]
        allowed = _METHODS.get(path)
        if allowed == self.command or (self.command == "HEAD" and allowed == "GET"):
            return True
        self._drain()
        if allowed is None:
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"{self.path}: not found; use POST /translate or GET /health"})
        else:
            self._reply(HTTPStatus.METHOD_NOT_ALLOWED,
                        {"error": f"{self.command} {path}: not allowed; use {allowed} {path}"}, headers={"Allow": allowed})
        return False

    # 405 and `Allow` on a known path, where `http.server` would say 501
    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _routed

    def _body(self) -> bytes:
        lengths = self.headers.get_all("Content-Length", [])
        coded = self.headers.get("Transfer-Encoding")
        if not lengths:
            self._leave_body()  # its end is unknown
            chunked = "; a chunked body is not read: send it with its length" if coded else ""
            raise _BadRequest(HTTPStatus.LENGTH_REQUIRED, f"Content-Length header required{chunked}")
        # Two lengths, where a proxy may go by the other one (HTTP's rule: Transfer-Encoding first): read by
        # Content-Length, the rest of the body was taken for the next request on this connection.
        if coded or len({length.strip() for length in lengths}) > 1:
            self._leave_body()
            given = f"Transfer-Encoding {coded!r} and Content-Length" if coded else f"Content-Length {lengths}"
            raise _BadRequest(HTTPStatus.BAD_REQUEST, f"{given} both give the body's length; send Content-Length "
                                                      "alone, once")
        digits = lengths[0].strip()
        if not (digits.isascii() and digits.isdigit()):  # not int(): it takes "+1_0", and "-1" (read to EOF: a hang)
            self._leave_body()
            raise _BadRequest(HTTPStatus.BAD_REQUEST, f"Content-Length {lengths[0]!r} is not a number of bytes")
        size = int(digits)
        if size > MAX_BODY_BYTES:
            self._leave_body()
            raise _BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                              f"request body of {size} bytes is over the limit of {MAX_BODY_BYTES}; send fewer lines")
        try:
            body = self.rfile.read(size)
        except TimeoutError:  # the socket reads no more once timed out
            self.close_connection = True
            raise _BadRequest(HTTPStatus.REQUEST_TIMEOUT, f"request body not sent: nothing came for {self.timeout:g} "
                                                          "s; send it whole at once") from None
        if len(body) < size:  # the client stopped sending: what came is no whole request
            self.close_connection = True
            raise _BadRequest(HTTPStatus.BAD_REQUEST, f"request body cut short: {len(body)} of the {size} bytes "
                                                      "its Content-Length gives arrived")
        return body

    def _leave_body(self) -> None:
        """Leave the body unread: the connection closes after the answer, as it cannot serve a next request."""
        self.close_connection = self.body_unread = True

    def _discard_unread(self) -> None:
        """Read and drop what comes after the answer until the client closes, for up to `LINGER_SECONDS`.

        A socket closed with bytes unread resets the connection, and a client still sending the body
        (http.client, so urllib and requests, reads no answer before it has sent the whole request) got
        a broken pipe instead of the answer.
        """
        sock = self.connection
        try:
            self.wfile.flush()
            sock.shutdown(socket.SHUT_WR)  # the answer is whole: a client reading to the end has it all
            sock.settimeout(IDLE_POLL_SECONDS)
            now = time.monotonic()
            deadline, quiet_until = now + LINGER_SECONDS, now + LINGER_IDLE_SECONDS
            while not self.server.stopping and time.monotonic() < min(deadline, quiet_until):
                try:
                    if not sock.recv(2**16):
                        return  # the client has closed
                except TimeoutError:
                    continue
                quiet_until = time.monotonic() + LINGER_IDLE_SECONDS
        except OSError:  # the client reset the connection: nothing left to read
            pass

    def _drain(self) -> None:
        """Read and drop a body nobody wants, so the connection stays usable."""
        if "Content-Length" not in self.headers and "Transfer-Encoding" not in self.headers:
            return  # no body
        try:
            self._body()
        except _BadRequest:
            pass  # `_body` has closed the connection: the body's end is unknown

    def _reply(self, status: HTTPStatus, payload: dict[str, Any], *, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        if self.server.stopping:
            self.close_connection = True  # said below, so that the client sends no next request on it
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")  # so that the client does not send the next request on it
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The errors `http.server` sends itself (a request line it cannot parse, a method without `do_`,
        too many headers) as JSON, like every other error here, not as its HTML page."""
        self.log_error("code %d, message %s", code, message)
        if self.command is None:  # a request line not understood: answer with a status line, not as HTTP/0.9
            self.request_version = self.protocol_version
        self.close_connection = True  # the rest of the request was not read
        self._reply(HTTPStatus(code), {"error": message or HTTPStatus(code).phrase})

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.info("%s %s", self.address_string(), format % args)


def _parse(body: bytes) -> tuple[list[str], int | None]:
    """The lines and beam of a request body.

    Raises:
        _BadRequest: the body is not UTF-8 JSON of the form {"text": [str, ...], "beam": int?}.
    """
    bad = HTTPStatus.BAD_REQUEST
    try:
        # RFC 8259 §8.1: a byte order mark may be ignored (a JSON file saved by a Windows editor, sent as is)
        request = json.loads(body.decode("utf-8").removeprefix("\ufeff"), parse_int=_parse_int)
    except UnicodeDecodeError as err:
        raise _BadRequest(bad, f"body is not UTF-8 ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise _BadRequest(bad, f"body is not JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except RecursionError:  # `json` parses nesting by recursion: deeper than the interpreter's limit
        raise _BadRequest(bad, 'body nests too deeply to parse; send {"text": [str, ...]}') from None
    if not isinstance(request, dict) or "text" not in request:
        raise _BadRequest(bad, 'body must be a JSON object with "text": a list of strings')
    unknown = sorted(set(request) - {"text", "beam"})
    if unknown:
        raise _BadRequest(bad, f"unknown field {unknown[0]!r}; the fields are \"text\" and \"beam\"")
    lines = request["text"]
    if not isinstance(lines, list):
        raise _BadRequest(bad, f'"text" must be a list of strings, not {type(lines).__name__}')
    for i, line in enumerate(lines):
        if not isinstance(line, str):
            raise _BadRequest(bad, f'"text"[{i}] must be a string, not {type(line).__name__}')
        if not line.isascii():
            try:
                line.encode("utf-8")
            except UnicodeEncodeError as err:  # JSON's "\ud800" escape: half of a UTF-16 pair, no character
                raise _BadRequest(bad, f'"text"[{i}] holds a lone surrogate ({line[err.start]!a} at character '
                                       f'{err.start}), not text; send whole characters') from None
    beam = request.get("beam")
    if beam is not None and (isinstance(beam, bool) or not isinstance(beam, int) or not 1 <= beam <= MAX_BEAM):
        raise _BadRequest(bad, f'"beam" ({beam!r}) must be an integer in [1, {MAX_BEAM}]')
    return lines, beam


def _parse_int(digits: str) -> int:
    """`int` of a JSON integer, or `_BadRequest` for one longer than `MAX_NUMBER_DIGITS`."""
    if len(digits) > MAX_NUMBER_DIGITS + digits.startswith("-"):
        raise _BadRequest(HTTPStatus.BAD_REQUEST, f"body holds a number of {len(digits.lstrip('-'))} digits, over "
                                                  f"the {MAX_NUMBER_DIGITS} read; \"beam\" is an integer in [1, {MAX_BEAM}]")
    return int(digits)
