#!/usr/bin/python3
"""A TCP relay to a Unix socket, for the fleet tests: one worker reaches PostgreSQL through it.

    /usr/bin/python3 scripts/pg_relay.py SOCKET_PATH

Listens on a free port of 127.0.0.1 and prints `ready PORT`; each connection is relayed to
SOCKET_PATH (PostgreSQL's `.s.PGSQL.N`). One process, one thread: SIGSTOP of it is a partition
as a network cut makes one (nothing is closed, nothing answers, new connections wait in the
backlog), and SIGCONT heals it. Run by `FleetTests.aWorkerCutOffAloneStopsBeforeItsJobsAreTaken`.
"""
import selectors
import socket
import sys


def main() -> None:
    target = sys.argv[1]
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
            try:
                peers[ready].sendall(data)
            except OSError:
                drop(ready)


if __name__ == "__main__":
    main()
