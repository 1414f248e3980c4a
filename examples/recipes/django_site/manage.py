"""The recipe project's ``manage.py`` (run from the repository root, see docs/deployment.md)."""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Run a Django management command with the recipe's settings."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.recipes.django_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
