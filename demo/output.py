"""How the demo talks: timestamped story lines and tables through rich.

On a terminal the output has colour; piped into a file or a test it is plain text
(rich detects that), and story lines are never wrapped so that they stay greppable.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["Output", "escape"]


class Output:
    """Prints the story with the seconds elapsed since the demo began."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False)
        self.began = time.monotonic()

    def elapsed(self) -> float:
        """Seconds since the demo began."""
        return time.monotonic() - self.began

    def _stamp(self) -> str:
        return f"[dim]\\[{self.elapsed():5.1f}s][/dim]"

    def heading(self, text: str) -> None:
        """A new chapter of the story."""
        self.console.print()
        self.console.print(f"{self._stamp()} [bold cyan]== {text}[/bold cyan]", soft_wrap=True)

    def say(self, markup: str) -> None:
        """One story line (rich markup; escape untrusted parts with :func:`escape`)."""
        self.console.print(f"{self._stamp()} {markup}", soft_wrap=True)

    def ok(self, markup: str) -> None:
        """A step that happened as it should."""
        self.say(f"[green]OK[/green] {markup}")

    def feed(self, markup: str) -> None:
        """A line of the live feed of executions (indented under the story)."""
        self.console.print(f"{self._stamp()}   [dim]|[/dim] {markup}", soft_wrap=True)

    def fail(self, text: str) -> None:
        """The story broke: say what did not happen."""
        self.console.print()
        self.console.print(f"[bold red]DEMO FAILED:[/bold red] {escape(text)}", soft_wrap=True)

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        """A small table (cells are plain text, not markup)."""
        table = Table(title=title, title_justify="left", show_edge=True, pad_edge=True)
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        self.console.print(table)

    def block(self, title: str, text: str) -> None:
        """A titled block of raw text (log tails)."""
        self.console.print(f"[bold]{escape(title)}[/bold]")
        self.console.print(escape(text), soft_wrap=True)
