"""`python -m workers.cli`: the `ratchet` command line."""

from workers.cli.commands import main

if __name__ == "__main__":
    raise SystemExit(main())
