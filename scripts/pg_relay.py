#!/usr/bin/python3
"""A TCP relay to a Unix socket, for the fleet tests: one worker reaches PostgreSQL through it.

    /usr/bin/python3 scripts/pg_relay.py SOCKET_PATH [WORD]

Listens on a free port of 127.0.0.1 and prints `ready PORT`; each connection is relayed to
SOCKET_PATH (PostgreSQL's `.s.PGSQL.N`). One process, one thread: SIGSTOP of it is a partition
as a network cut makes one (nothing is closed, nothing answers, new connections wait in the
backlog), and SIGCONT heals it. Run by `FleetTests.aWorkerCutOffAloneStopsBeforeItsJobsAreTaken`.

With WORD, SIGUSR1 arms a cut of one COMMIT's answer: the first transaction after it whose
client bytes hold WORD (a bound value: `completed`) commits on the server, but its answer
(CommandComplete `COMMIT`) never reaches the client, whose connection is closed instead, as a
server restart or a network cut at that moment leaves it; prints `cut` then. Run by
`FleetTests.aCompletionWhoseCommitAnswerWasLostIsLinked`.
"""
import selectors
import signal
import socket
import sys

# The server's CommandComplete of a COMMIT: 'C', its length (4 + 7), the tag.
COMMIT_DONE = b"C\x00\x00\x00\x0bCOMMIT\x00"


def main() -> None:
    target = sys.argv[1]
    word = sys.argv[2].encode() if len(sys.argv) > 2 else None
    armed = [False]
    signal.signal(signal.SIGUSR1, lambda *_: armed.__setitem__(0, True))
    # The test process starts this with its signal mask, which blocks some signals.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1, signal.SIGTERM})
    # The client sockets whose transaction has sent WORD since the cut was armed.
    marked: set[socket.socket] = set()
    clients: set[socket.socket] = set()
    selector = selectors.DefaultSelector()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    selector.register(listener, selectors.EVENT_READ)
    peers: dict[socket.socket, socket.socket] = {}

    def drop(one: socket.socket) -> None:
        for end in (one, peers.get(one)):
            if end is not None and end in peers:
                selector.unregister(end)
                del peers[end]
                marked.discard(end)
                clients.discard(end)
                end.close()

    print(f"ready {listener.getsockname()[1]}", flush=True)
    while True:
        for key, _ in selector.select():
            ready = key.fileobj
            if ready is listener:
                client, _ = listener.accept()
                server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    server.connect(target)
                except OSError:
                    client.close()
                    server.close()
                    continue
                peers[client], peers[server] = server, client
                clients.add(client)
                selector.register(client, selectors.EVENT_READ)
                selector.register(server, selectors.EVENT_READ)
                continue
            try:
                data = ready.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                drop(ready)
                continue
            if word is not None and armed[0]:
                if ready in clients and word in data:
                    marked.add(ready)
                elif ready not in clients and peers[ready] in marked and COMMIT_DONE in data:
                    # Committed on the server; the answer goes nowhere.
                    armed[0] = False
                    peers[ready].sendall(data[: data.index(COMMIT_DONE)])
                    drop(ready)
                    print("cut", flush=True)
                    continue
            try:
                peers[ready].sendall(data)
            except OSError:
                drop(ready)


if __name__ == "__main__":
    main()
