"""Child process of the contract suite: connect with a registry URL, act, report on stdout.

Not a test module. Usage::

    python child_store.py URL create PATH VALUE
        start a store, print READY, wait for a GO line on stdin, call create(PATH, VALUE)
        and print ``WON <created_revision>`` or ``LOST``; then close and exit.
    python child_store.py URL ephemeral PATH
        start a store, create PATH as an ephemeral node, print
        ``READY <session_timeout> <session_id>`` and block on stdin until killed
        (or until stdin closes, then close the store and exit).

Any exception is printed as ``ERROR <type>: <message>`` and the exit status is 1.
"""

from __future__ import annotations

import sys

from shardkeeper.registry import open_store


def main(argv: list[str]) -> int:
    """Run one action (see the module docstring); returns the exit status."""
    url, action, path = argv[:3]
    store = open_store(url)
    try:
        store.start()
        if action == "create":
            print("READY", flush=True)
            if sys.stdin.readline().strip() != "GO":
                return 2
            node = store.create(path, argv[3].encode())
            print(f"WON {node.created_revision}" if node is not None else "LOST", flush=True)
            return 0
        if action == "ephemeral":
            store.create(path, b"alive", ephemeral=True)
            print(f"READY {store.session_timeout} {store.session_id}", flush=True)
            sys.stdin.readline()
            return 0
        print(f"ERROR ValueError: unknown action {action!r}", flush=True)
        return 2
    except Exception as exc:
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        return 1
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
