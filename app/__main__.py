"""Entry point: ``python -m app`` (and the frozen app's executable)."""

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the command line; with no subcommand, open the window (or the headless comparison)."""
    from app.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
