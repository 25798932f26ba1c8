"""Entry point: ``python -m app`` (and the frozen app's executable)."""

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the command line; with no subcommand, open the window (or the headless comparison).

    Started as ``python -m app`` on Linux, the process first re-executes itself once with an
    optimized BLAS preloaded when one is installed, and says once on stderr when it has none
    (:mod:`app.engine.blas`). PyTorch is kept out of the process (:mod:`app.models.no_torch`:
    transformers would import it when installed, ~9 s on an NVIDIA host).
    """
    if argv is None:
        from app.models.no_torch import keep_torch_out

        keep_torch_out()
        from app.engine.blas import maybe_reexec_with_optimized_blas, warn_if_slow_blas

        maybe_reexec_with_optimized_blas()
        warn_if_slow_blas(sys.stderr)
    from app.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
