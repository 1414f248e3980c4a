"""``python -m demo --backend zookeeper|etcd [--fast] [--keep-dir]``.

Exit codes: 0 the whole story happened; 1 a step did not happen (the message says
which); 2 bad arguments; 130 interrupted (Ctrl-C or SIGTERM). Nothing is left
running in any case.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from demo.output import Output
from demo.story import FAST, NORMAL, DemoFailure, Story
from shardkeeper.localregistry import ClusterError

__all__ = ["main"]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM takes the same way out as Ctrl-C, so that the cleanup in main() runs.
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns the process exit code (see module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m demo",
        description="Sharding, resharding and failover of a job on a local registry.",
    )
    parser.add_argument("--backend", choices=["zookeeper", "etcd"], default="zookeeper")
    parser.add_argument(
        "--fast", action="store_true", help="fire every second instead of every 2 s (tests)"
    )
    parser.add_argument(
        "--keep-dir",
        action="store_true",
        help="keep the working directory (server data, worker logs and journals)",
    )
    args = parser.parse_args(argv)

    signal.signal(signal.SIGTERM, _interrupt)
    out = Output()
    workdir = Path(tempfile.mkdtemp(prefix="shardkeeper-demo-"))
    timing = FAST if args.fast else NORMAL
    out.console.print(
        f"[bold]shardkeeper demo[/bold] on {args.backend}"
        + (" (fast)" if args.fast else "")
        + f"; working directory {workdir}",
        soft_wrap=True,
    )
    story = Story(args.backend, timing, workdir, out)
    code = 0
    try:
        story.run()
    except DemoFailure as exc:
        out.fail(str(exc))
        _show_logs(story, out)
        code = 1
    except ClusterError as exc:
        out.fail(f"the {args.backend} server did not start: {exc}")
        code = 1
    except KeyboardInterrupt:
        out.fail("interrupted")
        code = 130
    except Exception as exc:
        # a bug or an unexpected store error: say so plainly, keep the logs, clean up
        out.fail(f"unexpected error: {exc!r}")
        out.console.print_exception()
        _show_logs(story, out)
        code = 1
    finally:
        story.close()
    keep = args.keep_dir or code != 0
    if keep:
        out.console.print(f"logs, journals and server data kept in {workdir}", soft_wrap=True)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    if code == 0:
        out.console.print(
            f"[bold green]demo complete[/bold green] in {out.elapsed():.1f}s", soft_wrap=True
        )
    return code


def _show_logs(story: Story, out: Output) -> None:
    for w in story.workers:
        try:
            lines = w.log_path.read_text(errors="replace").splitlines()[-12:]
        except OSError:
            continue
        out.block(f"last lines of {w.name}'s log ({w.log_path}):", "\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
