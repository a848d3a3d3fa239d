#!/usr/bin/env python3
"""Drives dld's aria2 JSON-RPC (/jsonrpc) with aria2p, a client library written for aria2,
as its users drive aria2: add, follow, pause, resume, list, purge, stats, a wrong secret.

Usage: check-aria2p.py PORT SECRET ORIGIN_URL
Prints "ok" and exits 0 when every step went as with aria2; else says which step failed.
"""
import sys
import time

import aria2p


def wait(download, condition, what, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        download.update()
        if condition(download):
            return
        time.sleep(0.05)
    sys.exit(f"{what}: status {download.status}, error {download.error_message!r}")


def main():
    port, secret, origin = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    api = aria2p.API(aria2p.Client(host="http://127.0.0.1", port=port, secret=secret))
    version = api.client.get_version()
    assert "version" in version and "enabledFeatures" in version, version

    done = api.add_uris([f"{origin}/bytes/150000"], options={"out": "p.bin"})
    wait(done, lambda d: d.is_complete or d.has_failed, "the first download")
    assert done.is_complete, done.error_message
    assert done.total_length == 150000 and done.completed_length == 150000, (done.total_length, done.completed_length)
    assert str(done.files[0].path).endswith("/p.bin"), done.files[0].path

    held = api.add_uris([f"{origin}/bytes/1000"], options={"pause": "true"})
    held.update()
    assert held.is_paused, held.status
    assert api.resume([held]) == [True]
    wait(held, lambda d: d.is_complete or d.has_failed, "the resumed download")
    assert held.is_complete, held.error_message

    gids = sorted(d.gid for d in api.get_downloads())
    assert gids == sorted([done.gid, held.gid]), gids
    stats = api.get_stats()
    assert stats.num_stopped == 2 and stats.num_active == 0, (stats.num_stopped, stats.num_active)
    assert api.purge() is True
    assert api.get_downloads() == [], api.get_downloads()

    wrong = aria2p.API(aria2p.Client(host="http://127.0.0.1", port=port, secret="not-the-secret"))
    try:
        wrong.get_stats()
        sys.exit("a wrong secret was accepted")
    except aria2p.ClientException as error:
        assert error.code == 1 and error.message == "Unauthorized", (error.code, error.message)
    print("ok")


if __name__ == "__main__":
    main()
