"""The daemon's Unix socket: the shim's requests and the launchers' sessions, on one event loop.

One thread owns every connection (selectors): it reads frames without ever waiting on
a client, so idle, slow or hostile clients cost a file descriptor and nothing else. A
request whose answer is already known (a staged file, a report) is answered in the loop;
an OPEN that waits for a copy or a peer is answered by the copy's own end (a callback on
the staging thread hands the answer to the loop: no thread waits per request), an
INVALIDATE runs on a pool of request threads, and the loop sends the client a heartbeat
frame every HEARTBEAT_MS meanwhile, so the shim can tell a slow copy from a stalled daemon.
The socket answers before the daemon's snapshot exists (the walk runs on a thread of its
own, daemon.py): a request that needs it (OPEN, INDEX, a full REPORT) is held, with
heartbeats, and handled as if it had just arrived once the snapshot is ready or has
failed; nothing on the loop ever waits for the walk. Every connection's peer uid is
checked (SO_PEERCRED): only the daemon's own user is served. A malformed, oversized or
slow request is answered with an error, counted, and closed. Launcher sessions (ATTACH)
stay open for a run; when the last one closes an embedded daemon stops by itself, so a
killed launcher never leaves a daemon behind.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import selectors
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from monarch import protocol, secure
from monarch.node.daemon import NodeDaemon
from monarch.node.snapshot.gate import SnapshotState
from monarch.node.writeback_door import WritebackDoor
from monarch.node.outcomes import Outcome
from monarch.errors import DaemonError
from monarch.protocol import ProtocolError

log = logging.getLogger(__name__)

REQUEST_THREADS = 64          # requests waiting for a copy or a peer at once; more queue without blocking the loop
REQUEST_TIMEOUT = 5.0         # seconds a client has to send its whole request
MAX_CONNECTIONS = 4096        # open connections at once (beyond: closed at accept)
MAX_SESSIONS = 1024           # attached launchers at once
# An embedded daemon stops EMBEDDED_IDLE_SECONDS after its last session closed (a grace for
# launchers started a moment apart), or at once if that session said it was done (its final
# REPORT): the launcher waiting for it to exit (its tiers removed) is not kept waiting.
EMBEDDED_IDLE_SECONDS = 0.5
EMBEDDED_FIRST_ATTACH_SECONDS = 120.0  # an embedded daemon no launcher ever attached to stops after this
DOOR_BOOKS_SECONDS = 0.1      # the front door's copies reach the stager's books at least this often


class _Conn:
    __slots__ = ("sock", "inbuf", "outbuf", "deadline", "session", "pending", "next_beat", "close_after",
                 "answer_by", "outfd", "fd_at", "done", "held")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.deadline = time.monotonic() + REQUEST_TIMEOUT
        self.session = False       # an attached launcher
        self.pending = False       # a request is running on the pool
        self.next_beat = 0.0
        self.close_after = False   # close once outbuf is written
        self.answer_by = 0.0       # an OPEN still staging is answered "PFS" at this time
        self.outfd: int | None = None  # a descriptor to pass with the answer frame (SCM_RIGHTS), then close
        self.fd_at = 0             # where in outbuf that frame starts
        self.done = False          # a session that asked its final REPORT: it is closing
        self.held: tuple[int, bytes] | None = None  # (verb, body) of a request waiting for the snapshot


class NodeServer:
    """Serves one NodeDaemon on its socket until stopped (or, embedded, until unused)."""

    def __init__(self, daemon: NodeDaemon, embedded: bool):
        self.daemon = daemon
        self.embedded = embedded
        self.path = daemon.socket_path
        self.errors: collections.Counter[str] = collections.Counter()  # refused requests, by reason
        self.held: collections.Counter[str] = collections.Counter()  # requests that waited for the snapshot, by verb
        self._conns: dict[int, _Conn] = {}
        self._sessions = 0
        self._ever_attached = False
        self._last_change = time.monotonic()
        self._last_was_done = False  # the last session to close had said it was done
        self._stop = threading.Event()
        self._done: collections.deque[tuple[_Conn, bytes, str | None, int | None]] = collections.deque()
        self._woken = False  # a wake byte is on its way: later finishers need not send one
        self._held: list[_Conn] = []  # requests waiting for the snapshot, in arrival order
        self._settled = False  # the loop has seen the snapshot ready or failed (loop thread only)
        self._settled_flag = threading.Event()  # set by the walk's thread, read by the loop
        # the instance's own socket; daemon.sock, which launchers look for, names it once it listens
        instance = daemon.instance
        _claim_socket(instance.socket_path)
        old_umask = os.umask(0o177)  # the socket file is 0600 from the start
        try:
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(instance.socket_path)
        finally:
            os.umask(old_umask)
        self._listener.listen(1024)
        try:
            instance.publish_socket()
        except OSError as e:
            self._listener.close()
            instance.unpublish_socket()
            raise DaemonError(f"cannot name the daemon's socket {self.path}: {e.strerror}") from None
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._pool = ThreadPoolExecutor(max_workers=REQUEST_THREADS, thread_name_prefix="monarch-request")
        self._sel = selectors.DefaultSelector()
        # the C front door (monarch.frontdoor) accepts and answers what it can on a thread of
        # its own, and hands the rest over here; without it this loop accepts everything
        self.front_door = daemon.make_front_door(self._listener.fileno())
        self._next_absorb = 0.0
        # a connection's key holds its _Conn; the loop's own sources hold their handler
        if self.front_door is not None:
            self._sel.register(self.front_door.wake_fd, selectors.EVENT_READ, self._from_door)
        else:
            self._sel.register(self._listener, selectors.EVENT_READ, self._accept)
        self._sel.register(self._wake_r, selectors.EVENT_READ, self._drain_wake)
        self.writeback_door = _writeback_door(daemon)  # the shim's write-back calls, on threads of their own
        # the request verbs (protocol.VERB_*), each to its handler: (conn, body)
        self._handlers: dict[int, Callable[[_Conn, bytes], None]] = {
            protocol.VERB_OPEN: self._open, protocol.VERB_INVALIDATE: self._invalidate,
            protocol.VERB_HINT: self._hint, protocol.VERB_INDEX: self._index,
            protocol.VERB_ATTACH: self._attach, protocol.VERB_REPORT: self._report, protocol.VERB_STOP: self._stop_asked,
            protocol.VERB_PAGES: self._pages, protocol.VERB_WB: self._writeback, protocol.VERB_DESCRIBE: self._describe}
        daemon.gate.when_settled(self._snapshot_settled)

    # -- the loop -----------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()
        self._wake()

    def serve(self) -> None:
        log.debug("phase serving")
        self._release_held()  # the snapshot may be there already (a daemon made in the foreground)
        try:
            while not self._stop.is_set():
                for key, events in self._sel.select(timeout=protocol.HEARTBEAT_MS / 1000):
                    if isinstance(key.data, _Conn):
                        self._on_event(key.data, events)
                    else:
                        key.data()  # the listener, the front door or the wake pipe
                self._deliver_done()
                self._release_held()
                self._tick()
                if self.embedded and self._unused():
                    log.info("last session closed: stopping")
                    log.debug("phase daemon.stopping")
                    break
        finally:
            self._stop.set()
            if self.front_door is not None:
                self.front_door.stop()
                self.daemon.absorb_front_door()
            if self.writeback_door is not None:
                self.writeback_door.stop()
            self._pool.shutdown(wait=False, cancel_futures=True)
            for conn in list(self._conns.values()):
                self._close(conn)
            self._sel.close()
            self._listener.close()
            self._wake_r.close()
            self._wake_w.close()
            self.daemon.instance.unpublish_socket()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("accept: %s", e)
                return
            self._adopt(sock)

    def _from_door(self) -> None:
        """The front door's news: what it copied (into the books), then the connections it
        handed over, each with the bytes it read of the request."""
        self.daemon.absorb_front_door()
        for fd, data in self.front_door.take():
            try:
                sock = socket.socket(fileno=fd)
            except OSError as e:  # never: the door hands over sockets it accepted; but never fatal either
                log.warning("a connection from the front door is not a socket (%s): closed", e)
                os.close(fd)
                continue
            self._adopt(sock, data)

    def _adopt(self, sock: socket.socket, data: bytes = b"") -> None:
        if len(self._conns) >= MAX_CONNECTIONS:
            self.errors["too_many_connections"] += 1
            sock.close()
            return
        if not secure.peer_is_me(sock):
            self.errors["other_user"] += 1
            log.warning("refused a connection from another uid (this daemon serves uid %d only)", os.getuid())
            sock.close()
            return
        sock.setblocking(False)
        conn = _Conn(sock)
        self._conns[sock.fileno()] = conn
        self._sel.register(sock, selectors.EVENT_READ, conn)
        if data:
            conn.inbuf += data
            self._parse(conn)

    def _on_event(self, conn: _Conn, events: int) -> None:
        if events & selectors.EVENT_WRITE:
            self._flush(conn)
        if events & selectors.EVENT_READ and conn.sock.fileno() >= 0:
            try:
                data = conn.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._close(conn)
                return
            if conn.pending or conn.close_after:
                self._refuse(conn, "data_while_busy", "one request per connection")
                return
            conn.inbuf += data
            self._parse(conn)

    def _parse(self, conn: _Conn) -> None:
        """Handle every complete frame in the buffer (a session may send several REPORTs)."""
        while len(conn.inbuf) >= protocol.REQUEST_HEADER.size and not conn.pending and not conn.close_after:
            try:
                verb, length = protocol.decode_request_header(bytes(conn.inbuf[:protocol.REQUEST_HEADER.size]))
            except ProtocolError as e:
                self._refuse(conn, "malformed", str(e))
                return
            end = protocol.REQUEST_HEADER.size + length
            if len(conn.inbuf) < end:
                return
            body = bytes(conn.inbuf[protocol.REQUEST_HEADER.size:end])
            del conn.inbuf[:end]
            self._request(conn, verb, body)

    def _request(self, conn: _Conn, verb: int, body: bytes) -> None:
        if conn.session and verb != protocol.VERB_REPORT:
            self._refuse(conn, "bad_session_request", "a session only asks for REPORT")
            return
        self._handlers[verb](conn, body)  # decode_request_header let known verbs through only

    # -- the shim's requests ------------------------------------------------------------------
    def _open(self, conn: _Conn, body: bytes) -> None:
        key = self._key(conn, body)
        if key is None:
            return
        resolve_timeout = self.daemon.config.staging.resolve_timeout
        if not self._settled:
            self._hold(conn, protocol.VERB_OPEN, body, answer_by=resolve_timeout)
            return
        known = self.daemon.resolver.resolve_now(key)
        if known is not None:
            self._answer(conn, *_open_answer(known), close=True)
            return
        now = self._begin_waiting(conn)
        conn.answer_by = now + resolve_timeout
        # no thread waits for the copy: its end answers
        self.daemon.resolver.resolve_async(key, lambda answer, outcome, c=conn: self._resolved(c, answer, outcome))

    def _pages(self, conn: _Conn, body: bytes) -> None:
        """Another owner's pages for a guarded fault: the front door's alone (the C data path),
        never Python's (a page's round trip through it would cost more than the PFS's): not
        served, the shim reads the PFS."""
        self._answer(conn, protocol.encode_answer(protocol.STATUS_ERROR, b"pages are the front door's"), close=True)

    def _invalidate(self, conn: _Conn, body: bytes) -> None:
        key = self._key(conn, body)
        if key is None:
            return
        self._begin_waiting(conn)
        work = lambda: (self.daemon.invalidate(key), protocol.encode_answer(0))[1]  # noqa: E731
        future = self._pool.submit(work)
        future.add_done_callback(lambda f, c=conn: self._finished(c, f))

    def _describe(self, conn: _Conn, body: bytes) -> None:
        """A file the walk only listed, described for the shim's metadata call (on a request thread:
        a PFS stat); the front door answers these itself where it may write the index."""
        key = self._key(conn, body)
        if key is None:
            return
        self._begin_waiting(conn)
        work = lambda: protocol.encode_answer(0 if self._settled and self.daemon.describe(key) else 1)  # noqa: E731
        self._pool.submit(work).add_done_callback(lambda f, c=conn: self._finished(c, f))

    def _key(self, conn: _Conn, body: bytes) -> str | None:
        """The request's key, or None once the request is refused for it."""
        key = _valid_key(body)
        if key is None:
            self._refuse(conn, "bad_key", "a key is '<root index>/<relative path>' without NUL, '.' or '..'")
        return key

    def _begin_waiting(self, conn: _Conn) -> float:
        """The request's answer comes later (heartbeats meanwhile); now, by the monotonic clock."""
        conn.pending = True
        now = time.monotonic()
        conn.next_beat = now + protocol.HEARTBEAT_MS / 1000
        return now

    def _hint(self, conn: _Conn, body: bytes) -> None:
        try:
            self.daemon.hint(body)
        except ProtocolError as e:
            self._refuse(conn, "bad_hint", str(e))
            return
        conn.deadline = time.monotonic() + REQUEST_TIMEOUT  # the hinting reader may send more
        self._answer(conn, protocol.encode_answer(0))

    def _index(self, conn: _Conn, body: bytes) -> None:
        if body:  # a poll (INDEX_POLL): never held; the front door answers it itself while the walk runs
            status = protocol.INDEX_WALKING if not self._settled else None
        elif not self._settled:
            self._hold(conn, protocol.VERB_INDEX, body)
            return
        else:
            status = None
        if status is None:
            ready = self.daemon.gate.state is SnapshotState.READY
            status = protocol.INDEX_READY if ready else protocol.INDEX_NONE
        self._answer(conn, protocol.encode_answer(status), close=True)

    # -- the launchers' sessions --------------------------------------------------------------
    def _attach(self, conn: _Conn, body: bytes) -> None:
        if self._sessions >= MAX_SESSIONS:
            self._refuse(conn, "too_many_sessions", f"at most {MAX_SESSIONS} sessions")
            return
        conn.session = True
        self._sessions += 1
        self._ever_attached = True
        self._last_was_done = False
        self._last_change = time.monotonic()
        log.debug("phase attach %d", self._sessions)
        answer = {"env": self.daemon.client_env(), "run": self.daemon.describe()}
        self._answer(conn, protocol.encode_answer(0, json.dumps(answer).encode()))

    def _report(self, conn: _Conn, body: bytes) -> None:
        # a body of b"brief" (progress polls): the counters without the timeline
        brief = body == protocol.REPORT_BRIEF
        if not brief and not self._settled:  # the report's snapshot figures: when they exist
            self._hold(conn, protocol.VERB_REPORT, body)
            return
        conn.done = conn.done or body == protocol.REPORT_FINAL
        if not brief and (conn.done or not conn.session):
            # a last report, on a request thread: seconds over millions of files, while the loop
            # answers and takes the door's copies (else they pile up in it); it tells what the job's
            # writes became once on the PFS (a brief one is a poll: the launcher's line, W7)
            writeback, _ = self.daemon.writeback, self._begin_waiting(conn)
            work = lambda: (writeback is not None and writeback.finish(), self._report_frame(brief))[1]  # noqa: E731
            self._pool.submit(work).add_done_callback(lambda f, c=conn: self._finished(c, f))
            return
        self._answer(conn, self._report_frame(brief), close=not conn.session)
        if not brief:
            log.debug("phase report.answered")

    def _report_frame(self, brief: bool) -> bytes:
        refused = self.errors + (self.writeback_door.refused if self.writeback_door is not None else collections.Counter())
        stats = self.daemon.stats(brief=brief) | {"requests_refused": dict(refused),
                                                  "requests_held_for_snapshot": dict(self.held)}
        return protocol.encode_answer(0, json.dumps(stats).encode())

    def _writeback(self, conn: _Conn, body: bytes) -> None:
        """A write-back call (monarch/writeback/wire.py), on a request thread: it may wait for the drain."""
        if self.daemon.writeback is None:
            self._refuse(conn, "no_writeback", "this daemon has no write-back paths")
            return
        self._begin_waiting(conn)
        self._pool.submit(self.daemon.writeback.call, body).add_done_callback(lambda f, c=conn: self._finished(c, f))

    def _stop_asked(self, conn: _Conn, body: bytes) -> None:
        self._answer(conn, protocol.encode_answer(0), close=True)
        self.request_stop()

    # -- requests that wait for the snapshot ------------------------------------------------
    def _hold(self, conn: _Conn, verb: int, body: bytes, answer_by: float = 0.0) -> None:
        """Keep a request until the snapshot is ready or failed (heartbeats meanwhile; an OPEN
        is answered PFS after ``answer_by`` seconds, as if its copy were slow)."""
        now = time.monotonic()
        conn.pending = True
        conn.held = (verb, body)
        conn.next_beat = now + protocol.HEARTBEAT_MS / 1000
        conn.answer_by = now + answer_by if answer_by else 0.0
        self._held.append(conn)
        self.held[protocol.VERBS[verb]] += 1

    def _snapshot_settled(self) -> None:
        """On the walk's thread (or here, if it had ended): wake the loop to release the held."""
        self._settled_flag.set()
        self._wake()

    def _release_held(self) -> None:
        """Once the snapshot is ready or failed: every held request, in order, as if new."""
        if self._settled or not self._settled_flag.is_set():
            return
        self._settled = True
        self.daemon.open_front_door()
        if self.front_door is not None:
            self.front_door.settle()  # INDEX polls: Python's to answer from now on (ready or failed)
        held, self._held = self._held, []
        for conn in held:
            if not conn.pending or conn.held is None or self._conns.get(conn.sock.fileno()) is not conn:
                continue  # answered meanwhile (an OPEN given up on) or gone
            verb, body = conn.held
            conn.pending, conn.held, conn.answer_by = False, None, 0.0
            self._request(conn, verb, body)
            self._parse(conn)  # a session's later frames, kept in its buffer meanwhile

    def _finished(self, conn: _Conn, future) -> None:
        """On a pool thread: hand the answer to the loop."""
        try:
            answer = future.result()
        except Exception:  # a bug here must not take the daemon down: the shim reads the PFS
            log.exception("request failed")
            answer = protocol.encode_answer(protocol.SLOT_PFS)
        self._hand_over(conn, answer, None, None)

    def _resolved(self, conn: _Conn, answer: tuple[int, str], outcome: Outcome) -> None:
        """On any thread (a staging thread, or the loop itself): an OPEN's answer is known."""
        frame, fd = _open_answer(answer)
        self._hand_over(conn, frame, outcome, fd)

    def _hand_over(self, conn: _Conn, frame: bytes, outcome: Outcome | None, fd: int | None) -> None:
        self._done.append((conn, frame, outcome, fd))
        if not self._woken:  # one wake byte per batch of answers, not one per answer
            self._woken = True
            self._wake()

    def _deliver_done(self) -> None:
        self._woken = False
        while self._done:
            conn, answer, outcome, fd = self._done.popleft()
            if not conn.pending or self._conns.get(conn.sock.fileno()) is not conn:
                if fd is not None:
                    os.close(fd)
                continue  # answered already (timed out) or gone: the late answer is not counted
            conn.pending = False
            if outcome is not None:
                self.daemon.count(outcome)
            self._answer(conn, answer, fd, close=True)

    def _tick(self) -> None:
        """Heartbeats to waiting clients; close clients too slow to send their request; the
        front door's copies into the books (it wakes the loop only for a batch of them)."""
        now = time.monotonic()
        if self.front_door is not None and now >= self._next_absorb:
            self._next_absorb = now + DOOR_BOOKS_SECONDS
            self.daemon.absorb_front_door()
        for conn in list(self._conns.values()):
            if conn.pending and conn.answer_by and now >= conn.answer_by:
                conn.pending = False  # the copy goes on; this open reads the PFS
                self.daemon.count(Outcome.PFS_SNAPSHOT_NOT_READY if conn.held else Outcome.PFS_TIMEOUT)
                conn.held = None
                self._answer(conn, *_open_answer((protocol.SLOT_PFS, "")), close=True)
            elif conn.pending and now >= conn.next_beat:
                conn.next_beat = now + protocol.HEARTBEAT_MS / 1000
                self._answer(conn, protocol.encode_answer(protocol.STATUS_PENDING))
            elif not conn.session and not conn.pending and not conn.outbuf and now > conn.deadline:
                self.errors["request_timeout"] += 1
                self._close(conn)

    # -- writing ---------------------------------------------------------------------------
    def _answer(self, conn: _Conn, frame: bytes, fd: int | None = None, close: bool = False) -> None:
        if fd is not None:
            conn.outfd, conn.fd_at = fd, len(conn.outbuf)
        conn.outbuf += frame
        conn.close_after = conn.close_after or close
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        try:
            while conn.outbuf:
                if conn.outfd is None:
                    sent = conn.sock.send(conn.outbuf)
                elif conn.fd_at:  # heartbeats before the frame the descriptor goes with
                    sent = conn.sock.send(conn.outbuf[:conn.fd_at])
                    conn.fd_at -= sent
                else:
                    sent = socket.send_fds(conn.sock, [bytes(conn.outbuf)], [conn.outfd])
                    if sent:
                        os.close(conn.outfd)
                        conn.outfd = None
                del conn.outbuf[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # the client gave up (the shim read the PFS)
            self._close(conn)
            return
        if conn.outbuf:
            self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            return
        if conn.close_after:
            self._close(conn)
        elif conn.sock.fileno() >= 0:
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _refuse(self, conn: _Conn, reason: str, message: str) -> None:
        self.errors[reason] += 1
        conn.inbuf.clear()
        self._answer(conn, protocol.encode_answer(protocol.STATUS_ERROR, message.encode()[:4096]), close=True)

    def _close(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if fd < 0 or self._conns.get(fd) is not conn:
            return
        del self._conns[fd]
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        if conn.outfd is not None:
            os.close(conn.outfd)
            conn.outfd = None
        if conn.session:
            self._sessions -= 1
            self._last_was_done = conn.done
            self._last_change = time.monotonic()
            log.debug("phase detach %d", self._sessions)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # full (the loop will wake anyway) or closed at shutdown

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError, OSError):
            pass

    def _unused(self) -> bool:
        idle = time.monotonic() - self._last_change
        if self._ever_attached:
            return self._sessions == 0 and (self._last_was_done or idle > EMBEDDED_IDLE_SECONDS)
        return idle > EMBEDDED_FIRST_ATTACH_SECONDS


def _open_answer(answer: tuple[int, str | int]) -> tuple[bytes, int | None]:
    """An OPEN answer's frame, and the descriptor to pass with it (compressed copies)."""
    slot, where = answer
    if slot & protocol.ANSWER_FD:
        return protocol.encode_answer(slot), where
    return protocol.encode_answer(slot, os.fsencode(where) if slot != protocol.SLOT_PFS else b""), None


def _valid_key(body: bytes) -> str | None:
    """The key of a request, or None if it could name something outside a root's files."""
    index, sep, rel = body.partition(b"/")
    if not sep or not index.isdigit() or not rel or b"\0" in rel or rel.startswith(b"/"):
        return None
    if any(part in (b"", b".", b"..") for part in rel.split(b"/")):
        return None
    return protocol.key_str(body)


def _claim_socket(path: str) -> None:
    """Refuse to start over a live daemon; remove a socket file a dead one left (the run
    directory's lock already refuses a second live daemon of this version: see instance.py)."""
    if len(path.encode()) >= 108:
        raise DaemonError(f"socket path {path} is too long for a Unix socket (max 107 bytes); "
                          "choose a shorter run_base in the configuration")
    if not os.path.lexists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise DaemonError(f"a Monarch daemon already serves {path}; stop it (monarch stop) or use another run_base")


def _writeback_door(daemon: NodeDaemon) -> WritebackDoor | None:
    """The write-back calls' socket, started (None: no write-back here, or it cannot be made, said:
    the shim sends them to the main socket)."""
    if daemon.writeback is None:
        return None
    try:
        door = WritebackDoor(daemon.instance.writeback_socket_path, daemon.writeback.call)
    except OSError as e:
        log.warning("write-back: no socket of its own (%s): its calls go to the daemon's socket", e)
        return None
    door.start()
    return door
